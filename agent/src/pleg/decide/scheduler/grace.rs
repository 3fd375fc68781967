//! How long a kernel hint waits for the runtime's own event: the grace set while the runtime's
//! event stream answers, stretched to follow how late its events come.
//!
//! containerd publishes `/tasks/exit` a few ms after the kernel saw the exit on a calm node,
//! but hundreds of ms, and past a second, with 64 lifecycles in flight. A kernel hint whose
//! grace ends first is read on its own: a status call that finds the CRI store behind, and a
//! task-service call for what the store does not show yet; the runtime's event then comes
//! anyway. So the grace follows the lag the runtime's events show: each time one of them
//! answers a kernel hint (in its grace or after), the time since the kernel's hint is a sample.
//! It rises to a sample at once and falls back slowly, and never beyond [`MAX_KERNEL_GRACE`]:
//! a runtime event that never comes (a stream that went quiet) costs at most that much.

use std::time::Duration;

/// The longest a kernel hint waits for the runtime's event, however late those come.
pub const MAX_KERNEL_GRACE: Duration = Duration::from_secs(2);

/// Headroom over the lag seen: the grace is this many quarters of it.
const HEADROOM_QUARTERS: u32 = 6;

/// How much of the way down to a smaller sample the lag goes at each one (1/8): a burst of
/// late events holds the grace up while calmer ones bring it down over a few dozen samples.
const FALL_EIGHTHS: u32 = 1;

/// The kernel hints' grace: `base` (what the daemon set: zero without a runtime event stream)
/// stretched to the runtime's event lag.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelGrace {
    base: Duration,
    lag: Duration,
}

impl KernelGrace {
    /// The grace the daemon sets; the lag learnt so far stays (zero turns waiting off).
    pub fn set_base(&mut self, base: Duration) {
        self.base = base;
    }

    /// Zero while no runtime event answers kernel hints.
    pub fn base(&self) -> Duration {
        self.base
    }

    /// The runtime's event about a container came `lag` after the kernel's hint about it.
    pub fn observe(&mut self, lag: Duration) {
        self.lag = if lag >= self.lag {
            lag
        } else {
            self.lag - (self.lag - lag) * FALL_EIGHTHS / 8
        };
    }

    /// How long a kernel hint waits now: zero without a base, else the base or the lag seen
    /// with headroom, whichever is longer, up to [`MAX_KERNEL_GRACE`].
    pub fn current(&self) -> Duration {
        if self.base.is_zero() {
            return Duration::ZERO;
        }
        let stretched = (self.lag * HEADROOM_QUARTERS / 4).min(MAX_KERNEL_GRACE);
        self.base.max(stretched)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn grace(base: Duration, samples: &[Duration]) -> Duration {
        let mut grace = KernelGrace::default();
        grace.set_base(base);
        for &lag in samples {
            grace.observe(lag);
        }
        grace.current()
    }

    #[test]
    fn the_grace_follows_the_runtimes_event_lag_within_its_bounds() {
        let base = 250 * MS;
        for (samples, expected) in [
            // Calm: the base stands.
            (vec![], base),
            (vec![5 * MS, 10 * MS, 2 * MS], base),
            // Late events: the lag with headroom.
            (vec![400 * MS], 600 * MS),
            (vec![5 * MS, 800 * MS], 1200 * MS),
            // Never past the bound.
            (vec![5_000 * MS], MAX_KERNEL_GRACE),
            // A calmer sample brings it an eighth of the way down.
            (vec![800 * MS, Duration::ZERO], 1050 * MS),
        ] {
            assert_eq!(grace(base, &samples), expected, "{samples:?}");
        }
    }

    #[test]
    fn calm_events_bring_a_stretched_grace_back_to_its_base() {
        let mut samples = vec![1_500 * MS];
        samples.extend(std::iter::repeat_n(5 * MS, 40));
        assert_eq!(grace(250 * MS, &samples), 250 * MS);
        assert!(grace(250 * MS, &samples[..6]) > 500 * MS);
    }

    #[test]
    fn without_a_base_kernel_hints_do_not_wait() {
        assert_eq!(grace(Duration::ZERO, &[800 * MS]), Duration::ZERO);
    }
}
