//! Every OOM kill says which limit it came from (issue 54), on this host's cgroup v1 memory
//! controller: a container over its own 32 MiB limit, and a container without a limit in a
//! pod whose cgroup is capped at 48 MiB (a pod-level limit). Each ContainerDied (`plegd run
//! --output json`), the kernel's observation streamed ahead of it and the death as `plegd
//! watch` prints it carry the scope, the cgroup whose limit was hit (the one the kernel's own
//! log names, `oom_memcg=`) and the victim; `plegd_oom_kills_total` and
//! `plegd_pod_oom_kills_total` move by exactly one. The node-level OOM is the node check's
//! (`cargo xtask node`): this host has no memory to spare for one.

mod support;

use std::{collections::BTreeMap, time::Duration};

use plegd::{config::Mode, pleg::Source};
use plegd_tests::{
    Node,
    cri::{ContainerSpec, Cri, Pod},
    oom::{self, KernelOomKill},
};
use serde_json::Value;
use support::{RunningPlegd, WatchLines, push_config};

const DEADLINE: Duration = Duration::from_secs(30);

/// One test at a time: each plegd's kernel probes see every OOM kill on the host.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A counter's value (0 for a series not made yet).
fn value(metrics: &BTreeMap<String, f64>, series: &str) -> f64 {
    metrics.get(series).copied().unwrap_or(0.0)
}

fn node_series(scope: &str) -> String {
    format!("plegd_oom_kills_total{{scope=\"{scope}\"}}")
}

fn pod_series(pod: &Pod, scope: &str) -> String {
    format!(
        "plegd_pod_oom_kills_total{{namespace=\"{}\",pod=\"{}\",scope=\"{scope}\"}}",
        pod.namespace, pod.name
    )
}

/// Runs `spec` in `pod`, waits for its ContainerDied and checks it against the kernel's own
/// word and the watcher's: `scope`, its cgroup (the container's, `<pod cgroup>/<id>` with the
/// cgroupfs driver, or the pod's), the limit `bytes`; the counters move by one. Returns the
/// death's line.
async fn oom_kill(
    plegd: &mut RunningPlegd,
    watch: &mut WatchLines,
    cri: &Cri,
    pod: &Pod,
    spec: &ContainerSpec,
    (scope, bytes): (&str, u64),
) -> Value {
    let before = plegd.metrics();
    let kills_before = oom::kernel_oom_kills().ok();
    let id = cri.run_container(pod, spec).await.unwrap();
    let limited = match scope {
        "container" => oom::container_cgroup_path(pod.cgroup_parent(), &id),
        _ => oom::pod_cgroup_path(pod.cgroup_parent()),
    };
    let limited = limited.as_str();
    plegd
        .wait_container(&id, &["ContainerStarted", "ContainerDied"], DEADLINE)
        .await;
    let died = plegd.last_of(&id).clone();
    eprintln!("{scope}: {died}");
    assert_eq!(died["reason"], "OOMKilled", "{died}");
    let account = &died["oom"];
    assert_eq!(account["scope"], scope, "{died}");
    assert_eq!(account["cgroup"], limited, "{died}");
    assert_eq!(account["limit_bytes"], bytes, "{died}");
    assert_eq!(account["victim_comm"], "dd", "{died}");
    assert_eq!(
        account["victim_init"], true,
        "the init was the victim: {died}"
    );
    let pid = u32::try_from(account["victim_pid"].as_u64().unwrap()).unwrap();
    assert_eq!(
        Some(pid),
        died["init_pid"].as_u64().map(|p| p as u32),
        "{died}"
    );
    assert!(
        support::observations(&died)
            .iter()
            .any(|o| o.starts_with(&format!("ebpf:oom_scope={scope}({limited},"))),
        "{died}"
    );

    // The kernel's own word on the kill: the same cgroup.
    let kernel: KernelOomKill = oom::kernel_oom_kill_of(pid, DEADLINE).await.unwrap();
    assert_eq!(kernel.constraint, "CONSTRAINT_MEMCG", "{kernel:?}");
    assert_eq!(kernel.oom_memcg.as_deref(), Some(limited), "{kernel:?}");

    // plegd watch: the kernel's observation ahead of the death, then the death, each with it.
    let ahead = watch
        .until(DEADLINE, |line| {
            line["container_id"] == id.as_str()
                && line["type"] == "KernelObservation"
                && line["oom"].is_object()
        })
        .await;
    assert_eq!(ahead["oom"], *account, "{ahead}");
    let watched = watch
        .until(DEADLINE, |line| {
            line["container_id"] == id.as_str() && line["type"] == "ContainerDied"
        })
        .await;
    assert_eq!(watched["oom"], *account, "{watched}");

    // Exactly one kill counted, on the node (when the kernel made no other meanwhile: this
    // host runs other tests) and in the pod.
    let after = plegd.metrics();
    let on_node = value(&after, &node_series(scope)) - value(&before, &node_series(scope));
    let in_pod = value(&after, &pod_series(pod, scope)) - value(&before, &pod_series(pod, scope));
    eprintln!(
        "{scope}: {} {} -> {}; {} {} -> {}",
        node_series(scope),
        value(&before, &node_series(scope)),
        value(&after, &node_series(scope)),
        pod_series(pod, scope),
        value(&before, &pod_series(pod, scope)),
        value(&after, &pod_series(pod, scope)),
    );
    assert_eq!(in_pod, 1.0, "{}", pod_series(pod, scope));
    // The kernel's kills since, by their victims (its log is a ring: counts do not compare).
    let others = match (kills_before, oom::kernel_oom_kills().ok()) {
        (Some(before), Some(after)) => after
            .iter()
            .filter(|k| k.pid != pid && !before.contains(k))
            .count(),
        _ => 0,
    };
    if others == 0 {
        assert_eq!(on_node, 1.0, "{}", node_series(scope));
    } else {
        eprintln!("{others} other OOM kills on the host meanwhile: the node's count not checked");
    }
    died
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_oom_kill_says_which_limit_it_came_from() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let Node {
        containerd, cri, ..
    } = Node::start().await.unwrap();
    let config = push_config(
        &containerd,
        &[Source::Ebpf, Source::Containerd],
        Mode::Auto,
        support::SLOW,
    );
    // The kernel's side and every trigger: in the suite a pod-limit kill's death once came
    // with no kernel observation of the container at all (containerd's events reached the
    // PLEG before the ring was read up to the kill; the death now waits for that read).
    RunningPlegd::log_to_test_output_or(
        "info,plegd::sources::ebpf=debug,plegd::pleg::driver::generator=trace",
    );
    let (mut plegd, api) = RunningPlegd::start_serving_api(config).await;
    plegd.wait_sources_connected(1, DEADLINE).await;
    let mut watch = WatchLines::spawn(&api.socket, &["--kernel-observations"]);

    // The container over its own limit.
    let own = cri.run_pod("oom-own-limit").await.unwrap();
    oom_kill(
        &mut plegd,
        &mut watch,
        &cri,
        &own,
        &oom::hog("hog", Some(32 << 20)),
        ("container", 32 << 20),
    )
    .await;

    // A container without a limit, in a pod capped at 48 MiB.
    let shared = cri.run_pod("oom-pod-limit").await.unwrap();
    oom::cap_pod_memory(&shared, 48 << 20).unwrap();
    oom_kill(
        &mut plegd,
        &mut watch,
        &cri,
        &shared,
        &oom::hog("hog", None),
        ("pod", 48 << 20),
    )
    .await;
    plegd.stop().await;
    api.stopped();
}
