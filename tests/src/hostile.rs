//! Hostile input against the real `plegd` binary, and the one check every case ends with
//! (issue 53): whatever a peer sends, plegd stays alive, its RSS grows by less than
//! [`RSS_GROWTH_LIMIT`], its health answers, and a watcher that connects afterwards gets the
//! next `kill -9`'s `ContainerDied`.
//!
//! A case starts a [`Target`] (plegd with a metrics listener, against the harness's
//! containerd, born in a memory cgroup at the unit's `MemoryMax=`), then hands
//! [`Target::assert_held`] its input as a future: the future sends it, on as many connections
//! at once as the defaults admit ([`on_unix`], [`on_tcp`] open them), and returns whatever must
//! stay open while plegd's health is asked (the connections, held). The helper measures RSS
//! before, at its peak (VmHWM, reset before the input) and 10 s after the input is dropped, and
//! prints the three, so a run shows what each input costs.
//!
//! To measure what an input would cost without the bounds (a build of older code), two
//! variables change the setup: `PLEGD_TEST_MEMORY_LIMIT` the cgroup's limit (bytes, or with
//! K/M/G), `PLEGD_TEST_HOSTILE_CONNECTIONS` the connections of every case ([`connections`]).

use std::{
    fmt,
    future::Future,
    net::{IpAddr, SocketAddr},
    path::{Path, PathBuf},
    sync::atomic::{AtomicUsize, Ordering},
    time::Duration,
};

use anyhow::Context as _;
use plegd_proto::v1::{self as pb, pleg_client::PlegClient};
use tokio::{
    io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _},
    net::{TcpSocket, TcpStream, UnixStream},
    process::Command,
    task::JoinSet,
};

use crate::{
    Node,
    bench::{Birth, Plegd, peak_rss_bytes, rss_bytes},
    cri::{ContainerSpec, Pod},
    process::{is_alive, plegd_binary},
    unit::MemoryCgroup,
};

/// How much more memory than before an input plegd may ever hold because of it.
pub const RSS_GROWTH_LIMIT: u64 = 64 << 20;

/// When the "after" RSS is read: once the input is gone and plegd had time to give back what
/// it took.
pub const SETTLE: Duration = Duration::from_secs(10);

/// How long health, a connection or an event may take under load.
const DEADLINE: Duration = Duration::from_secs(30);

/// plegd under hostile input, with a pod whose containers the check kills.
pub struct Target {
    /// The harness's containerd and its clients (for cases that make pods of their own).
    pub node: Node,
    pub plegd: Plegd,
    pod: Pod,
    victims: AtomicUsize,
    _cgroup: MemoryCgroup,
    _dir: tempfile::TempDir,
}

/// What an input cost plegd, in bytes of RSS.
#[derive(Clone, Copy, Debug)]
pub struct Rss {
    pub before: u64,
    /// The most plegd held between the input and its end (VmHWM).
    pub peak: u64,
    /// [`SETTLE`] after the input ended.
    pub after: u64,
}

impl fmt::Display for Rss {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mib = |bytes: u64| bytes as f64 / f64::from(1 << 20);
        write!(
            f,
            "RSS {:.1} MiB before, {:.1} MiB at peak, {:.1} MiB {} s after",
            mib(self.before),
            mib(self.peak),
            mib(self.after),
            SETTLE.as_secs()
        )
    }
}

impl Target {
    /// Starts a containerd and `plegd run` (with a metrics listener on loopback and `args`
    /// added) in a memory cgroup limited to the unit's `MemoryMax=`, and a pod for the kills.
    pub async fn start(args: &[&str]) -> anyhow::Result<Self> {
        let node = Node::start().await?;
        let binary = plegd_binary()?;
        let limit = match std::env::var("PLEGD_TEST_MEMORY_LIMIT") {
            Ok(limit) => crate::unit::parse_size(&limit)?,
            Err(_) => crate::unit::memory_max()?,
        };
        let cgroup = MemoryCgroup::create(
            &format!("plegd-hostile-{}-{}", std::process::id(), next_id()),
            limit,
        );
        let dir = tempfile::tempdir()?;
        let args: Vec<String> = args.iter().map(|&a| a.to_owned()).collect();
        let plegd = Plegd::start_born(
            &binary,
            &node.containerd,
            dir.path(),
            &args,
            std::process::Stdio::null(),
            Birth {
                cgroup: Some(cgroup.dir.clone()),
                ..Birth::default()
            },
        )?;
        let pod = node.cri.run_pod("hostile").await?;
        Ok(Self {
            node,
            plegd,
            pod,
            victims: AtomicUsize::new(0),
            _cgroup: cgroup,
            _dir: dir,
        })
    }

    pub fn socket(&self) -> &Path {
        &self.plegd.socket
    }

    pub fn metrics(&self) -> SocketAddr {
        self.plegd.metrics
    }

    /// Runs `input` (which sends the hostile input and returns what must stay open meanwhile),
    /// then checks, in one place for every case: plegd is alive; its RSS grew by less than
    /// [`RSS_GROWTH_LIMIT`] over what it held before; `plegd health` answers over the socket
    /// (what the DaemonSet's probes run) while the input is still held; and, the input gone, a
    /// watcher that connects gets the `ContainerDied` of a container killed with SIGKILL.
    /// Prints and returns the RSS figures; fails with every problem found.
    pub async fn assert_held<T>(
        &self,
        what: &str,
        input: impl Future<Output = anyhow::Result<T>>,
    ) -> anyhow::Result<Rss> {
        let pid = self.plegd.pid();
        let before = rss_bytes(pid);
        reset_peak_rss(pid)?;
        let held = input.await.with_context(|| format!("sending {what}"))?;
        let mut problems = Vec::new();
        if let Err(e) = self.health().await {
            problems.push(format!("health while the input was held: {e:#}"));
        }
        let peak = peak_rss_bytes(pid);
        drop(held);
        tokio::time::sleep(SETTLE).await;
        let rss = Rss {
            before,
            peak,
            after: rss_bytes(pid),
        };
        println!("hostile input {what}: {rss}");
        if !is_alive(pid) {
            anyhow::bail!("{what}: plegd died (its log: {})", self.log().display());
        }
        if peak.saturating_sub(before) >= RSS_GROWTH_LIMIT {
            problems.push(format!(
                "RSS grew by {} MiB, the limit is {} MiB",
                (peak - before) >> 20,
                RSS_GROWTH_LIMIT >> 20
            ));
        }
        if let Err(e) = self.health().await {
            problems.push(format!("health after the input: {e:#}"));
        }
        if let Err(e) = self.next_kill_seen().await {
            problems.push(format!("a watcher after the input: {e:#}"));
        }
        anyhow::ensure!(problems.is_empty(), "{what}: {}", problems.join("; "));
        Ok(rss)
    }

    /// `plegd health` over the socket, as the DaemonSet's probes run it.
    async fn health(&self) -> anyhow::Result<()> {
        let output = tokio::time::timeout(
            DEADLINE,
            Command::new(plegd_binary()?)
                .arg("health")
                .arg("--socket")
                .arg(self.socket())
                .kill_on_drop(true)
                .output(),
        )
        .await
        .context("plegd health did not answer")??;
        anyhow::ensure!(
            output.status.success(),
            "plegd health: {}: {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
        Ok(())
    }

    /// Watches ContainerDied over a new connection, kills a new container's init with SIGKILL,
    /// and waits for its event.
    async fn next_kill_seen(&self) -> anyhow::Result<()> {
        let name = format!("victim-{}", self.victims.fetch_add(1, Ordering::Relaxed));
        let id = self
            .node
            .cri
            .run_container(&self.pod, &ContainerSpec::sleeper(&name))
            .await?;
        let channel = tokio::time::timeout(DEADLINE, crate::unix_channel(self.socket()))
            .await
            .context("dialing the socket")??;
        let request = pb::WatchRequest {
            types: vec![pb::EventType::ContainerDied as i32],
            ..Default::default()
        };
        // Subscribed once the call answers: the kill comes after.
        let mut events = tokio::time::timeout(DEADLINE, PlegClient::new(channel).watch(request))
            .await
            .context("Watch did not answer")??
            .into_inner();
        self.node.tasks.kill_init(&id).await?;
        let died = async {
            while let Some(event) = events.message().await? {
                if event.container_id == id {
                    return Ok(());
                }
            }
            anyhow::bail!("the stream ended")
        };
        tokio::time::timeout(DEADLINE, died)
            .await
            .with_context(|| format!("no ContainerDied of {id} within {DEADLINE:?}"))?
    }

    fn log(&self) -> PathBuf {
        self.plegd
            .socket
            .parent()
            .map_or_else(PathBuf::new, |dir| dir.join("plegd.log"))
    }
}

/// The connections a case opens: `admitted` (what plegd's defaults admit of one peer), or
/// `PLEGD_TEST_HOSTILE_CONNECTIONS`.
pub fn connections(admitted: usize) -> usize {
    std::env::var("PLEGD_TEST_HOSTILE_CONNECTIONS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(admitted)
}

fn next_id() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Makes the process's VmHWM its current RSS (clear_refs' "5", Linux 4.0), so the next
/// reading is the peak of what follows.
fn reset_peak_rss(pid: i32) -> anyhow::Result<()> {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5")
        .with_context(|| format!("resetting the peak RSS of {pid}"))
}

/// `connections` connections to the unix socket at `socket`, all open at once, each sent
/// `bytes`. Writes that plegd cuts short (it closed the connection) are not errors.
pub async fn on_unix(
    socket: &Path,
    connections: usize,
    bytes: &[u8],
) -> anyhow::Result<Vec<UnixStream>> {
    let mut streams = Vec::with_capacity(connections);
    for _ in 0..connections {
        streams.push(UnixStream::connect(socket).await?);
    }
    send_all(streams, bytes).await
}

/// `connections` TCP connections to `to` from `from`, all open at once, each sent `bytes`.
pub async fn on_tcp(
    from: IpAddr,
    to: SocketAddr,
    connections: usize,
    bytes: &[u8],
) -> anyhow::Result<Vec<TcpStream>> {
    let mut streams = Vec::with_capacity(connections);
    for _ in 0..connections {
        let socket = match from {
            IpAddr::V4(_) => TcpSocket::new_v4()?,
            IpAddr::V6(_) => TcpSocket::new_v6()?,
        };
        socket.bind(SocketAddr::new(from, 0))?;
        streams.push(socket.connect(to).await?);
    }
    send_all(streams, bytes).await
}

async fn send_all<S>(streams: Vec<S>, bytes: &[u8]) -> anyhow::Result<Vec<S>>
where
    S: AsyncWrite + Unpin + Send + 'static,
{
    let mut sending = JoinSet::new();
    for (i, mut stream) in streams.into_iter().enumerate() {
        let bytes = bytes.to_vec();
        sending.spawn(async move {
            let _ = stream.write_all(&bytes).await;
            (i, stream)
        });
    }
    let mut sent = sending.join_all().await;
    sent.sort_by_key(|(i, _)| *i);
    Ok(sent.into_iter().map(|(_, s)| s).collect())
}

/// Reads each stream until plegd closes it or `within` passes; how many it closed.
pub async fn closed_by_plegd<S>(streams: &mut [S], within: Duration) -> usize
where
    S: AsyncRead + Unpin,
{
    let deadline = tokio::time::Instant::now() + within;
    let mut closed = 0;
    for stream in streams {
        let mut buffer = [0u8; 4096];
        loop {
            match tokio::time::timeout_at(deadline, stream.read(&mut buffer)).await {
                Ok(Ok(0) | Err(_)) => {
                    closed += 1;
                    break;
                }
                Ok(Ok(_)) => {}
                Err(_) => break,
            }
        }
    }
    closed
}
