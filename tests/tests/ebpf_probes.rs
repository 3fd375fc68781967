//! The kernel probes against the real kernel and containerd: each lifecycle step of a real
//! container reaches userspace as a trigger for that container, with what the kernel saw.

use std::time::Duration;

use plegd::{
    pleg::{
        event::{ObservationKind, Trigger, TriggerSource},
        generator::{TriggerReceiver, trigger_channel},
        record::ContainerId,
    },
    runtime::Scope,
    sources::{
        ebpf::{self, Probes},
        status::{SourceRegistry, SourceState},
    },
};
use plegd_tests::{
    ContainerdOptions, PrivateContainerd,
    containerd::CRI_NAMESPACE,
    cri::{ContainerSpec, Cri},
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn container_lifecycle_reaches_userspace_with_kernel_observations() {
    let containerd = PrivateContainerd::start(&ContainerdOptions::unique())
        .await
        .unwrap();
    let probes = Probes::load().expect("eBPF loads on this kernel (root, BTF, tracefs)");
    assert!(
        probes.exit_details(),
        "BTF offsets found: exits carry their status"
    );
    let (tx, mut triggers) = trigger_channel();
    let registry = SourceRegistry::new();
    let shutdown = CancellationToken::new();
    let source = tokio::spawn(ebpf::run(
        probes,
        vec![CRI_NAMESPACE.to_owned()],
        tx,
        registry.clone(),
        plegd::api::Metrics::new(),
        shutdown.clone(),
    ));
    plegd_tests::wait::until("eBPF source connected", DEADLINE, || async {
        anyhow::Ok(registry.any_connected().then_some(()))
    })
    .await
    .unwrap();
    assert_eq!(registry.snapshot()[0].1.state, SourceState::Connected);

    let cri = Cri::connect(&containerd).await.unwrap();
    let tasks = Native::connect_in(&containerd, CRI_NAMESPACE)
        .await
        .unwrap();
    let pod = cri.run_pod("probed").await.unwrap();

    // Created: the cgroup appears (mkdir), then the container's command execs as pid 1 of its
    // pid namespace (busybox's sh then runs `sleep` in place, without another exec).
    let sleeper = cri
        .run_container(&pod, &ContainerSpec::sleeper("sleeper"))
        .await
        .unwrap();
    let exec = trigger_for(&mut triggers, &sleeper, "exec", |t| {
        t.observations
            .iter()
            .any(|o| matches!(&o.kind, ObservationKind::Exec(path) if path == "/bin/sh"))
    })
    .await;
    assert_eq!(exec.source, TriggerSource::Ebpf);

    // kill -9: the init's exit with signal 9.
    tasks.kill_init(&sleeper).await.unwrap();
    trigger_for(&mut triggers, &sleeper, "exit by SIGKILL", |t| {
        has(t, &ObservationKind::Signal(9))
    })
    .await;

    // A chosen exit code.
    let three = cri
        .run_container(&pod, &ContainerSpec::shell("three", "sleep 0.2; exit 3"))
        .await
        .unwrap();
    trigger_for(&mut triggers, &three, "exit code 3", |t| {
        has(t, &ObservationKind::ExitCode(3))
    })
    .await;
    // Its cgroup goes (rmdir) when the CRI plugin deletes the exited task.
    trigger_for(&mut triggers, &three, "cgroup removed", |t| {
        t.observations.is_empty()
    })
    .await;

    // The OOM killer.
    let hog = cri
        .run_container(&pod, &ContainerSpec::oom("hog"))
        .await
        .unwrap();
    trigger_for(&mut triggers, &hog, "OOM kill", |t| {
        has(t, &ObservationKind::OomKilled)
    })
    .await;

    cri.remove_pod(&pod).await.unwrap();
    shutdown.cancel();
    source.await.unwrap().unwrap();
}
