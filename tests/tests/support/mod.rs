//! plegd run in-process against the harness's containerd, its event lines read back as JSON.

#![allow(
    dead_code,
    reason = "each test file uses a different part of the support module"
)]

use std::{
    collections::{BTreeMap, HashMap},
    path::Path,
    time::Duration,
};

use plegd::{
    api::Shared,
    config::{Config, DEFAULT_SLOW_RELIST_PERIOD, Mode, OutputFormat, RunArgs},
    daemon::{self, Connected, Daemon},
    pleg::{DEFAULT_RELIST_THRESHOLD, Source},
    runtime::{RuntimeKind, RuntimeOptions},
    sources::status::{SourceRegistry, SourceState, SourceStatus},
};
use plegd_tests::{
    PrivateContainerd,
    cri::{ContainerSpec, Cri, Pod},
    native::Native,
    wait,
};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt as _, BufReader, DuplexStream, Lines};
use tokio_util::sync::CancellationToken;

/// A running plegd whose stdout is read line by line.
pub struct RunningPlegd {
    lines: Lines<BufReader<DuplexStream>>,
    pub shared: Shared,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
    /// Every event read so far, in order.
    pub events: Vec<Value>,
}

/// Room for plegd's output before its writer blocks: far more than a test that reads reads.
const OUTPUT_BUFFER: usize = 1 << 20;
/// How long a source may take to reach a state.
const STATE_DEADLINE: Duration = Duration::from_secs(30);
/// Longest a daemon takes to stop once shut down, in a VM without KVM on a loaded host too: a
/// shutdown that hangs fails its test, saying so, rather than the run's whole time budget.
const STOP_DEADLINE: Duration = Duration::from_secs(120);
/// Far longer than any test: with it, only the event streams (and reconnect relists) can be
/// fast.
pub const SLOW: Duration = Duration::from_secs(60);

/// Settings for a test daemon: fast relists, JSON output, polling only (no push sources, so
/// every event is the relist's own).
pub fn config(kind: RuntimeKind, socket: &Path, relist_period: Duration) -> Config {
    config_with_sources(kind, socket, relist_period, &[Source::Relist])
}

/// A CRI daemon whose only trigger source is the runtime event stream `source`, with full
/// relists [`SLOW`] apart whether the stream is healthy or not.
pub fn stream_only(socket: &Path, source: Source) -> Config {
    let mut settings = config_with_sources(RuntimeKind::Cri, socket, SLOW, &[source]);
    settings.slow_relist_period = SLOW;
    // The harness's private containerd has no other CRI events subscriber to take from: on
    // 1.6 and 1.7 the cri-events tests subscribe anyway.
    settings.allow_shared_cri_events = source == Source::CriEvents;
    settings
}

/// The state of `source` in `registry` (plegd's health), if it is there.
pub fn status_of(registry: &SourceRegistry, source: Source) -> Option<SourceStatus> {
    registry
        .snapshot()
        .into_iter()
        .find(|(s, _)| *s == source)
        .map(|(_, status)| status)
}

/// Waits until `source`'s status satisfies `want`, looking at each change of the registry, and
/// returns it.
pub async fn wait_state(
    registry: &SourceRegistry,
    source: Source,
    want: impl Fn(&SourceStatus) -> bool,
) -> SourceStatus {
    let mut changes = registry.changes();
    let reached = async {
        loop {
            // Marks the current version seen before looking: a change after the look wakes us.
            changes.borrow_and_update();
            if let Some(status) = status_of(registry, source).filter(&want) {
                return status;
            }
            changes
                .changed()
                .await
                .expect("the registry outlives its daemon");
        }
    };
    match tokio::time::timeout(STATE_DEADLINE, reached).await {
        Ok(status) => status,
        Err(_) => panic!(
            "{source:?} state not reached within {STATE_DEADLINE:?}; last: {:?}",
            status_of(registry, source)
        ),
    }
}

/// [`config`] with the given `--sources`.
pub fn config_with_sources(
    kind: RuntimeKind,
    socket: &Path,
    relist_period: Duration,
    sources: &[Source],
) -> Config {
    Config::load(&RunArgs {
        runtime: Some(kind),
        sources: Some(sources.to_vec()),
        runtime_endpoint: Some(socket.display().to_string()),
        relist_period: Some(relist_period),
        // plegd rejects a slow period shorter than the period.
        slow_relist_period: Some(relist_period.max(DEFAULT_SLOW_RELIST_PERIOD)),
        output: Some(OutputFormat::Json),
        namespaces: Some(vec!["k8s.io".into(), "plegd-native".into()]),
        // In-process daemons save no state between runs.
        state_dir: Some("none".into()),
        ..RunArgs::default()
    })
    .expect("valid test config")
}

/// A CRI daemon on `containerd` with `sources` as its push sources, in `mode`, relisting every
/// `period` (also while a push source is connected), JSON output, no saved state.
pub fn push_config(
    containerd: &PrivateContainerd,
    sources: &[Source],
    mode: Mode,
    period: Duration,
) -> Config {
    Config::load(&RunArgs {
        runtime: Some(RuntimeKind::Cri),
        runtime_endpoint: Some(containerd.socket().display().to_string()),
        sources: Some(sources.to_vec()),
        mode: Some(mode),
        relist_period: Some(period),
        slow_relist_period: Some(period),
        // Tests that make the relist slow look at the push sources, not at health.
        relist_threshold: Some(DEFAULT_RELIST_THRESHOLD.max(period.saturating_mul(2))),
        output: Some(OutputFormat::Json),
        // In-process daemons save no state between runs.
        state_dir: Some("none".into()),
        ..RunArgs::default()
    })
    .expect("valid test config")
}

/// The observations of an event line.
pub fn observations(event: &Value) -> Vec<String> {
    event["observations"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|o| o.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// Runs a sleeper named `name` in `pod` and waits (within `deadline`) for plegd's
/// `ContainerStarted` of it; returns its id.
pub async fn started_sleeper(
    plegd: &mut RunningPlegd,
    cri: &Cri,
    pod: &Pod,
    name: &str,
    deadline: Duration,
) -> String {
    let id = cri
        .run_container(pod, &ContainerSpec::sleeper(name))
        .await
        .unwrap();
    plegd
        .wait_container(&id, &["ContainerStarted"], deadline)
        .await;
    id
}

/// [`started_sleeper`], then its init killed with SIGKILL and its `ContainerDied` awaited;
/// returns its id.
pub async fn start_then_kill(
    plegd: &mut RunningPlegd,
    cri: &Cri,
    tasks: &Native,
    pod: &Pod,
    name: &str,
    deadline: Duration,
) -> String {
    let id = started_sleeper(plegd, cri, pod, name, deadline).await;
    tasks.kill_init(&id).await.unwrap();
    plegd
        .wait_container(&id, &["ContainerStarted", "ContainerDied"], deadline)
        .await;
    id
}

impl RunningPlegd {
    pub async fn start(config: Config) -> Self {
        Self::start_with_output_buffer(config, OUTPUT_BUFFER).await
    }

    /// plegd's logs go to the test's output, filtered by `RUST_LOG` (none without it).
    pub fn log_to_test_output() {
        if std::env::var_os("RUST_LOG").is_some() {
            log_with(tracing_subscriber::EnvFilter::from_default_env());
        }
    }

    /// [`RunningPlegd::log_to_test_output`] at `filter` when RUST_LOG says nothing: the test
    /// harness shows a test's output only when it fails, and a failure seen only in the busy
    /// suite then tells what plegd did.
    pub fn log_to_test_output_or(filter: &str) {
        log_with(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(filter)),
        );
    }

    /// [`RunningPlegd::start`] with room for only `bytes` of unread output: a test that does
    /// not read stalls plegd's output (its event consumer) once they are written.
    pub async fn start_with_output_buffer(config: Config, bytes: usize) -> Self {
        Self::connect_and_start(config, None, bytes).await
    }

    async fn connect_and_start(
        config: Config,
        listeners: Option<plegd::api::Listeners>,
        output_buffer: usize,
    ) -> Self {
        let shutdown = CancellationToken::new();
        let connected = daemon::connect(&config, &shutdown)
            .await
            .expect("runtime reachable")
            .expect("not shut down");
        Self::start_connected(connected, config, shutdown, listeners, output_buffer)
    }

    pub async fn start_with(
        connected: Connected,
        config: Config,
        shutdown: CancellationToken,
    ) -> Self {
        Self::start_connected(connected, config, shutdown, None, OUTPUT_BUFFER)
    }

    /// As `plegd run` does once the runtime is reached (the API served on `listeners`, if
    /// given), with stdout a pipe of `output_buffer` bytes.
    fn start_connected(
        connected: Connected,
        config: Config,
        shutdown: CancellationToken,
        listeners: Option<plegd::api::Listeners>,
        output_buffer: usize,
    ) -> Self {
        Self::log_to_test_output();
        // As `plegd run` does: the sources fitted to the runtime, from here on.
        let (config, plan) = connected
            .fit_sources(&config)
            .unwrap_or_else(|e| panic!("the sources fit the runtime: {e}"));
        let Connected {
            runtime, socket, ..
        } = connected;
        let ebpf = daemon::load_ebpf(&config).expect("eBPF loads where --mode ebpf asks for it");
        let push = daemon::PushSources {
            runtime_socket: Some(socket),
            ebpf,
            plan: Some(plan),
        };
        let (writer, reader) = tokio::io::duplex(output_buffer);
        let daemon =
            Daemon::start(runtime, push, listeners, &config, writer, ()).expect("daemon started");
        let shared = daemon.shared();
        let task = tokio::spawn(daemon.run(shutdown.clone()));
        Self {
            lines: BufReader::new(reader).lines(),
            shared,
            shutdown,
            task,
            events: Vec::new(),
        }
    }

    /// Waits until `count` push sources are connected, at most `timeout`.
    pub async fn wait_sources_connected(&self, count: usize, timeout: Duration) {
        let sources = self.shared.sources.clone();
        wait::until(&format!("{count} push sources connected"), timeout, || {
            let sources = sources.clone();
            async move {
                let connected = sources
                    .snapshot()
                    .iter()
                    .filter(|(_, s)| s.state == SourceState::Connected)
                    .count();
                anyhow::Ok((connected >= count).then_some(()))
            }
        })
        .await
        .unwrap();
    }

    /// Reads events until `done` holds over everything read so far, or fails at the deadline
    /// with what was read.
    pub async fn read_until(
        &mut self,
        what: &str,
        timeout: Duration,
        done: impl Fn(&[Value]) -> bool,
    ) {
        let deadline = tokio::time::Instant::now() + timeout;
        while !done(&self.events) {
            let line = tokio::time::timeout_at(deadline, self.lines.next_line())
                .await
                .unwrap_or_else(|_| {
                    panic!(
                        "timed out after {timeout:?} waiting for {what}; events: {:#?}",
                        self.events
                    )
                })
                .expect("reading plegd output")
                .expect("plegd output open");
            self.events.push(
                serde_json::from_str(&line)
                    .unwrap_or_else(|e| panic!("bad event line {line:?}: {e}")),
            );
        }
    }

    /// Waits until `container` has had exactly the event types `expected` (more would fail
    /// the final check of the test, not this wait).
    pub async fn wait_container(&mut self, container: &str, expected: &[&str], timeout: Duration) {
        let what = format!("{container}: {expected:?}");
        self.read_until(&what, timeout, |events| {
            types_of(events, container).len() >= expected.len()
        })
        .await;
        assert_eq!(
            types_of(&self.events, container),
            expected,
            "events of {container}"
        );
    }

    /// The last event of `container`.
    pub fn last_of(&self, container: &str) -> &Value {
        self.events
            .iter()
            .rev()
            .find(|e| e["container_id"] == container)
            .unwrap_or_else(|| panic!("no event for {container}"))
    }

    /// Reads whatever plegd prints during `settle` (absence of extra events can only be seen
    /// over time: a few relist periods).
    pub async fn drain(&mut self, settle: Duration) {
        let deadline = tokio::time::Instant::now() + settle;
        while let Ok(line) = tokio::time::timeout_at(deadline, self.lines.next_line()).await {
            let line = line
                .expect("reading plegd output")
                .expect("plegd output open");
            self.events
                .push(serde_json::from_str(&line).expect("event line"));
        }
    }

    /// Every metric's series and value, as `/metrics` would serve them now.
    pub fn metrics(&self) -> BTreeMap<String, f64> {
        parse_metrics(
            &self
                .shared
                .metrics
                .encode_as(plegd::base::metrics::Format::OpenMetrics),
        )
    }

    /// Shuts the daemon down, reading (and dropping) whatever output it still writes so one
    /// whose output a test left unread can finish.
    pub async fn stop(self) {
        let Self {
            mut lines,
            shutdown,
            task,
            ..
        } = self;
        shutdown.cancel();
        let drain = async { while let Ok(Some(_)) = lines.next_line().await {} };
        let (result, ()) = tokio::time::timeout(STOP_DEADLINE, async { tokio::join!(task, drain) })
            .await
            .unwrap_or_else(|_| {
                panic!("plegd did not stop within {STOP_DEADLINE:?} of its shutdown")
            });
        result.expect("daemon task").expect("daemon output");
    }
}

/// The event types of one container, in order.
pub fn types_of(events: &[Value], container: &str) -> Vec<String> {
    events
        .iter()
        .filter(|e| e["container_id"] == container)
        .map(|e| e["type"].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// Every container's event types, for the final "nothing else happened" check.
pub fn types_by_container(events: &[Value]) -> HashMap<String, Vec<String>> {
    let mut by = HashMap::<String, Vec<String>>::new();
    for event in events {
        by.entry(
            event["container_id"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
        )
        .or_default()
        .push(event["type"].as_str().unwrap_or_default().to_owned());
    }
    by
}

/// The options `daemon::connect` would use, for tests that connect by hand.
pub fn runtime_options(config: &Config) -> RuntimeOptions {
    RuntimeOptions {
        call_timeout: config.runtime_timeout,
        namespaces: config.namespaces.clone(),
        ..RuntimeOptions::default()
    }
}

/// The API of a test daemon: the plegd.v1 socket (in its own temp dir) and the metrics
/// address.
pub struct ServedApi {
    pub socket: std::path::PathBuf,
    pub metrics: std::net::SocketAddr,
    /// The TLS listener's address, when the config asked for one.
    pub tcp: Option<std::net::SocketAddr>,
    _dir: tempfile::TempDir,
}

impl ServedApi {
    /// A client of the plegd.v1 API.
    pub async fn client(
        &self,
    ) -> plegd_proto::v1::pleg_client::PlegClient<tonic::transport::Channel> {
        plegd::api::client::connect(&self.socket)
            .await
            .expect("API socket answers")
    }

    /// Checks that the servers stopped with the daemon ([`RunningPlegd::stop`], which fails
    /// if they did not stop cleanly): the socket is gone.
    pub fn stopped(self) {
        assert!(
            !self.socket.exists(),
            "{}: the API's socket is removed when the daemon stops",
            self.socket.display()
        );
    }
}

impl RunningPlegd {
    /// Starts a daemon as [`RunningPlegd::start`] does, serving its API as `plegd run` does:
    /// on a socket in a fresh temp dir (`run/plegd.sock`, so the directory is created) and
    /// metrics on a free port of 127.0.0.1.
    pub async fn start_serving_api(mut config: Config) -> (Self, ServedApi) {
        let dir = tempfile::tempdir().expect("temp dir");
        config.socket = dir.path().join("run/plegd.sock");
        config.metrics_address = Some("127.0.0.1:0".parse().expect("address"));
        let listeners = plegd::api::Listeners::bind(&config).expect("API listeners bound");
        let metrics = listeners.metrics_address().expect("metrics bound");
        let tcp = listeners.tcp_address();
        let socket = config.socket.clone();
        let plegd = Self::connect_and_start(config, Some(listeners), OUTPUT_BUFFER).await;
        let api = ServedApi {
            socket,
            metrics,
            tcp,
            _dir: dir,
        };
        (plegd, api)
    }
}

/// Parses OpenMetrics text into `series -> value`, failing on any malformed line.
pub fn parse_metrics(text: &str) -> BTreeMap<String, f64> {
    let mut values = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let (series, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("bad line {line:?}"));
        let value: f64 = value
            .parse()
            .unwrap_or_else(|_| panic!("bad value in {line:?}"));
        values.insert(series.to_owned(), value);
    }
    assert!(
        text.ends_with("# EOF\n"),
        "OpenMetrics text ends with # EOF"
    );
    values
}

/// A plain HTTP/1.1 response: status code, `Content-Type` (empty without one), body.
pub struct HttpResponse {
    pub code: u16,
    pub content_type: String,
    pub body: String,
}

/// GET `path` over plain HTTP/1.1, with `accept` as the Accept header if given.
pub async fn http_get(
    address: std::net::SocketAddr,
    path: &str,
    accept: Option<&str>,
) -> HttpResponse {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
    let accept = accept.map_or(String::new(), |a| format!("Accept: {a}\r\n"));
    let request =
        format!("GET {path} HTTP/1.1\r\nHost: plegd\r\n{accept}Connection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    tokio::time::timeout(STATE_DEADLINE, stream.read_to_string(&mut response))
        .await
        .expect("HTTP answer in time")
        .unwrap();
    let (head, body) = response.split_once("\r\n\r\n").expect("HTTP response");
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .expect("status code");
    let content_type = head
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("content-type")
                .then(|| value.trim().to_owned())
        })
        .unwrap_or_default();
    HttpResponse {
        code,
        content_type,
        body: body.to_owned(),
    }
}

/// Says on stderr, past the test harness's capture (which takes only `eprintln!`), that `test`
/// skips and why: a skipped test still counts as passed.
pub fn skip(test: &str, why: &str) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr(), "skipping {test}: {why}");
}

/// Whether the running containerd streams CRI container events; says why a test skips if not.
pub fn has_cri_events(containerd: &PrivateContainerd, test: &str) -> bool {
    let version = containerd.version();
    let has = version.has_cri_container_events();
    if !has {
        skip(
            test,
            &format!(
                "containerd {version} does not implement CRI GetContainerEvents (run with \
                 PLEGD_TEST_CONTAINERD=1.7 or 2.1)"
            ),
        );
    }
    has
}

/// `plegd watch --output json` with `args` against `socket`: its lines as they come.
pub struct WatchLines {
    lines: tokio::sync::mpsc::UnboundedReceiver<String>,
    _watcher: plegd_tests::process::Terminating,
}

impl WatchLines {
    pub fn spawn(socket: &Path, args: &[&str]) -> Self {
        use std::io::BufRead as _;
        let mut child = std::process::Command::new(plegd_tests::process::plegd_binary().unwrap())
            .arg("watch")
            .arg("--socket")
            .arg(socket)
            .args(["--output", "json"])
            .args(args)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("plegd watch starts");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, lines) = tokio::sync::mpsc::unbounded_channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
            {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Self {
            lines,
            _watcher: plegd_tests::process::Terminating(child),
        }
    }

    /// The next line, parsed, within `deadline`.
    pub async fn next(&mut self, deadline: Duration) -> Value {
        let line = tokio::time::timeout(deadline, self.lines.recv())
            .await
            .expect("a line in time")
            .expect("plegd watch alive");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"))
    }

    /// Lines until one satisfies `done`, within `deadline` each; the last.
    pub async fn until(
        &mut self,
        deadline: Duration,
        mut done: impl FnMut(&Value) -> bool,
    ) -> Value {
        loop {
            let line = self.next(deadline).await;
            if done(&line) {
                return line;
            }
        }
    }
}

/// Sends plegd's logs at `filter` to the test's output. Another test of the binary may have
/// set it up already: the first one stands.
fn log_with(filter: tracing_subscriber::EnvFilter) {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_test_writer()
        .try_init();
}
