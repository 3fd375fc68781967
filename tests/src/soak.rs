//! The churn audit's runner: container lifecycles by the hundred against a `plegd run` process,
//! a `plegd watch --output json` process recording what it receives, ground truth from what the
//! harness did and from CRI, and the [`audit`](crate::audit) checker's report. Behind
//! `cargo xtask soak` and tests/tests/soak.rs.
//!
//! Each lifecycle is: create, start, then one of kill -9, exit with a code, OOM kill, a 0.1 s
//! run, a CRI stop, its whole pod stopped; then CRI's last word on it (`ContainerStatus`) and
//! removal. Pods of every pid-namespace mode share the lifecycles; a lifecycle that stops its
//! pod has a pod of its own. Lifecycles start alone or in bursts of [`BURST`], after random
//! pauses, all drawn from one seed.

use std::{
    path::{Path, PathBuf},
    str::FromStr,
    time::{Duration, Instant, SystemTime},
};

use anyhow::{Context as _, bail};
use k8s_cri::v1::{ContainerState, ContainerStatus};
use nix::sys::signal::Signal;

use crate::{
    Node,
    audit::{self, Action, Exit, Folding, Report, Timing, Truth},
    bench::{Jitter, Plegd},
    containerd::CRI_NAMESPACE,
    cri::{ContainerSpec, Cri, PidMode, Pod},
    native::Native,
};

/// Lifecycles started at once in a burst.
pub const BURST: usize = 20;
/// Lifecycles in flight at most: beyond it, a burst waits for earlier ones to end.
const IN_FLIGHT: usize = 40;
/// Long-lived pods per pid-namespace mode.
const PODS_PER_MODE: usize = 2;
/// The relist period of the polling mode.
const POLLING_PERIOD: Duration = Duration::from_secs(1);
/// Longest wait for one step of the runtime (an exit to be recorded, a call to answer).
const STEP: Duration = Duration::from_secs(30);

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
            window: match self {
                Self::Polling => POLLING_PERIOD + Duration::from_millis(500),
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

/// What goes wrong halfway through the churn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// containerd SIGKILLed and started again on the same state.
    ContainerdRestart,
    /// plegd SIGKILLed and started again: a new run, the watcher resyncs.
    PlegdKill,
    /// plegd SIGTERMed and started again on its saved state: the same run continues.
    PlegdTerm,
}

impl Fault {
    pub const ALL: [Fault; 3] = [Self::ContainerdRestart, Self::PlegdKill, Self::PlegdTerm];

    pub fn key(self) -> &'static str {
        match self {
            Self::ContainerdRestart => "containerd-restart",
            Self::PlegdKill => "plegd-kill",
            Self::PlegdTerm => "plegd-term",
        }
    }
}

impl FromStr for Fault {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL.into_iter().find(|f| f.key() == s).ok_or_else(|| {
            format!("unknown fault {s:?} (containerd-restart, plegd-kill, plegd-term)")
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
}

/// What a soak run found.
#[derive(Debug)]
pub struct Outcome {
    pub report: Report,
    pub elapsed: Duration,
    /// Lifecycles the harness could not complete (a runtime call failed, e.g. during a
    /// containerd restart): not audited.
    pub abandoned: Vec<String>,
}

/// One lifecycle, drawn before it runs.
#[derive(Clone, Debug)]
struct Draw {
    name: String,
    action: Action,
    /// How long it runs before the harness ends it.
    runs: Duration,
    /// How long it stays exited before removal.
    lingers: Duration,
    /// Which long-lived pod (ignored by [`Action::StopPod`], which gets its own).
    pod: usize,
    pid_mode: PidMode,
}

impl Draw {
    fn new(n: usize, jitter: &mut Jitter) -> Self {
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
    let mut args = plan.mode.args();
    if plan.fault == Some(Fault::PlegdTerm) {
        args.extend([
            "--state-dir".to_owned(),
            dir.join("state").display().to_string(),
        ]);
    }
    let mut plegd = Plegd::start(binary, &node.containerd, dir, &args)?;
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
    let mut faulted = plan.fault.is_none();
    let mut outage = None;
    while n < plan.lifecycles || began.elapsed() < plan.duration {
        let burst = if jitter.pick(4) == 0 { BURST } else { 1 };
        while lifecycles.len() + burst > IN_FLIGHT {
            results.extend(lifecycles.join_next().await);
        }
        for _ in 0..burst {
            let draw = Draw::new(n, &mut jitter);
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
        if !faulted && n >= plan.lifecycles / 2 {
            faulted = true;
            let down = SystemTime::now();
            inject(plan.fault, node, &mut plegd).await?;
            if plan.fault.is_some() {
                outage = Some((down, SystemTime::now()));
            }
            if plan.fault == Some(Fault::ContainerdRestart) {
                clients = (
                    Cri::connect(&node.containerd).await?,
                    Native::connect_in(&node.containerd, CRI_NAMESPACE).await?,
                );
            }
        }
        tokio::time::sleep(jitter.below(Duration::from_millis(300))).await;
    }
    while let Some(result) = lifecycles.join_next().await {
        results.push(result);
    }
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
    let records = watch.records();
    let folding = Folding {
        outage,
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
        abandoned,
    })
}

async fn inject(fault: Option<Fault>, node: &Node, plegd: &mut Plegd) -> anyhow::Result<()> {
    match fault {
        None => {}
        Some(Fault::ContainerdRestart) => node.containerd.crash_and_restart().await?,
        Some(Fault::PlegdKill) => plegd.restart(Signal::SIGKILL)?,
        Some(Fault::PlegdTerm) => plegd.restart(Signal::SIGTERM)?,
    }
    Ok(())
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
async fn lifecycle(
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
    let created = SystemTime::now();
    let id = cri.create_container(pod, &draw.spec()).await?;
    cri.start_container(&id).await?;
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
        removed: true,
        timing: Timing {
            created: Some(created),
            started: at(status.started_at),
            finished: at(status.finished_at),
            exit_shown: exited.then_some(exit_shown),
            removed: Some(removed),
        },
    })
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
    println!(
        "soak: mode {}, fault {fault}, seed {}, {:.1} s, {} lifecycles abandoned\n{}\
         reproduce: cargo xtask soak --mode {} --lifecycles {} --seed {}{}",
        plan.mode.key(),
        plan.seed,
        outcome.elapsed.as_secs_f64(),
        outcome.abandoned.len(),
        outcome.report,
        plan.mode.key(),
        plan.lifecycles,
        plan.seed,
        plan.fault
            .map(|f| format!(" --fault {}", f.key()))
            .unwrap_or_default(),
    );
    for why in &outcome.abandoned {
        println!("  abandoned: {why}");
    }
    if outcome.report.expected == 0 {
        bail!("the soak audited no transition");
    }
    if !outcome.report.is_clean() {
        bail!("the soak found lost, duplicated, reordered or wrong transitions");
    }
    Ok(())
}

/// Where a run's files go.
pub fn run_dir(root: &Path, plan: &Plan) -> PathBuf {
    root.join(format!(
        "{}-{}",
        plan.mode.key(),
        plan.fault.map_or("none", Fault::key)
    ))
}
