//! The event bus: the fan-out of lifecycle events. The relist publishes each event once;
//! every consumer (API watchers, the sync loop, stdout, the OTLP export) is a subscriber with
//! its own bounded queue and its own lag policy, so none of them can delay the relist or each
//! other. Kernel notices and pod syncs, which are never resumed, have fan-outs of their own
//! (a broadcast channel, `pleg::sync_loop`'s feed) under the same rule: nobody waits.
//!
//! - **Sequences come from the relister**: [`EventBus::publish`] assigns nothing; events are
//!   published in sequence order, gapless within a daemon run (an event out of order is
//!   dropped with a warning).
//! - **Resume**: [`EventBus::subscribe`] with `from` > 0 returns every kept event with
//!   sequence >= `from`, then the live ones, atomically (no gap, no duplicate). `from` older
//!   than the oldest kept event, or beyond the next sequence, is [`SubscribeError`]. `from` = 0
//!   means live events only. A subscription knows the first sequence it delivers
//!   ([`Subscription::start`]), taken under the same lock as the subscription itself.
//! - **Slow subscribers are ended, never waited for**: publishing never blocks. When a
//!   subscriber's queue is full, it is removed and its [`Subscription`] ends with
//!   [`Ended::Lagged`] at its next read (events still queued are dropped: the subscriber
//!   resumes from what it last received). Other subscribers are not delayed.
//! - **Bounded memory**: `history` events, and no more than `history_bytes` of them
//!   ([`Sequenced::size`]; the newest is kept whatever its size), plus at most `queue` per
//!   subscriber; a subscriber's backlog is at most the history's shared (`Arc`) events. A
//!   queue holds the newest events, those the history holds too, as long as the history keeps
//!   at least a queue's length of them.

use std::{
    collections::VecDeque,
    sync::{
        Arc, Mutex, MutexGuard,
        atomic::{AtomicBool, Ordering},
    },
};

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family},
};
use tokio::sync::{
    mpsc::{self, error::TrySendError},
    watch,
};
use tracing::warn;

/// Default number of events kept for resuming watchers.
pub const DEFAULT_EVENT_HISTORY: usize = 10_000;
/// Default bytes the kept events hold at most ([`Sequenced::size`]): 10,000 events of a
/// usual size (about 1 KiB) fit; of the largest (16 KiB of a pod's labels and annotations,
/// `--pod-metadata-max-bytes`), about 1,900, more than a subscriber's queue, so that the
/// queues hold only events the history holds. Far below the unit's `MemoryMax=160M`.
pub const DEFAULT_EVENT_HISTORY_BYTES: usize = 32 << 20;
/// Default queue length of each subscriber.
pub const DEFAULT_WATCH_QUEUE: usize = 1024;

/// Label of the count of subscribers ended as lagged.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LaggedLabel {
    /// `watcher` or `internal`.
    pub kind: &'static str,
}

/// What the bus needs of an event.
pub trait Sequenced {
    fn sequence(&self) -> u64;

    /// The bytes the event holds, itself and what it owns, about: what the history's byte
    /// budget counts. The same every time it is asked.
    fn size(&self) -> usize;
}

/// Why a subscription cannot start.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubscribeError {
    #[error(
        "sequence {from} is no longer kept (oldest kept: {oldest}); list the pods and watch anew"
    )]
    TooOld { from: u64, oldest: u64 },
    #[error("sequence {from} is ahead of the stream (next: {next}); list the pods and watch anew")]
    Ahead { from: u64, next: u64 },
}

/// Why a subscription ended.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Ended {
    #[error("lagged: more than {queue} events behind; resume from the last sequence received + 1")]
    Lagged { queue: usize },
    #[error("the event bus is closed")]
    Closed,
}

/// Fan-out of events to subscribers, with history for resuming. Cheap to clone.
pub struct EventBus<T> {
    inner: Arc<Mutex<Inner<T>>>,
    run_id: u64,
    queue: usize,
    /// True once closed: the publisher is done.
    closed: watch::Sender<bool>,
}

impl<T> Clone for EventBus<T> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
            run_id: self.run_id,
            queue: self.queue,
            closed: self.closed.clone(),
        }
    }
}

impl<T> std::fmt::Debug for EventBus<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let inner = lock(&self.inner);
        f.debug_struct("EventBus")
            .field("run_id", &self.run_id)
            .field("last", &inner.last)
            .field("history", &inner.history.len())
            .field("subscribers", &inner.subscribers.len())
            .finish()
    }
}

struct Inner<T> {
    history: VecDeque<Arc<T>>,
    capacity: usize,
    /// The history's events' sizes, summed.
    bytes: usize,
    /// The most `bytes` may reach (but for the newest event alone).
    max_bytes: usize,
    /// Counts the events the byte budget dropped before the history held `capacity` of them.
    byte_evictions: Counter,
    /// Counts the subscribers ended as lagged, by kind.
    lagged: Family<LaggedLabel, Counter>,
    /// Sequence of the last published event (0: none).
    last: u64,
    subscribers: Vec<Slot<T>>,
    next_id: u64,
    closed: bool,
}

struct Slot<T> {
    id: u64,
    tx: mpsc::Sender<Arc<T>>,
    lagged: Arc<AtomicBool>,
    /// One of the daemon's own consumers (stdout, the sync loop), not a watcher.
    internal: bool,
}

impl<T: Sequenced> EventBus<T> {
    /// A bus keeping `history` events (at least one) and `queue` (at least one) per subscriber.
    pub fn new(run_id: u64, history: usize, queue: usize) -> Self {
        Self {
            inner: Arc::new(Mutex::new(Inner {
                history: VecDeque::with_capacity(history.clamp(1, 1 << 16)),
                capacity: history.max(1),
                bytes: 0,
                max_bytes: DEFAULT_EVENT_HISTORY_BYTES,
                byte_evictions: Counter::default(),
                lagged: Family::default(),
                last: 0,
                subscribers: Vec::new(),
                next_id: 0,
                closed: false,
            })),
            run_id,
            queue: queue.max(1),
            closed: watch::Sender::new(false),
        }
    }

    /// [`EventBus::new`] continuing a run saved at a clean shutdown: `kept` (in order) are
    /// resumable, and the next event published is `last` + 1.
    pub fn resumed(
        run_id: u64,
        history: usize,
        queue: usize,
        last: u64,
        kept: Vec<Arc<T>>,
    ) -> Self {
        let bus = Self::new(run_id, history, queue);
        {
            let mut inner = bus.lock();
            inner.last = last;
            let skip = kept.len().saturating_sub(inner.capacity);
            for event in kept.into_iter().skip(skip) {
                inner.keep(event);
            }
        }
        bus
    }

    /// Keeps no more than `bytes` of events in the history too (at least the newest, whatever
    /// its size), counting each event this drops before the history holds its number of
    /// events on `evictions`.
    #[must_use]
    pub fn with_history_bytes(self, bytes: usize, evictions: Counter) -> Self {
        {
            let mut inner = self.lock();
            inner.max_bytes = bytes;
            inner.byte_evictions = evictions;
            inner.evict();
        }
        self
    }

    /// Counts each subscriber ended as lagged on `lagged`, by kind (`watcher`, or `internal`:
    /// stdout, the sync loop, the OTLP export, which catch up from the history).
    #[must_use]
    pub fn counting_lagged(self, lagged: Family<LaggedLabel, Counter>) -> Self {
        self.lock().lagged = lagged;
        self
    }

    /// The kept events, oldest first.
    pub fn history(&self) -> Vec<Arc<T>> {
        self.lock().history.iter().cloned().collect()
    }

    /// Identifies this daemon run: sequences restart at 1 in every run, unless it continues a
    /// saved one.
    pub fn run_id(&self) -> u64 {
        self.run_id
    }

    /// Sequence of the last published event (0: none yet).
    pub fn last_sequence(&self) -> u64 {
        self.lock().last
    }

    /// Number of live watchers (subscribers made with [`EventBus::subscribe`]; the daemon's
    /// own consumers are not counted).
    pub fn subscriber_count(&self) -> usize {
        self.lock()
            .subscribers
            .iter()
            .filter(|s| !s.internal)
            .count()
    }

    /// Keeps `event` and hands it to every subscriber; never blocks. Subscribers whose queue is
    /// full are ended as lagged.
    pub fn publish(&self, event: Arc<T>) {
        let mut inner = self.lock();
        let sequence = event.sequence();
        if sequence <= inner.last {
            warn!(
                sequence,
                last = inner.last,
                "event out of order; not published"
            );
            return;
        }
        inner.last = sequence;
        inner.keep(Arc::clone(&event));
        let Inner {
            subscribers,
            lagged,
            ..
        } = &mut *inner;
        subscribers.retain(|slot| match slot.tx.try_send(Arc::clone(&event)) {
            Ok(()) => true,
            Err(TrySendError::Full(_)) => {
                warn!(
                    subscriber = slot.id,
                    queue = slot.tx.max_capacity(),
                    "a subscriber fell behind; ending it as lagged"
                );
                slot.lagged.store(true, Ordering::Release);
                let kind = if slot.internal { "internal" } else { "watcher" };
                lagged.get_or_create(&LaggedLabel { kind }).inc();
                false
            }
            Err(TrySendError::Closed(_)) => false,
        });
    }

    /// Subscribes a watcher from sequence `from` (0: live events only); see the module docs.
    pub fn subscribe(&self, from: u64) -> Result<Subscription<T>, SubscribeError> {
        self.add_subscriber(from, self.queue, false)
    }

    /// Subscribes one of the daemon's own consumers, with a queue of its own length (at least
    /// one) and a lag policy of its own; not counted as a watcher.
    pub fn consume(&self, from: u64, queue: usize) -> Result<Subscription<T>, SubscribeError> {
        self.add_subscriber(from, queue, true)
    }

    fn add_subscriber(
        &self,
        from: u64,
        queue: usize,
        internal: bool,
    ) -> Result<Subscription<T>, SubscribeError> {
        let queue = queue.max(1);
        let mut inner = self.lock();
        let next = inner.last + 1;
        let oldest = inner.history.front().map_or(next, |e| e.sequence());
        let backlog: VecDeque<Arc<T>> = match from {
            0 => VecDeque::new(),
            from if from > next => return Err(SubscribeError::Ahead { from, next }),
            from if from < oldest => return Err(SubscribeError::TooOld { from, oldest }),
            from => {
                let start = inner.history.partition_point(|e| e.sequence() < from);
                inner.history.range(start..).cloned().collect()
            }
        };
        let start = if from == 0 { next } else { from };
        let (tx, rx) = mpsc::channel(queue);
        let lagged = Arc::new(AtomicBool::new(false));
        let id = inner.next_id;
        inner.next_id += 1;
        if !inner.closed {
            inner.subscribers.push(Slot {
                id,
                tx,
                lagged: Arc::clone(&lagged),
                internal,
            });
        }
        Ok(Subscription {
            backlog,
            rx,
            lagged,
            queue,
            start,
            id,
            bus: Arc::clone(&self.inner),
        })
    }

    /// Ends every subscription (after what is queued) and refuses new live ones: the
    /// publisher is done.
    pub fn close(&self) {
        let mut inner = self.lock();
        inner.closed = true;
        inner.subscribers.clear();
        self.closed.send_replace(true);
    }

    /// Resolves once the bus is closed.
    pub async fn closed(&self) {
        let mut closed = self.closed.subscribe();
        // The sender lives in `self`: wait_for cannot fail while we hold it.
        let _ = closed.wait_for(|closed| *closed).await;
    }

    fn lock(&self) -> MutexGuard<'_, Inner<T>> {
        lock(&self.inner)
    }
}

impl<T: Sequenced> Inner<T> {
    /// Adds `event` to the history, dropping the oldest past either bound.
    fn keep(&mut self, event: Arc<T>) {
        self.bytes += event.size();
        self.history.push_back(event);
        self.evict();
    }

    fn evict(&mut self) {
        while self.history.len() > self.capacity
            || (self.bytes > self.max_bytes && self.history.len() > 1)
        {
            let by_bytes = self.history.len() <= self.capacity;
            let Some(oldest) = self.history.pop_front() else {
                return;
            };
            self.bytes -= oldest.size();
            if by_bytes {
                self.byte_evictions.inc();
            }
        }
    }
}

fn lock<T>(inner: &Mutex<Inner<T>>) -> MutexGuard<'_, Inner<T>> {
    // Plain collections updated in single statements: a poisoned lock is still consistent.
    inner.lock().unwrap_or_else(|p| p.into_inner())
}

impl<T: Sequenced> EventBus<T> {
    /// Follows the events from sequence `from` (at least 1) for one of the daemon's own
    /// consumers that keeps its place: a [`Follower`], which catches up from the history
    /// whenever it lags a whole `queue` behind.
    pub fn follow(&self, from: u64, queue: usize) -> Follower<T> {
        let (events, skipped) = self.consume_from(from.max(1), queue);
        Follower {
            bus: self.clone(),
            next: events.start(),
            events,
            skipped,
        }
    }

    /// A subscription from `from`, or from the oldest kept event if `from` is no longer kept
    /// (what it passes over: `from..start`), or from the next one if `from` is ahead.
    fn consume_from(&self, mut from: u64, queue: usize) -> (Subscription<T>, Option<Skipped>) {
        let wanted = from;
        loop {
            match self.consume(from, queue) {
                Ok(events) => {
                    let skipped = (events.start() > wanted).then_some(Skipped {
                        from: wanted,
                        to: events.start(),
                    });
                    return (events, skipped);
                }
                // The history moves on only as events are published: this ends.
                Err(SubscribeError::TooOld { oldest, .. }) => from = oldest,
                Err(SubscribeError::Ahead { next, .. }) => from = next,
            }
        }
    }
}

/// Events a [`Follower`] passed over: `from..to` were no longer kept when it came for them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Skipped {
    pub from: u64,
    pub to: u64,
}

impl Skipped {
    pub fn count(&self) -> u64 {
        self.to - self.from
    }
}

/// What a [`Follower`] reads.
#[derive(Debug)]
pub enum Followed<T> {
    Event(Arc<T>),
    Skipped(Skipped),
}

/// A consumer's place in the events that lagging does not lose: it reads like a
/// [`Subscription`], and after a lag resumes from the history at the event after the last it
/// read; only what the history no longer holds is lost, and said ([`Followed::Skipped`]).
/// Memory stays the bus's: the history, shared, and one queue.
pub struct Follower<T> {
    bus: EventBus<T>,
    events: Subscription<T>,
    /// The sequence of the next event to read: where a lag resumes.
    next: u64,
    skipped: Option<Skipped>,
}

impl<T: Sequenced> Follower<T> {
    /// The next event or skip; `None` once the bus is closed and every event read.
    /// Cancel-safe: a `next` dropped before it returned has consumed nothing.
    pub async fn next(&mut self) -> Option<Followed<T>> {
        loop {
            if let Some(skipped) = self.skipped.take() {
                return Some(Followed::Skipped(skipped));
            }
            match self.events.next().await {
                Ok(event) => {
                    self.next = event.sequence() + 1;
                    return Some(Followed::Event(event));
                }
                Err(Ended::Lagged { queue }) => {
                    (self.events, self.skipped) = self.bus.consume_from(self.next, queue);
                }
                Err(Ended::Closed) => return None,
            }
        }
    }

    /// The sequence of the next event it reads.
    pub fn next_sequence(&self) -> u64 {
        self.next
    }

    /// The run whose events it reads ([`EventBus::run_id`]).
    pub fn run_id(&self) -> u64 {
        self.bus.run_id()
    }
}

impl<T> std::fmt::Debug for Follower<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Follower")
            .field("next", &self.next)
            .field("skipped", &self.skipped)
            .finish_non_exhaustive()
    }
}

/// One subscriber's view: its backlog from the history, then live events.
pub struct Subscription<T> {
    backlog: VecDeque<Arc<T>>,
    rx: mpsc::Receiver<Arc<T>>,
    lagged: Arc<AtomicBool>,
    queue: usize,
    start: u64,
    id: u64,
    bus: Arc<Mutex<Inner<T>>>,
}

impl<T> Subscription<T> {
    /// The sequence of the first event this subscription delivers: where a client that lags
    /// or disconnects before reading anything resumes.
    pub fn start(&self) -> u64 {
        self.start
    }

    /// The length of its queue.
    pub fn queue(&self) -> usize {
        self.queue
    }

    /// The next event, or why there are no more.
    pub async fn next(&mut self) -> Result<Arc<T>, Ended> {
        if let Some(event) = self.backlog.pop_front() {
            return Ok(event);
        }
        // Checked first: once lagged, what is still queued is dropped.
        if self.lagged.load(Ordering::Acquire) {
            return Err(Ended::Lagged { queue: self.queue });
        }
        match self.rx.recv().await {
            Some(event) => Ok(event),
            None if self.lagged.load(Ordering::Acquire) => Err(Ended::Lagged { queue: self.queue }),
            None => Err(Ended::Closed),
        }
    }
}

impl<T> Drop for Subscription<T> {
    fn drop(&mut self) {
        let id = self.id;
        lock(&self.bus).subscribers.retain(|slot| slot.id != id);
    }
}

impl<T> std::fmt::Debug for Subscription<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscription")
            .field("id", &self.id)
            .field("backlog", &self.backlog.len())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[derive(Debug, PartialEq, Eq)]
    struct E(u64);

    impl Sequenced for E {
        fn sequence(&self) -> u64 {
            self.0
        }

        fn size(&self) -> usize {
            100
        }
    }

    fn publish(bus: &EventBus<E>, range: std::ops::RangeInclusive<u64>) {
        for s in range {
            bus.publish(Arc::new(E(s)));
        }
    }

    async fn take(sub: &mut Subscription<E>, n: usize) -> Vec<u64> {
        let mut got = Vec::new();
        for _ in 0..n {
            let e = tokio::time::timeout(Duration::from_secs(1), sub.next())
                .await
                .expect("event in time")
                .expect("subscription alive");
            got.push(e.0);
        }
        got
    }

    #[tokio::test]
    async fn resume_gets_exactly_the_missed_events_then_live_ones() {
        let bus = EventBus::new(7, 100, 16);
        publish(&bus, 1..=5);
        let mut sub = bus.subscribe(3).unwrap();
        publish(&bus, 6..=7);
        assert_eq!(take(&mut sub, 5).await, [3, 4, 5, 6, 7]);
        // Resuming at the next sequence: nothing missed, live only.
        let mut next = bus.subscribe(8).unwrap();
        publish(&bus, 8..=8);
        assert_eq!(take(&mut next, 1).await, [8]);
        assert_eq!(take(&mut sub, 1).await, [8]);
        assert_eq!(bus.run_id(), 7);
        assert_eq!(bus.last_sequence(), 8);
    }

    #[tokio::test]
    async fn zero_means_live_only() {
        let bus = EventBus::new(1, 100, 16);
        publish(&bus, 1..=3);
        let mut sub = bus.subscribe(0).unwrap();
        assert_eq!(sub.start(), 4);
        publish(&bus, 4..=4);
        assert_eq!(take(&mut sub, 1).await, [4]);
        assert_eq!(bus.subscribe(2).unwrap().start(), 2);
    }

    #[tokio::test]
    async fn a_consumer_with_its_own_queue_lags_on_its_own_and_is_no_watcher() {
        let bus = EventBus::new(1, 100, 2);
        let mut roomy = bus.consume(0, 10).unwrap();
        let mut tight = bus.subscribe(0).unwrap();
        assert_eq!(bus.subscriber_count(), 1);
        publish(&bus, 1..=5);
        assert_eq!(take(&mut roomy, 5).await, [1, 2, 3, 4, 5]);
        assert_eq!(tight.next().await.unwrap_err(), Ended::Lagged { queue: 2 });
    }

    #[test]
    fn too_old_or_ahead_is_out_of_range() {
        let bus = EventBus::new(1, 3, 16);
        // Nothing published: only 1 (the next) is valid.
        assert!(bus.subscribe(1).is_ok());
        assert_eq!(
            bus.subscribe(2).unwrap_err(),
            SubscribeError::Ahead { from: 2, next: 1 }
        );
        publish(&bus, 1..=10);
        assert_eq!(
            bus.subscribe(7).unwrap_err(),
            SubscribeError::TooOld { from: 7, oldest: 8 }
        );
        assert!(bus.subscribe(8).is_ok());
        assert!(bus.subscribe(11).is_ok());
        assert_eq!(
            bus.subscribe(12).unwrap_err(),
            SubscribeError::Ahead { from: 12, next: 11 }
        );
    }

    #[tokio::test]
    async fn a_subscriber_that_stops_reading_is_ended_as_lagged_while_another_keeps_up() {
        let bus = EventBus::new(1, 1000, 4);
        let mut slow = bus.subscribe(0).unwrap();
        let mut fast = bus.subscribe(0).unwrap();
        let mut seen = Vec::new();
        for s in 1..=20 {
            publish(&bus, s..=s);
            seen.extend(take(&mut fast, 1).await);
        }
        assert_eq!(seen, (1..=20).collect::<Vec<_>>());
        assert_eq!(bus.subscriber_count(), 1);
        assert_eq!(slow.next().await.unwrap_err(), Ended::Lagged { queue: 4 });
        // The lagged one can resume from the history.
        let mut resumed = bus.subscribe(1).unwrap();
        assert_eq!(take(&mut resumed, 20).await.len(), 20);
    }

    #[tokio::test]
    async fn each_subscriber_ended_as_lagged_is_counted_by_kind() {
        let lagged = Family::<LaggedLabel, Counter>::default();
        let bus = EventBus::new(1, 50, 2).counting_lagged(lagged.clone());
        let _watcher = bus.subscribe(0).unwrap();
        let _internal = bus.consume(0, 4).unwrap();
        publish(&bus, 1..=10);
        let count = |kind| lagged.get_or_create(&LaggedLabel { kind }).get();
        assert_eq!((count("watcher"), count("internal")), (1, 1));
    }

    #[tokio::test]
    async fn memory_stays_bounded() {
        let bus = EventBus::new(1, 50, 8);
        let _stalled = bus.subscribe(0).unwrap();
        publish(&bus, 1..=10_000);
        let inner = bus.lock();
        assert_eq!(inner.history.len(), 50);
        assert_eq!(inner.history.front().unwrap().0, 9_951);
        assert!(inner.subscribers.is_empty(), "the stalled one was dropped");
    }

    #[tokio::test]
    async fn the_history_stays_within_its_bytes_too_counting_what_that_drops() {
        let evictions = Counter::default();
        let bus = EventBus::new(1, 50, 8).with_history_bytes(1_000, evictions.clone());
        publish(&bus, 1..=30);
        let history: Vec<u64> = bus.history().iter().map(|e| e.0).collect();
        assert_eq!(history, (21..=30).collect::<Vec<_>>(), "ten of 100 bytes");
        assert_eq!(bus.lock().bytes, 1_000);
        assert_eq!(evictions.get(), 20);
        assert!(matches!(
            bus.subscribe(20),
            Err(SubscribeError::TooOld { oldest: 21, .. })
        ));

        // The number of events binds first: not counted as the bytes' doing.
        let by_number = Counter::default();
        let bus = EventBus::new(1, 5, 8).with_history_bytes(1_000, by_number.clone());
        publish(&bus, 1..=30);
        assert_eq!(bus.history().len(), 5);
        assert_eq!(by_number.get(), 0);

        // An event larger than the whole budget is still kept, alone.
        let tiny = EventBus::new(1, 50, 8).with_history_bytes(10, Counter::default());
        publish(&tiny, 1..=3);
        assert_eq!(tiny.history().len(), 1);
        assert_eq!(tiny.history()[0].0, 3);

        // A resumed history is held to the budget given after.
        let saved = (1..=20).map(|e| Arc::new(E(e))).collect();
        let resumed =
            EventBus::resumed(1, 50, 8, 20, saved).with_history_bytes(500, Counter::default());
        assert_eq!(resumed.history().first().map(|e| e.0), Some(16));
        assert_eq!(resumed.lock().bytes, 500);
    }

    #[tokio::test]
    async fn dropping_or_closing_ends_subscriptions() {
        let bus = EventBus::new(1, 10, 8);
        let sub = bus.subscribe(0).unwrap();
        assert_eq!(bus.subscriber_count(), 1);
        drop(sub);
        assert_eq!(bus.subscriber_count(), 0);
        let mut sub = bus.subscribe(0).unwrap();
        publish(&bus, 1..=1);
        bus.close();
        bus.closed().await;
        assert_eq!(take(&mut sub, 1).await, [1]);
        assert_eq!(sub.next().await.unwrap_err(), Ended::Closed);
    }

    #[tokio::test]
    async fn a_resumed_bus_serves_the_saved_history_and_continues_its_sequence() {
        let bus = EventBus::new(9, 3, 8);
        publish(&bus, 1..=5);
        let resumed = EventBus::resumed(bus.run_id(), 3, 8, bus.last_sequence(), bus.history());
        assert_eq!((resumed.run_id(), resumed.last_sequence()), (9, 5));
        let mut sub = resumed.subscribe(3).unwrap();
        publish(&resumed, 6..=6);
        assert_eq!(take(&mut sub, 4).await, [3, 4, 5, 6]);
        assert!(resumed.subscribe(2).is_err());
        // A smaller history keeps the newest.
        let small = EventBus::resumed(9, 1, 8, 5, vec![Arc::new(E(4)), Arc::new(E(5))]);
        assert_eq!(small.history().len(), 1);
        assert_eq!(small.history()[0].0, 5);
    }

    async fn follow(follower: &mut Follower<E>) -> Vec<String> {
        let mut read = Vec::new();
        while let Some(followed) = follower.next().await {
            read.push(match followed {
                Followed::Event(e) => e.0.to_string(),
                Followed::Skipped(s) => format!("skipped {}..{}", s.from, s.to),
            });
        }
        read
    }

    #[tokio::test]
    async fn a_follower_that_lags_catches_up_from_the_history() {
        let bus = EventBus::new(1, 100, 8);
        let mut follower = bus.follow(1, 2);
        // Never read meanwhile: its queue of 2 overflows at once.
        publish(&bus, 1..=20);
        bus.close();
        let want: Vec<String> = (1..=20).map(|s| s.to_string()).collect();
        assert_eq!(follow(&mut follower).await, want);
        assert_eq!(follower.next_sequence(), 21);
    }

    #[tokio::test]
    async fn a_follower_past_the_history_says_what_it_skipped_and_goes_on_from_the_oldest() {
        let bus = EventBus::new(1, 5, 8);
        let mut follower = bus.follow(1, 2);
        publish(&bus, 1..=3);
        // 3 overflowed its queue: it resumes from the history, which still holds 1..=3.
        assert!(matches!(follower.next().await, Some(Followed::Event(e)) if e.0 == 1));
        // It lags again at 6; the history keeps 16..=20 by the time it comes back for 4.
        publish(&bus, 4..=20);
        bus.close();
        assert_eq!(
            follow(&mut follower).await,
            ["2", "3", "skipped 4..16", "16", "17", "18", "19", "20"]
        );
    }

    #[tokio::test]
    async fn following_from_a_sequence_no_longer_kept_or_ahead_starts_where_events_are() {
        let bus = EventBus::new(1, 5, 8);
        publish(&bus, 1..=10);
        let mut old = bus.follow(3, 8);
        let mut ahead = bus.follow(40, 8);
        publish(&bus, 11..=11);
        bus.close();
        assert_eq!(
            follow(&mut old).await,
            ["skipped 3..6", "6", "7", "8", "9", "10", "11"]
        );
        assert_eq!(follow(&mut ahead).await, ["11"]);
    }

    #[test]
    fn out_of_order_events_are_not_published() {
        let bus = EventBus::new(1, 10, 8);
        publish(&bus, 1..=3);
        publish(&bus, 2..=2);
        assert_eq!(bus.last_sequence(), 3);
        assert_eq!(bus.lock().history.len(), 3);
    }
}
