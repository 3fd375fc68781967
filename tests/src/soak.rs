//! The churn audit's runner: container lifecycles by the hundred against a `plegd run` process,
//! a `plegd watch --output json` process recording what it receives, ground truth from what the
//! harness did and from CRI, and the [`audit`](crate::audit) checker's report. Behind
//! `cargo xtask soak` and tests/tests/soak.rs.
//!
//! Each lifecycle is: create, start, then one of kill -9, exit with a code, OOM kill, a 0.1 s
//! run, a CRI stop, its whole pod stopped; then CRI's last word on it (`ContainerStatus`) and
//! removal. Pods of every pid-namespace mode share the lifecycles; a lifecycle that stops its
//! pod has a pod of its own. Lifecycles start alone or in bursts of [`BURST`], after random
//! pauses, all drawn from one seed; or, with [`Plan::in_flight`] K, K at once from the start,
//! a new one as each ends (the shape issue 52 measured, see [`crate::churn`]). plegd reads the
//! runtime through the backend [`Plan::runtime`] names.

use std::{
    path::{Path, PathBuf},
    str::FromStr,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant, SystemTime},
};

use anyhow::{Context as _, bail};
use k8s_cri::v1::{ContainerState, ContainerStatus};
use nix::sys::signal::Signal;

use crate::{
    Node,
    abuse::{self, Abuse},
    audit::{self, Action, Exit, Folding, Polled, Report, Timing, Truth},
    bench::{Birth, Jitter, Plegd, metric_at},
    containerd::CRI_NAMESPACE,
    cri::{ContainerSpec, Cri, PidMode, Pod},
    native::Native,
    pki::Pki,
    proxy::MutingProxy,
    wait::until,
};

/// Lifecycles started at once in a burst.
pub const BURST: usize = 20;
/// Lifecycles in flight at most: beyond it, a burst waits for earlier ones to end.
const IN_FLIGHT: usize = 40;
/// Long-lived pods per pid-namespace mode.
pub(crate) const PODS_PER_MODE: usize = 2;
/// The relist period of the polling mode.
const POLLING_PERIOD: Duration = Duration::from_secs(1);
/// What polling mode's folding window adds to its relist period: the time a relist takes on
/// a loaded node.
const RELIST_MARGIN: Duration = Duration::from_millis(500);
/// Longest wait for one step of the runtime (an exit to be recorded, a call to answer).
const STEP: Duration = Duration::from_secs(30);
/// Tries of a lifecycle's start the runtime failed ([`started`]), and the pause between them.
const START_TRIES: u32 = 3;
const START_BACKOFF: Duration = Duration::from_millis(500);

/// How plegd runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// eBPF hints only (no event stream; full relists every 10 s: the kernel sees nothing when
    /// the runtime removes an exited container, so only a full relist finds the removal).
    Ebpf,
    /// containerd's event stream only (full relists every 300 s).
    Events,
    /// Every source, default settings.
    Default,
    /// No push source: a full relist every second.
    Polling,
}

impl Mode {
    pub const ALL: [Mode; 4] = [Self::Ebpf, Self::Events, Self::Default, Self::Polling];

    pub fn key(self) -> &'static str {
        match self {
            Self::Ebpf => "ebpf",
            Self::Events => "events",
            Self::Default => "default",
            Self::Polling => "polling",
        }
    }

    /// `plegd run` arguments.
    pub fn args(self) -> Vec<String> {
        let slow = crate::bench::PUSH_ONLY_PERIODS;
        let ebpf_periods = [
            "--relist-period",
            "10s",
            "--slow-relist-period",
            "10s",
            "--relist-threshold",
            "1m",
        ];
        let args: Vec<&str> = match self {
            Self::Ebpf => [&["--mode", "ebpf", "--sources", "ebpf"][..], &ebpf_periods].concat(),
            Self::Events => [&["--sources", "containerd"][..], &slow].concat(),
            Self::Default => Vec::new(),
            Self::Polling => vec!["--mode", "polling", "--relist-period", "1s"],
        };
        args.into_iter().map(str::to_owned).collect()
    }

    /// The foldings this mode allows (see [`audit`]): a relist period and the time a relist
    /// takes on a loaded node in polling mode; the time a hint takes to become a relist under
    /// bursts of churn on a small node otherwise.
    pub fn folding(self) -> Folding {
        Folding {
            outage: None,
            polled: None,
            window: match self {
                Self::Polling => POLLING_PERIOD + RELIST_MARGIN,
                Self::Ebpf | Self::Events | Self::Default => Duration::from_millis(500),
            },
        }
    }
}

impl FromStr for Mode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|m| m.key() == s)
            .ok_or_else(|| format!("unknown mode {s:?} (ebpf, events, default, polling)"))
    }
}

/// Which runtime API plegd reads (`plegd run --runtime`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Runtime {
    /// CRI (plegd's default).
    #[default]
    Cri,
    /// containerd's own API.
    Containerd,
}

impl Runtime {
    pub const ALL: [Runtime; 2] = [Self::Cri, Self::Containerd];

    pub fn key(self) -> &'static str {
        match self {
            Self::Cri => "cri",
            Self::Containerd => "containerd",
        }
    }
}

impl FromStr for Runtime {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|r| r.key() == s)
            .ok_or_else(|| format!("unknown runtime {s:?} (cri, containerd)"))
    }
}

/// Lifecycles audited of those attempted, at least: a run that could complete fewer (runtime
/// calls failing under its load) says too little, and fails; but for a containerd killed on
/// purpose, whose restart the harness's calls in flight do not survive.
pub const AUDITED_SHARE: f64 = 0.95;

/// What goes wrong halfway through the churn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// containerd SIGKILLed and started again on the same state.
    ContainerdRestart,
    /// plegd SIGKILLed and started again: a new run, the watcher resyncs.
    PlegdKill,
    /// plegd SIGTERMed and started again on its saved state: the same run continues.
    PlegdTerm,
    /// plegd's eBPF ring buffer one page small (`--ebpf-ring-bytes`) and an exec storm in
    /// containers of a pod of their own: kernel events are lost and counted, and full relists
    /// follow.
    RingOverflow,
    /// containerd SIGSTOPped for [`HANG`], then SIGCONTed: every runtime call hangs meanwhile,
    /// and containers exit without containerd hearing of it.
    ContainerdHang,
    /// plegd's containerd event connection held silent for [`SILENCE`] while containerd runs
    /// on (a [`MutingProxy`] holds back what containerd writes on it): its heartbeat finds it
    /// silent, and full relists run at the fast period until it reconnects.
    SilentStream,
}

/// How long [`Fault::ContainerdHang`] freezes containerd.
const HANG: Duration = Duration::from_secs(4);
/// How long [`Fault::SilentStream`] keeps the stream silent at least (then until two fast
/// full relists ran).
const SILENCE: Duration = Duration::from_secs(4);
/// `--event-heartbeat` under [`Fault::SilentStream`]: silence found within about two.
const HEARTBEAT: &str = "1s";
/// Containers of the exec storm, and their execs each.
const STORMS: usize = 4;
const STORM_EXECS: u32 = 3000;

impl Fault {
    pub const ALL: [Fault; 6] = [
        Self::ContainerdRestart,
        Self::PlegdKill,
        Self::PlegdTerm,
        Self::RingOverflow,
        Self::ContainerdHang,
        Self::SilentStream,
    ];

    pub fn key(self) -> &'static str {
        match self {
            Self::ContainerdRestart => "containerd-restart",
            Self::PlegdKill => "plegd-kill",
            Self::PlegdTerm => "plegd-term",
            Self::RingOverflow => "ring-overflow",
            Self::ContainerdHang => "containerd-hang",
            Self::SilentStream => "silent-stream",
        }
    }

    /// Whether the fault means anything in `mode`: a ring needs the eBPF probes, a silent
    /// stream containerd's event stream.
    pub fn applies_to(self, mode: Mode) -> bool {
        match self {
            Self::RingOverflow => matches!(mode, Mode::Ebpf | Mode::Default),
            Self::SilentStream => matches!(mode, Mode::Events | Mode::Default),
            Self::ContainerdRestart | Self::PlegdKill | Self::PlegdTerm | Self::ContainerdHang => {
                true
            }
        }
    }
}

impl FromStr for Fault {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL.into_iter().find(|f| f.key() == s).ok_or_else(|| {
            let keys: Vec<&str> = Self::ALL.into_iter().map(Self::key).collect();
            format!("unknown fault {s:?} ({})", keys.join(", "))
        })
    }
}

/// One soak run.
#[derive(Clone, Debug)]
pub struct Plan {
    pub mode: Mode,
    pub fault: Option<Fault>,
    /// Lifecycles to run (at least).
    pub lifecycles: usize,
    /// Keep starting lifecycles until this much time has passed, if it is longer.
    pub duration: Duration,
    pub seed: u64,
    /// Hostile and careless clients on its API from the first lifecycle to the last
    /// ([`crate::abuse`]), plegd born with a unit's 1,024 descriptors and its TLS listener on.
    pub abuse: bool,
    /// K lifecycles in flight from the start, a new one as each ends, no pauses; `None`:
    /// bursts after random pauses.
    pub in_flight: Option<usize>,
    /// The backend plegd reads the runtime with.
    pub runtime: Runtime,
}

/// What a soak run found.
#[derive(Debug)]
pub struct Outcome {
    pub report: Report,
    pub elapsed: Duration,
    /// Lifecycles started (the report audits those that completed).
    pub attempted: usize,
    /// Lifecycles the harness could not complete (a runtime call failed, e.g. during a
    /// containerd restart): not audited.
    pub abandoned: Vec<String>,
    /// What the fault measured of itself (losses counted, silence found after ...).
    pub notes: Vec<String>,
    pub abuse: Option<abuse::Report>,
}

/// One lifecycle, drawn before it runs.
#[derive(Clone, Debug)]
pub(crate) struct Draw {
    name: String,
    action: Action,
    /// How long it runs before the harness ends it.
    runs: Duration,
    /// How long it stays exited before removal.
    lingers: Duration,
    /// Which long-lived pod (ignored by [`Action::StopPod`], which gets its own).
    pub(crate) pod: usize,
    pid_mode: PidMode,
}

impl Draw {
    pub(crate) fn new(n: usize, jitter: &mut Jitter) -> Self {
        let action = match jitter.pick(6) {
            0 => Action::Kill,
            1 => Action::Exit(1 + jitter.pick(120) as u8),
            2 => Action::Oom,
            3 => Action::Brief,
            4 => Action::Stop,
            _ => Action::StopPod,
        };
        let pod = jitter.pick(PidMode::ALL.len() * PODS_PER_MODE);
        Self {
            name: format!("c{n}"),
            action,
            runs: Duration::from_millis(50) + jitter.below(Duration::from_millis(1500)),
            lingers: jitter.below(Duration::from_millis(2000)),
            pod,
            pid_mode: PidMode::ALL[pod % PidMode::ALL.len()],
        }
    }

    /// The same lifecycle in the shape issue 52 measured: ended as soon as it runs, removed
    /// as soon as CRI shows it exited (its ending and pod as drawn).
    fn at_once(self) -> Self {
        Self {
            runs: Duration::ZERO,
            lingers: Duration::ZERO,
            ..self
        }
    }

    fn spec(&self) -> ContainerSpec {
        let runs = self.runs.as_secs_f64();
        match self.action {
            Action::Kill | Action::Stop | Action::StopPod => ContainerSpec::sleeper(&self.name),
            Action::Exit(code) => {
                ContainerSpec::shell(&self.name, &format!("sleep {runs:.2}; exit {code}"))
            }
            Action::Oom => ContainerSpec::oom(&self.name),
            Action::Brief => ContainerSpec::shell(&self.name, "sleep 0.1"),
        }
    }
}

/// Runs `plan` on `node` with the `plegd` at `binary`, its files under `dir`.
pub async fn run(node: &Node, binary: &Path, dir: &Path, plan: &Plan) -> anyhow::Result<Outcome> {
    let began = Instant::now();
    if let Some(fault) = plan.fault
        && !fault.applies_to(plan.mode)
    {
        bail!(
            "fault {} does not apply to mode {}",
            fault.key(),
            plan.mode.key()
        );
    }
    std::fs::create_dir_all(dir)?;
    let proxy = match plan.fault {
        Some(Fault::SilentStream) => Some(MutingProxy::start(
            dir,
            node.containerd.socket(),
            crate::proxy::EVENT_STREAM,
        )?),
        _ => None,
    };
    let mut args = plegd_args(plan, dir, proxy.as_ref())?;
    let (birth, target) = if plan.abuse {
        let (tls_args, target) = abuse_target(dir)?;
        args.extend(tls_args);
        (
            Birth {
                nofile: Some(UNIT_NOFILE),
                ..Birth::default()
            },
            Some(target),
        )
    } else {
        (Birth::default(), None)
    };
    let mut plegd = Plegd::start_born(
        binary,
        &node.containerd,
        dir,
        &args,
        std::process::Stdio::null(),
        birth,
    )?;
    let watch = plegd.watch_from_start()?;
    let prefix = format!("soak-{}-{:x}", plan.mode.key(), plan.seed);
    let mut pods = Vec::new();
    for (i, pid_mode) in PidMode::ALL
        .iter()
        .cycle()
        .take(PidMode::ALL.len() * PODS_PER_MODE)
        .enumerate()
    {
        pods.push(
            node.cri
                .run_pod_in(&format!("{prefix}-{i}"), *pid_mode)
                .await?,
        );
    }

    // The clients lifecycles start with: a containerd restart breaks their connections, so
    // later lifecycles get new ones (those in flight then may fail: abandoned, not audited).
    let mut clients = (node.cri.clone(), node.tasks.clone());
    let mut jitter = Jitter::new(plan.seed);
    let mut lifecycles = tokio::task::JoinSet::new();
    let mut results = Vec::new();
    let mut n = 0;
    let mut faulted = false;
    let (mut outage, mut polled) = (None, None);
    let mut notes = Vec::new();
    let mut losses = None;
    let run_began = SystemTime::now();
    let abuse = match target {
        Some(target) => Some(
            Abuse::start(
                abuse::Target {
                    pid: plegd.pid(),
                    metrics: plegd.metrics,
                    ..target
                },
                &abuse::Scale::default(),
            )
            .await?,
        ),
        None => None,
    };
    while n < plan.lifecycles || began.elapsed() < plan.duration {
        let (burst, limit) = match plan.in_flight {
            Some(k) => (1, k.max(1)),
            None => (if jitter.pick(4) == 0 { BURST } else { 1 }, IN_FLIGHT),
        };
        while lifecycles.len() + burst > limit {
            results.extend(lifecycles.join_next().await);
        }
        for _ in 0..burst {
            let draw = Draw::new(n, &mut jitter);
            let draw = if plan.in_flight.is_some() {
                draw.at_once()
            } else {
                draw
            };
            let pod = pods[draw.pod].clone();
            let (cri, tasks, prefix) = (clients.0.clone(), clients.1.clone(), prefix.clone());
            lifecycles.spawn(async move {
                let name = draw.name.clone();
                lifecycle(&cri, &tasks, &pod, &prefix, draw)
                    .await
                    .with_context(|| format!("lifecycle {name}"))
            });
            n += 1;
        }
        if let Some(fault) = plan.fault
            && !faulted
            && n >= plan.lifecycles / 2
        {
            faulted = true;
            let injection = Injection {
                node,
                mode: plan.mode,
                plegd: &mut plegd,
                proxy: proxy.as_ref(),
                prefix: &prefix,
            };
            let injected = injection.inject(fault).await?;
            (outage, polled) = (injected.outage, injected.polled);
            notes.extend(injected.notes);
            pods.extend(injected.pod);
            losses = injected.losses;
            if plan.fault == Some(Fault::ContainerdRestart) {
                clients = (
                    Cri::connect(&node.containerd).await?,
                    Native::connect_in(&node.containerd, CRI_NAMESPACE).await?,
                );
            }
        }
        // With K in flight, the next starts as soon as one ends.
        if plan.in_flight.is_none() {
            tokio::time::sleep(jitter.below(Duration::from_millis(300))).await;
        }
    }
    while let Some(result) = lifecycles.join_next().await {
        results.push(result);
    }
    let abuse = match abuse {
        Some(abuse) => Some(abuse.stop().await?),
        None => None,
    };
    let mut truths = Vec::new();
    let mut abandoned = Vec::new();
    for result in results {
        match result {
            Ok(Ok(truth)) => truths.push(truth),
            Ok(Err(e)) => abandoned.push(format!("{e:#}")),
            Err(e) => abandoned.push(e.to_string()),
        }
    }

    await_quiet(&plegd, &watch, &truths).await;
    if let Some(losses) = losses {
        let (span, note) = losses.span(run_began).await?;
        polled = Some(span);
        notes.push(note);
    }
    let records = watch.records();
    let folding = Folding {
        outage,
        polled,
        ..plan.mode.folding()
    };
    let report = audit::check(&truths, &records, folding);
    // Beside plegd's log, for a report that needs explaining.
    std::fs::write(
        dir.join("audit.txt"),
        format!("{truths:#?}\n{records:#?}\n"),
    )?;
    watch.stop();
    plegd.stop();
    for pod in &pods {
        let _ = clients.0.remove_pod(pod).await;
    }
    Ok(Outcome {
        report,
        elapsed: began.elapsed(),
        attempted: n,
        abandoned,
        notes,
        abuse,
    })
}

/// RLIMIT_NOFILE of a unit that sets no `LimitNOFILE` (systemd's soft default), here hard too:
/// plegd cannot raise it, the harshest case.
const UNIT_NOFILE: u64 = 1_024;

/// `plegd run`'s flags for a TLS listener on a free loopback port, and the abuse's view of it
/// (its pid is filled in once it runs).
fn abuse_target(dir: &Path) -> anyhow::Result<(Vec<String>, abuse::Target)> {
    let pki = Pki::new("plegd soak CA")?;
    let tls = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let args = pki.listener_args(dir, &tls.to_string())?;
    let client = pki.leaf(&["careless"], rcgen::ExtendedKeyUsagePurpose::ClientAuth)?;
    Ok((
        args,
        abuse::Target {
            pid: 0,
            socket: dir.join("plegd.sock"),
            tls,
            metrics: tls,
            ca_pem: pki.ca_pem.clone(),
            client,
        },
    ))
}

/// `plegd run` arguments of `plan`: its mode's, and what its fault needs.
fn plegd_args(plan: &Plan, dir: &Path, proxy: Option<&MutingProxy>) -> anyhow::Result<Vec<String>> {
    let mut args = plan.mode.args();
    set(&mut args, "--runtime", plan.runtime.key());
    match plan.fault {
        Some(Fault::PlegdTerm) => set(&mut args, "--state-dir", dir.join("state").display()),
        Some(Fault::RingOverflow) => {
            let page = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)?
                .context("no page size")?;
            set(&mut args, "--ebpf-ring-bytes", page);
        }
        Some(Fault::SilentStream) => {
            let proxy = proxy.context("a silent stream needs the proxy")?;
            set(&mut args, "--runtime-endpoint", proxy.socket.display());
            set(&mut args, "--event-heartbeat", HEARTBEAT);
            // What a silent stream falls back to (the slow period stays the mode's).
            set(
                &mut args,
                "--relist-period",
                POLLING_PERIOD.as_secs().to_string() + "s",
            );
        }
        Some(Fault::ContainerdRestart | Fault::PlegdKill | Fault::ContainerdHang) | None => {}
    }
    Ok(args)
}

/// Gives `flag` the value `value` in `args`, in place if it is there already.
fn set(args: &mut Vec<String>, flag: &str, value: impl ToString) {
    let value = value.to_string();
    match args.iter().position(|a| a == flag) {
        Some(i) => args[i + 1] = value,
        None => args.extend([flag.to_owned(), value]),
    }
}

const DROPS: &str = "plegd_ringbuf_drops_total";
const FULL_RELISTS: &str = "plegd_relists_total{scope=\"full\"}";
/// When plegd's last successful full relist began (Unix seconds).
const LAST_FULL_RELIST: &str = "kubelet_pleg_last_seen_seconds";
const SILENT_STREAMS: &str = "plegd_silent_streams_total";

/// What a fault is done with.
struct Injection<'a> {
    node: &'a Node,
    mode: Mode,
    plegd: &'a mut Plegd,
    proxy: Option<&'a MutingProxy>,
    prefix: &'a str,
}

/// A restart of plegd from `down` until its push sources are `connected` again: what they said
/// then is lost, so what changed then is found by the restarted plegd's full relists alone, a
/// second apart, and by the full relist each source's connect asks for ([`Folding::polled`]).
/// plegd is healthy (its first full relist read) before its containerd stream is connected: a
/// start published in between reaches no subscription of plegd's.
pub fn polled_across_a_restart(down: SystemTime, connected: SystemTime) -> Polled {
    Polled {
        from: down,
        to: connected,
        window: POLLING_PERIOD + RELIST_MARGIN,
    }
}

/// From `from` to `to`, in seconds (zero if `to` came first).
fn seconds(from: SystemTime, to: SystemTime) -> f64 {
    to.duration_since(from).unwrap_or_default().as_secs_f64()
}

/// What injecting a fault left.
#[derive(Default)]
struct Injected {
    /// When plegd could not follow the runtime (see [`Folding::outage`]).
    outage: Option<(SystemTime, SystemTime)>,
    /// When plegd followed it by full relists alone (see [`Folding::polled`]).
    polled: Option<Polled>,
    /// What the fault measured of itself.
    notes: Vec<String>,
    /// A pod of the fault's own, to remove at the end.
    pod: Option<Pod>,
    /// Kernel losses, sampled until the end of the run (they give the polled span then).
    losses: Option<LossSampler>,
}

impl Injection<'_> {
    async fn inject(self, fault: Fault) -> anyhow::Result<Injected> {
        let down = SystemTime::now();
        match fault {
            Fault::ContainerdRestart => return self.restart_containerd(down).await,
            Fault::PlegdKill => self.plegd.restart(Signal::SIGKILL)?,
            Fault::PlegdTerm => self.plegd.restart(Signal::SIGTERM)?,
            Fault::ContainerdHang => self.hang().await?,
            Fault::SilentStream => return self.silence().await,
            // The polled span is known once the losses stopped, at the end of the run.
            Fault::RingOverflow => {
                let (pod, losses) = self.storm().await?;
                return Ok(Injected {
                    pod: Some(pod),
                    losses: Some(losses),
                    ..Injected::default()
                });
            }
        }
        let up = SystemTime::now();
        let mut injected = Injected {
            outage: Some((down, up)),
            ..Injected::default()
        };
        if matches!(fault, Fault::PlegdKill | Fault::PlegdTerm) {
            let plegd = &*self.plegd;
            let connected = until("plegd's push sources connected again", STEP, || async {
                anyhow::Ok(plegd.sources_connected()?.then(SystemTime::now))
            })
            .await?;
            injected.polled = Some(polled_across_a_restart(down, connected));
            injected.notes.push(format!(
                "plegd healthy {:.2} s after it was stopped, its push sources connected {:.2} s \
                 after that",
                seconds(down, up),
                seconds(up, connected)
            ));
        }
        Ok(injected)
    }

    /// Kills containerd and starts it again. Its event stream breaks with it and replays
    /// nothing: where the stream is plegd's only push source (full relists minutes apart),
    /// plegd cannot follow the runtime until its first full relist of the new containerd,
    /// which the stream's reconnect schedules after its backoff; a container that exited then
    /// and was removed before that relist left no status to read its exit from. Elsewhere
    /// plegd follows it again once it answers: kernel hints read it, or polling does.
    async fn restart_containerd(&self, down: SystemTime) -> anyhow::Result<Injected> {
        let gone = self.node.containerd.crash_and_restart().await?;
        let up = SystemTime::now();
        if self.mode != Mode::Events {
            return Ok(Injected {
                outage: Some((down, up)),
                ..Injected::default()
            });
        }
        let plegd = &*self.plegd;
        let relisted = until(
            "plegd's first full relist of the new containerd",
            STEP,
            || async {
                let began = SystemTime::UNIX_EPOCH
                    + Duration::try_from_secs_f64(plegd.metric(LAST_FULL_RELIST)?)?;
                anyhow::Ok((began > gone).then_some(began))
            },
        )
        .await?;
        Ok(Injected {
            outage: Some((down, relisted.max(up))),
            notes: vec![format!(
                "containerd answered {:.1} s after the kill; plegd's first full relist of it \
                 began {:.1} s after that",
                seconds(down, up),
                seconds(up, relisted)
            )],
            ..Injected::default()
        })
    }

    /// Freezes containerd for [`HANG`].
    async fn hang(&self) -> anyhow::Result<()> {
        let pid = self
            .node
            .containerd
            .pid()
            .context("containerd is not running")?;
        let pid = nix::unistd::Pid::from_raw(pid);
        nix::sys::signal::kill(pid, Signal::SIGSTOP)?;
        tokio::time::sleep(HANG).await;
        nix::sys::signal::kill(pid, Signal::SIGCONT)?;
        Ok(())
    }

    /// Mutes plegd's event stream until plegd found it silent and ran two full relists since,
    /// [`SILENCE`] at least; unmutes it and waits for it to be connected again. plegd cannot
    /// follow the runtime from the mute to its first fast full relist (the outage); the fast
    /// relists follow it from then on until the stream is back (polled).
    async fn silence(&self) -> anyhow::Result<Injected> {
        let proxy = self.proxy.context("a silent stream needs the proxy")?;
        let plegd = &*self.plegd;
        let silent_before = plegd.metric(SILENT_STREAMS)?;
        let (muted, down) = (Instant::now(), SystemTime::now());
        proxy.mute(true);
        until(&format!("{SILENT_STREAMS} grows"), STEP, || async {
            anyhow::Ok((plegd.metric(SILENT_STREAMS)? > silent_before).then_some(()))
        })
        .await?;
        let found = muted.elapsed();
        let full_at_found = plegd.metric(FULL_RELISTS)?;
        let relists = |n: f64| {
            until("full relists while silent", STEP, move || async move {
                anyhow::Ok((plegd.metric(FULL_RELISTS)? >= full_at_found + n).then_some(()))
            })
        };
        relists(1.0).await?;
        let up = SystemTime::now();
        relists(2.0).await?;
        let relisted = muted.elapsed();
        tokio::time::sleep(SILENCE.saturating_sub(relisted)).await;
        proxy.mute(false);
        until("the stream connected again", STEP, || async {
            anyhow::Ok((plegd.source_state("containerd")? == "connected").then_some(()))
        })
        .await?;
        let note = format!(
            "stream found silent {:.1} s after it went quiet (heartbeat {HEARTBEAT}); two full \
             relists {:.1} s after that; reconnected {:.1} s after the silence began",
            found.as_secs_f64(),
            (relisted - found).as_secs_f64(),
            muted.elapsed().as_secs_f64()
        );
        Ok(Injected {
            outage: Some((down, up)),
            polled: Some(Polled {
                from: up,
                to: SystemTime::now(),
                window: POLLING_PERIOD + RELIST_MARGIN,
            }),
            notes: vec![note],
            ..Injected::default()
        })
    }

    /// Starts the exec storm in a pod of its own, and a [`LossSampler`] on plegd.
    async fn storm(&self) -> anyhow::Result<(Pod, LossSampler)> {
        let sampler = LossSampler::start(self.plegd.metrics)?;
        let cri = &self.node.cri;
        let pod = cri
            .run_pod_in(&format!("{}-storm", self.prefix), PidMode::Container)
            .await?;
        for i in 0..STORMS {
            let spec = ContainerSpec::exec_storm(&format!("storm{i}"), STORM_EXECS);
            cri.run_container(&pod, &spec).await?;
        }
        Ok((pod, sampler))
    }
}

/// How often plegd reads the kernel's count of events the ring had no room for.
const LOSS_CHECK: Duration = Duration::from_secs(1);
/// How often [`LossSampler`] reads plegd's metrics.
const SAMPLE: Duration = Duration::from_millis(200);

/// When plegd counted kernel events lost over a run, and the first full relist after the last
/// of them, as its metrics show them every [`SAMPLE`].
struct LossSampler {
    task: tokio::task::JoinHandle<Losses>,
    stop: Arc<AtomicBool>,
}

#[derive(Clone, Copy, Debug, Default)]
struct Losses {
    lost: f64,
    first: Option<SystemTime>,
    last: Option<SystemTime>,
    /// The first sample after `last` with more full relists than at `last`.
    relisted: Option<SystemTime>,
}

impl LossSampler {
    fn start(metrics: std::net::SocketAddr) -> anyhow::Result<Self> {
        let (before, full_start) = (
            metric_at(metrics, DROPS)?,
            metric_at(metrics, FULL_RELISTS)?,
        );
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        // A blocking thread: the samples are blocking HTTP reads, and the test runtime's few
        // workers are busy with the churn.
        let task = tokio::task::spawn_blocking(move || {
            let mut losses = Losses::default();
            // The drops seen so far, and the full relists at the sample before the last growth
            // of them: the relist a loss check asks for may be over by the next sample.
            let (mut seen, mut full_before_last, mut full_seen) = (before, full_start, full_start);
            // Once stopped, sampling goes on (bounded) until a full relist followed the last
            // losses counted.
            let mut settle_until = None;
            loop {
                if stopped.load(Ordering::Relaxed) {
                    let settled = losses.last.is_none() || losses.relisted.is_some();
                    let deadline = *settle_until.get_or_insert_with(|| Instant::now() + STEP);
                    if settled || Instant::now() > deadline {
                        break;
                    }
                }
                std::thread::sleep(SAMPLE);
                // A sample that fails (plegd busy) is skipped: the counters keep their counts.
                let (Ok(drops), Ok(full)) =
                    (metric_at(metrics, DROPS), metric_at(metrics, FULL_RELISTS))
                else {
                    continue;
                };
                let now = SystemTime::now();
                if drops > seen {
                    losses.first.get_or_insert(now);
                    losses.last = Some(now);
                    losses.relisted = None;
                    (losses.lost, seen, full_before_last) = (drops - before, drops, full_seen);
                }
                if losses.last.is_some() && losses.relisted.is_none() && full > full_before_last {
                    losses.relisted = Some(now);
                }
                full_seen = full;
            }
            losses
        });
        Ok(Self { task, stop })
    }

    /// Stops sampling; the time plegd followed the runtime by full relists alone, one per
    /// loss check: from a loss check before the first counted losses (they happened since) to
    /// the full relist after the last.
    async fn span(self, began: SystemTime) -> anyhow::Result<(Polled, String)> {
        self.stop.store(true, Ordering::Relaxed);
        let losses = self.task.await?;
        let (Some(first), Some(last)) = (losses.first, losses.last) else {
            bail!("the exec storm lost no kernel event: the ring never overflowed");
        };
        let relisted = losses
            .relisted
            .context("no full relist came after the last kernel events lost")?;
        let into = |t: SystemTime| t.duration_since(began).unwrap_or_default().as_secs_f64();
        let note = format!(
            "{} kernel events lost, counted from {:.1} s to {:.1} s into the run; a full relist \
             within {:.1} s of the last count",
            losses.lost,
            into(first),
            into(last),
            relisted
                .duration_since(last)
                .unwrap_or_default()
                .as_secs_f64()
        );
        let span = Polled {
            from: first - LOSS_CHECK - SAMPLE,
            to: relisted,
            window: LOSS_CHECK + RELIST_MARGIN,
        };
        Ok((span, note))
    }
}

/// Waits (bounded) until every removal reached the watcher and the watcher has the last event
/// the daemon published: whatever is still missing then is reported, not awaited forever.
async fn await_quiet(plegd: &Plegd, watch: &crate::bench::Watch, truths: &[Truth]) {
    let deadline = tokio::time::Instant::now() + STEP;
    for truth in truths.iter().filter(|t| t.removed) {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        if left.is_zero() {
            break;
        }
        watch
            .arrivals
            .wait(&truth.container_id, "ContainerRemoved", left)
            .await;
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while let Ok(last) = plegd.last_sequence()
        && watch.last_sequence() < last
        && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Runs one lifecycle; its ground truth.
pub(crate) async fn lifecycle(
    cri: &Cri,
    tasks: &Native,
    pod: &Pod,
    prefix: &str,
    draw: Draw,
) -> anyhow::Result<Truth> {
    let own_pod = match draw.action {
        Action::StopPod => Some(
            cri.run_pod_in(&format!("{prefix}-{}", draw.name), draw.pid_mode)
                .await?,
        ),
        _ => None,
    };
    let pod = own_pod.as_ref().unwrap_or(pod);
    let id = started(cri, pod, &draw.spec()).await?;
    match draw.action {
        Action::Kill => {
            tokio::time::sleep(draw.runs).await;
            let pid = tasks.init_pid(&id).await?;
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), Signal::SIGKILL)?;
        }
        Action::Stop => {
            tokio::time::sleep(draw.runs).await;
            cri.stop_container(&id, Duration::from_secs(1)).await?;
        }
        Action::StopPod => {
            tokio::time::sleep(draw.runs).await;
            cri.stop_pod(pod).await?;
        }
        Action::Exit(_) | Action::Oom | Action::Brief => {}
    }
    let status = exited(cri, &id).await?;
    let exit_shown = SystemTime::now();
    tokio::time::sleep(draw.lingers).await;
    // CRI's reason once more: containerd handles an OOM kill's event apart from the exit.
    let later_reason = cri.container_status(&id).await.ok().map(|s| s.reason);
    let removed = SystemTime::now();
    match &own_pod {
        Some(pod) => cri.remove_pod(pod).await?,
        None => cri.remove_container(&id).await?,
    }
    let exited = status.state == ContainerState::ContainerExited as i32;
    let at = |nanos: i64| {
        (nanos > 0).then(|| SystemTime::UNIX_EPOCH + Duration::from_nanos(nanos as u64))
    };
    Ok(Truth {
        container_id: id,
        pod: pod.name.clone(),
        pid_mode: pod.pid_mode,
        action: draw.action,
        exit: exited.then(|| Exit {
            code: status.exit_code,
            reason: status.reason.clone(),
        }),
        later_reason,
        removed: true,
        timing: Timing {
            // The runtime's own record, as the start and finish: a CreateContainer sent while
            // containerd was frozen makes the container only once it thaws.
            created: at(status.created_at),
            started: at(status.started_at),
            finished: at(status.finished_at),
            exit_shown: exited.then_some(exit_shown),
            removed: Some(removed),
        },
    })
}

/// Creates and starts a container of `spec` in `pod`; its id. A start the runtime fails is
/// tried again in a new container, as kubelet's next sync would, up to [`START_TRIES`] times: containerd 1.6 fails `runc create` on `/proc/0/ns/ipc` while the
/// pod's shim does not answer a state call within 2 s (after a hang, under a burst; the
/// sandbox's pid then reads 0), and a lifecycle given up there would be abandoned, not
/// audited. The failed container is removed; no truth names it, so the audit ignores it.
async fn started(cri: &Cri, pod: &Pod, spec: &ContainerSpec) -> anyhow::Result<String> {
    let mut tries = 1;
    loop {
        let id = cri.create_container(pod, spec).await?;
        match cri.start_container(&id).await {
            Ok(()) => return Ok(id),
            Err(e) if tries < START_TRIES => {
                eprintln!("soak: the start of {id:.12} failed, trying a new container: {e:#}");
                let _ = cri.remove_container(&id).await;
                tries += 1;
                tokio::time::sleep(START_BACKOFF).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// CRI's status of `id` once it shows the container exited (containerd 1.6 may show an exit
/// racing its restart as unknown for a while); the last status seen if it never does in time.
async fn exited(cri: &Cri, id: &str) -> anyhow::Result<ContainerStatus> {
    let deadline = Instant::now() + STEP;
    loop {
        let status = cri.container_status(id).await;
        match status {
            Ok(status)
                if status.state == ContainerState::ContainerExited as i32
                    || Instant::now() > deadline =>
            {
                return Ok(status);
            }
            Err(e) if Instant::now() > deadline => return Err(e),
            _ => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// The seed of a run: `PLEGD_SOAK_SEED` if set, else the clock's.
pub fn seed_from_env() -> anyhow::Result<u64> {
    match std::env::var("PLEGD_SOAK_SEED") {
        Ok(seed) => seed.parse().context("PLEGD_SOAK_SEED"),
        Err(_) => Ok(SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)?
            .as_nanos() as u64),
    }
}

/// Prints `outcome` for a run of `plan` with the line that reproduces it; fails when the
/// report is not clean or audited nothing.
pub fn conclude(plan: &Plan, outcome: &Outcome) -> anyhow::Result<()> {
    let fault = plan.fault.map_or("none", Fault::key);
    let audited = outcome.report.lifecycles;
    println!(
        "soak: mode {}, fault {fault}, runtime {}, {}, seed {}, {:.1} s, lifecycles attempted \
         {}, audited {audited} ({:.1} %), abandoned {}\n{}\
         reproduce: cargo xtask soak --mode {} --runtime {} --lifecycles {} --seed {}{}{}",
        plan.mode.key(),
        plan.runtime.key(),
        plan.in_flight
            .map_or("bursts".to_owned(), |k| format!("{k} in flight")),
        plan.seed,
        outcome.elapsed.as_secs_f64(),
        outcome.attempted,
        100.0 * audited_share(outcome),
        outcome.abandoned.len(),
        outcome.report,
        plan.mode.key(),
        plan.runtime.key(),
        plan.lifecycles,
        plan.seed,
        plan.in_flight
            .map(|k| format!(" --in-flight {k}"))
            .unwrap_or_default(),
        plan.fault
            .map(|f| format!(" --fault {}", f.key()))
            .unwrap_or_default(),
    );
    for note in &outcome.notes {
        println!("  fault: {note}");
    }
    for why in &outcome.abandoned {
        println!("  abandoned: {why}");
    }
    if let Some(abuse) = &outcome.abuse {
        println!("{abuse}");
        let problems = abuse.problems(crate::unit::memory_max()?);
        if !problems.is_empty() {
            bail!("under abuse: {}", problems.join("; "));
        }
    }
    if outcome.report.expected == 0 {
        bail!("the soak audited no transition");
    }
    // A containerd killed under the churn breaks the harness's own calls: the lifecycles in
    // flight then are abandoned by the harness, not lost by plegd (the report says which).
    let runtime_killed = plan.fault == Some(Fault::ContainerdRestart);
    if !runtime_killed && audited_share(outcome) < AUDITED_SHARE {
        bail!(
            "the soak audited {} of {} lifecycles attempted, under {:.0} %",
            outcome.report.lifecycles,
            outcome.attempted,
            100.0 * AUDITED_SHARE
        );
    }
    if !outcome.report.is_clean() {
        bail!("the soak found lost, duplicated, reordered or wrong transitions");
    }
    Ok(())
}

/// The share of the lifecycles attempted that the report audits (1 when none were).
fn audited_share(outcome: &Outcome) -> f64 {
    if outcome.attempted == 0 {
        1.0
    } else {
        outcome.report.lifecycles as f64 / outcome.attempted as f64
    }
}

/// Where a run's files go.
pub fn run_dir(root: &Path, plan: &Plan) -> PathBuf {
    root.join(format!(
        "{}-{}-{}-{}{}",
        plan.mode.key(),
        plan.fault.map_or("none", Fault::key),
        plan.runtime.key(),
        plan.in_flight
            .map_or("bursts".to_owned(), |k| format!("k{k}")),
        if plan.abuse { "-abused" } else { "" }
    ))
}
