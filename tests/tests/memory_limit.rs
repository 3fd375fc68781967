//! plegd under the memory limit its systemd unit sets (deploy/systemd/plegd.service's
//! `MemoryMax=`, read from the unit, never restated here), through a burst of container
//! lifecycles with two consumers that never read (its own stdout and an API watcher): it stays
//! alive, its memory cgroup saw no OOM kill, and a reading watcher got every transition of
//! every container. Its memory holds no transparent huge page (`plegd::base::heap`: with them, its
//! RSS idle grew by 13 MiB of 2 MiB pages that were mostly empty).
//!
//! plegd is born in a memory cgroup the test creates (cgroup2's `memory.max` where cgroup2 has
//! the memory controller, else v1's `memory.limit_in_bytes`) and removes after, so its start
//! is charged there too. The burst: [`CONTAINERS`] containers started (all running at once),
//! killed with SIGKILL and removed, through CRI on the harness's containerd.
//! `PLEGD_TEST_MEMORY_CONTAINERS` changes their number (docs/install.md's measurement used 300) and
//! `PLEGD_TEST_MEMORY_LIMIT` (bytes, or with K/M/G) the limit: a limit far below it shows the
//! test fail.

mod support;

use std::{
    io::PipeReader,
    path::Path,
    process::{Command, Stdio},
    sync::Arc,
    time::{Duration, Instant},
};

use k8s_cri::v1::ContainerState;
use plegd_tests::{
    Node,
    bench::{Birth, Plegd, cpu_time, peak_rss_bytes, proc_number},
    cri::{ContainerSpec, Cri, Pod},
    native::Native,
    process::{Terminating, is_alive, plegd_binary},
    unit::MemoryCgroup,
};
use tokio::{sync::Semaphore, task::JoinSet};

/// Containers in the burst, all running at once before they are killed.
const CONTAINERS: usize = 100;
/// Pods the containers share.
const PODS: usize = 10;
/// CRI calls in flight at once.
const IN_FLIGHT: usize = 16;
const DEADLINE: Duration = Duration::from_secs(120);

/// The unit's `MemoryMax=`, or `PLEGD_TEST_MEMORY_LIMIT`.
fn memory_limit() -> u64 {
    match std::env::var("PLEGD_TEST_MEMORY_LIMIT") {
        Ok(limit) => plegd_tests::unit::parse_size(&limit).unwrap(),
        Err(_) => plegd_tests::unit::memory_max().unwrap(),
    }
}

fn containers() -> usize {
    std::env::var("PLEGD_TEST_MEMORY_CONTAINERS").map_or(CONTAINERS, |n| {
        n.parse().expect("PLEGD_TEST_MEMORY_CONTAINERS: a number")
    })
}

/// A `plegd watch` on `socket` whose output nobody reads: its stream stalls once the pipe
/// and HTTP/2's windows are full.
fn stalled_watcher(binary: &Path, socket: &Path) -> (Terminating, PipeReader) {
    let (reader, writer) = std::io::pipe().unwrap();
    let child = Command::new(binary)
        .arg("watch")
        .arg("--socket")
        .arg(socket)
        .args(["--output", "json", "--from", "1"])
        .stdin(Stdio::null())
        .stdout(writer)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    (Terminating(child), reader)
}

/// Whether the kernel may give `pid` transparent huge pages (`THP_enabled` of its status,
/// Linux 6.x and some 5.x; `None` where the line is missing), and the KiB of them it holds.
fn huge_pages(pid: i32) -> (Option<bool>, u64) {
    let enabled = proc_number(pid, "status", "THP_enabled:").map(|v| v != 0);
    let held = proc_number(pid, "smaps_rollup", "AnonHugePages:")
        .unwrap_or_else(|| panic!("/proc/{pid}/smaps_rollup: no AnonHugePages"));
    (enabled, held)
}

/// Runs a sleeper per name, [`IN_FLIGHT`] at a time; returns the ids in order.
async fn run_all(cri: &Cri, pods: &[Pod], count: usize) -> Vec<String> {
    let permits = Arc::new(Semaphore::new(IN_FLIGHT));
    let mut started = JoinSet::new();
    for n in 0..count {
        let (cri, pod, permits) = (cri.clone(), pods[n % pods.len()].clone(), permits.clone());
        started.spawn(async move {
            let _permit = permits.acquire().await.unwrap();
            let id = cri
                .run_container(&pod, &ContainerSpec::sleeper(&format!("burst-{n}")))
                .await
                .unwrap();
            (n, id)
        });
    }
    let mut ids = started.join_all().await;
    ids.sort();
    ids.into_iter().map(|(_, id)| id).collect()
}

/// Kills each container's init with SIGKILL, waits for CRI to say exited, removes it.
async fn kill_and_remove_all(cri: &Cri, tasks: &Native, ids: &[String]) {
    let permits = Arc::new(Semaphore::new(IN_FLIGHT));
    let mut ended = JoinSet::new();
    for id in ids {
        let (cri, tasks, permits, id) = (cri.clone(), tasks.clone(), permits.clone(), id.clone());
        ended.spawn(async move {
            let _permit = permits.acquire().await.unwrap();
            tasks.kill_init(&id).await.unwrap();
            cri.wait_state(&id, ContainerState::ContainerExited, DEADLINE)
                .await
                .unwrap();
            cri.remove_container(&id).await.unwrap();
        });
    }
    ended.join_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plegd_stays_alive_under_its_memory_limit_through_a_burst() {
    let limit = memory_limit();
    let count = containers();
    let Node {
        containerd,
        cri,
        tasks,
    } = Node::start().await.unwrap();
    let binary = plegd_binary().unwrap();
    let cgroup = MemoryCgroup::create(&format!("plegd-memory-test-{}", std::process::id()), limit);
    let dir = tempfile::tempdir().unwrap();

    // Its own stdout: a pipe nobody reads.
    let (_unread_stdout, stdout) = std::io::pipe().unwrap();
    let plegd = Plegd::start_born(
        &binary,
        &containerd,
        dir.path(),
        &[],
        stdout.into(),
        Birth {
            cgroup: Some(cgroup.dir.clone()),
            ..Birth::default()
        },
    )
    .unwrap();
    assert!(cgroup.holds(plegd.pid()), "plegd runs in the test's cgroup");
    let watch = plegd.watch_from_start().unwrap();
    let (_stalled, _unread_watch) = stalled_watcher(&binary, &plegd.socket);
    let cpu_before = cpu_time(plegd.pid());
    let began = Instant::now();

    let mut pods = Vec::new();
    for n in 0..PODS {
        pods.push(cri.run_pod(&format!("memory-{n}")).await.unwrap());
    }
    let ids = run_all(&cri, &pods, count).await;
    kill_and_remove_all(&cri, &tasks, &ids).await;
    for pod in &pods {
        cri.remove_pod(pod).await.unwrap();
    }

    let mut missing = Vec::new();
    for id in &ids {
        for what in ["ContainerStarted", "ContainerDied", "ContainerRemoved"] {
            if watch.arrivals.wait(id, what, DEADLINE).await.is_none() {
                missing.push(format!("{id} {what}"));
            }
        }
    }
    let (peak_rss, cpu) = (
        peak_rss_bytes(plegd.pid()),
        cpu_time(plegd.pid()).saturating_sub(cpu_before),
    );
    let elapsed = began.elapsed();
    eprintln!(
        "plegd under a {} MiB limit ({:?}), {count} containers: peak RSS (VmHWM) {:.1} MiB, \
         cgroup peak {:.1} MiB, at the limit {} times, OOM kills {}, CPU {:.2} s in {:.1} s \
         ({:.0}% of a core)",
        limit >> 20,
        cgroup.controller,
        peak_rss as f64 / f64::from(1 << 20),
        cgroup.peak() as f64 / f64::from(1 << 20),
        cgroup.at_limit(),
        cgroup.oom_kills(),
        cpu.as_secs_f64(),
        elapsed.as_secs_f64(),
        100.0 * cpu.as_secs_f64() / elapsed.as_secs_f64(),
    );
    assert!(is_alive(plegd.pid()), "plegd died under its memory limit");
    assert_eq!(cgroup.oom_kills(), 0, "the memory cgroup OOM-killed plegd");
    assert!(
        missing.is_empty(),
        "the watcher missed {} of {} transitions: {missing:?}",
        missing.len(),
        3 * ids.len()
    );
    let (enabled, held) = huge_pages(plegd.pid());
    assert_ne!(enabled, Some(true), "plegd allows transparent huge pages");
    assert_eq!(held, 0, "plegd holds {held} KiB of transparent huge pages");
    watch.stop();
    plegd.stop();
}
