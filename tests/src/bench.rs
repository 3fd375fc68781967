//! What `cargo xtask bench` measures plegd with, from outside the daemon: the release `plegd`
//! binary run as a process of its own, a `plegd watch --output json` process whose lines are
//! timed as they arrive, containerd's own event stream and a CRI `ContainerStatus` poller as the
//! two anchors, and the CPU time and memory of a process from /proc.
//!
//! Every instant is wall-clock (`SystemTime`): containerd's `TaskExit.exited_at` is one, and the
//! kill, the arrivals and the anchors are compared on the same clock.

use std::{
    collections::HashMap,
    io::{BufRead as _, BufReader, Read as _, Write as _},
    net::{SocketAddr, TcpStream},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant, SystemTime},
};

use anyhow::{Context as _, bail};
use containerd_client::{
    events::{TaskExit, TaskStart},
    services::v1::{SubscribeRequest, events_client::EventsClient},
};
use k8s_cri::v1::ContainerState;
use prost::Message as _;
use tokio::sync::Notify;

use crate::{PrivateContainerd, audit::Record, cri::Cri, process::Terminating, unix_channel};

/// How long a daemon's CPU time stays still before [`Plegd::await_settled`] takes its start as
/// done (/proc counts it in ticks of 10 ms).
const SETTLED_FOR: Duration = Duration::from_millis(300);
/// The longest [`Plegd::await_settled`] waits.
const SETTLE_BOUND: Duration = Duration::from_secs(10);

/// `plegd run` arguments of a push-source-only mode: full relists 300 s apart, so only the
/// source can be fast (plegd rejects a health threshold under two full relist periods).
pub const PUSH_ONLY_PERIODS: [&str; 6] = [
    "--relist-period",
    "300s",
    "--slow-relist-period",
    "300s",
    "--relist-threshold",
    "10m",
];

/// First instants of `(container id, what)`, awaited by id: event arrivals at the watch client,
/// containerd's timestamps.
#[derive(Default)]
pub struct Arrivals {
    seen: Mutex<HashMap<(String, String), SystemTime>>,
    changed: Notify,
}

impl Arrivals {
    /// Keeps the first instant of each `(id, what)`.
    pub fn record(&self, id: &str, what: &str, at: SystemTime) {
        self.seen
            .lock()
            .expect("arrivals lock")
            .entry((id.to_owned(), what.to_owned()))
            .or_insert(at);
        self.changed.notify_waiters();
    }

    pub fn get(&self, id: &str, what: &str) -> Option<SystemTime> {
        self.seen
            .lock()
            .expect("arrivals lock")
            .get(&(id.to_owned(), what.to_owned()))
            .copied()
    }

    /// The instant of `(id, what)`, waiting up to `timeout` for it.
    pub async fn wait(&self, id: &str, what: &str, timeout: Duration) -> Option<SystemTime> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if let Some(at) = self.get(id, what) {
                return Some(at);
            }
            tokio::time::timeout_at(deadline, changed).await.ok()?;
        }
    }
}

/// A `plegd run` process with its API on a socket of its own.
pub struct Plegd {
    process: Terminating,
    pub socket: PathBuf,
    pub metrics: SocketAddr,
    binary: PathBuf,
    /// The whole `run` command line, to start it again the same way.
    command: Vec<std::ffi::OsString>,
    dir: PathBuf,
    /// What it is born with beyond the caller's.
    birth: Birth,
}

/// What a started plegd is born with beyond what the caller has.
#[derive(Clone, Debug, Default)]
pub struct Birth {
    /// The cgroup (a directory of cgroupfs, v1 or v2): everything it ever allocates is charged
    /// there, its start included.
    pub cgroup: Option<PathBuf>,
    /// Its open-file limit, soft and hard (a unit's 1,024 with no headroom above).
    pub nofile: Option<u64>,
}

impl Plegd {
    /// Starts `binary run` against `containerd`'s CRI (or the `--runtime-endpoint` in `args`)
    /// with `args` added, and waits until its API answers `plegd health`.
    pub fn start(
        binary: &Path,
        containerd: &PrivateContainerd,
        dir: &Path,
        args: &[String],
    ) -> anyhow::Result<Self> {
        Self::start_with_stdout(binary, containerd, dir, args, Stdio::null())
    }

    /// [`Plegd::start`] with its event output on stdout going to `stdout` (a pipe nobody
    /// reads stalls it). A restart writes to nowhere.
    pub fn start_with_stdout(
        binary: &Path,
        containerd: &PrivateContainerd,
        dir: &Path,
        args: &[String],
        stdout: Stdio,
    ) -> anyhow::Result<Self> {
        Self::start_born(binary, containerd, dir, args, stdout, Birth::default())
    }

    /// [`Plegd::start_with_stdout`] with the daemon born with `birth` (see [`Birth`]). A
    /// restart is born the same way.
    pub fn start_born(
        binary: &Path,
        containerd: &PrivateContainerd,
        dir: &Path,
        args: &[String],
        stdout: Stdio,
        birth: Birth,
    ) -> anyhow::Result<Self> {
        let plegd = Self::launch(binary, containerd, dir, args, stdout, birth)?;
        plegd.await_healthy()?;
        Ok(plegd)
    }

    /// [`Plegd::start_born`] without waiting for anything: returns once the process is spawned
    /// (its socket and /metrics come later), for a caller that times its start itself.
    pub fn launch(
        binary: &Path,
        containerd: &PrivateContainerd,
        dir: &Path,
        args: &[String],
        stdout: Stdio,
        birth: Birth,
    ) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let socket = dir.join("plegd.sock");
        let _ = std::fs::remove_file(&socket);
        let metrics = free_port()?;
        let mut command: Vec<std::ffi::OsString> = vec!["run".into()];
        // The CRI backend unless asked for another (containerd's own API).
        if !args.iter().any(|a| a == "--runtime") {
            command.extend(["--runtime".into(), "cri".into()]);
        }
        // containerd's own socket unless asked for another (a proxy in front of it).
        if !args.iter().any(|a| a == "--runtime-endpoint") {
            command.extend(["--runtime-endpoint".into(), containerd.socket().into()]);
        }
        command.extend([
            "--socket".into(),
            socket.clone().into(),
            "--output".into(),
            "json".into(),
            "--metrics-address".into(),
            metrics.to_string().into(),
        ]);
        // No saved state unless asked for: each start a run of its own.
        if !args.iter().any(|a| a == "--state-dir") {
            command.extend(["--state-dir".into(), "none".into()]);
        }
        command.extend(args.iter().map(Into::into));
        let process = Self::spawn(binary, &command, dir, stdout, &birth)?;
        Ok(Self {
            process,
            socket,
            metrics,
            binary: binary.to_owned(),
            command,
            dir: dir.to_owned(),
            birth,
        })
    }

    fn spawn(
        binary: &Path,
        command: &[std::ffi::OsString],
        dir: &Path,
        stdout: Stdio,
        birth: &Birth,
    ) -> anyhow::Result<Terminating> {
        // Appended to: a restarted daemon's log follows the one before.
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("plegd.log"))?;
        let mut daemon = Command::new(binary);
        daemon
            .args(command)
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(log);
        if let Some(cgroup) = &birth.cgroup {
            crate::process::born_in_cgroup(&mut daemon, cgroup)?;
        }
        if let Some(nofile) = birth.nofile {
            use std::os::unix::process::CommandExt as _;
            // SAFETY: setrlimit is async-signal-safe, and nothing else runs in the child.
            unsafe {
                daemon.pre_exec(move || {
                    nix::sys::resource::setrlimit(
                        nix::sys::resource::Resource::RLIMIT_NOFILE,
                        nofile,
                        nofile,
                    )
                    .map_err(std::io::Error::from)
                });
            }
        }
        let child = daemon
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        Ok(Terminating(child))
    }

    fn await_healthy(&self) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self.healthy() {
            if Instant::now() > deadline || !crate::process::is_alive(self.pid()) {
                bail!(
                    "plegd {:?} did not become healthy; its log is {}",
                    self.command,
                    self.dir.join("plegd.log").display()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(())
    }

    /// Ends the daemon with `signal` (SIGKILL: a crash; SIGTERM: a clean stop), waits for it to
    /// exit, and starts it again the same way.
    pub fn restart(&mut self, signal: nix::sys::signal::Signal) -> anyhow::Result<()> {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid()), signal)?;
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.process.0.try_wait()?.is_none() {
            if Instant::now() > deadline {
                bail!("plegd did not exit on {signal}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.process = Self::spawn(
            &self.binary,
            &self.command,
            &self.dir,
            Stdio::null(),
            &self.birth,
        )?;
        self.await_healthy()
    }

    /// `plegd health --output json`.
    fn health(&self) -> anyhow::Result<serde_json::Value> {
        let output = Command::new(&self.binary)
            .arg("health")
            .arg("--socket")
            .arg(&self.socket)
            .args(["--output", "json"])
            .stderr(Stdio::null())
            .output()?;
        Ok(serde_json::from_slice(&output.stdout)?)
    }

    /// The last sequence number the daemon published.
    pub fn last_sequence(&self) -> anyhow::Result<u64> {
        self.health()?["last_sequence"]
            .as_u64()
            .context("plegd health gave no last_sequence")
    }

    /// The state of event source `source` ("containerd", "ebpf", ...) as `plegd health`
    /// names it ("connected", "reconnecting", ...).
    pub fn source_state(&self, source: &str) -> anyhow::Result<String> {
        let health = self.health()?;
        health["sources"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|s| s["source"] == source)
            .and_then(|s| s["state"].as_str())
            .map(str::to_owned)
            .with_context(|| format!("plegd health shows no source {source}: {health}"))
    }

    /// Whether every push source `plegd health` shows is connected ([`sources_connected`]).
    pub fn sources_connected(&self) -> anyhow::Result<bool> {
        sources_connected(&self.health()?)
    }

    fn healthy(&self) -> bool {
        Command::new(&self.binary)
            .arg("health")
            .arg("--socket")
            .arg(&self.socket)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    pub fn pid(&self) -> i32 {
        self.process.pid()
    }

    /// Waits until the daemon's start is behind it (its probes loaded, its first full relist
    /// read, its heap collected): no CPU tick for [`SETTLED_FOR`], within [`SETTLE_BOUND`].
    /// Whether it settled. A node's plegd starts once; a measurement of what it costs the
    /// runtime while running should not count its start.
    pub async fn await_settled(&self) -> bool {
        let deadline = Instant::now() + SETTLE_BOUND;
        let mut last = cpu_time(self.pid());
        while Instant::now() < deadline {
            tokio::time::sleep(SETTLED_FOR).await;
            let now = cpu_time(self.pid());
            if now == last {
                return true;
            }
            last = now;
        }
        false
    }

    /// Its API's `ListPods` (which waits for the run's first full relist).
    pub async fn list_pods(&self) -> anyhow::Result<plegd_proto::v1::ListPodsResponse> {
        let channel = unix_channel(&self.socket).await?;
        Ok(plegd_proto::v1::pleg_client::PlegClient::new(channel)
            .list_pods(plegd_proto::v1::ListPodsRequest {})
            .await?
            .into_inner())
    }

    /// A `plegd watch --output json` process on this daemon, each line timed as it arrives.
    pub fn watch(&self) -> anyhow::Result<Watch> {
        Watch::start(&self.binary, &self.socket, 0, false)
    }

    /// [`Plegd::watch`] that also asks for the kernel's observations ahead of confirmation;
    /// the arrival of each container's first kernel death is recorded as [`KERNEL_DEATH`].
    pub fn watch_with_kernel_observations(&self) -> anyhow::Result<Watch> {
        Watch::start(&self.binary, &self.socket, 0, true)
    }

    /// [`Plegd::watch`] from the run's first event on: nothing published before it connects is
    /// missed.
    pub fn watch_from_start(&self) -> anyhow::Result<Watch> {
        Watch::start(&self.binary, &self.socket, 1, false)
    }

    /// A counter or gauge of its /metrics (the sum of its series).
    pub fn metric(&self, name: &str) -> anyhow::Result<f64> {
        metric_at(self.metrics, name)
    }

    /// Each series of a metric, by its labels ([`metric_series_at`]).
    pub fn metric_series(
        &self,
        name: &str,
    ) -> anyhow::Result<std::collections::BTreeMap<String, f64>> {
        metric_series_at(self.metrics, name)
    }

    pub fn stop(self) {
        let _ = self.process.stop(Duration::from_secs(10));
    }
}

/// A counter or gauge of the /metrics served at `address` (the sum of its series).
pub fn metric_at(address: SocketAddr, name: &str) -> anyhow::Result<f64> {
    Ok(metric_series_at(address, name)?.values().sum())
}

/// Each series of a counter or gauge of the /metrics served at `address`, by its labels as
/// written (`{call="ListContainers"}`; empty for a series without labels).
pub fn metric_series_at(
    address: SocketAddr,
    name: &str,
) -> anyhow::Result<std::collections::BTreeMap<String, f64>> {
    let mut stream = TcpStream::connect(address)?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(stream, "GET /metrics HTTP/1.0\r\nHost: {address}\r\n\r\n")?;
    let mut text = String::new();
    stream.read_to_string(&mut text)?;
    Ok(text
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix(name)?;
            let (labels, value) = rest.rsplit_once(' ')?;
            if !(labels.is_empty() || labels.starts_with('{')) {
                return None;
            }
            Some((labels.to_owned(), value.parse::<f64>().ok()?))
        })
        .collect())
}

/// The status code of a `GET path` over HTTP/1.0 at `address`.
pub fn http_status_at(address: SocketAddr, path: &str) -> anyhow::Result<u16> {
    let mut stream = TcpStream::connect(address)?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {address}\r\n\r\n")?;
    let mut text = String::new();
    stream.read_to_string(&mut text)?;
    text.split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .with_context(|| format!("no status line from {address}{path}"))
}

/// How many series the /metrics served at `address` has: all of them, and those of the
/// per-container counters (`plegd_container_*`), which follow what the node runs.
pub fn series_count_at(address: SocketAddr) -> anyhow::Result<(usize, usize)> {
    let mut stream = TcpStream::connect(address)?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(stream, "GET /metrics HTTP/1.0\r\nHost: {address}\r\n\r\n")?;
    let mut text = String::new();
    stream.read_to_string(&mut text)?;
    let body = text.split_once("\r\n\r\n").map_or("", |(_, body)| body);
    let samples: Vec<&str> = body
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    let containers = samples
        .iter()
        .filter(|l| l.starts_with("plegd_container_"))
        .count();
    Ok((samples.len(), containers))
}

/// Whether every push source in `health` (what `plegd health --output json` prints) is
/// connected, or off, or unsupported here: none still connecting or reconnecting. A restarted
/// plegd is healthy once its first full relist is read, before its containerd stream is
/// subscribed: what the runtime publishes in between reaches none of plegd's streams.
pub fn sources_connected(health: &serde_json::Value) -> anyhow::Result<bool> {
    let sources = health["sources"]
        .as_array()
        .with_context(|| format!("plegd health shows no sources: {health}"))?;
    Ok(sources
        .iter()
        .all(|s| !matches!(s["state"].as_str(), Some("connecting" | "reconnecting"))))
}

/// A local TCP port free a moment ago.
fn free_port() -> std::io::Result<SocketAddr> {
    std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()
}

/// A `plegd watch --output json` process; its events' arrivals by `(container id, type)`, and
/// everything it printed, in order, for the audit.
pub struct Watch {
    process: Terminating,
    pub arrivals: Arc<Arrivals>,
    records: Arc<Mutex<Vec<Record>>>,
}

impl Watch {
    fn start(
        binary: &Path,
        socket: &Path,
        from: u64,
        kernel_observations: bool,
    ) -> anyhow::Result<Self> {
        let mut child = Command::new(binary)
            .arg("watch")
            .arg("--socket")
            .arg(socket)
            .args(["--output", "json", "--from", &from.to_string()])
            .args(kernel_observations.then_some("--kernel-observations"))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .context("starting plegd watch")?;
        let stdout = child.stdout.take().context("watch stdout")?;
        let arrivals = Arc::new(Arrivals::default());
        let records = Arc::new(Mutex::new(Vec::new()));
        let (arrived, recorded) = (arrivals.clone(), records.clone());
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let at = SystemTime::now();
                let Some(record) = Record::from_watch_line(&line, at) else {
                    continue;
                };
                if let Record::Event(event) = &record {
                    // When plegd sent it: what it took inside plegd, and what the way to a client
                    // added. Recorded before the arrival, which wakes whoever waits for it.
                    if let Some(emitted) = emitted_at(&line) {
                        let what = format!("{} emitted", event.event_type);
                        arrived.record(&event.container_id, &what, emitted);
                    }
                    arrived.record(&event.container_id, &event.event_type, at);
                    // Only observation lines are read a second time.
                    if event.event_type == "KernelObservation" && is_kernel_death(&line) {
                        arrived.record(&event.container_id, KERNEL_DEATH, at);
                    }
                }
                recorded.lock().expect("watch records lock").push(record);
            }
        });
        Ok(Self {
            process: Terminating(child),
            arrivals,
            records,
        })
    }

    /// What it printed so far, in order.
    pub fn records(&self) -> Vec<Record> {
        self.records.lock().expect("watch records lock").clone()
    }

    /// The sequence of the last event it printed (0: none).
    pub fn last_sequence(&self) -> u64 {
        self.records
            .lock()
            .expect("watch records lock")
            .iter()
            .rev()
            .find_map(|r| match r {
                Record::Event(e) if e.sequence > 0 => Some(e.sequence),
                Record::Resync(resync) => Some(resync.sequence),
                Record::Event(_) => None,
            })
            .unwrap_or(0)
    }

    pub fn stop(self) {
        let _ = self.process.stop(Duration::from_secs(5));
    }
}

/// What [`Watch`] records a container's first kernel observation of a death (exit status,
/// signal, exit or OOM kill of its init, ahead of confirmation) as.
pub const KERNEL_DEATH: &str = "KernelObservation death";

/// Whether a `plegd watch --output json` line is a kernel observation of a death.
fn is_kernel_death(line: &str) -> bool {
    let Ok(value) = serde_json::from_str::<serde_json::Value>(line) else {
        return false;
    };
    value["type"] == "KernelObservation"
        && value["observations"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(serde_json::Value::as_str)
            .any(|o| {
                ["signal=", "exit_code=", "exited", "oom_killed"]
                    .iter()
                    .any(|kind| o.contains(kind))
            })
}

/// The `emitted_at` of a `plegd watch --output json` line (microseconds).
fn emitted_at(line: &str) -> Option<SystemTime> {
    let value: serde_json::Value = serde_json::from_str(line).ok()?;
    humantime::parse_rfc3339_weak(value["emitted_at"].as_str()?).ok()
}

/// containerd's own event stream, as `ctr events` reads it: `/tasks/exit` recorded as `"exit"`
/// at the payload's `exited_at`, as [`EXIT_PUBLISHED`] at the envelope's timestamp (when the
/// shim published it) and as [`EXIT_ARRIVAL`] when it reached this subscriber, `/tasks/start`
/// as `"start"` at the envelope's timestamp (init processes only).
pub async fn containerd_events(containerd: &PrivateContainerd) -> anyhow::Result<Arc<Arrivals>> {
    let channel = unix_channel(&containerd.socket()).await?;
    let arrivals = Arc::new(Arrivals::default());
    let record = arrivals.clone();
    // containerd sends the response's headers with the first event: the call would not return
    // before something happens, so it is awaited in the task that reads the stream.
    tokio::spawn(async move {
        let Ok(response) = EventsClient::new(channel)
            .subscribe(SubscribeRequest::default())
            .await
        else {
            return;
        };
        let mut stream = response.into_inner();
        while let Ok(Some(envelope)) = stream.message().await {
            let payload = envelope
                .event
                .as_ref()
                .map_or(&[][..], |any| any.value.as_slice());
            match envelope.topic.as_str() {
                "/tasks/exit" => {
                    if let Ok(exit) = TaskExit::decode(payload)
                        && exit.id == exit.container_id
                        && let Some(at) = exit.exited_at.and_then(|t| SystemTime::try_from(t).ok())
                    {
                        record.record(&exit.container_id, "exit", at);
                        if let Some(published) = envelope
                            .timestamp
                            .and_then(|t| SystemTime::try_from(t).ok())
                        {
                            record.record(&exit.container_id, EXIT_PUBLISHED, published);
                        }
                        record.record(&exit.container_id, EXIT_ARRIVAL, SystemTime::now());
                    }
                }
                "/tasks/start" => {
                    if let Ok(start) = TaskStart::decode(payload)
                        && let Some(at) = envelope
                            .timestamp
                            .and_then(|t| SystemTime::try_from(t).ok())
                    {
                        record.record(&start.container_id, "start", at);
                    }
                }
                _ => {}
            }
        }
    });
    // Time for the request to reach containerd and subscribe.
    tokio::time::sleep(Duration::from_millis(500)).await;
    Ok(arrivals)
}

/// What [`containerd_events`] records the publish time of a container's `/tasks/exit` envelope
/// as.
pub const EXIT_PUBLISHED: &str = "exit_published";

/// What [`containerd_events`] records the arrival of a container's `/tasks/exit` as.
pub const EXIT_ARRIVAL: &str = "exit_arrival";

/// The first moment CRI `ContainerStatus` shows the container EXITED, asking as fast as it
/// answers; `None` past `timeout`.
pub async fn cri_exited(cri: &Cri, id: &str, timeout: Duration) -> Option<SystemTime> {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if let Ok(status) = cri.container_status(id).await
            && status.state == ContainerState::ContainerExited as i32
        {
            return Some(SystemTime::now());
        }
    }
    None
}

/// A process's CPU time so far (user + system, from /proc/<pid>/stat).
pub fn cpu_time(pid: i32) -> Duration {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return Duration::ZERO;
    };
    // Fields after the parenthesised command name: state is field 3, utime 14, stime 15.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace()
        .collect();
    let ticks: u64 = fields
        .get(11..13)
        .map_or(0, |f| f.iter().filter_map(|v| v.parse::<u64>().ok()).sum());
    Duration::from_secs_f64(ticks as f64 / clock_ticks() as f64)
}

fn clock_ticks() -> u64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok()?.trim().parse().ok())
        .unwrap_or(100)
}

/// A process's resident memory in bytes (VmRSS).
pub fn rss_bytes(pid: i32) -> u64 {
    status_bytes(pid, "VmRSS:")
}

/// The most resident memory a process has had, in bytes (VmHWM, its high-water mark).
pub fn peak_rss_bytes(pid: i32) -> u64 {
    status_bytes(pid, "VmHWM:")
}

/// A `kB` field of /proc/<pid>/status, in bytes (0 when the process is gone).
fn status_bytes(pid: i32, field: &str) -> u64 {
    proc_number(pid, "status", field).unwrap_or(0) * 1024
}

/// The number of a `field: value` line (in kB for sizes) of /proc/<pid>/`file` (`status`,
/// `smaps_rollup`); `None` when the process is gone or the file has no such field.
pub fn proc_number(pid: i32, file: &str, field: &str) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/{file}")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// The CPU time `pids` use over `window`, as a percentage of one core each.
pub async fn cpu_percent(pids: &[i32], window: Duration) -> Vec<f64> {
    let before: Vec<Duration> = pids.iter().map(|&p| cpu_time(p)).collect();
    tokio::time::sleep(window).await;
    pids.iter()
        .zip(before)
        .map(|(&p, b)| 100.0 * cpu_time(p).saturating_sub(b).as_secs_f64() / window.as_secs_f64())
        .collect()
}

/// Milliseconds from `from` to `to` (negative when `to` came first).
pub fn ms_between(from: SystemTime, to: SystemTime) -> f64 {
    match to.duration_since(from) {
        Ok(d) => d.as_secs_f64() * 1e3,
        Err(e) => -e.duration().as_secs_f64() * 1e3,
    }
}

/// A small deterministic generator for the delays between kills (xorshift64*).
pub struct Jitter(u64);

impl Jitter {
    pub fn new(seed: u64) -> Self {
        Self(seed | 1)
    }

    /// Uniform in `[0, max)`.
    pub fn below(&mut self, max: Duration) -> Duration {
        max.mul_f64(self.unit())
    }

    /// One of `0..n` (0 when `n` is 0).
    pub fn pick(&mut self, n: usize) -> usize {
        ((n as f64 * self.unit()) as usize).min(n.saturating_sub(1))
    }

    /// Uniform in `[0, 1)`.
    fn unit(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let x = self.0.wrapping_mul(0x2545_F491_4F6C_DD1D);
        (x >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_stays_below_its_bound_and_spreads() {
        let mut jitter = Jitter::new(7);
        let max = Duration::from_millis(1000);
        let draws: Vec<_> = (0..1000).map(|_| jitter.below(max)).collect();
        assert!(draws.iter().all(|d| *d < max));
        assert!(draws.iter().any(|d| *d < max / 10));
        assert!(draws.iter().any(|d| *d > max * 9 / 10));
        let picks: Vec<_> = (0..1000).map(|_| jitter.pick(6)).collect();
        assert!((0..6).all(|i| picks.contains(&i)) && picks.iter().all(|&i| i < 6));
    }

    #[test]
    fn only_a_kernel_observation_of_a_death_is_a_kernel_death() {
        let line = |kind: &str, observation: &str| {
            serde_json::json!({"type": kind, "container_id": "c", "observations": [observation]})
                .to_string()
        };
        assert!(is_kernel_death(&line("KernelObservation", "ebpf:signal=9")));
        assert!(is_kernel_death(&line(
            "KernelObservation",
            "ebpf:exit_code=1"
        )));
        assert!(is_kernel_death(&line(
            "KernelObservation",
            "ebpf:oom_killed"
        )));
        assert!(!is_kernel_death(&line(
            "KernelObservation",
            "ebpf:exec=/bin/sleep"
        )));
        // The confirmed event carries the kernel's observation too: it is not one.
        assert!(!is_kernel_death(&line("ContainerDied", "ebpf:signal=9")));
        assert!(!is_kernel_death("not json"));
    }

    #[test]
    fn this_process_has_cpu_time_and_memory() {
        let pid = std::process::id() as i32;
        // Spins until the kernel counted a tick of it: 50 ms of wall time spun had none in a
        // busy suite (the other jobs had the cores).
        let deadline = Instant::now() + Duration::from_secs(10);
        while cpu_time(pid).is_zero() && Instant::now() < deadline {}
        assert!(cpu_time(pid) > Duration::ZERO);
        assert!(rss_bytes(pid) > 0);
    }

    #[tokio::test]
    async fn arrivals_wake_a_waiter_and_keep_the_first_instant() {
        let arrivals = Arc::new(Arrivals::default());
        let early = SystemTime::UNIX_EPOCH + Duration::from_secs(1);
        let writer = arrivals.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            writer.record("c", "ContainerDied", early);
            writer.record("c", "ContainerDied", SystemTime::now());
        });
        let at = arrivals
            .wait("c", "ContainerDied", Duration::from_secs(5))
            .await;
        assert_eq!(at, Some(early));
        assert_eq!(
            arrivals.wait("c", "other", Duration::from_millis(10)).await,
            None
        );
    }
}
