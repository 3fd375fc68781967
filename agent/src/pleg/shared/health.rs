//! PLEG health: is the full relist keeping up? (kubelet's `GenericPLEG.Healthy`).
//!
//! Health is computed from timestamps when asked, never set by the relist loop: a relist that
//! hangs cannot report itself, but the age of the last success keeps growing and crosses the
//! threshold on its own.

use std::{
    fmt::Write as _,
    sync::{Mutex, MutexGuard},
    time::Duration,
};

use tokio::{sync::watch, time::Instant};

/// How old the last successful full relist may be before the PLEG is unhealthy (kubelet's
/// `relistThreshold`).
pub const DEFAULT_RELIST_THRESHOLD: Duration = Duration::from_secs(3 * 60);

/// Why the PLEG is unhealthy. The messages are kubelet's, word for word, since node tooling
/// greps for them.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum HealthError {
    #[error("pleg has yet to be successful")]
    NeverSucceeded,
    /// `age` is truncated to whole seconds (kubelet prints nanoseconds; nobody needs them).
    #[error("pleg was last seen active {} ago; threshold is {}", go_duration(*.age), go_duration(*.threshold))]
    Stale {
        age: Duration,
        threshold: Duration,
        /// How long the relist running now has been at it, if one is: tells a hang from a
        /// loop that stopped.
        running_for: Option<Duration>,
    },
}

/// Relist timestamps, shared between the relister (writes) and health checks (reads).
pub struct Health {
    threshold: Duration,
    state: Mutex<State>,
    /// Marked at each successful full relist, so who reports health (gRPC health, systemd
    /// readiness) turns healthy as the PLEG does, not at its next look.
    succeeded: watch::Sender<()>,
}

#[derive(Debug, Default)]
struct State {
    /// Start of the last full relist that succeeded (kubelet's `relistTime`).
    last_success: Option<Instant>,
    /// Start of the full relist in progress, if any.
    running_since: Option<Instant>,
}

impl Health {
    pub fn new(threshold: Duration) -> Self {
        Self {
            threshold,
            state: Mutex::default(),
            succeeded: watch::Sender::new(()),
        }
    }

    /// Changes at each successful full relist. Turning unhealthy is a matter of time passing,
    /// with no event: who reports health also looks on a timer.
    pub fn successes(&self) -> watch::Receiver<()> {
        self.succeeded.subscribe()
    }

    /// A full relist started at `at`.
    pub fn relist_started(&self, at: Instant) {
        self.lock().running_since = Some(at);
    }

    /// The full relist started at `started` succeeded. The start time is what counts: the
    /// relist vouches for the state as of then.
    pub fn relist_succeeded(&self, started: Instant) {
        let mut state = self.lock();
        state.last_success = state.last_success.max(Some(started));
        state.running_since = None;
        drop(state);
        self.succeeded.send_replace(());
    }

    /// The full relist in progress failed; the last success stays as it was.
    pub fn relist_failed(&self) {
        self.lock().running_since = None;
    }

    /// `Ok` while the last successful full relist is within the threshold.
    pub fn check(&self) -> Result<(), HealthError> {
        let now = Instant::now();
        let state = self.lock();
        let last_success = state.last_success.ok_or(HealthError::NeverSucceeded)?;
        let age = now.saturating_duration_since(last_success);
        if age <= self.threshold {
            return Ok(());
        }
        Err(HealthError::Stale {
            age: Duration::from_secs(age.as_secs()),
            threshold: self.threshold,
            running_for: state
                .running_since
                .map(|t| now.saturating_duration_since(t)),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Plain timestamps written in single statements: a poisoned lock still holds valid data.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl std::fmt::Debug for Health {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Health")
            .field("threshold", &self.threshold)
            .field("state", &*self.lock())
            .finish_non_exhaustive()
    }
}

/// Formats like Go's `time.Duration.String`: "3m0s", "1h2m3.5s", "1.5ms", "0s".
fn go_duration(d: Duration) -> String {
    let nanos = d.as_nanos();
    if nanos == 0 {
        return "0s".to_owned();
    }
    if nanos < 1_000 {
        return format!("{nanos}ns");
    }
    if nanos < 1_000_000 {
        return format!("{}µs", decimal(nanos, 1_000));
    }
    if nanos < 1_000_000_000 {
        return format!("{}ms", decimal(nanos, 1_000_000));
    }
    let secs = d.as_secs();
    let (hours, minutes) = (secs / 3600, secs / 60 % 60);
    let mut out = String::new();
    if hours > 0 {
        let _ = write!(out, "{hours}h");
    }
    if hours > 0 || minutes > 0 {
        let _ = write!(out, "{minutes}m");
    }
    let _ = write!(out, "{}s", decimal(nanos % 60_000_000_000, 1_000_000_000));
    out
}

/// `value / unit` with the fraction's trailing zeros dropped, like Go.
fn decimal(value: u128, unit: u128) -> String {
    let (whole, frac) = (value / unit, value % unit);
    if frac == 0 {
        return whole.to_string();
    }
    let width = unit.ilog10() as usize;
    let digits = format!("{frac:0width$}");
    format!("{whole}.{}", digits.trim_end_matches('0'))
}

#[cfg(test)]
mod tests {
    use tokio::time::advance;

    use super::*;

    fn health() -> Health {
        Health::new(DEFAULT_RELIST_THRESHOLD)
    }

    #[test]
    fn go_duration_format() {
        let cases = [
            (Duration::ZERO, "0s"),
            (Duration::from_nanos(5), "5ns"),
            (Duration::from_nanos(1_500), "1.5µs"),
            (Duration::from_micros(1_500), "1.5ms"),
            (Duration::from_secs(1), "1s"),
            (Duration::from_millis(1_500), "1.5s"),
            (Duration::from_secs(180), "3m0s"),
            (Duration::from_secs(184), "3m4s"),
            (Duration::from_secs(3600), "1h0m0s"),
            (Duration::from_millis(3_723_500), "1h2m3.5s"),
        ];
        for (d, want) in cases {
            assert_eq!(go_duration(d), want, "{d:?}");
        }
    }

    #[test]
    fn unhealthy_before_the_first_relist() {
        let health = health();
        let err = health.check().expect_err("healthy before any relist");
        assert_eq!(err.to_string(), "pleg has yet to be successful");
    }

    #[tokio::test(start_paused = true)]
    async fn healthy_within_threshold_unhealthy_after() {
        let health = health();
        health.relist_started(Instant::now());
        health.relist_succeeded(Instant::now());
        assert_eq!(health.check(), Ok(()));
        advance(DEFAULT_RELIST_THRESHOLD).await;
        assert_eq!(health.check(), Ok(()));
        advance(Duration::from_millis(4_300)).await;
        let err = health.check().expect_err("healthy past the threshold");
        assert_eq!(
            err.to_string(),
            "pleg was last seen active 3m4s ago; threshold is 3m0s"
        );
        assert_eq!(
            err,
            HealthError::Stale {
                age: Duration::from_secs(184),
                threshold: DEFAULT_RELIST_THRESHOLD,
                running_for: None,
            }
        );
    }

    #[tokio::test]
    async fn a_success_wakes_who_waits_and_a_failure_does_not() {
        let health = health();
        let mut successes = health.successes();
        health.relist_started(Instant::now());
        health.relist_failed();
        assert!(!successes.has_changed().unwrap());
        health.relist_started(Instant::now());
        health.relist_succeeded(Instant::now());
        tokio::time::timeout(Duration::from_secs(5), successes.changed())
            .await
            .expect("no change after a success")
            .unwrap();
        assert_eq!(health.check(), Ok(()));
    }

    #[tokio::test(start_paused = true)]
    async fn a_hanging_relist_turns_unhealthy() {
        let health = health();
        health.relist_started(Instant::now());
        health.relist_succeeded(Instant::now());
        advance(Duration::from_secs(1)).await;
        // The next relist starts and never returns: nobody calls relist_succeeded.
        health.relist_started(Instant::now());
        advance(Duration::from_secs(200)).await;
        match health.check() {
            Err(HealthError::Stale {
                age, running_for, ..
            }) => {
                assert_eq!(age, Duration::from_secs(201));
                assert_eq!(running_for, Some(Duration::from_secs(200)));
            }
            other => panic!("expected stale, got {other:?}"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_relist_does_not_count() {
        let health = health();
        health.relist_succeeded(Instant::now());
        advance(Duration::from_secs(170)).await;
        health.relist_started(Instant::now());
        health.relist_failed();
        advance(Duration::from_secs(11)).await;
        assert!(matches!(
            health.check(),
            Err(HealthError::Stale {
                running_for: None,
                ..
            })
        ));
    }
}
