//! `cargo xtask bench`: how long a full relist takes.
//!
//! - On the real runtime: 100 pods (sandbox + one container each) made through CRI on a private
//!   containerd, relisted through both backends side by side: a steady-state relist (list, no
//!   change) and one where every pod changed (list + inspect of all 100 pods).
//! - On the fake in-memory runtime (pure core only), with criterion: the same at 100, 1,000 and
//!   10,000 pods, reported per pod (criterion's throughput), beside the floor no relist gets
//!   under (`dropped`: the listing the runtime handed over, only dropped); `cargo xtask bench` reads
//!   criterion's estimates.json for its report (and sets `PLEGD_BENCH_FAKE_ONLY`). The fake's
//!   listing is copied before each timed relist ([`Prepared`]): copying it, the fake's work and
//!   not plegd's, was about half of a steady relist's time at 10,000 pods. So are its
//!   inspections before a relist where every pod changed: the fake's lookups in its maps and
//!   its copy of each stored record, out of the CPU's caches at 10,000 pods, were a fifth of
//!   that relist (a real runtime's inspection arrives decoded into fresh memory).
//!
//! The real runtime's figures are the median (with min and max) of several runs in the same
//! process.

use std::{
    collections::VecDeque,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use criterion::{BenchmarkId, Criterion, Throughput};
use plegd::{
    pleg::{
        ContainerId, ContainerRead, ContainerState, Health, PodCache, PodLifecycleEvent, PodRecord,
        PodUid, RelistConfig, Runtime, RuntimeError, Scope, TaskRecord,
        testing::{EventSink, Hints, Relister},
    },
    runtime::{
        AnyRuntime, RuntimeKind, RuntimeOptions,
        testing::{FakeRuntime, container},
    },
};
use plegd_tests::{
    ContainerdOptions, PrivateContainerd,
    cri::{ContainerSpec, Cri},
};

const REAL_PODS: usize = 100;
const FAKE_PODS: [usize; 3] = [100, 1_000, 10_000];
const RUNS: usize = 7;

struct Stats(Vec<Duration>);

impl std::fmt::Display for Stats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut v = self.0.clone();
        v.sort();
        write!(
            f,
            "median {:>9.2?}  min {:>9.2?}  max {:>9.2?}  ({} runs)",
            v[v.len() / 2],
            v[0],
            v[v.len() - 1],
            v.len()
        )
    }
}

/// Drops each event it is handed, as a daemon's bus with no subscriber does.
struct Discard;

impl EventSink for Discard {
    fn publish(&self, event: PodLifecycleEvent) {
        std::hint::black_box(event);
    }
}

/// A relister whose events are dropped as they come.
fn relister<R: Runtime>(runtime: R) -> Relister<R> {
    let health = Arc::new(Health::new(Duration::from_secs(180)));
    Relister::new(
        runtime,
        Arc::new(PodCache::new()),
        health,
        Arc::new(Discard),
        RelistConfig::default(),
    )
}

/// The fake runtime with a node listing copied ahead, and each pod's inspection if asked: the
/// next full listing hands the listing over, the next inspection of a pod its copy.
#[derive(Clone)]
struct Prepared {
    fake: FakeRuntime,
    listing: Arc<Mutex<Option<Vec<PodRecord>>>>,
    /// Ascending, as the relist inspects them: each is found at the front (a map of 10,000
    /// was a search out of the caches per inspection, the bench's work and not plegd's).
    inspections: Arc<Mutex<VecDeque<PodRecord>>>,
}

impl Prepared {
    fn of(fake: FakeRuntime) -> Self {
        Self {
            fake,
            listing: Arc::default(),
            inspections: Arc::default(),
        }
    }

    async fn prepare(&self, inspections: bool) {
        let listing = self.fake.list_pods(&Scope::Node).await.expect("fake lists");
        if inspections {
            let mut prepared = VecDeque::with_capacity(listing.len());
            for pod in &listing {
                let inspected = self.fake.inspect_pod(&pod.uid, None).await;
                prepared.extend(inspected.expect("fake inspects"));
            }
            *self.inspections.lock().unwrap() = prepared;
        }
        *self.listing.lock().unwrap() = Some(listing);
        // The calls the fake recorded would otherwise pile up over the run.
        self.fake.forget_calls();
    }
}

impl Runtime for Prepared {
    fn endpoint(&self) -> &str {
        self.fake.endpoint()
    }

    async fn list_pods(&self, scope: &Scope) -> Result<Vec<PodRecord>, RuntimeError> {
        let prepared = match scope {
            Scope::Node => self.listing.lock().unwrap().take(),
            _ => None,
        };
        match prepared {
            Some(listing) => Ok(listing),
            None => self.fake.list_pods(scope).await,
        }
    }

    async fn inspect_pod(
        &self,
        pod: &PodUid,
        known: Option<&PodRecord>,
    ) -> Result<Option<PodRecord>, RuntimeError> {
        let prepared = {
            let mut inspections = self.inspections.lock().unwrap();
            // Those the relist did not ask for (a pod it found unchanged) are passed over.
            while inspections.front().is_some_and(|next| next.uid < *pod) {
                inspections.pop_front();
            }
            inspections.pop_front_if(|next| next.uid == *pod)
        };
        match prepared {
            Some(record) => Ok(Some(record)),
            None => self.fake.inspect_pod(pod, known).await,
        }
    }

    async fn read_containers(
        &self,
        ids: &[ContainerId],
        committed: Option<&PodRecord>,
    ) -> Result<Vec<ContainerRead>, RuntimeError> {
        self.fake.read_containers(ids, committed).await
    }

    async fn task_record(
        &self,
        container: &ContainerId,
    ) -> Result<Option<TaskRecord>, RuntimeError> {
        self.fake.task_record(container).await
    }
}

async fn time_relist<R: Runtime>(relister: &mut Relister<R>) -> Duration {
    let start = Instant::now();
    relister
        .relist(&Scope::Node, &Hints::default(), true)
        .await
        .expect("relist succeeds");
    start.elapsed()
}

/// Steady state (nothing changed) and every-pod-changed relists; `change` flips every pod.
async fn measure<R: Runtime>(runtime: R, change: impl AsyncFn(bool)) -> (Stats, Stats) {
    let mut relister = relister(runtime);
    time_relist(&mut relister).await;
    let mut steady = Vec::new();
    let mut changed = Vec::new();
    for run in 0..RUNS {
        steady.push(time_relist(&mut relister).await);
        change(run % 2 == 0).await;
        changed.push(time_relist(&mut relister).await);
    }
    (Stats(steady), Stats(changed))
}

/// A fake runtime of `pods` pods, each a sandbox and one app container.
fn fake_node(pods: usize) -> FakeRuntime {
    let runtime = FakeRuntime::new();
    for i in 0..pods {
        let pod = format!("pod-{i:05}");
        runtime.add_pod(&pod, "bench", &pod);
        let mut sandbox = container(&format!("sb-{i:05}"), "", ContainerState::Running);
        sandbox.sandbox = true;
        runtime.set_container(&pod, sandbox);
        runtime.set_container(
            &pod,
            container(&format!("ctr-{i:05}"), "app", ContainerState::Running),
        );
    }
    runtime
}

/// Flips every pod's app container between running and exited (untimed).
fn flip(runtime: &FakeRuntime, pods: usize, exit: bool) {
    let (state, code) = if exit {
        (ContainerState::Exited, Some(1))
    } else {
        (ContainerState::Running, None)
    };
    for i in 0..pods {
        runtime.set_state(&format!("pod-{i:05}"), &format!("ctr-{i:05}"), state, code);
    }
}

/// The pure core at node scale, with criterion: a full relist (list, diff, cache) of the fake
/// runtime at each of `FAKE_PODS`, nothing changed and every pod changed, per pod.
fn fake(c: &mut Criterion, rt: &tokio::runtime::Runtime) {
    let mut group = c.benchmark_group("relist_core");
    for pods in FAKE_PODS {
        group.throughput(Throughput::Elements(pods as u64));
        let runtime = fake_node(pods);
        let prepared = Prepared::of(runtime.clone());
        let mut relister = relister(prepared.clone());
        rt.block_on(time_relist(&mut relister));
        let timed = |relister: &mut Relister<Prepared>, inspections: bool| {
            rt.block_on(async {
                prepared.prepare(inspections).await;
                time_relist(relister).await
            })
        };
        group.bench_function(BenchmarkId::new("steady", pods), |b| {
            b.iter_custom(|iters| (0..iters).map(|_| timed(&mut relister, false)).sum())
        });
        // The floor beside the relist: only the listing the runtime handed over, dropped, as
        // every relist drops it. With glibc's malloc it grew per pod as fast as the relist
        // (4.6x from 100 to 10,000 pods: each free reads chunks the caches no longer hold);
        // with plegd's mimalloc, 1.6x.
        group.bench_function(BenchmarkId::new("dropped", pods), |b| {
            b.iter_custom(|iters| {
                (0..iters)
                    .map(|_| {
                        rt.block_on(prepared.prepare(false));
                        let listing = prepared.listing.lock().unwrap().take();
                        let start = Instant::now();
                        drop(std::hint::black_box(listing));
                        start.elapsed()
                    })
                    .sum()
            })
        });
        let mut exit = true;
        group.bench_function(BenchmarkId::new("changed", pods), |b| {
            b.iter_custom(|iters| {
                (0..iters)
                    .map(|_| {
                        flip(&runtime, pods, exit);
                        exit = !exit;
                        timed(&mut relister, true)
                    })
                    .sum()
            })
        });
    }
    group.finish();
}

async fn real() -> anyhow::Result<()> {
    let containerd = PrivateContainerd::start(&ContainerdOptions::named("bench")).await?;
    let cri = Cri::connect(&containerd).await?;
    eprintln!("bench: creating {REAL_PODS} pods on a private containerd...");
    let mut containers = Vec::new();
    for i in 0..REAL_PODS {
        let pod = cri.run_pod(&format!("bench-{i}")).await?;
        containers.push((
            pod.clone(),
            cri.run_container(&pod, &ContainerSpec::sleeper("app"))
                .await?,
        ));
        if (i + 1) % 25 == 0 {
            eprintln!("bench:   {} pods", i + 1);
        }
    }
    // "Every pod changed": each pod's app container is stopped and a new attempt started, so
    // every pod has one Died and one Started event and is inspected.
    let attempt = std::sync::atomic::AtomicU32::new(0);
    let current = std::sync::Mutex::new(containers.clone());
    let change = async |_: bool| {
        let next = attempt.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        let pods: Vec<_> = current.lock().unwrap().clone();
        let mut replaced = Vec::new();
        for (pod, id) in pods {
            cri.stop_container(&id, Duration::ZERO).await.expect("stop");
            cri.remove_container(&id).await.expect("remove");
            let mut spec = ContainerSpec::sleeper("app");
            spec.attempt = next;
            replaced.push((
                pod.clone(),
                cri.run_container(&pod, &spec).await.expect("run"),
            ));
        }
        *current.lock().unwrap() = replaced;
    };
    println!(
        "real containerd 1.6 + runc, {REAL_PODS} pods ({} containers):",
        2 * REAL_PODS
    );
    for kind in [RuntimeKind::Cri, RuntimeKind::Containerd] {
        let runtime =
            AnyRuntime::connect(kind, &containerd.socket(), RuntimeOptions::default()).await?;
        let (steady, changed) = measure(runtime, &change).await;
        let kind = kind.to_string();
        println!("  {kind:<10} full relist, nothing changed   {steady}");
        println!("  {kind:<10} full relist, every pod changed {changed}");
    }
    Ok(())
}

/// plegd's allocator (agent/src/main.rs): what a relist frees is most of its time.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> anyhow::Result<()> {
    // Memory as plegd's, without transparent huge pages.
    plegd::base::heap::keep_huge_pages_out();
    // One thread, as `plegd run` has.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    // criterion reads its own flags (`--bench`, `--sample-size`, filters) from the command line.
    let mut criterion = Criterion::default().configure_from_args();
    fake(&mut criterion, &rt);
    criterion.final_summary();
    // `cargo xtask bench` measures the real runtime elsewhere (`node`) and sets this.
    if std::env::var_os("PLEGD_BENCH_FAKE_ONLY").is_none() {
        rt.block_on(real())?;
    }
    Ok(())
}
