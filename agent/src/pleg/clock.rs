//! Time, passed in (habit 8): code under test runs on a [`ManualClock`] instead of sleeping.

use std::{
    sync::Mutex,
    time::{Duration, SystemTime},
};

use tokio::time::Instant;

/// Monotonic time for ages and deadlines, wall time for what users see.
pub trait Clock: Send + Sync + 'static {
    /// Monotonic now (tokio's type, so deadlines feed `tokio::time::sleep_until` directly).
    fn now(&self) -> Instant;
    /// Wall-clock now, for event timestamps.
    fn wall(&self) -> SystemTime;
}

/// The real clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }

    fn wall(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// A clock that moves only when told to, for tests. (tokio's own `pause`/`advance` need its
/// `test-util` feature, which this crate does not enable.)
#[derive(Debug)]
pub struct ManualClock {
    start: Instant,
    wall_start: SystemTime,
    elapsed: Mutex<Duration>,
}

impl ManualClock {
    /// A clock stopped at the real now.
    pub fn new() -> Self {
        Self {
            start: Instant::now(),
            wall_start: SystemTime::now(),
            elapsed: Mutex::new(Duration::ZERO),
        }
    }

    /// Moves both clocks forward by `by`.
    pub fn advance(&self, by: Duration) {
        *self.lock() += by;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Duration> {
        // A Duration cannot be left half-written: a poisoned lock is still valid.
        self.elapsed
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Instant {
        self.start + *self.lock()
    }

    fn wall(&self) -> SystemTime {
        self.wall_start + *self.lock()
    }
}
