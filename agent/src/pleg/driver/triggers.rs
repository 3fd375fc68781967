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

/// The receiving half, owned by the generator.
#[derive(Debug)]
pub struct TriggerReceiver {
    pub(super) triggers: mpsc::Receiver<Trigger>,
    pub(super) full_relist: Arc<tokio::sync::Notify>,
    pub(super) notices: Option<Notices>,
    answered: watch::Sender<Option<Instant>>,
}

impl TriggerReceiver {
    /// The next trigger, for driving a source without a generator (tests, tools).
    #[cfg(any(test, feature = "testing"))]
    pub async fn recv(&mut self) -> Option<Trigger> {
        self.triggers.recv().await
    }

    /// Waits until a full relist is requested (at once if one is pending), for driving a
    /// source without a generator.
    #[cfg(any(test, feature = "testing"))]
    pub async fn full_relist_requested(&self) {
        self.full_relist.notified().await;
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
    (
        TriggerSender {
            triggers: tx,
            full_relist: Arc::clone(&full_relist),
            notices: notices.clone(),
            presence,
            answered,
        },
        TriggerReceiver {
            triggers: rx,
            full_relist,
            notices,
            answered: answered_tx,
        },
    )
}
