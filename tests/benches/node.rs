//! `cargo xtask bench`: plegd on a real node, measured from outside, side by side in one run.
//!
//! The release `plegd` binary (`--bin`) runs as a process of its own against the harness's
//! private containerd, once per mode and section; events are timed as they arrive at a
//! `plegd watch --output json` process. Sections (the numbers go to `--out` as JSON, which
//! `cargo xtask bench` turns into the report):
//! - latency: kill -9 of a container's init to `ContainerDied`, with containerd's `/tasks/exit`
//!   (its `exited_at`) and the first CRI `ContainerStatus` showing EXITED as anchors measured
//!   for the same kill; `StartContainer` returned and `/tasks/start` to `ContainerStarted`.
//! - idle: plegd's and containerd's CPU over a window with N idle containers, containerd's
//!   without plegd as the baseline, plegd's RSS.
//! - churn: containers started and killed at a rate; plegd's CPU, relists and runtime calls (by
//!   method) per container lifecycle, and the kill latency then.
//! - kernel: run time per run of each eBPF program (kernel bpf_stats) during an exec storm in
//!   containers, and the ring buffer's lost events (`plegd_ringbuf_drops`).
//! - cost, throughput, overload, density: a busy node (issue 52), see [`busy`].
//!
//! Nothing here asserts a timing: it measures and reports. `PLEGD_BENCH_KEEP=1` keeps the
//! bench's directory (each mode's `plegd.log`, at the level `RUST_LOG` sets) for a look.

use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant, SystemTime},
};

use anyhow::{Context as _, Result};
use clap::Parser;
use plegd_tests::{
    ContainerdOptions, Node,
    bench::{self, Arrivals, Jitter, Plegd, ms_between},
    cri::{ContainerSpec, Pod},
    otlp,
};
use serde_json::{Value, json};

#[path = "node/busy.rs"]
mod busy;

/// Containers started at once per batch of kills.
const BATCH: usize = 25;
const DEADLINE: Duration = Duration::from_secs(30);
/// Container starts pending at once in the churn section. Unbounded, 50/s on 2 cores left a
/// thousand starts pending, and nearly all of them timed out.
const CHURN_STARTS_IN_FLIGHT: usize = 8;
/// How long one churn start may take before it counts as failed.
const CHURN_START_BOUND: Duration = Duration::from_secs(30);

#[derive(Debug, Parser)]
struct Args {
    /// The release `plegd` binary.
    #[arg(long)]
    bin: PathBuf,
    /// Where the results go (JSON).
    #[arg(long)]
    out: PathBuf,
    /// kill -9s per mode.
    #[arg(long, default_value_t = 200)]
    kills: usize,
    /// OOM kills per mode (a 32 MiB limit and a hog), after its kill -9s.
    #[arg(long, default_value_t = 10)]
    ooms: usize,
    /// Idle containers per idle measurement.
    #[arg(long, value_delimiter = ',', default_values_t = [10, 100, 300])]
    idle: Vec<usize>,
    /// Seconds of each idle CPU window.
    #[arg(long, default_value_t = 60)]
    window: u64,
    /// Container start+kill rates per second of the churn section.
    #[arg(long, value_delimiter = ',', default_values_t = [10, 50])]
    rates: Vec<u32>,
    /// The modes of the churn section (default: every available mode).
    #[arg(long, value_delimiter = ',')]
    churn_modes: Vec<String>,
    /// Seconds of each churn run.
    #[arg(long, default_value_t = 20)]
    churn: u64,
    /// Short processes of the exec storm.
    #[arg(long, default_value_t = 10_000)]
    execs: usize,
    /// Sections to run (default: all): latency, idle, churn, kernel, cost, throughput,
    /// overload, density.
    #[arg(long, value_delimiter = ',')]
    sections: Vec<String>,
    /// Lifecycles in flight (K) of the cost, throughput and overload sections (default: 2,16,64
    /// for cost, 16,64 for throughput, 16 for overload; overload takes the first).
    #[arg(long, value_delimiter = ',')]
    in_flight: Vec<usize>,
    /// Lifecycles (N) per cost run.
    #[arg(long, default_value_t = 64)]
    lifecycles: usize,
    /// plegd's runtime backends (`--runtime`) of the cost and throughput sections.
    #[arg(long, value_delimiter = ',', default_values_t = ["cri".to_owned(), "containerd".to_owned()])]
    runtimes: Vec<String>,
    /// Lifecycles per throughput round.
    #[arg(long, default_value_t = 96)]
    throughput_lifecycles: usize,
    /// Alternated rounds per throughput configuration (no plegd, plegd per backend).
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Lifecycles per mode of the overload section.
    #[arg(long, default_value_t = 96)]
    overload_lifecycles: usize,
    /// The modes of the overload section.
    #[arg(long, value_delimiter = ',', default_values_t = ["default".to_owned(), "containerd".to_owned(), "ebpf".to_owned(), "polling-1s".to_owned()])]
    overload_modes: Vec<String>,
    /// Pods (each a sandbox and one container) of the density section.
    #[arg(long, value_delimiter = ',', default_values_t = [250, 500, 1000])]
    pods: Vec<usize>,
    /// Modes of the latency and idle sections (default: every mode).
    #[arg(long, value_delimiter = ',')]
    modes: Vec<String>,
    /// `cargo bench` passes it; nothing to filter.
    #[arg(long, hide = true)]
    bench: bool,
}

/// One way to run plegd.
struct Mode {
    key: &'static str,
    label: &'static str,
    args: Vec<String>,
    /// Why this mode cannot run here.
    unavailable: Option<String>,
    /// Whether it runs the eBPF source, whose observations a watcher can ask for.
    kernel_observations: bool,
}

/// The bench's modes; `otlp` is the receiver the export mode sends to (printing nothing), or
/// why there is none.
fn modes(node: &Node, binary: &Path, otlp: &Result<otlp::Receiver, String>) -> Vec<Mode> {
    let args = |a: &[&str]| a.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    let slow = |a: &[&str]| {
        let mut v = args(a);
        v.extend(args(&bench::PUSH_ONLY_PERIODS));
        v
    };
    let version = node.containerd.version();
    let mut modes = vec![
        Mode {
            key: "ebpf",
            label: "eBPF only (relist 300 s)",
            args: slow(&["--mode", "ebpf", "--sources", "ebpf"]),
            unavailable: None,
            kernel_observations: true,
        },
        Mode {
            key: "containerd",
            label: "containerd events only (relist 300 s)",
            args: slow(&["--sources", "containerd"]),
            unavailable: None,
            kernel_observations: false,
        },
        Mode {
            key: "cri-events",
            label: "CRI events only (relist 300 s)",
            args: slow(&["--sources", "cri-events"]),
            unavailable: (!version.has_cri_container_events()).then(|| {
                format!("containerd {version} does not implement CRI GetContainerEvents (1.7+)")
            }),
            kernel_observations: false,
        },
        Mode {
            key: "default",
            label: "default (auto)",
            args: Vec::new(),
            unavailable: None,
            kernel_observations: true,
        },
    ];
    let help = std::process::Command::new(binary)
        .args(["run", "--help"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    if help.contains("--otlp-endpoint") {
        let (endpoint, unavailable) = match otlp {
            Ok(receiver) => (format!("http://127.0.0.1:{}", receiver.port), None),
            Err(why) => (String::new(), Some(why.clone())),
        };
        modes.push(Mode {
            key: "otlp",
            label: "default, every event exported over OTLP",
            args: vec!["--otlp-endpoint".to_owned(), endpoint],
            unavailable,
            kernel_observations: true,
        });
    }
    if help.contains("--confirm") {
        modes.push(Mode {
            key: "confirm-cri",
            label: "default, --confirm cri",
            args: args(&["--confirm", "cri"]),
            unavailable: None,
            kernel_observations: true,
        });
    }
    modes.push(Mode {
        key: "polling-1s",
        label: "polling 1 s",
        args: args(&["--mode", "polling", "--relist-period", "1s"]),
        unavailable: None,
        kernel_observations: false,
    });
    modes.push(Mode {
        key: "polling-100ms",
        label: "polling 100 ms",
        args: args(&["--mode", "polling", "--relist-period", "100ms"]),
        unavailable: None,
        kernel_observations: false,
    });
    modes
}

struct Bench {
    args: Args,
    node: Node,
    events: Arc<Arrivals>,
    dir: tempfile::TempDir,
    jitter: Jitter,
}

impl Bench {
    fn plegd(&self, mode: &Mode) -> Result<Plegd> {
        Plegd::start(
            &self.args.bin,
            &self.node.containerd,
            &self.dir.path().join(mode.key),
            &mode.args,
        )
    }

    /// Starts `count` sleepers in `pod` (attempt `attempt`); each with when `StartContainer`
    /// returned.
    async fn start_batch(
        &self,
        pod: &Pod,
        count: usize,
        attempt: u32,
    ) -> Result<Vec<(String, SystemTime)>> {
        let mut started = Vec::new();
        for i in 0..count {
            let mut spec = ContainerSpec::sleeper(&format!("c{i}"));
            spec.attempt = attempt;
            let id = self.node.cri.create_container(pod, &spec).await?;
            self.node.cri.start_container(&id).await?;
            started.push((id, SystemTime::now()));
        }
        Ok(started)
    }

    /// kill -9 of the container's init; when it was sent.
    async fn kill(&self, id: &str) -> Result<SystemTime> {
        let pid = self.node.tasks.init_pid(id).await?;
        let at = SystemTime::now();
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        )?;
        Ok(at)
    }

    async fn latency(&mut self, mode: &Mode) -> Result<Value> {
        let plegd = self.plegd(mode)?;
        // Where the kernel's observations can come: timed at the same client, beside the
        // confirmed events.
        let watch = if mode.kernel_observations {
            plegd.watch_with_kernel_observations()?
        } else {
            plegd.watch()?
        };
        let pod = self.node.cri.run_pod(&format!("lat-{}", mode.key)).await?;
        let (mut kills, mut starts) = (Vec::new(), Vec::new());
        let mut attempt = 0;
        while kills.len() < self.args.kills {
            let count = BATCH.min(self.args.kills - kills.len());
            let batch = self.start_batch(&pod, count, attempt).await?;
            attempt += 1;
            for (id, returned) in &batch {
                let arrived = watch
                    .arrivals
                    .wait(id, "ContainerStarted", DEADLINE)
                    .await
                    .with_context(|| format!("{}: no ContainerStarted for {id}", mode.key))?;
                let task_start = self.events.get(id, "start");
                starts.push(json!({
                    "from_call_ms": ms_between(*returned, arrived),
                    "from_task_start_ms": task_start.map(|t| ms_between(t, arrived)),
                }));
            }
            for (id, _) in &batch {
                // Kills land anywhere in a relist period (both pollings' periods fit in 1 s).
                tokio::time::sleep(self.jitter.below(Duration::from_secs(1))).await;
                let killed = self.kill(id).await?;
                let cri = bench::cri_exited(&self.node.cri, id, DEADLINE);
                let died = watch.arrivals.wait(id, "ContainerDied", DEADLINE);
                let (cri, died) = tokio::join!(cri, died);
                let exit = self.events.wait(id, "exit", Duration::from_secs(5)).await;
                let exit_arrival = self.events.get(id, bench::EXIT_ARRIVAL);
                let emitted = watch.arrivals.get(id, "ContainerDied emitted");
                let kernel = watch.arrivals.get(id, bench::KERNEL_DEATH);
                kills.push(json!({
                    "kernel_ms": kernel.map(|t| ms_between(killed, t)),
                    "died_ms": died.map(|t| ms_between(killed, t)),
                    "exit_ms": exit.map(|t| ms_between(killed, t)),
                    "exit_arrival_ms": exit_arrival.map(|t| ms_between(killed, t)),
                    "emitted_ms": emitted.map(|t| ms_between(killed, t)),
                    "cri_ms": cri.map(|t| ms_between(killed, t)),
                }));
            }
            for (id, _) in &batch {
                self.node.cri.remove_container(id).await?;
            }
        }
        let ooms = self.ooms(&pod, &watch.arrivals).await?;
        self.node.cri.remove_pod(&pod).await?;
        watch.stop();
        plegd.stop();
        Ok(json!({ "kills": kills, "starts": starts, "ooms": ooms }))
    }

    /// OOM kills, one at a time: each container's `/tasks/exit` (its exit time, and its
    /// arrival at a subscriber) and its `ContainerDied` at the client, timed from its start.
    async fn ooms(&self, pod: &Pod, arrivals: &Arrivals) -> Result<Vec<Value>> {
        let mut ooms = Vec::new();
        for i in 0..self.args.ooms {
            let id = self
                .node
                .cri
                .create_container(pod, &ContainerSpec::oom(&format!("oom{i}")))
                .await?;
            self.node.cri.start_container(&id).await?;
            let started = SystemTime::now();
            let died = arrivals.wait(&id, "ContainerDied", DEADLINE).await;
            let exit = self.events.wait(&id, "exit", Duration::from_secs(5)).await;
            let exit_arrival = self.events.get(&id, bench::EXIT_ARRIVAL);
            let emitted = arrivals.get(&id, "ContainerDied emitted");
            ooms.push(json!({
                "died_ms": died.map(|t| ms_between(started, t)),
                "exit_ms": exit.map(|t| ms_between(started, t)),
                "exit_arrival_ms": exit_arrival.map(|t| ms_between(started, t)),
                "emitted_ms": emitted.map(|t| ms_between(started, t)),
            }));
            self.node.cri.remove_container(&id).await?;
        }
        Ok(ooms)
    }

    /// Pods of up to 10 idle sleepers, `count` containers in all.
    async fn idle_pods(&self, count: usize) -> Result<Vec<Pod>> {
        let mut pods = Vec::new();
        let mut left = count;
        while left > 0 {
            let pod = self
                .node
                .cri
                .run_pod(&format!("idle-{}", pods.len()))
                .await?;
            self.start_batch(&pod, left.min(10), 0).await?;
            left -= left.min(10);
            pods.push(pod);
        }
        Ok(pods)
    }

    async fn remove_pods(&self, pods: &[Pod]) -> Result<()> {
        for pod in pods {
            self.node.cri.remove_pod(pod).await?;
        }
        Ok(())
    }

    async fn idle(&mut self, modes: &[&Mode]) -> Result<Value> {
        let window = Duration::from_secs(self.args.window);
        let containerd = self.node.containerd.pid().context("containerd pid")?;
        let mut rows = Vec::new();
        for &count in &self.args.idle.clone() {
            eprintln!("bench: idle, {count} containers");
            let pods = self.idle_pods(count).await?;
            tokio::time::sleep(Duration::from_secs(2)).await;
            let baseline = bench::cpu_percent(&[containerd], window).await[0];
            rows.push(json!({
                "mode": "none", "containers": count, "containerd_cpu": baseline,
            }));
            for mode in modes {
                let plegd = self.plegd(mode)?;
                // Past the first full relist and inspection of every pod.
                tokio::time::sleep(Duration::from_secs(2)).await;
                let cpu = bench::cpu_percent(&[plegd.pid(), containerd], window).await;
                let (series, container_series) = bench::series_count_at(plegd.metrics)?;
                rows.push(json!({
                    "mode": mode.key,
                    "containers": count,
                    "plegd_cpu": cpu[0],
                    "containerd_cpu": cpu[1],
                    "containerd_added_cpu": cpu[1] - baseline,
                    "rss_bytes": bench::rss_bytes(plegd.pid()),
                    "series": series,
                    "container_series": container_series,
                }));
                plegd.stop();
            }
            self.remove_pods(&pods).await?;
        }
        Ok(Value::Array(rows))
    }

    /// Containers started at `rate` a second, each killed a second after its start.
    ///
    /// At most [`CHURN_STARTS_IN_FLIGHT`] starts are pending at once: a tick that finds them
    /// all busy starts nothing and is counted as such, so a rate the node cannot take is
    /// reported as the rate it achieved rather than piling up starts that all time out. A kill
    /// whose `ContainerDied` misses [`DEADLINE`] is looked for again at the end of the run, to
    /// tell an event that came late from one that never came.
    async fn churn_run(&self, mode: &Mode, rate: u32) -> Result<Value> {
        let plegd = self.plegd(mode)?;
        let watch = plegd.watch()?;
        let pod = self
            .node
            .cri
            .run_pod(&format!("churn-{}-{rate}", mode.key))
            .await?;
        let length = Duration::from_secs(self.args.churn);
        let starting = Arc::new(tokio::sync::Semaphore::new(CHURN_STARTS_IN_FLIGHT));
        let cpu_before = bench::cpu_time(plegd.pid());
        let relists_before = plegd.metric("plegd_relists_total")?;
        let calls_before = plegd.metric_series("plegd_runtime_calls_total")?;
        let began = Instant::now();
        let mut tasks = tokio::task::JoinSet::new();
        let (mut ticks, mut saturated) = (0u32, 0u32);
        while began.elapsed() < length {
            ticks += 1;
            let next = began + Duration::from_secs_f64(f64::from(ticks) / f64::from(rate));
            let Ok(permit) = starting.clone().try_acquire_owned() else {
                saturated += 1;
                tokio::time::sleep_until(next.into()).await;
                continue;
            };
            let (cri, tasks_api, pod, arrivals) = (
                self.node.cri.clone(),
                self.node.tasks.clone(),
                pod.clone(),
                watch.arrivals.clone(),
            );
            let name = format!("churn{ticks}");
            tasks.spawn(async move {
                let id = tokio::time::timeout(
                    CHURN_START_BOUND,
                    cri.run_container(&pod, &ContainerSpec::sleeper(&name)),
                )
                .await
                .map_err(|_| "start timed out")?
                .map_err(|_| "start failed")?;
                drop(permit);
                tokio::time::sleep(Duration::from_secs(1)).await;
                let pid = tasks_api.init_pid(&id).await.map_err(|_| "no init pid")?;
                let killed = SystemTime::now();
                nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                )
                .map_err(|_| "kill failed")?;
                let died = arrivals.wait(&id, "ContainerDied", DEADLINE).await;
                // One not seen in time stays until the pod goes: removing it could make its
                // ContainerDied come from the removal's relist rather than from its death.
                if died.is_some() {
                    let _ = cri.remove_container(&id).await;
                }
                Ok::<_, &str>((id, killed, died))
            });
            tokio::time::sleep_until(next.into()).await;
        }
        let cpu = bench::cpu_time(plegd.pid()).saturating_sub(cpu_before);
        let elapsed = began.elapsed();
        let (mut died, mut untimed) = (Vec::new(), Vec::new());
        let mut failed: std::collections::BTreeMap<&str, u32> = Default::default();
        while let Some(result) = tasks.join_next().await {
            match result.unwrap_or(Err("task panicked")) {
                Ok((_, killed, Some(at))) => died.push(ms_between(killed, at)),
                Ok((id, killed, None)) => untimed.push((id, killed)),
                Err(reason) => *failed.entry(reason).or_default() += 1,
            }
        }
        // What the lifecycles cost plegd, each from its start to its removal.
        let lifecycle_cpu = bench::cpu_time(plegd.pid()).saturating_sub(cpu_before);
        let relists = plegd.metric("plegd_relists_total")? - relists_before;
        let mut calls_by_method = plegd.metric_series("plegd_runtime_calls_total")?;
        for (series, calls) in &mut calls_by_method {
            *calls -= calls_before.get(series).copied().unwrap_or_default();
        }
        let calls: f64 = calls_by_method.values().sum();
        let mut late = Vec::new();
        let last_look = tokio::time::Instant::now() + DEADLINE;
        for (id, killed) in &untimed {
            let left = last_look.saturating_duration_since(tokio::time::Instant::now());
            if let Some(at) = watch.arrivals.wait(id, "ContainerDied", left).await {
                late.push(ms_between(*killed, at));
            }
        }
        let lost = untimed.len() - late.len();
        let started = died.len() + untimed.len();
        if !failed.is_empty() || !untimed.is_empty() || saturated > 0 {
            eprintln!(
                "bench: churn at {rate}/s: {saturated} of {ticks} ticks found {CHURN_STARTS_IN_FLIGHT} starts pending; \
                 failed {failed:?}; ContainerDied late {}, never {lost}",
                late.len()
            );
        }
        // Bounded too: after a load the node could not take, removing the pod may not end.
        let removed = tokio::time::timeout(DEADLINE * 2, self.node.cri.remove_pod(&pod)).await;
        if removed.is_err() {
            eprintln!("bench: churn at {rate}/s: removing its pod did not end in time");
        }
        watch.stop();
        plegd.stop();
        Ok(json!({
            "mode": mode.key,
            "rate": rate,
            "achieved": started as f64 / length.as_secs_f64(),
            "saturated_ticks": saturated,
            "plegd_cpu": 100.0 * cpu.as_secs_f64() / elapsed.as_secs_f64(),
            "lifecycles": started,
            "cpu_ms_per_lifecycle": lifecycle_cpu.as_secs_f64() * 1e3 / started.max(1) as f64,
            "relists_per_lifecycle": relists / started.max(1) as f64,
            "calls_per_lifecycle": calls / started.max(1) as f64,
            "calls_per_lifecycle_by_method": calls_by_method
                .iter()
                .map(|(series, calls)| {
                    let method = series.trim_start_matches("{call=\"").trim_end_matches("\"}");
                    (method.to_owned(), json!(calls / started.max(1) as f64))
                })
                .collect::<serde_json::Map<_, _>>(),
            "died_ms": died,
            "late_ms": late,
            "lost": lost,
            "failed": failed,
        }))
    }

    /// Per eBPF program, runs and run time during an exec storm of `--execs` processes.
    async fn kernel(&self, mode: &Mode) -> Result<Value> {
        let plegd = self.plegd(mode)?;
        let watch = plegd.watch()?;
        let stats = aya::sys::enable_stats(aya::sys::Stats::RunTime)?;
        let before = bpf_costs();
        let pod = self.node.cri.run_pod("storm").await?;
        let per = self.args.execs.div_ceil(4);
        let began = Instant::now();
        let mut ids = Vec::new();
        for i in 0..4 {
            let script =
                format!("i=0; while [ $i -lt {per} ]; do /bin/busybox true; i=$((i+1)); done");
            let id = self
                .node
                .cri
                .run_container(&pod, &ContainerSpec::shell(&format!("storm{i}"), &script))
                .await?;
            ids.push(id);
        }
        for id in &ids {
            watch
                .arrivals
                .wait(id, "ContainerDied", Duration::from_secs(300))
                .await
                .context("exec storm container did not end")?;
        }
        let storm = began.elapsed();
        let after = bpf_costs();
        drop(stats);
        let drops = plegd.metric("plegd_ringbuf_drops_total")?;
        self.node.cri.remove_pod(&pod).await?;
        watch.stop();
        plegd.stop();
        let programs: Vec<Value> = after
            .iter()
            .map(|(name, runs, time)| {
                let (runs0, time0) = before
                    .iter()
                    .find(|(n, ..)| n == name)
                    .map_or((0, Duration::ZERO), |(_, r, t)| (*r, *t));
                let runs = runs - runs0;
                let ns = time.saturating_sub(time0).as_nanos() as f64;
                json!({
                    "program": name,
                    "runs": runs,
                    "ns_per_run": if runs == 0 { Value::Null } else { json!(ns / runs as f64) },
                })
            })
            .collect();
        Ok(json!({
            "execs": self.args.execs,
            "storm_seconds": storm.as_secs_f64(),
            "programs": programs,
            "ringbuf_drops": drops,
        }))
    }
}

/// Per plegd probe: runs and total in-kernel run time so far, from the kernel's bpf_stats.
/// The kernel keeps 15 characters of a name (`sched_process_e` is exec and exit, raw or
/// not): programs of one name are told apart by load order, one program per probe in
/// `PROGRAMS` order.
fn bpf_costs() -> Vec<(&'static str, u64, Duration)> {
    let mut infos: Vec<_> = aya::programs::loaded_programs().flatten().collect();
    infos.sort_by_key(|info| std::cmp::Reverse(info.id()));
    let mut costs = Vec::new();
    for program in plegd::sources::ebpf::features::PROGRAMS
        .iter()
        .rev()
        .map(|spec| spec.name)
    {
        // The newest loaded program whose kernel name is a prefix of one of this probe's
        // (its classic program's, or a raw one's, which starts with it), not yet taken.
        let Some(at) = infos.iter().position(|info| {
            info.name_as_str().is_some_and(|n| {
                !n.is_empty()
                    && plegd::sources::ebpf::features::PROGRAM_NAMES
                        .iter()
                        .any(|name| name.starts_with(program) && name.starts_with(n))
            })
        }) else {
            continue;
        };
        let info = infos.remove(at);
        costs.push((program, info.run_count(), info.run_time()));
    }
    costs.reverse();
    costs
}

fn uname_r() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    let node = Node::start_with(&ContainerdOptions::named("bench-node")).await?;
    let events = bench::containerd_events(&node.containerd).await?;
    let otlp = otlp::Receiver::start_quiet()
        .await
        .map_err(|e| format!("{e:#}"));
    let modes = modes(&node, &args.bin, &otlp);
    let seed = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)?
        .as_nanos() as u64;
    let mut b = Bench {
        args,
        node,
        events,
        dir: tempfile::Builder::new()
            .disable_cleanup(std::env::var_os("PLEGD_BENCH_KEEP").is_some())
            .tempdir()?,
        jitter: Jitter::new(seed),
    };
    let available: Vec<&Mode> = modes.iter().filter(|m| m.unavailable.is_none()).collect();
    // The overload section's modes are its own (`--overload-modes`), not `--modes`'.
    let every_available = available.clone();

    let (sections, chosen_modes) = (b.args.sections.clone(), b.args.modes.clone());
    let wants = |section: &str| sections.is_empty() || sections.iter().any(|s| s == section);
    let chosen =
        |mode: &Mode| chosen_modes.is_empty() || chosen_modes.iter().any(|k| k == mode.key);
    let modes: Vec<&Mode> = modes.iter().filter(|m| chosen(m)).collect();
    let available: Vec<&Mode> = available.into_iter().filter(|m| chosen(m)).collect();
    let mut latency = Vec::new();
    for mode in modes.iter().filter(|_| wants("latency")) {
        eprintln!("bench: latency, {}", mode.label);
        let mut row = json!({
            "mode": mode.key, "label": mode.label, "args": mode.args.join(" "),
            "unavailable": mode.unavailable,
        });
        if mode.unavailable.is_none() {
            let measured = b.latency(mode).await?;
            row["kills"] = measured["kills"].clone();
            row["starts"] = measured["starts"].clone();
            row["ooms"] = measured["ooms"].clone();
        }
        latency.push(row);
    }
    let mut results = json!({
        "kernel_release": uname_r(),
        "cores": std::thread::available_parallelism().map_or(0, |n| n.get()),
        "containerd": b.node.containerd.version().to_string(),
        "kills_per_mode": b.args.kills,
        "idle_window_s": b.args.window,
        "churn_s": b.args.churn,
        "churn_starts_in_flight": CHURN_STARTS_IN_FLIGHT,
        "latency": latency,
    });
    // Written after each section: a run cut short still shows what it measured.
    let out = b.args.out.clone();
    let save = |results: &Value| std::fs::write(&out, results.to_string());
    save(&results)?;
    if wants("idle") {
        results["idle"] = b.idle(&available).await?;
        save(&results)?;
    }
    let mut churn = Vec::new();
    let churn_modes = available
        .iter()
        .filter(|_| wants("churn"))
        .filter(|m| b.args.churn_modes.is_empty() || b.args.churn_modes.iter().any(|k| k == m.key));
    // Every mode at one rate before the next rate: a mode's run at a low rate does not follow
    // its run at a rate that overloaded the node.
    let churn_modes: Vec<&&Mode> = churn_modes.collect();
    for &rate in &b.args.rates.clone() {
        for mode in &churn_modes {
            eprintln!("bench: churn, {} at {rate}/s", mode.label);
            churn.push(b.churn_run(mode, rate).await?);
        }
    }
    results["churn"] = Value::Array(churn);
    save(&results)?;
    if wants("kernel") {
        eprintln!("bench: exec storm");
        results["kernel"] = b.kernel(available[0]).await?;
        save(&results)?;
    }
    if wants("cost") {
        results["cost"] = b.cost().await?;
        results["cost_lifecycles"] = json!(b.args.lifecycles);
        save(&results)?;
    }
    if wants("throughput") {
        results["throughput"] = b.throughput().await?;
        save(&results)?;
    }
    if wants("overload") {
        let overload_modes: Vec<&Mode> = b
            .args
            .overload_modes
            .iter()
            .filter_map(|key| every_available.iter().find(|m| m.key == key).copied())
            .collect();
        results["overload"] = b.overload(&overload_modes).await?;
        save(&results)?;
    }
    if wants("density") {
        results["density"] = b.density().await?;
    }
    std::fs::write(&b.args.out, serde_json::to_string_pretty(&results)?)?;
    Ok(())
}
