//! What the runtime's event streams (containerd `Events.Subscribe`, CRI `GetContainerEvents`)
//! share: reconnecting forever with backoff, reporting their state, and asking for a full
//! relist on every (re)connect, since neither stream replays what was missed while it was down.

use std::{
    future::Future,
    pin::pin,
    time::{Duration, SystemTime},
};

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tonic::{Code, Response, Status, Streaming};
use tracing::{debug, info, warn};

use crate::{
    base::backoff::{Backoff, Exponential, time_seed},
    pleg::{RuntimeError, Source, Trigger, TriggerSender},
    runtime::transport::{connect_unix, with_causes},
    sources::status::{SourceRegistry, SourceState},
};

/// Ceiling of the first randomised retry delay (the very first retry is immediate).
pub const BACKOFF_BASE: Duration = Duration::from_secs(1);
/// Longest wait between two connection attempts.
pub const BACKOFF_CAP: Duration = Duration::from_secs(60);
/// A connection that stayed up this long resets the backoff: its loss is a new incident.
pub const BACKOFF_RESET_AFTER: Duration = Duration::from_secs(30);

/// How long a stream call may stay without an answer once the runtime has answered a probe on
/// the same connection before the stream counts as established. Go gRPC servers (containerd,
/// CRI-O) send a stream's headers with its first message, so an idle stream gives no other sign
/// of life; an `Unimplemented` answer comes well within this.
const STREAM_SETTLE: Duration = Duration::from_millis(100);

/// The reconnect policy: the first retry is immediate, the n-th waits a random time up to
/// `BACKOFF_BASE * 2^(n-2)`, capped at [`BACKOFF_CAP`].
fn reconnect_backoff(seed: u64) -> Backoff {
    Backoff::new(Exponential::doubling(BACKOFF_BASE, BACKOFF_CAP))
        .immediate_first()
        .full_jitter(seed)
}

/// The wait before reconnecting, after an attempt whose connection stayed up for
/// `connected_for` (`None`: it never connected). A connection that stayed up
/// [`BACKOFF_RESET_AFTER`] starts a new incident.
fn next_delay(backoff: &mut Backoff, connected_for: Option<Duration>) -> Duration {
    if connected_for.is_some_and(|up| up >= BACKOFF_RESET_AFTER) {
        backoff.reset();
    }
    backoff.next_delay()
}

/// How one connection of a stream source ended.
#[derive(Debug)]
pub(crate) enum SessionEnd {
    /// The runtime does not offer the stream: stop trying.
    Unsupported(Unimplemented),
    /// The connection failed or broke. `connected_at`: when it was established, if it was.
    Lost {
        error: SessionError,
        connected_at: Option<Instant>,
    },
}

/// The runtime answered the stream call with `Unimplemented`.
#[derive(Debug, thiserror::Error)]
#[error("the runtime does not implement it ({})", status_text(.0))]
pub(crate) struct Unimplemented(#[source] Status);

/// Why a session was lost.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SessionError {
    #[error(transparent)]
    Dial(RuntimeError),
    /// The stream or the probe call failed; shown as `Code: message`, with the transport's
    /// cause when tonic hides one.
    #[error("{}", status_text(.0))]
    Call(#[source] Status),
    #[error("runtime did not answer within {0:?}")]
    ProbeTimeout(Duration),
    #[error("the runtime ended the stream")]
    StreamEnded,
    /// Connected, but a heartbeat published through the runtime did not come back on it.
    #[error("no heartbeat came back on the stream within {0:?}: declared silent")]
    Silent(Duration),
}

/// What a session reports through: the source's registry entry and the trigger channel.
#[derive(Clone, Debug)]
pub(crate) struct Link {
    pub source: Source,
    pub registry: SourceRegistry,
    pub triggers: TriggerSender,
    /// Deadline of connecting and of the probe call.
    pub timeout: Duration,
}

impl Link {
    /// The stream is up: report it, and relist everything, since what happened while it was
    /// down is not replayed.
    fn connected(&self) -> Instant {
        info!(source = ?self.source, "event stream connected; scheduling a full relist");
        self.registry.set(self.source, SourceState::Connected, "");
        self.triggers.request_full_relist();
        Instant::now()
    }

    fn deliver(&self, trigger: Trigger) {
        self.registry.delivered(self.source, SystemTime::now());
        self.triggers.send(trigger);
    }
}

impl SessionError {
    /// The runtime did not answer at all: its socket refused the connection or it did not
    /// answer the probe.
    fn runtime_down(&self) -> bool {
        matches!(self, Self::Dial(_) | Self::ProbeTimeout(_))
    }
}

/// Runs `session` again and again, with [`Backoff`] between attempts (cut short once the
/// runtime answers a relist, if it was down), until the source is unsupported or `shutdown`.
pub(crate) async fn run_forever<F, Fut>(link: Link, shutdown: CancellationToken, mut session: F)
where
    F: FnMut(Link) -> Fut,
    Fut: Future<Output = SessionEnd>,
{
    link.registry
        .set(link.source, SourceState::Connecting, "starting");
    let mut backoff = reconnect_backoff(time_seed());
    // Warn once per outage, not once per failed attempt.
    let mut outage_reported = false;
    loop {
        let end = tokio::select! {
            () = shutdown.cancelled() => return,
            end = session(link.clone()) => end,
        };
        match end {
            SessionEnd::Unsupported(why) => {
                info!(source = ?link.source, "{why}; this source stays off");
                link.registry
                    .set(link.source, SourceState::Unsupported, why.to_string());
                return;
            }
            SessionEnd::Lost {
                error,
                connected_at,
            } => {
                if matches!(error, SessionError::Silent(_)) {
                    link.registry.silent(link.source);
                }
                let lost_at = Instant::now();
                let runtime_down = error.runtime_down();
                let connected_for = connected_at.map(|at| at.elapsed());
                if connected_for.is_some() {
                    outage_reported = false;
                }
                let delay = next_delay(&mut backoff, connected_for);
                if outage_reported {
                    debug!(source = ?link.source, %error, ?delay, "event stream still down");
                } else {
                    warn!(source = ?link.source, %error, ?delay, "event stream lost; reconnecting");
                    outage_reported = true;
                }
                link.registry
                    .set(link.source, SourceState::Reconnecting, error.to_string());
                // A runtime that did not answer (a restart, an upgrade) is tried again as soon
                // as a relist reads it, rather than after a backoff that grows to a minute
                // over a long outage while the relists poll; one that answered and refused
                // the stream waits out the backoff.
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    () = tokio::time::sleep(delay) => {}
                    () = link.triggers.runtime_answered_since(lost_at), if runtime_down => {
                        debug!(source = ?link.source, "the runtime answers a relist again; reconnecting now");
                    }
                }
            }
        }
    }
}

/// One connection's life: opens the stream `call` (with `probe`, a unary call on the same
/// connection, proving the runtime answers while the stream's headers may still be pending),
/// reports it connected, and hands each message's trigger to the generator until the stream
/// ends, or until `silence` (polled only once connected) says it delivers no more.
/// `to_trigger` returns `Err` for a message it could not read: a sign of loss.
pub(crate) async fn stream_session<T, C, P, S, E>(
    link: &Link,
    call: C,
    probe: P,
    silence: S,
    mut to_trigger: impl FnMut(T) -> Result<Option<Trigger>, E>,
) -> SessionEnd
where
    C: Future<Output = Result<Response<Streaming<T>>, Status>>,
    P: Future<Output = Result<(), Status>>,
    S: Future<Output = SessionError>,
    E: std::fmt::Display,
{
    let mut call = pin!(call);
    // Polled only once the stream is up: its first poll starts its clock.
    let mut silence = pin!(silence);
    let mut connected_at = None;
    let lost = |error: SessionError, connected_at| SessionEnd::Lost {
        error,
        connected_at,
    };
    // Polled first so the stream request goes out before the probe.
    let answered = tokio::select! {
        biased;
        answer = &mut call => Some(answer),
        probed = tokio::time::timeout(link.timeout, probe) => match probed {
            Ok(Ok(())) => None,
            Ok(Err(status)) => return lost(SessionError::Call(status), None),
            Err(_) => return lost(SessionError::ProbeTimeout(link.timeout), None),
        },
    };
    let answer = match answered {
        Some(answer) => answer,
        None => tokio::select! {
            answer = &mut call => answer,
            () = tokio::time::sleep(STREAM_SETTLE) => {
                connected_at = Some(link.connected());
                // The headers come with the first message: the stream is up, and may already
                // be silent.
                tokio::select! {
                    answer = &mut call => answer,
                    error = &mut silence => return lost(error, connected_at),
                }
            }
        },
    };
    let mut stream = match answer {
        Ok(response) => response.into_inner(),
        Err(status) if status.code() == Code::Unimplemented => {
            return SessionEnd::Unsupported(Unimplemented(status));
        }
        Err(status) => return lost(SessionError::Call(status), connected_at),
    };
    if connected_at.is_none() {
        connected_at = Some(link.connected());
    }
    loop {
        let message = tokio::select! {
            message = stream.message() => message,
            error = &mut silence => return lost(error, connected_at),
        };
        match message {
            Ok(Some(message)) => match to_trigger(message) {
                Ok(Some(trigger)) => link.deliver(trigger),
                Ok(None) => {}
                Err(error) => {
                    warn!(source = ?link.source, %error, "unreadable event; scheduling a full relist");
                    link.triggers.request_full_relist();
                }
            },
            Ok(None) => return lost(SessionError::StreamEnded, connected_at),
            Err(status) => return lost(SessionError::Call(status), connected_at),
        }
    }
}

/// Dials the runtime for a session; a failure ends the session as lost.
pub(crate) async fn dial(
    socket: &std::path::Path,
    timeout: Duration,
) -> Result<tonic::transport::Channel, SessionEnd> {
    connect_unix(socket, timeout)
        .await
        .map_err(|error| SessionEnd::Lost {
            error: SessionError::Dial(error),
            connected_at: None,
        })
}

/// A status as `Code: message`, with the transport's cause when it hides one.
fn status_text(status: &Status) -> String {
    with_causes(format!("{:?}: {}", status.code(), status.message()), status)
}

#[cfg(test)]
mod tests {
    use tokio::sync::mpsc;

    use super::*;
    use crate::pleg::testing::{TriggerReceiver, trigger_channel};

    // The schedule and the jitter are tested with `Backoff`; here, what reconnecting adds.
    #[test]
    fn a_stable_connection_resets_the_backoff_a_short_one_does_not() {
        let mut b = reconnect_backoff(42);
        assert_eq!(next_delay(&mut b, None), Duration::ZERO);
        for _ in 0..7 {
            next_delay(&mut b, None);
        }
        // Up for a moment only: keeps backing off (the first retry of an incident is at once).
        assert_ne!(
            next_delay(&mut b, Some(Duration::from_secs(1))),
            Duration::ZERO
        );
        assert_eq!(
            next_delay(&mut b, Some(BACKOFF_RESET_AFTER)),
            Duration::ZERO
        );
        assert!(next_delay(&mut b, None) < BACKOFF_BASE);
    }

    /// Runs a source whose every session ends lost by `error`, and hands back when each
    /// attempt began.
    fn failing_source(
        error: fn() -> SessionError,
    ) -> (
        TriggerReceiver,
        mpsc::UnboundedReceiver<Instant>,
        CancellationToken,
    ) {
        let (triggers, receiver) = trigger_channel();
        let link = Link {
            source: Source::Containerd,
            registry: SourceRegistry::new(),
            triggers,
            timeout: Duration::from_secs(1),
        };
        let (attempts, attempted) = mpsc::unbounded_channel();
        let shutdown = CancellationToken::new();
        tokio::spawn(run_forever(link, shutdown.clone(), move |_| {
            attempts.send(Instant::now()).expect("the test listens");
            let error = error();
            async move {
                SessionEnd::Lost {
                    error,
                    connected_at: None,
                }
            }
        }));
        (receiver, attempted, shutdown)
    }

    fn refused() -> SessionError {
        SessionError::Dial(RuntimeError::Timeout {
            endpoint: "containerd.sock".into(),
            call: "connect",
            timeout: Duration::from_secs(1),
        })
    }

    fn ended() -> SessionError {
        SessionError::StreamEnded
    }

    /// Lets `n` attempts fail: past the first few the backoff waits seconds.
    async fn fail_times(attempted: &mut mpsc::UnboundedReceiver<Instant>, n: usize) {
        for _ in 0..n {
            attempted.recv().await.expect("an attempt");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_runtime_that_was_down_is_tried_again_once_a_relist_reads_it() {
        let (relists, mut attempted, shutdown) = failing_source(refused);
        fail_times(&mut attempted, 6).await;
        let lost_at = Instant::now();
        // A relist that began before the loss says nothing of the runtime since.
        relists.runtime_answered(lost_at - Duration::from_millis(1));
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert!(attempted.try_recv().is_err(), "woken by an old answer");
        let answered_at = Instant::now();
        relists.runtime_answered(answered_at);
        let next = attempted.recv().await.expect("an attempt");
        assert_eq!(next, answered_at, "the backoff was waited out");
        shutdown.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn a_runtime_that_answered_and_ended_the_stream_waits_out_the_backoff() {
        let (relists, mut attempted, shutdown) = failing_source(ended);
        fail_times(&mut attempted, 6).await;
        tokio::time::sleep(Duration::from_millis(1)).await;
        let answered_at = Instant::now();
        relists.runtime_answered(answered_at);
        let next = attempted.recv().await.expect("an attempt");
        assert!(next > answered_at, "woken by the relist");
        shutdown.cancel();
    }
}
