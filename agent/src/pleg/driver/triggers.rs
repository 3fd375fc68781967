//! The trigger channel: how every source hands its triggers to the generator. A source never
//! waits on it: when it is full, the trigger is dropped and a full relist asked for instead.

use std::sync::Arc;

use tokio::{
    sync::{mpsc, watch},
    time::Instant,
};
use tracing::debug;

use crate::pleg::{
    driver::sink::Notices,
    model::{
        event::NoticeKind,
        source::Source,
        trigger::{Scope, Trigger},
    },
};

/// Capacity of the trigger channel shared by every source. A full channel means the loop is
/// behind; sources then fall back to asking for a full relist (see [`TriggerSender`]).
pub const TRIGGER_CHANNEL_CAPACITY: usize = 4096;

/// How sources hand triggers to the generator. Never blocks a source: when the channel is
/// full, the trigger is dropped and a full relist is requested instead, so the change is still
/// found.
#[derive(Clone, Debug)]
pub struct TriggerSender {
    triggers: mpsc::Sender<Trigger>,
    full_relist: Arc<tokio::sync::Notify>,
    notices: Option<Notices>,
    /// Whether a container's presence alone is news (`--emit-changed`: a created container's
    /// `ContainerChanged`).
    presence: bool,
    /// Start of the last relist that read the runtime ([`TriggerReceiver::runtime_answered`]).
    answered: watch::Receiver<Option<Instant>>,
    /// The generator's asks to catch up ([`TriggerSender::answer_catch_ups`]).
    catch_up_asked: watch::Receiver<u64>,
    catch_up_done: Arc<watch::Sender<Option<u64>>>,
}

impl TriggerSender {
    /// Hands a trigger to the generator; a kernel trigger's observations are told as a
    /// notice first, ahead of any relist. A trigger that says only that containers
    /// exist is dropped unless presence is news: no event can come of it, and under churn
    /// such triggers are many (a cgroup made, containerd's `/containers/create` and
    /// `/tasks/create` for every container).
    pub fn send(&self, trigger: Trigger) {
        if !self.presence && trigger.only_presence() {
            return;
        }
        if let Some(notices) = &self.notices
            && trigger.source == Source::Ebpf
            && let Scope::Container(container) = &trigger.scope
        {
            notices.tell(
                NoticeKind::Ahead,
                container,
                &trigger.observations,
                trigger.observed_at,
            );
        }
        if self.triggers.try_send(trigger).is_err() {
            debug!("trigger channel full or closed: asking for a full relist instead");
            self.full_relist.notify_one();
        }
    }

    /// Asks for a full relist now (a source saw signs of loss: dropped kernel events, a stream
    /// reconnect).
    pub fn request_full_relist(&self) {
        self.full_relist.notify_one();
    }

    /// Makes the caller the source that catches up when the generator asks
    /// ([`TriggerReceiver::ask_catch_up`]): one that holds what it saw before handing it over
    /// (the kernel's ring), and can hand over at once everything it holds. One source at most;
    /// until the handle is dropped.
    pub fn answer_catch_ups(&self) -> CatchUps {
        let mut asked = self.catch_up_asked.clone();
        let now = *asked.borrow_and_update();
        self.catch_up_done.send_replace(Some(now));
        CatchUps {
            asked,
            done: Arc::clone(&self.catch_up_done),
        }
    }

    /// Returns once a relist that began after `since` has read the runtime: it answers
    /// again. Never, once the generator is gone.
    pub async fn runtime_answered_since(&self, since: Instant) {
        let mut answered = self.answered.clone();
        if answered
            .wait_for(|at| at.is_some_and(|at| at > since))
            .await
            .is_err()
        {
            std::future::pending::<()>().await;
        }
    }
}

/// A source's end of the generator's asks to catch up ([`TriggerSender::answer_catch_ups`]).
#[derive(Debug)]
pub struct CatchUps {
    asked: watch::Receiver<u64>,
    done: Arc<watch::Sender<Option<u64>>>,
}

impl CatchUps {
    /// The latest ask not answered yet, once there is one (never, once the generator is
    /// gone). Cancel safe.
    pub async fn asked(&mut self) -> u64 {
        if self.asked.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
        *self.asked.borrow_and_update()
    }

    /// Everything the source held when `ask` came is in the channel.
    pub fn caught_up(&self, ask: u64) {
        self.done.send_replace(Some(ask));
    }
}

impl Drop for CatchUps {
    fn drop(&mut self) {
        self.done.send_replace(None);
    }
}

/// The receiving half, owned by the generator.
#[derive(Debug)]
pub struct TriggerReceiver {
    pub(super) triggers: mpsc::Receiver<Trigger>,
    pub(super) full_relist: Arc<tokio::sync::Notify>,
    pub(super) notices: Option<Notices>,
    answered: watch::Sender<Option<Instant>>,
    catch_up_asked: watch::Sender<u64>,
    /// The last ask the catching-up source answered; `None` while no source answers.
    pub(super) catch_up_done: watch::Receiver<Option<u64>>,
}

impl TriggerReceiver {
    /// The next trigger, for driving a source without a generator (tests, tools).
    #[cfg(any(test, feature = "testing"))]
    pub async fn recv(&mut self) -> Option<Trigger> {
        self.triggers.recv().await
    }

    /// The next trigger if one is in the channel, for driving a source without a generator.
    #[cfg(any(test, feature = "testing"))]
    pub fn try_recv(&mut self) -> Option<Trigger> {
        self.triggers.try_recv().ok()
    }

    /// Waits until the source that catches up answered `ask` (or a later one), for driving a
    /// source without a generator.
    #[cfg(any(test, feature = "testing"))]
    pub async fn catch_up_answered(&mut self, ask: u64) {
        let answered = self
            .catch_up_done
            .wait_for(|done| done.is_some_and(|done| done >= ask))
            .await;
        assert!(answered.is_ok(), "the trigger senders are gone");
    }

    /// Waits until a full relist is requested (at once if one is pending), for driving a
    /// source without a generator.
    #[cfg(any(test, feature = "testing"))]
    pub async fn full_relist_requested(&self) {
        self.full_relist.notified().await;
    }

    /// Asks the source that holds what it saw (the kernel's ring) to hand it all over: the
    /// ask's number, answered in `catch_up_done` once every trigger of what it held is in the
    /// channel. `None` when no source answers such asks.
    pub fn ask_catch_up(&self) -> Option<u64> {
        self.catch_up_done.borrow().as_ref()?;
        let mut ask = 0;
        self.catch_up_asked.send_modify(|asked| {
            *asked += 1;
            ask = *asked;
        });
        Some(ask)
    }

    /// Resolves once ask `ask` is answered ([`Self::ask_catch_up`]), or no source answers any
    /// more: what the source held then is in the channel.
    pub fn caught_up(&self, ask: u64) -> impl Future<Output = ()> + Send + 'static {
        let mut done = self.catch_up_done.clone();
        async move {
            let _ = done
                .wait_for(|done| done.is_none_or(|done| done >= ask))
                .await;
        }
    }

    /// A relist that began at `started` read the runtime: a source that lost the runtime
    /// waits no longer to reach it again ([`TriggerSender::runtime_answered_since`]).
    pub fn runtime_answered(&self, started: Instant) {
        self.answered.send_replace(Some(started));
    }
}

/// A trigger channel for a source driven without a generator (tests, tools), passing every
/// trigger.
#[cfg(any(test, feature = "testing"))]
pub fn trigger_channel() -> (TriggerSender, TriggerReceiver) {
    observed_trigger_channel(None, true)
}

/// The trigger channel of the sources and the generator, whose kernel observations are also
/// told as `notices`, ahead of their relist (the generator tells those the runtime never
/// confirms); `presence`: whether triggers saying only that containers exist pass (see
/// [`TriggerSender::send`]).
pub fn observed_trigger_channel(
    notices: Option<Notices>,
    presence: bool,
) -> (TriggerSender, TriggerReceiver) {
    let (tx, rx) = mpsc::channel(TRIGGER_CHANNEL_CAPACITY);
    let full_relist = Arc::new(tokio::sync::Notify::new());
    let (answered_tx, answered) = watch::channel(None);
    let (asked_tx, asked) = watch::channel(0);
    let (done_tx, done) = watch::channel(None);
    (
        TriggerSender {
            triggers: tx,
            full_relist: Arc::clone(&full_relist),
            notices: notices.clone(),
            presence,
            answered,
            catch_up_asked: asked,
            catch_up_done: Arc::new(done_tx),
        },
        TriggerReceiver {
            triggers: rx,
            full_relist,
            notices,
            answered: answered_tx,
            catch_up_asked: asked_tx,
            catch_up_done: done,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn asks_to_catch_up_reach_the_one_source_that_answers_while_it_does() {
        let (sender, mut receiver) = trigger_channel();
        assert_eq!(receiver.ask_catch_up(), None, "no source answers yet");
        let mut catch_ups = sender.answer_catch_ups();
        // Two asks before the source looks: it answers the latest, which covers both.
        assert_eq!(receiver.ask_catch_up(), Some(1));
        assert_eq!(receiver.ask_catch_up(), Some(2));
        assert_eq!(catch_ups.asked().await, 2);
        catch_ups.caught_up(2);
        receiver.catch_up_answered(1).await;
        assert_eq!(*receiver.catch_up_done.borrow(), Some(2));
        // The source gone: nothing is asked, so nothing waits for an answer.
        drop(catch_ups);
        assert_eq!(receiver.ask_catch_up(), None);
    }
}
