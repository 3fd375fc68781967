//! The kernel probes against the real kernel and containerd: each lifecycle step of a real
//! container reaches userspace as a trigger for that container, with what the kernel saw.

use std::time::Duration;

use plegd::{
    pleg::{
        ContainerId, ObservationKind, Scope, Source, Trigger,
        testing::{TriggerReceiver, trigger_channel},
    },
    sources::{
        ebpf::{self, Probes},
        status::{SourceRegistry, SourceState},
    },
};
use plegd_tests::{
    Node,
    containerd::CRI_NAMESPACE,
    cri::{ContainerSpec, Cri, PidMode, Pod},
    native::Native,
};
use tokio_util::sync::CancellationToken;

const DEADLINE: Duration = Duration::from_secs(30);

/// Reads triggers until one for `container` satisfies `matches`.
async fn trigger_for(
    triggers: &mut TriggerReceiver,
    container: &str,
    what: &str,
    matches: impl Fn(&Trigger) -> bool,
) -> Trigger {
    let scope = Scope::Container(ContainerId(container.to_owned()));
    tokio::time::timeout(DEADLINE, async {
        loop {
            let trigger = triggers.recv().await.expect("source running");
            if trigger.scope == scope && matches(&trigger) {
                return trigger;
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no trigger for {container}: {what} within {DEADLINE:?}"))
}

fn has(trigger: &Trigger, kind: &ObservationKind) -> bool {
    trigger.observations.iter().any(|o| &o.kind == kind)
}

/// Every lifecycle step of containers in each pid namespace mode (their own, the pod's, the
/// host's) reaches userspace as a trigger with what the kernel saw; so do the deaths of
/// containers that were running before the probes attached.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn container_lifecycle_reaches_userspace_with_kernel_observations() {
    let Node {
        containerd: _containerd,
        cri,
        tasks,
    } = Node::start().await.unwrap();

    // Running before the probes attach: userspace finds their inits in /proc.
    let mut earlier = Vec::new();
    for mode in PidMode::ALL {
        let pod = cri
            .run_pod_in(&format!("early-{mode:?}"), mode)
            .await
            .unwrap();
        let id = cri
            .run_container(&pod, &ContainerSpec::sleeper("early"))
            .await
            .unwrap();
        earlier.push((mode, id));
    }

    let probes =
        Probes::load(ebpf::DEFAULT_RING_BYTES).expect("eBPF loads on this kernel (root, tracefs)");
    assert!(
        probes.features().exit_code.is_ok(),
        "BTF gives task_struct.exit_code: exits carry their status"
    );
    let (tx, mut triggers) = trigger_channel();
    let registry = SourceRegistry::new();
    let shutdown = CancellationToken::new();
    let source = tokio::spawn(ebpf::run(
        probes,
        vec![CRI_NAMESPACE.to_owned()],
        tx,
        registry.clone(),
        plegd::base::metrics::Metrics::new(),
        std::sync::Arc::new(plegd::pleg::PodCache::new()),
        shutdown.clone(),
    ));
    plegd_tests::wait::until("eBPF source connected", DEADLINE, || async {
        anyhow::Ok(registry.any_connected().then_some(()))
    })
    .await
    .unwrap();
    assert_eq!(registry.snapshot()[0].1.state, SourceState::Connected);

    for (mode, id) in &earlier {
        tasks.kill_init(id).await.unwrap();
        trigger_for(
            &mut triggers,
            id,
            &format!("{mode:?}: earlier init killed"),
            |t| has(t, &ObservationKind::Signal(9)),
        )
        .await;
    }

    for mode in PidMode::ALL {
        let pod = cri
            .run_pod_in(&format!("probed-{mode:?}"), mode)
            .await
            .unwrap();
        lifecycle_in(&cri, &tasks, &pod, &mut triggers).await;
        cri.remove_pod(&pod).await.unwrap();
    }

    shutdown.cancel();
    source.await.unwrap().unwrap();
}

/// Start, kill -9, exit with a code, cgroup removal and OOM kill of containers in `pod`.
async fn lifecycle_in(cri: &Cri, tasks: &Native, pod: &Pod, triggers: &mut TriggerReceiver) {
    let mode = pod.pid_mode;
    // Created: the cgroup appears (mkdir), then the container's command execs as its init
    // (busybox's sh then runs `sleep` in place).
    let sleeper = cri
        .run_container(pod, &ContainerSpec::sleeper("sleeper"))
        .await
        .unwrap();
    let exec = trigger_for(triggers, &sleeper, &format!("{mode:?}: exec"), |t| {
        t.observations
            .iter()
            .any(|o| matches!(&o.kind, ObservationKind::Exec(path) if path == "/bin/sh"))
    })
    .await;
    assert_eq!(exec.source, Source::Ebpf);

    // kill -9: the init's exit with signal 9.
    tasks.kill_init(&sleeper).await.unwrap();
    trigger_for(
        triggers,
        &sleeper,
        &format!("{mode:?}: exit by SIGKILL"),
        |t| has(t, &ObservationKind::Signal(9)),
    )
    .await;

    // A chosen exit code.
    let three = cri
        .run_container(pod, &ContainerSpec::shell("three", "sleep 0.2; exit 3"))
        .await
        .unwrap();
    trigger_for(triggers, &three, &format!("{mode:?}: exit code 3"), |t| {
        has(t, &ObservationKind::ExitCode(3))
    })
    .await;
    // Its cgroup goes (rmdir) when the CRI plugin deletes the exited task.
    trigger_for(
        triggers,
        &three,
        &format!("{mode:?}: cgroup removed"),
        |t| has(t, &ObservationKind::CgroupRemoved),
    )
    .await;

    // The OOM killer.
    let hog = cri
        .run_container(pod, &ContainerSpec::oom("hog"))
        .await
        .unwrap();
    trigger_for(triggers, &hog, &format!("{mode:?}: OOM kill"), |t| {
        has(t, &ObservationKind::OomKilled)
    })
    .await;
}
