//! `cargo xtask bench`: kill -9 to `ContainerDied` latency, side by side in one run, for
//! plegd with eBPF only, with containerd events only, and polling (1 s relist, kubelet's
//! default), plus the in-kernel cost per run of each eBPF program (kernel bpf_stats).
//!
//! Each round starts a batch of containers in one pod, then kills their init processes one at a
//! time, timing each kill to the arrival of the container's `ContainerDied` line.

#[path = "../tests/support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use plegd::{
    config::{Config, Mode, OutputFormat, RunArgs, SourceName},
    runtime::RuntimeKind,
};
use plegd_tests::{
    ContainerdOptions, PrivateContainerd,
    containerd::CRI_NAMESPACE,
    cri::{ContainerSpec, Cri},
    native::Native,
    process,
};
use support::{RunningPlegd, types_of};

const BATCH: usize = 25;
const ROUNDS: usize = 8;
const DEADLINE: Duration = Duration::from_secs(60);

fn config(
    socket: &std::path::Path,
    sources: &[SourceName],
    mode: Mode,
    period: Duration,
) -> Config {
    Config::load(&RunArgs {
        runtime: Some(RuntimeKind::Cri),
        runtime_endpoint: Some(socket.display().to_string()),
        sources: Some(sources.to_vec()),
        mode: Some(mode),
        relist_period: Some(period),
        slow_relist_period: Some(period),
        output: Some(OutputFormat::Json),
        // In-process daemons save no state between runs.
        state_dir: Some("none".into()),
        ..RunArgs::default()
    })
    .expect("valid bench config")
}

/// Kill-to-event latencies of `ROUNDS * BATCH` kills.
async fn measure(containerd: &PrivateContainerd, config: Config) -> Vec<Duration> {
    let mut plegd = RunningPlegd::start(config).await;
    let cri = Cri::connect(containerd).await.expect("CRI");
    let tasks = Native::connect_in(containerd, CRI_NAMESPACE)
        .await
        .expect("tasks");
    let pod = cri.run_pod("bench").await.expect("pod");
    let mut latencies = Vec::new();
    for round in 0..ROUNDS {
        let mut ids = Vec::new();
        for i in 0..BATCH {
            let spec = ContainerSpec::sleeper(&format!("c{i}"));
            let spec = (0..round).fold(spec, |s, _| s.restarted());
            ids.push(cri.run_container(&pod, &spec).await.expect("container"));
        }
        plegd
            .read_until("all started", DEADLINE, |events| {
                ids.iter()
                    .all(|id| types_of(events, id).contains(&"ContainerStarted".to_owned()))
            })
            .await;
        for (i, id) in ids.iter().enumerate() {
            // Spread the kills over the relist period's phases: killing right after the last
            // event would always land just after a relist and make polling look its worst.
            let phase = ((round * BATCH + i) * 373) % 1000;
            tokio::time::sleep(Duration::from_millis(phase as u64)).await;
            let pid = tasks.init_pid(id).await.expect("pid");
            let killed_at = Instant::now();
            process::kill_all(&[pid], Duration::ZERO);
            plegd
                .read_until("died", DEADLINE, |events| {
                    types_of(events, id).contains(&"ContainerDied".to_owned())
                })
                .await;
            latencies.push(killed_at.elapsed());
        }
        for id in &ids {
            cri.remove_container(id).await.expect("remove");
        }
    }
    cri.remove_pod(&pod).await.expect("remove pod");
    plegd.stop().await;
    latencies.sort();
    latencies
}

fn summary(latencies: &[Duration]) -> String {
    let at = |q: usize| latencies[(latencies.len() * q / 100).min(latencies.len() - 1)];
    format!(
        "p50 {:>9.1?}  p90 {:>9.1?}  p99 {:>9.1?}  max {:>9.1?}  ({} kills)",
        at(50),
        at(90),
        at(99),
        latencies[latencies.len() - 1],
        latencies.len()
    )
}

/// Per plegd program: runs and mean in-kernel time per run, from the kernel's bpf_stats.
/// The kernel keeps 15 characters of a name (`sched_process_e` is exec and exit): programs of
/// one name are told apart by load order, which is `PROGRAMS` order.
fn bpf_costs() -> Vec<(&'static str, u64, Duration)> {
    let mut infos: Vec<_> = aya::programs::loaded_programs().flatten().collect();
    infos.sort_by_key(|info| std::cmp::Reverse(info.id()));
    let mut costs = Vec::new();
    for program in plegd::sources::ebpf::features::PROGRAMS
        .iter()
        .rev()
        .map(|spec| spec.name)
    {
        // The newest loaded program whose kernel name is a prefix of ours, not yet taken.
        let Some(at) = infos.iter().position(|info| {
            info.name_as_str()
                .is_some_and(|n| !n.is_empty() && program.starts_with(n))
        }) else {
            continue;
        };
        let info = infos.remove(at);
        let runs = info.run_count();
        let mean = info.run_time() / u32::try_from(runs.max(1)).unwrap_or(u32::MAX);
        costs.push((program, runs, mean));
    }
    costs.reverse();
    costs
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let containerd = PrivateContainerd::start(&ContainerdOptions::named("bench-kill")).await?;
    println!(
        "kill -9 to ContainerDied, {} kills one at a time ({ROUNDS} batches of {BATCH} containers):",
        ROUNDS * BATCH
    );

    // Counts run time while the fd lives (kernel.bpf_stats_enabled, without touching the sysctl).
    let stats = aya::sys::enable_stats(aya::sys::Stats::RunTime)?;
    let slow = Duration::from_secs(300);
    let ebpf = measure(
        &containerd,
        config(&containerd.socket(), &[SourceName::Ebpf], Mode::Ebpf, slow),
    )
    .await;
    let costs = bpf_costs();
    drop(stats);
    println!("  ebpf only (relist 5 min)          {}", summary(&ebpf));
    let streams = measure(
        &containerd,
        config(
            &containerd.socket(),
            &[SourceName::Containerd],
            Mode::Auto,
            slow,
        ),
    )
    .await;
    println!("  containerd events (relist 5 min)  {}", summary(&streams));
    let polling = measure(
        &containerd,
        config(
            &containerd.socket(),
            &[],
            Mode::Polling,
            Duration::from_secs(1),
        ),
    )
    .await;
    println!("  polling (relist 1 s)              {}", summary(&polling));
    println!(
        "  ebpf p50 is {:.1}x faster than polling",
        polling[polling.len() / 2].as_secs_f64() / ebpf[ebpf.len() / 2].as_secs_f64()
    );
    println!("in-kernel cost per program run (bpf_stats, during the ebpf round):");
    for (name, runs, mean) in costs {
        println!("  {name:<20} {runs:>8} runs  {mean:>9.2?} per run");
    }
    Ok(())
}
