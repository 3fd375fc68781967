//! systemd's readiness protocol (`sd_notify(3)`): one datagram of `KEY=VALUE` lines to the unix
//! socket `$NOTIFY_SOCKET` names, written with std (the protocol is one `sendto`; a crate would
//! add a dependency for it). Without `$NOTIFY_SOCKET` (not started by systemd with
//! `Type=notify`) every call does nothing.

use std::{
    ffi::{OsStr, OsString},
    os::unix::{ffi::OsStrExt as _, net::UnixDatagram},
    path::Path,
    sync::Arc,
    time::Duration,
};

use tokio::{sync::watch, time::Instant};
use tracing::{debug, warn};

use crate::pleg::Health;

/// The variable systemd sets for a `Type=notify` service.
pub const NOTIFY_SOCKET: &str = "NOTIFY_SOCKET";

/// The message once the first full relist succeeded: the cache holds the node's pods.
pub const READY: &str = "READY=1\nSTATUS=first full relist done; generating events\n";
/// The message when shutdown starts.
pub const STOPPING: &str = "STOPPING=1\nSTATUS=stopping\n";
/// The watchdog's keep-alive (`WatchdogSec=` in the unit).
pub const WATCHDOG: &str = "WATCHDOG=1\n";

/// The least time between two keep-alives: the generator loop may turn thousands of times a
/// second under churn, and systemd needs one per half `WatchdogSec=`.
pub const WATCHDOG_SPACING: Duration = Duration::from_secs(1);

/// Why a notification could not be sent.
#[derive(Debug, thiserror::Error)]
pub enum NotifyError {
    /// Only unix sockets (a path or `@abstract`) are supported, not `vsock:`.
    #[error("unsupported {NOTIFY_SOCKET} address {address:?}")]
    Unsupported { address: OsString },
    #[error("sending to {NOTIFY_SOCKET} {address:?}: {source}")]
    Send {
        address: OsString,
        #[source]
        source: std::io::Error,
    },
}

/// Sends `state` to `$NOTIFY_SOCKET`; `Ok(false)` when the variable is not set.
pub fn notify(state: &str) -> Result<bool, NotifyError> {
    match std::env::var_os(NOTIFY_SOCKET) {
        Some(address) if !address.is_empty() => notify_to(&address, state).map(|()| true),
        _ => Ok(false),
    }
}

/// Sends `state` as one datagram to `address`: a socket path, or `@name` for an abstract one.
pub fn notify_to(address: &OsStr, state: &str) -> Result<(), NotifyError> {
    let send_err = |source| NotifyError::Send {
        address: address.to_owned(),
        source,
    };
    let socket = UnixDatagram::unbound().map_err(send_err)?;
    let sent = match address.as_bytes() {
        [b'/', ..] => socket.send_to(state.as_bytes(), Path::new(address)),
        [b'@', name @ ..] => {
            use std::os::linux::net::SocketAddrExt as _;
            let to = std::os::unix::net::SocketAddr::from_abstract_name(name).map_err(send_err)?;
            socket.send_to_addr(state.as_bytes(), &to)
        }
        _ => {
            return Err(NotifyError::Unsupported {
                address: address.to_owned(),
            });
        }
    };
    sent.map(drop).map_err(send_err)
}

/// Tells systemd plegd is ready once `health` shows a successful full relist (at once if it
/// does already); a failure to tell is logged, systemd's start timeout then says the rest.
pub async fn ready_after_first_relist(health: Arc<Health>) {
    if std::env::var_os(NOTIFY_SOCKET).is_none() {
        return;
    }
    first_full_relist(&health).await;
    send(READY);
}

/// Keeps systemd's watchdog fed while the PLEG's generator loop turns (`turns`, the PLEG's
/// pulse: a turn at least every 10 s, whatever the runtime answers), one keep-alive per turn
/// and at most one per [`WATCHDOG_SPACING`]. A loop that stops turning stops the keep-alives,
/// and systemd restarts plegd after `WatchdogSec=`; a runtime that fails or hangs does not,
/// since failed relists are turns too. Returns when the loop ends.
pub async fn watchdog(turns: watch::Receiver<Instant>) {
    if std::env::var_os(NOTIFY_SOCKET).is_none() {
        return;
    }
    keep_alive(turns, || send(WATCHDOG)).await;
}

async fn keep_alive(mut turns: watch::Receiver<Instant>, mut ping: impl FnMut()) {
    while turns.changed().await.is_ok() {
        ping();
        tokio::time::sleep(WATCHDOG_SPACING).await;
    }
}

/// Returns once `health` has seen a full relist succeed.
async fn first_full_relist(health: &Health) {
    let mut successes = health.successes();
    // The sender lives in `health`, borrowed here: `changed` cannot fail.
    while health.check().is_err() && successes.changed().await.is_ok() {}
}

/// Sends `state` if systemd listens, logging a failure.
pub fn send(state: &str) {
    match notify(state) {
        Ok(sent) => debug!(sent, state = state.trim_end(), "sd_notify"),
        Err(e) => warn!("cannot notify systemd: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_is_one_datagram_of_key_value_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify.sock");
        let listener = UnixDatagram::bind(&path).unwrap();
        notify_to(path.as_os_str(), READY).unwrap();
        let mut buffer = [0; 256];
        let n = listener.recv(&mut buffer).unwrap();
        let message = std::str::from_utf8(&buffer[..n]).unwrap();
        assert_eq!(message.lines().next(), Some("READY=1"));
        assert!(
            message.lines().all(|line| line.contains('=')),
            "{message:?}"
        );
    }

    #[test]
    fn abstract_addresses_are_supported() {
        use std::os::linux::net::SocketAddrExt as _;
        let name = format!("plegd-notify-test-{}", std::process::id());
        let at = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let listener = UnixDatagram::bind_addr(&at).unwrap();
        notify_to(OsStr::new(&format!("@{name}")), STOPPING).unwrap();
        let mut buffer = [0; 256];
        let n = listener.recv(&mut buffer).unwrap();
        assert_eq!(&buffer[..n], STOPPING.as_bytes());
    }

    #[test]
    fn other_addresses_are_refused() {
        assert!(matches!(
            notify_to(OsStr::new("vsock:2:1234"), READY),
            Err(NotifyError::Unsupported { .. })
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn the_watchdog_is_fed_per_turn_of_the_loop_spaced_and_only_while_it_turns() {
        let (turned, turns) = watch::channel(Instant::now());
        let pings = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let count = {
            let pings = Arc::clone(&pings);
            move || {
                pings.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        };
        let feeding = tokio::spawn(keep_alive(turns, count));
        let read = || pings.load(std::sync::atomic::Ordering::Relaxed);
        // A thousand turns within a second: one keep-alive, and one for those after it.
        for _ in 0..1000 {
            turned.send_replace(Instant::now());
            tokio::time::sleep(Duration::from_micros(500)).await;
        }
        tokio::time::sleep(WATCHDOG_SPACING * 2).await;
        assert_eq!(read(), 2);
        // No turn, no keep-alive, however long.
        tokio::time::sleep(Duration::from_secs(600)).await;
        assert_eq!(read(), 2);
        turned.send_replace(Instant::now());
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(read(), 3);
        // The loop's end ends it.
        drop(turned);
        tokio::time::timeout(WATCHDOG_SPACING * 2, feeding)
            .await
            .expect("ended with the loop")
            .unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn readiness_waits_for_the_first_full_relist() {
        let health = Health::new(Duration::from_secs(180));
        let mut waiting = std::pin::pin!(first_full_relist(&health));
        for _ in 0..3 {
            assert!(
                tokio::time::timeout(Duration::from_secs(10), &mut waiting)
                    .await
                    .is_err(),
                "ready before any relist"
            );
        }
        health.relist_succeeded(tokio::time::Instant::now());
        // Paused time: only the success itself, not a timer, can end the wait.
        tokio::time::timeout(Duration::ZERO, waiting)
            .await
            .expect("ready right after the first full relist");
    }
}
