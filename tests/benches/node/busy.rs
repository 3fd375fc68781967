//! The busy-node sections (issue 52), each driven by `plegd_tests::churn`'s lifecycles (create,
//! start, RUNNING, kill -9, EXITED, remove; K in flight, one shared pod for every
//! [`IN_FLIGHT_PER_POD`]) or by a node filled before plegd starts:
//! - cost: per backend and K, the runtime calls (by method), relists (targeted, full, answered
//!   by records) and plegd CPU per lifecycle, and the lifecycles a watcher got no event of, or
//!   no `ContainerStarted`, `ContainerDied` or `ContainerRemoved`;
//! - throughput: the driver's lifecycles per second with no plegd and beside plegd (default
//!   mode, each backend), in alternated rounds;
//! - overload: per event mode, plegd's own share of each `ContainerDied`: its `emitted_at` minus
//!   the publish time of containerd's `/tasks/exit` envelope, read by the bench's own
//!   subscriber;
//! - density: pods made on the runtime before plegd starts, then the time from exec to
//!   `/readyz` 200 and to a `ListPods` that shows every container with its state (and exit
//!   code), and plegd's RSS then.

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};
use k8s_cri::v1::ContainerState;
use plegd_proto::v1 as pb;
use plegd_tests::{
    bench::{self, Plegd, Watch, ms_between},
    churn,
    cri::{ContainerSpec, Pod},
};
use serde_json::{Value, json};

use crate::{Bench, Mode};

/// The quiet before the first create and after the last removal that a cost window adds, so
/// the reads a lifecycle causes late (or a pod's creation early) fall on the right side.
const MARGIN: Duration = Duration::from_secs(2);
/// Lifecycles in flight a pod of the driver's holds: K = 64 runs in four pods. A pod's
/// containers share its one shim, and on this node containerd 1.6's shim for one pod with 64
/// in flight fell behind with or without plegd (`runc create` failing on the sandbox's
/// `/proc/0/ns/ipc` after a state call of over 2 s): the runtime's own limit, not the churn
/// the section measures. 16 in one pod ran without a failure.
const IN_FLIGHT_PER_POD: usize = 16;
/// Longest wait, after a run, for events the watcher has not received yet.
const STRAGGLERS: Duration = Duration::from_secs(10);
/// Pods made (or removed) at once while filling the node for the density section.
const FILL_IN_FLIGHT: usize = 16;
/// Every this many pods of the density section, the container is one that exited (with a code
/// of its own), so the listing has exit codes to show.
const EXITED_EVERY: usize = 10;
/// Longest the density section waits for plegd to be ready and to list everything.
const DENSITY_BOUND: Duration = Duration::from_secs(120);

/// Waits for `plegd`'s start to be behind it ([`Plegd::await_settled`]); says so when it was not
/// within the bound (the section measures on, its start counted).
async fn settled(plegd: &Plegd) {
    if !plegd.await_settled().await {
        eprintln!("bench: plegd still busy after its start; measuring anyway");
    }
}

/// One configuration's throughput rounds: per round, lifecycles a second and the CPU time
/// containerd and plegd (none without it) spent per completed lifecycle.
#[derive(Default)]
struct Rounds {
    per_second: Vec<f64>,
    containerd_cpu_ms: Vec<f64>,
    plegd_cpu_ms: Vec<f64>,
    failed: usize,
}

impl Rounds {
    /// A round's `run`, with the CPU time of containerd and, if it ran, plegd over it.
    fn add(&mut self, run: &churn::Run, cpu: &[Duration]) {
        let per = |d: &Duration| d.as_secs_f64() * 1e3 / run.lifecycles.len().max(1) as f64;
        self.per_second.push(run.per_second());
        self.containerd_cpu_ms.extend(cpu.first().map(per));
        self.plegd_cpu_ms.extend(cpu.get(1).map(per));
        self.failed += run.failed.len();
    }
}

/// The event types a lifecycle owes a watcher.
const OWED: [&str; 3] = ["ContainerStarted", "ContainerDied", "ContainerRemoved"];

impl Bench {
    /// `plegd run` in default mode with the `runtime` backend (`cri`, `containerd`), its start
    /// behind it.
    async fn plegd_on(&self, runtime: &str, key: &str, extra: &[String]) -> Result<Plegd> {
        let mut args = vec!["--runtime".to_owned(), runtime.to_owned()];
        args.extend_from_slice(extra);
        let plegd = Plegd::start(
            &self.args.bin,
            &self.node.containerd,
            &self.dir.path().join(key),
            &args,
        )?;
        settled(&plegd).await;
        Ok(plegd)
    }

    /// The driver's lifecycles in pods of their own (made before, removed after), and the CPU
    /// time each of `pids` used while they ran (the pods' making and removal left out).
    async fn drive(
        &self,
        name: &str,
        lifecycles: usize,
        in_flight: usize,
        pids: &[i32],
    ) -> Result<(churn::Run, Vec<Duration>)> {
        let pods = self.pods_for(name, in_flight).await?;
        let before: Vec<Duration> = pids.iter().map(|&p| bench::cpu_time(p)).collect();
        let run = churn::run(
            &self.node.cri,
            &self.node.tasks,
            &pods,
            &churn::Plan {
                lifecycles,
                in_flight,
                prefix: "c".into(),
            },
        )
        .await;
        let cpu = pids
            .iter()
            .zip(before)
            .map(|(&p, b)| bench::cpu_time(p).saturating_sub(b))
            .collect();
        self.settle(&pods, &run).await;
        Ok((run, cpu))
    }

    /// The pods `in_flight` lifecycles run in, one for every [`IN_FLIGHT_PER_POD`]: `name`, or
    /// `name-0`, `name-1`, ... when there are more.
    async fn pods_for(&self, name: &str, in_flight: usize) -> Result<Vec<Pod>> {
        let count = in_flight.div_ceil(IN_FLIGHT_PER_POD).max(1);
        let mut pods = Vec::with_capacity(count);
        for i in 0..count {
            let name = if count == 1 {
                name.to_owned()
            } else {
                format!("{name}-{i}")
            };
            pods.push(self.node.cri.run_pod(&name).await?);
        }
        Ok(pods)
    }

    /// Reports a run's failures and removes its pods (with any container a failure left). A
    /// pod the runtime cannot remove is reported, not fatal: containerd 1.6 under a shim that
    /// fell behind keeps some killed containers running in its store, and the rounds that
    /// follow, in pods of their own, still measure.
    async fn settle(&self, pods: &[Pod], run: &churn::Run) {
        for failure in &run.failed {
            eprintln!("bench: lifecycle {} failed: {}", failure.n, failure.error);
        }
        for pod in pods {
            if let Err(e) = self.node.cri.remove_pod(pod).await {
                eprintln!("bench: pod {} left behind: {e:#}", pod.name);
            }
        }
    }

    /// The `in_flight` asked for, or the section's own.
    fn in_flight_or(&self, default: &[usize]) -> Vec<usize> {
        if self.args.in_flight.is_empty() {
            default.to_vec()
        } else {
            self.args.in_flight.clone()
        }
    }

    pub(crate) async fn cost(&self) -> Result<Value> {
        let mut rows = Vec::new();
        for runtime in &self.args.runtimes {
            for k in self.in_flight_or(&[2, 16, 64]) {
                eprintln!(
                    "bench: cost, --runtime {runtime}, {} lifecycles, {k} in flight",
                    self.args.lifecycles
                );
                rows.push(self.cost_run(runtime, k).await?);
            }
        }
        Ok(Value::Array(rows))
    }

    async fn cost_run(&self, runtime: &str, k: usize) -> Result<Value> {
        let plegd = self
            .plegd_on(runtime, &format!("cost-{runtime}-{k}"), &[])
            .await?;
        let watch = plegd.watch_from_start()?;
        let pods = self.pods_for(&format!("cost-{runtime}-{k}"), k).await?;
        // The pods' own reads done before the window opens.
        tokio::time::sleep(MARGIN).await;
        let before = Counters::read(&plegd)?;
        tokio::time::sleep(MARGIN).await;
        let run = churn::run(
            &self.node.cri,
            &self.node.tasks,
            &pods,
            &churn::Plan {
                lifecycles: self.args.lifecycles,
                in_flight: k,
                prefix: "c".into(),
            },
        )
        .await;
        tokio::time::sleep(MARGIN).await;
        let after = Counters::read(&plegd)?;
        let n = run.lifecycles.len().max(1) as f64;
        let per = |v: f64| v / n;
        let missing = missing_events(&watch, &run).await;
        self.settle(&pods, &run).await;
        watch.stop();
        plegd.stop();
        let calls = after.calls_since(&before);
        Ok(json!({
            "runtime": runtime,
            "in_flight": k,
            "lifecycles": run.lifecycles.len(),
            "failed": run.failed.len(),
            "per_second": run.per_second(),
            "calls_per_lifecycle": per(calls.values().sum()),
            "calls_per_lifecycle_by_method": calls
                .iter()
                .map(|(method, calls)| (method.clone(), json!(per(*calls))))
                .collect::<serde_json::Map<_, _>>(),
            "targeted_relists_per_lifecycle": per(after.targeted - before.targeted),
            "full_relists_per_lifecycle": per(after.full - before.full),
            "answered_by_records_per_lifecycle": per(after.answered - before.answered),
            "cpu_ms_per_lifecycle": per(after.cpu.saturating_sub(before.cpu).as_secs_f64() * 1e3),
            "missing": missing,
        }))
    }

    pub(crate) async fn throughput(&self) -> Result<Value> {
        let mut rows = Vec::new();
        let configs: Vec<Option<&String>> = std::iter::once(None)
            .chain(self.args.runtimes.iter().map(Some))
            .collect();
        let containerd = self.node.containerd.pid().context("containerd pid")?;
        for k in self.in_flight_or(&[16, 64]) {
            let mut rounds: BTreeMap<String, Rounds> = BTreeMap::new();
            // Alternated, so a drift of the node's speed falls on every configuration, and
            // in turn: round r starts with configuration r (mod their number), so none always
            // runs right after another's removals (containerd cleans up after them a while).
            for round in 0..self.args.rounds {
                let turn = round % configs.len();
                for config in configs[turn..].iter().chain(&configs[..turn]) {
                    let key = config.map_or("none".to_owned(), |r| format!("plegd-{r}"));
                    eprintln!(
                        "bench: throughput, {k} in flight, round {}, {key}",
                        round + 1
                    );
                    let plegd = match config {
                        Some(runtime) => Some(
                            self.plegd_on(runtime, &format!("throughput-{key}"), &[])
                                .await?,
                        ),
                        None => None,
                    };
                    let pids: Vec<i32> = std::iter::once(containerd)
                        .chain(plegd.as_ref().map(Plegd::pid))
                        .collect();
                    let (run, cpu) = self
                        .drive(
                            &format!("throughput-{k}-{round}-{key}"),
                            self.args.throughput_lifecycles,
                            k,
                            &pids,
                        )
                        .await?;
                    if let Some(plegd) = plegd {
                        plegd.stop();
                    }
                    rounds.entry(key).or_default().add(&run, &cpu);
                }
            }
            for (config, r) in rounds {
                rows.push(json!({
                    "in_flight": k,
                    "lifecycles": self.args.throughput_lifecycles,
                    "config": config,
                    "per_second": r.per_second,
                    "containerd_cpu_ms_per_lifecycle": r.containerd_cpu_ms,
                    "plegd_cpu_ms_per_lifecycle": r.plegd_cpu_ms,
                    "failed": r.failed,
                }));
            }
        }
        Ok(Value::Array(rows))
    }

    pub(crate) async fn overload(&self, modes: &[&Mode]) -> Result<Value> {
        let mut rows = Vec::new();
        let k = self.in_flight_or(&[16])[0];
        for mode in modes {
            eprintln!(
                "bench: overload, {}, {} lifecycles, {k} in flight",
                mode.label, self.args.overload_lifecycles
            );
            let plegd = self.plegd(mode)?;
            settled(&plegd).await;
            let watch = plegd.watch()?;
            let (run, _) = self
                .drive(
                    &format!("overload-{}", mode.key),
                    self.args.overload_lifecycles,
                    k,
                    &[],
                )
                .await?;
            let (mut share, mut no_died, mut no_exit) = (Vec::new(), 0, 0);
            let (mut arrival, mut beyond) = (Vec::new(), Vec::new());
            // The slowest deaths by container, to find in plegd's log (`PLEGD_BENCH_KEEP`).
            let mut by_container = Vec::new();
            let deadline = tokio::time::Instant::now() + STRAGGLERS;
            for l in &run.lifecycles {
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                if watch
                    .arrivals
                    .wait(&l.container_id, "ContainerDied", left)
                    .await
                    .is_none()
                {
                    no_died += 1;
                    continue;
                }
                let emitted = watch.arrivals.get(&l.container_id, "ContainerDied emitted");
                let published = self.events.get(&l.container_id, bench::EXIT_PUBLISHED);
                match emitted.zip(published) {
                    Some((emitted, published)) => {
                        let ms = ms_between(published, emitted);
                        share.push(ms);
                        by_container.push((ms, &l.container_id));
                    }
                    None => no_exit += 1,
                }
                // The same envelope's way to another subscriber (this bench's): what the node's
                // load adds before plegd could have it, and what plegd took beyond that.
                let arrived = self.events.get(&l.container_id, bench::EXIT_ARRIVAL);
                if let Some((published, arrived)) = published.zip(arrived) {
                    arrival.push(ms_between(published, arrived));
                    if let Some(emitted) = emitted {
                        beyond.push(ms_between(arrived, emitted));
                    }
                }
            }
            watch.stop();
            plegd.stop();
            rows.push(json!({
                "mode": mode.key,
                "label": mode.label,
                "in_flight": k,
                "lifecycles": run.lifecycles.len(),
                "failed": run.failed.len(),
                "per_second": run.per_second(),
                "share_ms": share,
                "arrival_ms": arrival,
                "beyond_arrival_ms": beyond,
                "no_died": no_died,
                "no_exit_event": no_exit,
                "slowest": slowest(by_container),
            }));
        }
        Ok(Value::Array(rows))
    }

    pub(crate) async fn density(&self) -> Result<Value> {
        let mut filled = Vec::new();
        let rows = self.density_rows(&mut filled).await;
        // Whatever was made goes, whatever went wrong.
        eprintln!("bench: density, removing {} pods", filled.len());
        let removed = churn::in_flight(filled.len(), FILL_IN_FLIGHT, |i| {
            let (cri, pod) = (self.node.cri.clone(), filled[i].pod.clone());
            async move { cri.remove_pod(&pod).await }
        })
        .await;
        for e in removed.into_iter().filter_map(Result::err) {
            eprintln!("bench: density: a pod was not removed: {e:#}");
        }
        rows
    }

    /// Fills the node to each size in turn (into `filled`) and measures a cold start at each.
    async fn density_rows(&self, filled: &mut Vec<Filled>) -> Result<Value> {
        let mut sizes = self.args.pods.clone();
        sizes.sort_unstable();
        let mut rows = Vec::new();
        for &size in &sizes {
            let more = size.saturating_sub(filled.len());
            eprintln!("bench: density, {more} more pods to {size}");
            let began = Instant::now();
            let made = self.fill(filled.len(), more).await;
            let fill_s = began.elapsed().as_secs_f64();
            let mut failed = Vec::new();
            for outcome in made {
                match outcome {
                    Ok(pod) => filled.push(pod),
                    Err(e) => failed.push(e),
                }
            }
            if let Some(e) = failed.into_iter().next() {
                return Err(e.context("filling the node"));
            }
            eprintln!("bench: density, {size} pods made in {fill_s:.1} s; plegd starts");
            let mut row = self.cold_start(filled).await?;
            row["fill_s"] = json!(fill_s);
            rows.push(row);
        }
        Ok(Value::Array(rows))
    }

    /// Makes pods `from..from + count`, each a sandbox and one container: a sleeper, or every
    /// [`EXITED_EVERY`]th one that exited with a code of its own (awaited until CRI shows it).
    async fn fill(&self, from: usize, count: usize) -> Vec<Result<Filled>> {
        churn::in_flight(count, FILL_IN_FLIGHT, |i| {
            let cri = self.node.cri.clone();
            let n = from + i;
            async move {
                let pod = cri.run_pod(&format!("density-{n}")).await?;
                let code = n
                    .is_multiple_of(EXITED_EVERY)
                    .then_some(1 + (n / EXITED_EVERY % 120) as u8);
                let spec = match code {
                    Some(code) => ContainerSpec::exiting("c", code),
                    None => ContainerSpec::sleeper("c"),
                };
                let container = cri.run_container(&pod, &spec).await?;
                if code.is_some() {
                    cri.wait_state(
                        &container,
                        ContainerState::ContainerExited,
                        Duration::from_secs(60),
                    )
                    .await?;
                }
                anyhow::Ok(Filled {
                    pod,
                    container,
                    exit_code: code.map(i32::from),
                })
            }
        })
        .await
    }

    /// Execs plegd on the filled node; the times to `/readyz` 200 and to a complete
    /// `ListPods`, and its RSS then.
    async fn cold_start(&self, filled: &[Filled]) -> Result<Value> {
        let began = Instant::now();
        let plegd = Plegd::launch(
            &self.args.bin,
            &self.node.containerd,
            &self.dir.path().join(format!("density-{}", filled.len())),
            &[],
            std::process::Stdio::null(),
            bench::Birth::default(),
        )?;
        // Asked apart from the listing: ListPods waits for the first full relist.
        let metrics = plegd.metrics;
        let ready = tokio::task::spawn_blocking(move || {
            while began.elapsed() < DENSITY_BOUND {
                if bench::http_status_at(metrics, "/readyz").is_ok_and(|s| s == 200) {
                    return Some(began.elapsed());
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            None
        });
        let mut listed = None;
        let mut last_missing = filled.len() * 2;
        while began.elapsed() < DENSITY_BOUND {
            if let Ok(pods) = plegd.list_pods().await {
                last_missing = unlisted(filled, &pods.pods);
                if last_missing == 0 {
                    listed = Some(began.elapsed());
                    break;
                }
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let ready = ready.await?;
        let (rss, peak) = (
            bench::rss_bytes(plegd.pid()),
            bench::peak_rss_bytes(plegd.pid()),
        );
        plegd.stop();
        let ms = |d: Option<Duration>| d.map(|d| d.as_secs_f64() * 1e3);
        Ok(json!({
            "pods": filled.len(),
            "containers": filled.len() * 2,
            "exited": filled.iter().filter(|f| f.exit_code.is_some()).count(),
            "ready_ms": ms(ready),
            "listed_ms": ms(listed),
            "unlisted": last_missing,
            "rss_bytes": rss,
            "peak_rss_bytes": peak,
        }))
    }
}

/// A pod the density section made, and what its container should show.
struct Filled {
    pod: Pod,
    container: String,
    /// The code it exited with; `None`: it runs.
    exit_code: Option<i32>,
}

/// How many sandboxes and containers of `filled` `pods` does not show in their state (and
/// with their exit code).
fn unlisted(filled: &[Filled], pods: &[pb::PodStatus]) -> usize {
    let shown: BTreeMap<&str, &pb::ContainerStatus> = pods
        .iter()
        .flat_map(|p| &p.containers)
        .map(|c| (c.id.as_str(), c))
        .collect();
    let running = pb::ContainerState::Running as i32;
    let exited = pb::ContainerState::Exited as i32;
    filled
        .iter()
        .map(|f| {
            let sandbox = shown
                .get(f.pod.id.as_str())
                .is_some_and(|c| c.state == running);
            let container = shown
                .get(f.container.as_str())
                .is_some_and(|c| match f.exit_code {
                    None => c.state == running,
                    Some(code) => c.state == exited && c.has_exit_code && c.exit_code == code,
                });
            usize::from(!sandbox) + usize::from(!container)
        })
        .sum()
}

/// plegd's counters a cost window reads at each end.
struct Counters {
    /// `plegd_runtime_calls_total` by method.
    calls: BTreeMap<String, f64>,
    targeted: f64,
    full: f64,
    answered: f64,
    cpu: Duration,
}

impl Counters {
    fn read(plegd: &Plegd) -> Result<Self> {
        let relists = plegd.metric_series("plegd_relists_total")?;
        let scope = |s: &str| {
            relists
                .get(&format!("{{scope=\"{s}\"}}"))
                .copied()
                .unwrap_or_default()
        };
        Ok(Self {
            calls: plegd
                .metric_series("plegd_runtime_calls_total")?
                .into_iter()
                .map(|(series, calls)| {
                    let method = series
                        .trim_start_matches("{call=\"")
                        .trim_end_matches("\"}");
                    (method.to_owned(), calls)
                })
                .collect(),
            targeted: scope("targeted"),
            full: scope("full"),
            answered: plegd.metric("plegd_answered_by_records_total")?,
            cpu: bench::cpu_time(plegd.pid()),
        })
    }

    /// The calls by method since `before`.
    fn calls_since(&self, before: &Self) -> BTreeMap<String, f64> {
        self.calls
            .iter()
            .map(|(method, calls)| {
                let earlier = before.calls.get(method).copied().unwrap_or_default();
                (method.clone(), calls - earlier)
            })
            .collect()
    }
}

/// Of `run`'s lifecycles, those the watcher got no event of, and those missing each owed event,
/// once stragglers had [`STRAGGLERS`] to come; the first few ids of each kind.
async fn missing_events(watch: &Watch, run: &churn::Run) -> Value {
    let deadline = tokio::time::Instant::now() + STRAGGLERS;
    let mut missing: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for l in &run.lifecycles {
        let id = l.container_id.as_str();
        let mut none = true;
        for what in OWED {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if watch.arrivals.wait(id, what, left).await.is_some() {
                none = false;
            } else {
                missing.entry(what).or_default().push(id);
            }
        }
        if none {
            missing.entry("no_event").or_default().push(id);
        }
    }
    let count = |what: &str| missing.get(what).map_or(0, Vec::len);
    let first = |what: &str| -> Vec<&str> {
        missing
            .get(what)
            .map_or(Vec::new(), |ids| ids.iter().take(5).copied().collect())
    };
    json!({
        "no_event": count("no_event"),
        "started": count("ContainerStarted"),
        "died": count("ContainerDied"),
        "removed": count("ContainerRemoved"),
        "no_event_ids": first("no_event"),
        "examples": OWED.iter().map(|w| (w.to_string(), json!(first(w)))).collect::<serde_json::Map<_, _>>(),
    })
}

/// The ten slowest of `deaths` (share in ms, container), slowest first.
fn slowest(mut deaths: Vec<(f64, &String)>) -> Value {
    deaths.sort_by(|a, b| b.0.total_cmp(&a.0));
    deaths.truncate(10);
    deaths
        .into_iter()
        .map(|(ms, id)| json!({ "container": id, "share_ms": ms }))
        .collect()
}
