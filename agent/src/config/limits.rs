//! Every setting's limits: no zero where zero would stall plegd, and ceilings past which a
//! value is a typo or would overflow a timer or a queue later; the eBPF ring's size.

use std::time::Duration;

use super::{Config, ConfigError, args::human};
use crate::runtime::MAX_POD_METADATA_MAX_BYTES;

impl Config {
    /// A zero here would stall plegd or refuse every event.
    pub(super) fn validate_nonzero(&self) -> Result<(), ConfigError> {
        let zero = [
            ("relist-period", self.relist_period.is_zero()),
            ("slow-relist-period", self.slow_relist_period.is_zero()),
            ("relist-threshold", self.relist_threshold.is_zero()),
            ("runtime-timeout", self.runtime_timeout.is_zero()),
            ("sync-frequency", self.sync_frequency.is_zero()),
            ("event-channel-capacity", self.event_channel_capacity == 0),
            ("inspect-concurrency", self.inspect_concurrency == 0),
            ("event-history", self.event_history == 0),
            ("watch-queue", self.watch_queue == 0),
            ("pod-metadata-max-bytes", self.pod_metadata.max_bytes == 0),
            ("event-history-bytes", self.event_history_bytes == 0),
            ("api-max-connections", self.api_limits.connections == 0),
            (
                "api-max-connections-per-peer",
                self.api_limits.connections_per_peer == 0,
            ),
            (
                "api-max-streams-per-peer",
                self.api_limits.streams_per_peer == 0,
            ),
        ];
        match zero.into_iter().find(|(_, is_zero)| *is_zero) {
            Some((key, _)) => Err(ConfigError::Zero { key }),
            None => Ok(()),
        }
    }

    /// Values past these bounds are typos, and some would overflow a timer or a queue's
    /// semaphore later (a panic in tokio) instead of failing here with the setting's name.
    pub(super) fn validate_bounds(&self) -> Result<(), ConfigError> {
        let durations = [
            ("relist-period", self.relist_period),
            ("slow-relist-period", self.slow_relist_period),
            ("relist-threshold", self.relist_threshold),
            ("runtime-timeout", self.runtime_timeout),
            ("sync-frequency", self.sync_frequency),
            ("event-heartbeat", self.event_heartbeat),
        ];
        if let Some((key, _)) = durations.into_iter().find(|(_, d)| *d > MAX_DURATION) {
            return Err(ConfigError::TooLarge {
                key,
                max: human(MAX_DURATION),
            });
        }
        let sizes = [
            (
                "pod-metadata-max-bytes",
                self.pod_metadata.max_bytes,
                MAX_POD_METADATA_MAX_BYTES,
            ),
            (
                "event-history-bytes",
                self.event_history_bytes,
                MAX_EVENT_HISTORY_BYTES,
            ),
        ];
        if let Some((key, _, max)) = sizes.into_iter().find(|(_, bytes, max)| bytes > max) {
            return Err(ConfigError::TooLarge {
                key,
                max: max.to_string(),
            });
        }
        let counts = [
            ("event-channel-capacity", self.event_channel_capacity),
            ("inspect-concurrency", self.inspect_concurrency),
            ("event-history", self.event_history),
            ("watch-queue", self.watch_queue),
            ("api-max-connections", self.api_limits.connections),
            (
                "api-max-connections-per-peer",
                self.api_limits.connections_per_peer,
            ),
            ("api-max-streams-per-peer", self.api_limits.streams_per_peer),
        ];
        match counts.into_iter().find(|(_, n)| *n > MAX_COUNT) {
            Some((key, _)) => Err(ConfigError::TooLarge {
                key,
                max: MAX_COUNT.to_string(),
            }),
            None => Ok(()),
        }
    }
}

/// The kernel's ring buffers are a power-of-two number of pages.
pub(super) fn check_ring_size(bytes: u32, page: u64) -> Result<(), ConfigError> {
    if bytes.is_power_of_two() && u64::from(bytes).is_multiple_of(page) {
        Ok(())
    } else {
        Err(ConfigError::RingSize { bytes, page })
    }
}

/// The longest duration a setting takes: a year (humantime's, 365.25 days, so that the
/// message says `1year`).
const MAX_DURATION: Duration = Duration::from_secs(31_557_600);

/// The largest count a setting takes: far more than any node needs, far below what would
/// overflow a tokio channel.
const MAX_COUNT: usize = 1 << 24;

/// The largest `--event-history-bytes`: past this the history alone would outgrow the unit's
/// `MemoryMax` several times over.
const MAX_EVENT_HISTORY_BYTES: usize = 1 << 30;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::resolve::load_given;

    #[test]
    fn the_ring_is_a_power_of_two_number_of_pages() {
        for bytes in [4096, 8192, 1 << 20] {
            check_ring_size(bytes, 4096).unwrap();
        }
        for (bytes, page) in [(0, 4096), (4095, 4096), (12288, 4096), (4096, 65536)] {
            let err = check_ring_size(bytes, page).unwrap_err().to_string();
            assert!(
                err.contains(&format!("({page} bytes): {bytes} is not")),
                "{err}"
            );
        }
    }

    #[test]
    fn zero_and_absurdly_large_values_are_rejected_naming_the_setting() {
        for (flag, value) in [
            ("--relist-period", "0s"),
            ("--runtime-timeout", "0ms"),
            ("--watch-queue", "0"),
            ("--inspect-concurrency", "0"),
            ("--pod-metadata-max-bytes", "0"),
            ("--event-history-bytes", "0"),
        ] {
            let err = load_given(&[flag, value]).unwrap_err().to_string();
            assert_eq!(err, format!("{} must be greater than zero", &flag[2..]));
        }
        for (flag, value, max) in [
            ("--runtime-timeout", "400years", "1year"),
            ("--relist-threshold", "366days", "1year"),
            ("--relist-period", "18446744073709551615s", "1year"),
            // tokio's channels panic past usize::MAX >> 3: never reached.
            ("--watch-queue", "18446744073709551615", "16777216"),
            ("--event-channel-capacity", "16777217", "16777216"),
            ("--event-history", "100000000", "16777216"),
            ("--pod-metadata-max-bytes", "1048577", "1048576"),
            ("--event-history-bytes", "1073741825", "1073741824"),
        ] {
            let err = load_given(&[flag, value]).unwrap_err().to_string();
            assert_eq!(err, format!("{} must be at most {max}", &flag[2..]));
        }
    }
}
