//! Exponential backoff, the one policy behind every retry in plegd: reconnecting the event
//! streams (with jitter), reaching the runtime at start, and retrying a targeted relist (without
//! jitter, so the scheduler stays deterministic).
//!
//! [`Exponential`] is the pure schedule, a function of the attempt number; [`Backoff`] counts
//! the failures and adds what a retry loop needs: an immediate first retry and full jitter,
//! each optional. Neither reads a clock: the caller sleeps.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The wait before each retry: `base` for the first `steady` retries, then doubling, never
/// above `cap`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Exponential {
    pub base: Duration,
    pub cap: Duration,
    /// Retries at `base` before the doubling starts (at least one: `base` is the first wait).
    pub steady: u32,
}

impl Exponential {
    /// `base`, then doubling up to `cap`.
    pub const fn doubling(base: Duration, cap: Duration) -> Self {
        Self {
            base,
            cap,
            steady: 1,
        }
    }

    /// The wait before retry number `attempt + 1` (`attempt` counts from 0).
    pub fn delay(&self, attempt: u32) -> Duration {
        let doublings = attempt.saturating_sub(self.steady.saturating_sub(1));
        // Past 31 doublings the shift would overflow; any cap is reached long before.
        let factor = 1u32.checked_shl(doublings).unwrap_or(u32::MAX);
        self.base.saturating_mul(factor).min(self.cap)
    }
}

/// A retry loop's backoff: [`Exponential`] over the failures so far, optionally with an
/// immediate first retry and with full jitter (a uniform wait up to the schedule's delay, so
/// clients that lost the same server do not come back in step).
#[derive(Clone, Debug)]
pub struct Backoff {
    schedule: Exponential,
    immediate_first: bool,
    /// xorshift state when jittered; seeded by the caller so tests can repeat a sequence.
    jitter: Option<u64>,
    failures: u32,
}

impl Backoff {
    /// The plain schedule: the n-th call of [`next_delay`](Self::next_delay) returns
    /// `schedule.delay(n - 1)`.
    pub fn new(schedule: Exponential) -> Self {
        Self {
            schedule,
            immediate_first: false,
            jitter: None,
            failures: 0,
        }
    }

    /// The first retry goes at once, the schedule starts with the second: a single failure
    /// (a connection reset) costs nothing.
    pub fn immediate_first(mut self) -> Self {
        self.immediate_first = true;
        self
    }

    /// Full jitter from a xorshift generator seeded with `seed` (see [`time_seed`]).
    pub fn full_jitter(mut self, seed: u64) -> Self {
        // xorshift never leaves zero.
        self.jitter = Some(seed.max(1));
        self
    }

    /// Starts over: the next failure is the first of a new incident.
    pub fn reset(&mut self) {
        self.failures = 0;
    }

    /// Counts one more failure and returns the wait before the next attempt.
    pub fn next_delay(&mut self) -> Duration {
        let failures = self.failures;
        self.failures = self.failures.saturating_add(1);
        let attempt = if self.immediate_first {
            match failures.checked_sub(1) {
                Some(attempt) => attempt,
                None => return Duration::ZERO,
            }
        } else {
            failures
        };
        let ceiling = self.schedule.delay(attempt);
        match self.next_unit() {
            Some(unit) => ceiling.mul_f64(unit),
            None => ceiling,
        }
    }

    /// Uniform in [0, 1) when jittered.
    fn next_unit(&mut self) -> Option<f64> {
        let state = self.jitter.as_mut()?;
        let mut x = *state;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *state = x;
        Some((x >> 11) as f64 / (1u64 << 53) as f64)
    }
}

/// A seed that differs between processes and starts, for [`Backoff::full_jitter`].
pub fn time_seed() -> u64 {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    nanos ^ (u64::from(std::process::id()) << 32)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: Duration = Duration::from_secs(1);

    fn jittered() -> Backoff {
        Backoff::new(Exponential::doubling(SECOND, 60 * SECOND))
            .immediate_first()
            .full_jitter(42)
    }

    #[test]
    fn the_schedule_holds_steady_then_doubles_up_to_the_cap() {
        let ms = Duration::from_millis;
        let schedule = Exponential {
            base: ms(20),
            cap: SECOND,
            steady: 10,
        };
        let delays: Vec<_> = (0..17).map(|attempt| schedule.delay(attempt)).collect();
        let expected: Vec<_> = [20; 10]
            .into_iter()
            .chain([40, 80, 160, 320, 640, 1000, 1000])
            .map(ms)
            .collect();
        assert_eq!(delays, expected);
        // Far past any shift: still capped, no overflow.
        assert_eq!(schedule.delay(u32::MAX), SECOND);
    }

    #[test]
    fn without_jitter_the_delays_are_the_schedule() {
        let mut b = Backoff::new(Exponential::doubling(SECOND, 30 * SECOND));
        let delays: Vec<_> = (0..7).map(|_| b.next_delay().as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 8, 16, 30, 30]);
        b.reset();
        assert_eq!(b.next_delay(), SECOND);
    }

    #[test]
    fn the_first_retry_is_immediate_then_ceilings_double_up_to_the_cap() {
        let mut b = jittered();
        assert_eq!(b.next_delay(), Duration::ZERO);
        let ceilings = [1, 2, 4, 8, 16, 32, 60, 60, 60, 60];
        for ceiling in ceilings {
            let delay = b.next_delay();
            assert!(
                delay < Duration::from_secs(ceiling),
                "{delay:?} vs {ceiling}s"
            );
        }
        // Far past any shift: still capped, no overflow.
        for _ in 0..100 {
            assert!(b.next_delay() < 60 * SECOND);
        }
    }

    #[test]
    fn jitter_spreads_delays() {
        let mut b = jittered();
        b.next_delay();
        let delays: Vec<_> = (0..20).map(|_| b.next_delay()).skip(6).collect();
        let distinct: std::collections::BTreeSet<_> = delays.iter().collect();
        assert!(distinct.len() > 10, "{delays:?}");
        assert!(delays.iter().any(|d| *d > 30 * SECOND), "{delays:?}");
    }

    #[test]
    fn the_same_seed_gives_the_same_delays() {
        let (mut a, mut b) = (jittered(), jittered());
        for _ in 0..10 {
            assert_eq!(a.next_delay(), b.next_delay());
        }
        let mut zero = Backoff::new(Exponential::doubling(SECOND, 60 * SECOND))
            .immediate_first()
            .full_jitter(0);
        zero.next_delay();
        assert!(
            (0..5)
                .map(|_| zero.next_delay())
                .any(|d| d > Duration::ZERO)
        );
    }
}
