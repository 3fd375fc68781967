//! `cargo xtask bench`: how long a full relist takes.
//!
//! - On the real runtime: 100 pods (sandbox + one container each) made through CRI on a private
//!   containerd, relisted through both backends side by side: a steady-state relist (list, no
//!   change) and one where every pod changed (list + inspect of all 100 pods).
//! - On the fake in-memory runtime (pure core only), with criterion: the same at 100, 1,000 and
//!   10,000 pods, reported per pod (criterion's throughput); `cargo xtask bench` reads
//!   criterion's estimates.json for its report (and sets `PLEGD_BENCH_FAKE_ONLY`).
//!
//! The real runtime's figures are the median (with min and max) of several runs in the same
//! process.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use criterion::{BenchmarkId, Criterion, Throughput};
use plegd::{
    pleg::{
        cache::PodCache,
        event::PodLifecycleEvent,
        health::Health,
        hints::Hints,
        record::ContainerState,
        relist::{RelistConfig, Relister},
    },
    runtime::{
        AnyRuntime, Runtime, RuntimeKind, RuntimeOptions, Scope,
        testing::{FakeRuntime, container},
    },
};
use plegd_tests::{
    ContainerdOptions, PrivateContainerd,
    cri::{ContainerSpec, Cri},
};
use tokio::sync::mpsc;

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

/// A relister whose events are drained as they come.
fn relister<R: Runtime>(runtime: R) -> Relister<R> {
    let health = Arc::new(Health::new(Duration::from_secs(180)));
    let (tx, mut rx) = mpsc::unbounded_channel::<PodLifecycleEvent>();
    tokio::spawn(async move { while rx.recv().await.is_some() {} });
    Relister::new(
        runtime,
        Arc::new(PodCache::new()),
        health,
        Arc::new(tx),
        RelistConfig::default(),
    )
}

async fn time_relist<R: Runtime>(relister: &mut Relister<R>) -> Duration {
    let start = Instant::now();
    relister
        .relist(&Scope::All, &Hints::default(), true)
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

/// Flips every pod's app container between running and exited (untimed), and has the fake
/// forget the calls it recorded, which would otherwise pile up over the run.
fn flip(runtime: &FakeRuntime, pods: usize, exit: bool) {
    let (state, code) = if exit {
        (ContainerState::Exited, Some(1))
    } else {
        (ContainerState::Running, None)
    };
    for i in 0..pods {
        runtime.set_state(&format!("pod-{i:05}"), &format!("ctr-{i:05}"), state, code);
    }
    runtime.forget_calls();
}

/// The pure core at node scale, with criterion: a full relist (list, diff, cache) of the fake
/// runtime at each of `FAKE_PODS`, nothing changed and every pod changed, per pod.
fn fake(c: &mut Criterion, rt: &tokio::runtime::Runtime) {
    let mut group = c.benchmark_group("relist_core");
    for pods in FAKE_PODS {
        group.throughput(Throughput::Elements(pods as u64));
        let runtime = fake_node(pods);
        let mut relister = rt.block_on(async { relister(runtime.clone()) });
        rt.block_on(time_relist(&mut relister));
        group.bench_function(BenchmarkId::new("steady", pods), |b| {
            b.iter_custom(|iters| {
                (0..iters)
                    .map(|_| rt.block_on(time_relist(&mut relister)))
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
                        rt.block_on(time_relist(&mut relister))
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

fn main() -> anyhow::Result<()> {
    let rt = tokio::runtime::Runtime::new()?;
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
