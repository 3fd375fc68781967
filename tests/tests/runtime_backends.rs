//! Both runtime backends (CRI and containerd's own API) against a real private containerd: pod
//! identity, sandbox records, states, exit codes, scopes, removal, native containers, and
//! errors for unreachable or silent sockets.

use std::{
    collections::BTreeMap,
    path::Path,
    time::{Duration, Instant},
};

use k8s_cri::v1::ContainerState as CriState;
use plegd::{
    pleg::{
        ContainerId, ContainerRecord, ContainerState, PodRecord, PodUid, Runtime, RuntimeError,
        Scope, Store,
    },
    runtime::{AnyRuntime, ConnectError, Keys, PodMetadata, RuntimeKind, RuntimeOptions},
};
use plegd_tests::{
    ContainerdOptions, Node, PrivateContainerd,
    containerd::{CRI_NAMESPACE, NATIVE_NAMESPACE},
    cri::{ContainerSpec, PidMode, pod_labels},
    native::{Native, NativeSpec},
    wait,
};

const DEADLINE: Duration = Duration::from_secs(30);
const KINDS: [RuntimeKind; 2] = [RuntimeKind::Cri, RuntimeKind::Containerd];

async fn start() -> PrivateContainerd {
    PrivateContainerd::start(&ContainerdOptions::unique())
        .await
        .expect("private containerd starts")
}

async fn connect(kind: RuntimeKind, socket: &Path, namespaces: &[&str]) -> AnyRuntime {
    let options = RuntimeOptions {
        namespaces: namespaces.iter().map(|n| (*n).to_owned()).collect(),
        ..RuntimeOptions::default()
    };
    AnyRuntime::connect(kind, socket, options)
        .await
        .unwrap_or_else(|e| panic!("{kind} backend connects: {e}"))
}

fn uid(s: &str) -> PodUid {
    PodUid(s.to_owned())
}

fn record<'a>(pod: &'a PodRecord, id: &str) -> &'a ContainerRecord {
    pod.containers
        .get(&ContainerId(id.to_owned()))
        .unwrap_or_else(|| panic!("{id} not in {pod:#?}"))
}

/// Inspects the pod until `id` is in `state`; returns its record then.
async fn wait_inspected(
    runtime: &AnyRuntime,
    pod: &PodUid,
    id: &str,
    state: ContainerState,
) -> ContainerRecord {
    let what = format!("{id} of {pod} to be {state:?} ({})", runtime.endpoint());
    wait::until(&what, DEADLINE, || async {
        let inspected = runtime.inspect_pod(pod, None).await?;
        let record = inspected.and_then(|p| p.containers.get(&ContainerId(id.to_owned())).cloned());
        Ok::<_, RuntimeError>(record.filter(|r| r.state == state))
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cri_pods_are_listed_with_identity_sandbox_and_states_by_every_scope() {
    let Node {
        containerd, cri, ..
    } = Node::start().await.unwrap();
    let pod = cri.run_pod("two").await.unwrap();
    let other = cri.run_pod("other").await.unwrap();
    let a = cri
        .run_container(&pod, &ContainerSpec::sleeper("a"))
        .await
        .unwrap();
    let b = cri
        .run_container(&pod, &ContainerSpec::sleeper("b"))
        .await
        .unwrap();
    let c = cri
        .run_container(&other, &ContainerSpec::sleeper("c"))
        .await
        .unwrap();
    for id in [&a, &b, &c] {
        cri.wait_state(id, CriState::ContainerRunning, DEADLINE)
            .await
            .unwrap();
    }

    for kind in KINDS {
        let runtime = connect(kind, &containerd.socket(), &[CRI_NAMESPACE]).await;
        assert!(!runtime.version().await.unwrap().version.is_empty());

        let all = runtime.list_pods(&Scope::Node).await.unwrap();
        assert_eq!(all.len(), 2, "{kind}: {all:#?}");
        let listed = all.iter().find(|p| p.uid.0 == pod.uid).unwrap();
        assert_eq!(
            (listed.namespace.as_str(), listed.name.as_str()),
            ("plegd-test", "two"),
            "{kind}"
        );
        assert_eq!(listed.containers.len(), 3, "{kind}: {listed:#?}");
        let sandbox = record(listed, &pod.id);
        assert!(
            sandbox.sandbox && sandbox.name.is_empty(),
            "{kind}: {sandbox:?}"
        );
        assert_eq!(sandbox.state, ContainerState::Running, "{kind}");
        for (id, name) in [(&a, "a"), (&b, "b")] {
            let container = record(listed, id);
            assert_eq!(
                (container.name.as_str(), container.sandbox, container.state),
                (name, false, ContainerState::Running),
                "{kind}"
            );
            assert!(container.created_at.is_some(), "{kind}");
        }

        let mut scoped = runtime.list_pods(&Scope::Pod(uid(&pod.uid))).await.unwrap();
        assert_eq!(scoped.len(), 1, "{kind}: {scoped:#?}");
        // The containerd backend lists the node's CRI containers from the CRI store (one call
        // for them all) and one pod's from their tasks: the same states, from another store.
        for record in scoped[0].containers.values_mut() {
            record.confirmed_by = record_of(&all, &record.id.0).confirmed_by;
        }
        assert_eq!(&scoped[0], listed, "{kind}");

        for id in [&a, &pod.id] {
            let found = runtime
                .list_pods(&Scope::Container(ContainerId(id.clone())))
                .await
                .unwrap();
            assert_eq!(found.len(), 1, "{kind}: {found:#?}");
            assert_eq!(found[0].uid.0, pod.uid, "{kind}");
        }

        let inspected = runtime
            .inspect_pod(&uid(&pod.uid), None)
            .await
            .unwrap()
            .unwrap();
        let a_inspected = record(&inspected, &a);
        assert_eq!(
            (a_inspected.state, a_inspected.exit_code),
            (ContainerState::Running, None),
            "{kind}"
        );
        // The statuses the last inspection knows are taken as they were.
        let again = runtime
            .inspect_pod(&uid(&pod.uid), Some(&inspected))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(again, inspected, "{kind}");

        let nobody = uid("no-such-pod");
        assert!(
            runtime
                .list_pods(&Scope::Pod(nobody.clone()))
                .await
                .unwrap()
                .is_empty()
        );
        assert!(runtime.inspect_pod(&nobody, None).await.unwrap().is_none());
        let missing = Scope::Container(ContainerId("no-such-container".into()));
        assert!(runtime.list_pods(&missing).await.unwrap().is_empty());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kills_exit_codes_and_removals_are_reported_by_both_backends() {
    let Node {
        containerd,
        cri,
        tasks,
    } = Node::start().await.unwrap();
    let cri_runtime = connect(RuntimeKind::Cri, &containerd.socket(), &[]).await;
    let native_runtime = connect(RuntimeKind::Containerd, &containerd.socket(), &[]).await;
    let runtimes = [&cri_runtime, &native_runtime];

    let pod = cri.run_pod("exits").await.unwrap();
    let pod_uid = uid(&pod.uid);
    let killed = cri
        .run_container(&pod, &ContainerSpec::sleeper("killed"))
        .await
        .unwrap();
    let three = cri
        .run_container(&pod, &ContainerSpec::exiting("three", 3))
        .await
        .unwrap();
    cri.wait_state(&killed, CriState::ContainerRunning, DEADLINE)
        .await
        .unwrap();
    for runtime in runtimes {
        wait_inspected(runtime, &pod_uid, &killed, ContainerState::Running).await;
    }

    tasks.kill_init(&killed).await.unwrap();
    for runtime in runtimes {
        let record = wait_inspected(runtime, &pod_uid, &killed, ContainerState::Exited).await;
        assert_eq!(record.exit_code, Some(137), "{}", runtime.endpoint());
        assert_eq!(record.reason, "Error", "{}", runtime.endpoint());
        assert!(record.finished_at.is_some(), "{}", runtime.endpoint());

        let record = wait_inspected(runtime, &pod_uid, &three, ContainerState::Exited).await;
        assert_eq!(record.exit_code, Some(3), "{}", runtime.endpoint());

        // A list carries the state but, like CRI's, no exit details.
        let listed = runtime
            .list_pods(&Scope::Pod(pod_uid.clone()))
            .await
            .unwrap();
        let listed = record_of(&listed, &three);
        assert_eq!(
            (listed.state, listed.exit_code),
            (ContainerState::Exited, None)
        );
    }

    cri.remove_container(&three).await.unwrap();
    for runtime in runtimes {
        let listed = runtime
            .list_pods(&Scope::Pod(pod_uid.clone()))
            .await
            .unwrap();
        assert_eq!(listed.len(), 1);
        assert!(
            !listed[0]
                .containers
                .contains_key(&ContainerId(three.clone()))
        );
        let inspected = runtime.inspect_pod(&pod_uid, None).await.unwrap().unwrap();
        assert!(
            !inspected
                .containers
                .contains_key(&ContainerId(three.clone()))
        );
        assert!(
            runtime
                .list_pods(&Scope::Container(ContainerId(three.clone())))
                .await
                .unwrap()
                .is_empty()
        );
    }

    cri.remove_pod(&pod).await.unwrap();
    for runtime in runtimes {
        assert!(runtime.list_pods(&Scope::Node).await.unwrap().is_empty());
        assert!(runtime.inspect_pod(&pod_uid, None).await.unwrap().is_none());
    }
}

fn record_of<'a>(pods: &'a [PodRecord], id: &str) -> &'a ContainerRecord {
    let pod = pods
        .iter()
        .find(|p| p.containers.contains_key(&ContainerId(id.to_owned())))
        .unwrap_or_else(|| panic!("{id} not in {pods:#?}"));
    record(pod, id)
}

/// A full relist inspects a listed pod by reading only the containers whose state changed
/// since the pod's last inspection, on both backends (the containerd backend through CRI, as
/// containerd's own API would read every container's task again): an unchanged container
/// keeps its known record, here marked with a reason no runtime gives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listed_pods_inspection_reads_only_the_containers_that_changed() {
    let Node {
        containerd,
        cri,
        tasks,
    } = Node::start().await.unwrap();
    let pod = cri.run_pod("listed").await.unwrap();
    let [kept, killed] = cri.run_sleepers(&pod, ["kept", "killed"]).await.unwrap();
    for id in [&kept, &killed] {
        cri.wait_state(id, CriState::ContainerRunning, DEADLINE)
            .await
            .unwrap();
    }
    let pod_uid = uid(&pod.uid);
    let listed = |pods: Vec<PodRecord>| pods.into_iter().find(|p| p.uid == pod_uid).unwrap();
    let mut known = Vec::new();
    for kind in KINDS {
        let runtime = connect(kind, &containerd.socket(), &[]).await;
        let pod = listed(runtime.list_pods(&Scope::Node).await.unwrap());
        let mut first = runtime.inspect_listed(pod, None).await.unwrap().unwrap();
        assert_eq!(
            record(&first, &killed).state,
            ContainerState::Running,
            "{kind}"
        );
        first
            .containers
            .get_mut(&ContainerId(kept.clone()))
            .unwrap()
            .reason = "known".into();
        known.push((runtime, first));
    }

    tasks.kill_init(&killed).await.unwrap();
    cri.wait_state(&killed, CriState::ContainerExited, DEADLINE)
        .await
        .unwrap();
    for (runtime, known) in &known {
        let pod = listed(runtime.list_pods(&Scope::Node).await.unwrap());
        let inspected = runtime
            .inspect_listed(pod, Some(known))
            .await
            .unwrap()
            .unwrap();
        let endpoint = runtime.endpoint();
        assert_eq!(
            record(&inspected, &kept).reason,
            "known",
            "{endpoint}: read again"
        );
        let died = record(&inspected, &killed);
        assert_eq!(
            (died.state, died.exit_code, died.reason.as_str()),
            (ContainerState::Exited, Some(137), "Error"),
            "{endpoint}"
        );
    }
}

/// A container read by id before its pod was committed (a hint or the task service's event
/// ahead of the pod's listing) carries the pod's kept labels and annotations: its first event
/// goes out with them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_read_before_its_pod_has_the_pods_labels() {
    let Node {
        containerd, cri, ..
    } = Node::start().await.unwrap();
    let pod = cri
        .run_pod_with("labelled", PidMode::Container, |config| {
            config.labels.insert("app".into(), "web".into());
            config.labels.insert("team".into(), "core".into());
            config
                .annotations
                .insert("example.com/owner".into(), "alice".into());
        })
        .await
        .unwrap();
    let id = cri
        .run_container(&pod, &ContainerSpec::sleeper("app"))
        .await
        .unwrap();
    let kept = PodMetadata {
        labels: Keys::from_list(&["app".to_owned()]),
        annotations: Keys::All,
        ..PodMetadata::default()
    };
    for kind in KINDS {
        for (metadata, labels, annotations) in [
            (PodMetadata::default(), vec![], vec![]),
            (
                kept.clone(),
                vec![("app", "web")],
                vec![("example.com/owner", "alice")],
            ),
        ] {
            let options = RuntimeOptions {
                pod_metadata: metadata,
                ..RuntimeOptions::default()
            };
            let runtime = AnyRuntime::connect(kind, &containerd.socket(), options)
                .await
                .unwrap();
            let read = runtime
                .read_containers(&[ContainerId(id.clone())], None)
                .await
                .unwrap();
            let found = read[0].found.as_ref().expect("the container is found");
            let map = |list: &[(&str, &str)]| -> BTreeMap<String, String> {
                list.iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect()
            };
            assert_eq!(
                (&found.labels, &found.annotations),
                (&map(&labels), &map(&annotations)),
                "{kind}: {found:#?}"
            );
            assert_eq!(found.uid.0, pod.uid, "{kind}");
        }
    }
}

/// RunPodSandbox makes the sandbox's container before its task, and the CRI store has the
/// sandbox only once it is ready: the containerd backend must not read a task-less sandbox
/// CRI does not know as a dead one (a new pod's first event would be its sandbox's death).
/// One CRI has stopped (its task deleted) is: CRI's NOTREADY.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_still_being_made_is_not_read_as_dead_by_the_containerd_backend() {
    let Node {
        containerd, cri, ..
    } = Node::start().await.unwrap();
    let runtime = connect(RuntimeKind::Containerd, &containerd.socket(), &[]).await;
    let making_uid = "5f0c9a52-0d7e-4a6c-9d0e-making000001";
    let mut labels = pod_labels("making", "default", making_uid);
    labels.insert("io.cri-containerd.kind".into(), "sandbox".into());
    let making = NativeSpec {
        labels,
        ..NativeSpec::shell("exec sleep 2147483647")
    };
    let native = Native::connect_in(&containerd, CRI_NAMESPACE)
        .await
        .unwrap();
    native.create("making", &making).await.unwrap();
    let stopped = cri.run_pod("stopped").await.unwrap();
    cri.stop_pod(&stopped).await.unwrap();

    let id = ContainerId("making".to_owned());
    let making_uid = uid(making_uid);
    let listed = runtime.list_pods(&Scope::Node).await.unwrap();
    assert!(listed.iter().all(|p| p.uid != making_uid), "{listed:#?}");
    let by_pod = runtime.list_pods(&Scope::Pod(making_uid.clone())).await;
    assert!(by_pod.unwrap().is_empty());
    let by_id = runtime.list_pods(&Scope::Container(id.clone())).await;
    assert!(by_id.unwrap().is_empty());
    assert!(
        runtime
            .inspect_pod(&making_uid, None)
            .await
            .unwrap()
            .is_none()
    );
    let read = runtime.read_containers(&[id], None).await.unwrap();
    assert!(read[0].found.is_none(), "{read:#?}");

    let stopped_uid = uid(&stopped.uid);
    let listed = runtime.list_pods(&Scope::Node).await.unwrap();
    let pod = listed.iter().find(|p| p.uid == stopped_uid).unwrap();
    assert_eq!(record(pod, &stopped.id).state, ContainerState::Exited);
    let inspected = runtime.inspect_pod(&stopped_uid, None).await.unwrap();
    assert_eq!(
        record(&inspected.unwrap(), &stopped.id).state,
        ContainerState::Exited
    );
    native.remove("making").await.unwrap();
}

/// The containerd backend lists the CRI plugin's namespace without asking a CRI container's
/// shim (containerd's Tasks.List asks every task's shim in turn: seconds on a busy node): the
/// plugin's containers and sandboxes take their state from its store, confirmed by it, a
/// container made there without CRI from its own task.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_containerd_backend_lists_cri_containers_from_the_cri_store() {
    let Node {
        containerd, cri, ..
    } = Node::start().await.unwrap();
    let pod = cri.run_pod("listed").await.unwrap();
    let a = cri
        .run_container(&pod, &ContainerSpec::sleeper("a"))
        .await
        .unwrap();
    cri.wait_state(&a, CriState::ContainerRunning, DEADLINE)
        .await
        .unwrap();
    let plain = Native::connect_in(&containerd, CRI_NAMESPACE)
        .await
        .unwrap();
    plain
        .run("plain", &NativeSpec::shell("exec sleep 2147483647"))
        .await
        .unwrap();
    let runtime = connect(RuntimeKind::Containerd, &containerd.socket(), &[]).await;
    let plain_uid = uid(&format!("{CRI_NAMESPACE}/plain"));
    let listed = |pods: &[PodRecord], uid: &PodUid, id: &str| {
        let pod = pods
            .iter()
            .find(|p| &p.uid == uid)
            .unwrap_or_else(|| panic!("{uid} not listed: {pods:#?}"));
        let record = record(pod, id);
        (record.state, record.confirmed_by)
    };

    let pods = runtime.list_pods(&Scope::Node).await.unwrap();
    let pod_uid = uid(&pod.uid);
    for id in [&a, &pod.id] {
        assert_eq!(
            listed(&pods, &pod_uid, id),
            (ContainerState::Running, Store::Cri)
        );
    }
    assert_eq!(
        listed(&pods, &plain_uid, "plain"),
        (ContainerState::Running, Store::Task)
    );

    cri.stop_container(&a, Duration::ZERO).await.unwrap();
    plain.kill("plain", 9).await.unwrap();
    assert_eq!(plain.wait("plain").await.unwrap(), 137);
    let pods = runtime.list_pods(&Scope::Node).await.unwrap();
    assert_eq!(
        listed(&pods, &pod_uid, &a),
        (ContainerState::Exited, Store::Cri)
    );
    assert_eq!(
        listed(&pods, &plain_uid, "plain"),
        (ContainerState::Exited, Store::Task)
    );
    // Two listings: the plain container's task asked twice, no task list.
    let calls = runtime.calls();
    assert_eq!((calls.made("Tasks.List"), calls.made("Tasks.Get")), (0, 2));
    plain.remove("plain").await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn native_containers_are_their_own_pods_in_the_containerd_backend() {
    let containerd = start().await;
    let native = Native::connect(&containerd).await.unwrap();
    let runtime = connect(
        RuntimeKind::Containerd,
        &containerd.socket(),
        &[CRI_NAMESPACE, NATIVE_NAMESPACE],
    )
    .await;

    native
        .run("sleeper", &NativeSpec::shell("exec sleep 2147483647"))
        .await
        .unwrap();
    native
        .run("three", &NativeSpec::shell("exit 3"))
        .await
        .unwrap();
    assert_eq!(native.wait("three").await.unwrap(), 3);

    let pods = runtime.list_pods(&Scope::Node).await.unwrap();
    assert_eq!(pods.len(), 2, "{pods:#?}");
    let sleeper_uid = uid(&format!("{NATIVE_NAMESPACE}/sleeper"));
    let sleeper = pods.iter().find(|p| p.uid == sleeper_uid).unwrap();
    assert_eq!(
        (sleeper.namespace.as_str(), sleeper.name.as_str()),
        (NATIVE_NAMESPACE, "sleeper")
    );
    let record = record(sleeper, "sleeper");
    assert_eq!(
        (record.name.as_str(), record.sandbox, record.state),
        ("sleeper", false, ContainerState::Running)
    );

    let three_uid = uid(&format!("{NATIVE_NAMESPACE}/three"));
    let three = runtime
        .inspect_pod(&three_uid, None)
        .await
        .unwrap()
        .unwrap();
    let three = &three.containers[&ContainerId("three".into())];
    assert_eq!(
        (three.state, three.exit_code, three.reason.as_str()),
        (ContainerState::Exited, Some(3), "Error")
    );

    let found = runtime
        .list_pods(&Scope::Container(ContainerId("sleeper".into())))
        .await
        .unwrap();
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].uid, sleeper_uid);

    native.kill("sleeper", 9).await.unwrap();
    assert_eq!(native.wait("sleeper").await.unwrap(), 137);
    let killed = runtime
        .inspect_pod(&sleeper_uid, None)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        killed.containers[&ContainerId("sleeper".into())].exit_code,
        Some(137)
    );

    native.remove("three").await.unwrap();
    assert!(
        runtime
            .inspect_pod(&three_uid, None)
            .await
            .unwrap()
            .is_none()
    );
    let pods = runtime.list_pods(&Scope::Node).await.unwrap();
    assert!(pods.iter().all(|p| p.uid != three_uid), "{pods:#?}");

    // The CRI backend sees only CRI's containers.
    let cri = connect(RuntimeKind::Cri, &containerd.socket(), &[]).await;
    assert!(cri.list_pods(&Scope::Node).await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_sockets_give_errors_naming_the_endpoint() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.sock");
    // A socket file whose listener is gone, as after a runtime crash.
    let stale = dir.path().join("stale.sock");
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());

    for kind in KINDS {
        for socket in [&missing, &stale] {
            let error = AnyRuntime::connect(kind, socket, RuntimeOptions::default())
                .await
                .expect_err("nothing listens there");
            let ConnectError::Runtime(RuntimeError::Connect { endpoint, .. }) = &error else {
                panic!("{kind}: unexpected {error:?}");
            };
            assert!(endpoint.contains(&*socket.to_string_lossy()), "{endpoint}");
            assert!(
                error.to_string().contains(&*socket.to_string_lossy()),
                "{error}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_namespaces_are_rejected_before_connecting() {
    let options = RuntimeOptions {
        namespaces: vec!["not a namespace".into()],
        ..RuntimeOptions::default()
    };
    let error = AnyRuntime::connect(RuntimeKind::Containerd, Path::new("/nonexistent"), options)
        .await
        .expect_err("invalid namespace");
    assert!(matches!(error, ConnectError::Namespace(_)), "{error:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_socket_that_never_answers_times_out_within_the_call_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("silent.sock");
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    // Accepts and holds every connection without a byte of HTTP/2.
    let silent = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = listener.accept().await {
            held.push(stream);
        }
    });
    let call_timeout = Duration::from_millis(300);

    for kind in KINDS {
        let options = RuntimeOptions {
            call_timeout,
            ..RuntimeOptions::default()
        };
        let started = Instant::now();
        let result = async {
            let runtime = AnyRuntime::connect(kind, &socket, options).await?;
            runtime.list_pods(&Scope::Node).await?;
            Ok::<_, ConnectError>(())
        }
        .await;
        let elapsed = started.elapsed();
        let Err(ConnectError::Runtime(RuntimeError::Timeout {
            endpoint, timeout, ..
        })) = &result
        else {
            panic!("{kind}: expected a timeout, got {result:?}");
        };
        assert_eq!(*timeout, call_timeout);
        assert!(endpoint.contains(&*socket.to_string_lossy()), "{endpoint}");
        // Connecting and one call, each bounded by the call timeout.
        assert!(elapsed < 3 * call_timeout, "{kind}: took {elapsed:?}");
    }
    silent.abort();
}
