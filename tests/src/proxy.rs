//! A unix socket in front of containerd's that forwards every connection both ways, and can
//! make one kind of connection go silent while connected: a stuck event exchange or a
//! half-dead connection, with the runtime itself alive.

use std::{
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
};

use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::{UnixListener, UnixStream},
    sync::{oneshot, watch},
};

/// plegd's heartbeat topic (`plegd::sources::containerd_events::HEARTBEAT_TOPIC`): its event
/// connection sends it in its `Subscribe` filters and its heartbeats, in clear (gRPC bodies
/// are not compressed, unlike the headers that name the method), and no other call does.
pub const EVENT_STREAM: &[u8] = b"/plegd/heartbeat";

/// The proxy; it stops when dropped.
pub struct MutingProxy {
    pub socket: PathBuf,
    muted: watch::Sender<bool>,
    /// Dropped to stop the proxy's thread, and every connection with it.
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl MutingProxy {
    /// Listens on `proxy.sock` in `dir`, forwarding to `upstream`. Muting applies to the
    /// connections whose client has sent `marker` (see [`EVENT_STREAM`]): while muted, nothing
    /// the server writes on them reaches the client; calls and streams stay open.
    ///
    /// It forwards on a thread of its own: on the test's runtime, busy with a churn on two
    /// cores, every call through it waited for a worker, and the daemon behind it lagged.
    pub fn start(dir: &Path, upstream: PathBuf, marker: &'static [u8]) -> std::io::Result<Self> {
        let socket = dir.join("proxy.sock");
        let _ = std::fs::remove_file(&socket);
        let listener = std::os::unix::net::UnixListener::bind(&socket)?;
        listener.set_nonblocking(true)?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let (muted, _) = watch::channel(false);
        let subscribe = muted.clone();
        let (stop, stopped) = oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("muting-proxy".into())
            .spawn(move || {
                runtime.block_on(async move {
                    let Ok(listener) = UnixListener::from_std(listener) else {
                        return;
                    };
                    let mut connections = tokio::task::JoinSet::new();
                    let accepting = async {
                        while let Ok((client, _)) = listener.accept().await {
                            let upstream = upstream.clone();
                            let muted = subscribe.subscribe();
                            connections.spawn(async move {
                                if let Ok(server) = UnixStream::connect(&upstream).await {
                                    forward(client, server, muted, marker).await;
                                }
                            });
                            // Ended connections' results, so the set holds only live ones.
                            while connections.try_join_next().is_some() {}
                        }
                    };
                    tokio::select! {
                        _ = stopped => {}
                        () = accepting => {}
                    }
                });
            })?;
        Ok(Self {
            socket,
            muted,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    pub fn mute(&self, muted: bool) {
        self.muted.send_replace(muted);
    }
}

impl Drop for MutingProxy {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

async fn forward(
    client: UnixStream,
    server: UnixStream,
    mut muted: watch::Receiver<bool>,
    marker: &'static [u8],
) {
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let marked = Arc::new(AtomicBool::new(false));
    let upstream = async {
        let mut seen = MarkerScan::new(marker);
        let mut buffer = vec![0; 64 * 1024];
        loop {
            let n = client_read.read(&mut buffer).await?;
            if n == 0 {
                return std::io::Result::Ok(());
            }
            if seen.feed(&buffer[..n]) {
                marked.store(true, Ordering::Relaxed);
            }
            server_write.write_all(&buffer[..n]).await?;
        }
    };
    let downstream = async {
        let mut buffer = vec![0; 64 * 1024];
        loop {
            let n = server_read.read(&mut buffer).await?;
            if n == 0 {
                return std::io::Result::Ok(());
            }
            // Held, not dropped: unmuted, the connection carries on where it stopped.
            if marked.load(Ordering::Relaxed) && muted.wait_for(|muted| !muted).await.is_err() {
                return Ok(());
            }
            client_write.write_all(&buffer[..n]).await?;
        }
    };
    let _ = tokio::join!(upstream, downstream);
}

/// Whether a byte stream, fed in chunks, has held `marker` (across chunk boundaries too).
struct MarkerScan {
    marker: &'static [u8],
    /// The last `marker.len() - 1` bytes fed.
    tail: Vec<u8>,
    found: bool,
}

impl MarkerScan {
    fn new(marker: &'static [u8]) -> Self {
        Self {
            marker,
            tail: Vec::new(),
            found: false,
        }
    }

    fn feed(&mut self, chunk: &[u8]) -> bool {
        if self.found || self.marker.is_empty() {
            self.found = true;
            return true;
        }
        self.tail.extend_from_slice(chunk);
        self.found = self
            .tail
            .windows(self.marker.len())
            .any(|w| w == self.marker);
        let keep = self.marker.len() - 1;
        if self.tail.len() > keep {
            self.tail.drain(..self.tail.len() - keep);
        }
        self.found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_marker_is_found_within_and_across_chunks_only_when_whole() {
        let mut scan = MarkerScan::new(b"/plegd/heartbeat");
        assert!(!scan.feed(b"xx/plegd/heart"));
        assert!(!scan.feed(b""));
        assert!(scan.feed(b"beat.."));
        assert!(scan.feed(b"anything after"));

        let mut scan = MarkerScan::new(b"/plegd/heartbeat");
        assert!(!scan.feed(b"/plegd/heartbea"));
        assert!(!scan.feed(b"T, then /plegd/hearbeat"));
        assert!(scan.feed(b"/plegd/heartbeat"));
    }
}
