//! plegd with its kernel probes (`--mode ebpf`, no other push source, full relists slowed to
//! minutes): container deaths are found through eBPF in milliseconds and carry what the kernel
//! saw; `--mode polling` yields the same events through the relist; `--mode auto` falls back
//! when the probes cannot load.

mod support;

use std::time::{Duration, Instant};

use k8s_cri::v1::ContainerState;
use plegd::{
    config::{Config, Mode, RunArgs},
    daemon::{self, EbpfStart},
    pleg::{Source, Store},
    sources::status::SourceState,
};
use plegd_proto::v1 as pb;
use plegd_tests::{
    Node, PrivateContainerd,
    cri::{ContainerSpec, Cri, PidMode, Pod},
    native::Native,
};
use support::{RunningPlegd, observations, push_config, start_then_kill};

const DEADLINE: Duration = Duration::from_secs(30);

/// Far longer than any wait below: an event within it did not come from the periodic relist.
const SLOW: Duration = Duration::from_secs(300);

/// eBPF as the only push source, relists every `period`, in `mode`.
fn ebpf_config(containerd: &PrivateContainerd, mode: Mode, period: Duration) -> Config {
    push_config(containerd, &[Source::Ebpf], mode, period)
}

/// In every pid namespace mode (each container its own, the pod's, the host's), starts and
/// deaths (kill -9, an exit code, the OOM killer) are found through eBPF, with what the
/// kernel saw, while the full relist sleeps.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deaths_are_found_through_ebpf_long_before_the_relist_with_kernel_observations() {
    let Node {
        containerd,
        cri,
        tasks,
    } = Node::start().await.unwrap();
    let mut plegd = RunningPlegd::start(ebpf_config(&containerd, Mode::Ebpf, SLOW)).await;
    plegd.wait_sources_connected(1, DEADLINE).await;
    // The first full relist (at start) saw no pod; everything below comes from eBPF triggers.
    for mode in PidMode::ALL {
        let pod = cri
            .run_pod_in(&format!("kernel-{mode:?}").to_lowercase(), mode)
            .await
            .unwrap();
        lifecycle_through_ebpf(&mut plegd, &cri, &tasks, &pod).await;
    }
    // Removal from the runtime's store has no kernel trace: the stream sources or the relist
    // report it.
    plegd.stop().await;
}

/// plegd's `Tasks.Wait` calls so far.
fn waits(plegd: &RunningPlegd) -> f64 {
    plegd
        .metrics()
        .get(r#"plegd_runtime_calls_total{call="Tasks.Wait"}"#)
        .copied()
        .unwrap_or(0.0)
}

/// plegd's `Tasks.Wait` calls once they reach `at_least`, or after a second.
async fn wait_for_waits(plegd: &RunningPlegd, at_least: f64) -> f64 {
    let deadline = Instant::now() + Duration::from_secs(1);
    while waits(plegd) < at_least && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    waits(plegd)
}

async fn lifecycle_through_ebpf(plegd: &mut RunningPlegd, cri: &Cri, tasks: &Native, pod: &Pod) {
    let mode = pod.pid_mode;
    // The sandbox's start is told, its exit watched.
    plegd
        .wait_container(&pod.id, &["ContainerStarted"], DEADLINE)
        .await;
    let waits_before = waits(plegd);
    let killed = cri
        .run_container(pod, &ContainerSpec::sleeper("killed"))
        .await
        .unwrap();
    plegd
        .wait_container(&killed, &["ContainerStarted"], DEADLINE)
        .await;
    let started = plegd.last_of(&killed);
    assert_eq!(started["sources"], serde_json::json!(["ebpf"]), "{mode:?}");
    // Found through the exec of its command, or through its cgroup's creation when the relist
    // that hint asked for already saw it running (containerd 2.x starts a task fast): then the
    // exec's relist finds nothing new, and its observation has no event to ride on. busybox's
    // shell runs `sleep` by executing itself again (/proc/self/exe): when the CRI store shows
    // the start only after that, the event carries that exec too, or only it.
    let seen = observations(started);
    assert!(
        seen.iter()
            .all(|o| o == "ebpf:exec=/bin/sh" || o == "ebpf:exec=/proc/self/exe"),
        "{mode:?}: {started}"
    );

    // Its exit is watched from its start (one `Tasks.Wait`, held open), and the death's read
    // is answered by that watch: no `Wait` more.
    let watched = wait_for_waits(plegd, waits_before + 1.0).await;
    assert!(watched > waits_before, "{mode:?}: the exit's watch");

    let kill_at = Instant::now();
    tasks.kill_init(&killed).await.unwrap();
    plegd
        .wait_container(
            &killed,
            &["ContainerStarted", "ContainerDied"],
            Duration::from_secs(5),
        )
        .await;
    let kill_to_event = kill_at.elapsed();
    let died = plegd.last_of(&killed);
    assert_eq!(
        died["sources"],
        serde_json::json!(["ebpf"]),
        "{mode:?}: {died}"
    );
    assert!(
        observations(died).contains(&"ebpf:signal=9".to_owned()),
        "{mode:?}: {died}"
    );
    assert_eq!(died["exit_code"], 137, "{mode:?}");
    // Which store confirmed it is not asserted: the task service through the watch, or the
    // CRI store where it was as quick (2.1, the pod's pid namespace: of two records as far on,
    // CRI's wins).
    assert_eq!(
        waits(plegd),
        watched,
        "{mode:?}: the death asked no Wait of its own"
    );
    eprintln!("{mode:?}: kill -9 to ContainerDied via eBPF: {kill_to_event:?}");

    let exits = cri
        .run_container(pod, &ContainerSpec::shell("exits", "sleep 0.3; exit 3"))
        .await
        .unwrap();
    plegd
        .wait_container(
            &exits,
            &["ContainerStarted", "ContainerDied"],
            Duration::from_secs(10),
        )
        .await;
    let died = plegd.last_of(&exits);
    assert!(
        observations(died).contains(&"ebpf:exit_code=3".to_owned()),
        "{mode:?}: {died}"
    );
    assert_eq!(died["exit_code"], 3, "{mode:?}");

    let hog = cri
        .run_container(pod, &ContainerSpec::oom("hog"))
        .await
        .unwrap();
    plegd
        .wait_container(
            &hog,
            &["ContainerStarted", "ContainerDied"],
            Duration::from_secs(10),
        )
        .await;
    let died = plegd.last_of(&hog);
    assert!(
        observations(died).contains(&"ebpf:oom_killed".to_owned()),
        "{mode:?}: {died}"
    );
    // CRI's reason, unless containerd's task record confirmed the death first: then CRI's
    // status is merged into the cache later, without a second event. Where the killed process
    // is not the init (the shell exits with its status after), containerd may record "Error":
    // whether its OOM event is handled before the exit is its own race (seen on 2.1 with the
    // pod's pid namespace); the kernel's oom_killed above is plegd's part.
    assert!(
        died["reason"] == "OOMKilled"
            || died["reason"] == "Error"
            || (died["reason"] == "" && died["confirmed_by"] == "task"),
        "{mode:?}: {died}"
    );
}

/// The same scenario in polling mode: the same event types, found by the relist.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polling_mode_yields_the_same_events_through_the_relist() {
    let Node {
        containerd,
        cri,
        tasks,
    } = Node::start().await.unwrap();
    let config = ebpf_config(&containerd, Mode::Polling, Duration::from_millis(200));
    assert!(config.sources.is_empty());
    let mut plegd = RunningPlegd::start(config).await;
    let pod = cri.run_pod("polled").await.unwrap();
    let killed = start_then_kill(&mut plegd, &cri, &tasks, &pod, "killed", DEADLINE).await;
    let died = plegd.last_of(&killed);
    assert_eq!(died["sources"], serde_json::json!(["relist"]));
    assert!(observations(died).is_empty());
    assert_eq!(died["exit_code"], 137);
    let ebpf = plegd
        .shared
        .sources
        .snapshot()
        .into_iter()
        .find(|(s, _)| *s == Source::Ebpf)
        .unwrap();
    assert_eq!(ebpf.1.state, SourceState::Disabled);
    plegd.stop().await;
}

/// Runs `auto_mode_child` in a mount namespace of its own where `hidden` (tracefs, the
/// kernel's BTF) are empty tmpfs: the rest of the machine, and other tests, keep them.
fn in_a_mount_namespace_without(hidden: &[&str]) {
    let mounts: String = hidden
        .iter()
        .map(|dir| format!("umount {dir} 2>/dev/null; mount -t tmpfs none {dir} && "))
        .collect();
    let output = std::process::Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg(format!(
            "{mounts}{} --exact auto_mode_child --nocapture --include-ignored",
            std::env::current_exe().unwrap().display()
        ))
        .env("PLEGD_AUTO_MODE_CHILD", hidden.join(" "))
        .output()
        .expect("unshare runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "child failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("1 passed"), "{stdout}");
}

const TRACEFS: &str = "/sys/kernel/tracing";
const BTF: &str = "/sys/kernel/btf";

/// `--mode auto` where the probes can attach in no way (no tracefs for the classic
/// tracepoints, no BTF for the raw ones: an old kernel) falls back with the reason; `--mode
/// ebpf` fails fast with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_mode_runs_without_ebpf_when_it_cannot_load() {
    in_a_mount_namespace_without(&[TRACEFS, BTF]);
}

/// Without tracefs the probes attach as raw tracepoints, which need none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_tracepoints_need_no_tracefs() {
    in_a_mount_namespace_without(&[TRACEFS]);
}

/// Without BTF the probes fall back to the classic tracepoints, one by one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_btf_the_classic_tracepoints_attach() {
    in_a_mount_namespace_without(&[BTF]);
}

/// Runs inside a mount namespace of [`in_a_mount_namespace_without`].
#[tokio::test]
#[ignore = "run by the tests above in a mount namespace of its own"]
async fn auto_mode_child() {
    let hidden =
        std::env::var("PLEGD_AUTO_MODE_CHILD").expect("run by in_a_mount_namespace_without");
    let with_mode = |mode| {
        Config::load(&RunArgs {
            mode: Some(mode),
            ..RunArgs::default()
        })
        .unwrap()
    };
    let (no_tracefs, no_btf) = (hidden.contains(TRACEFS), hidden.contains(BTF));
    let loaded = daemon::load_ebpf(&with_mode(Mode::Auto)).expect("auto mode never fails");
    match (loaded, no_tracefs && no_btf) {
        (EbpfStart::Unavailable(reason), true) => {
            let reason = reason.to_string();
            assert!(reason.contains("tracefs"), "{reason}");
            assert!(reason.contains("btf"), "{reason}");
            let error = daemon::load_ebpf(&with_mode(Mode::Ebpf))
                .err()
                .expect("ebpf mode fails fast");
            assert!(error.to_string().contains("tracefs"), "{error}");
        }
        (EbpfStart::Loaded(probes), false) => {
            let programs = probes.program_names();
            assert_eq!(programs.len(), 5, "{programs:?}");
            let raw = programs.iter().filter(|p| p.contains("_raw")).count();
            assert_eq!(raw, if no_btf { 0 } else { 5 }, "{programs:?}");
        }
        (EbpfStart::Unavailable(reason), false) => panic!("the probes did not load: {reason}"),
        (EbpfStart::Off, _) => panic!("auto mode turned eBPF off"),
        (EbpfStart::Loaded(_), true) => panic!("the probes loaded without tracefs and BTF"),
    }
}

/// The same death seen by the kernel and by containerd's event stream yields one
/// `ContainerDied`, naming the sources that saw it by then, each with its observation.
/// Confirmed at the task record, whichever source leads to the record first makes the event,
/// and the other adds none. Confirmed at the CRI store, both usually do: containerd publishes
/// its exit event before its CRI plugin updates the store (the update follows from it). But
/// plegd's stream is one more subscriber of containerd's event exchange, and on a loaded node
/// (containerd 2.1 in a clean-clone CI run) CRI showed the exit before the event reached plegd,
/// 83 ms after the kill: the death went out with the kernel's observation alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_death_seen_by_ebpf_and_containerd_is_one_event() {
    let Node {
        containerd,
        cri,
        tasks,
    } = Node::start().await.unwrap();
    for confirm in [Store::Cri, Store::Task] {
        let mut config = push_config(
            &containerd,
            &[Source::Ebpf, Source::Containerd],
            Mode::Ebpf,
            SLOW,
        );
        config.confirm = confirm;
        let mut plegd = RunningPlegd::start(config).await;
        plegd.wait_sources_connected(2, DEADLINE).await;
        let pod = cri.run_pod(&format!("both-{confirm:?}")).await.unwrap();
        let killed = start_then_kill(&mut plegd, &cri, &tasks, &pod, "killed", DEADLINE).await;
        let died = plegd.last_of(&killed).clone();
        assert_eq!(died["exit_code"], 137, "{died}");
        let seen = observations(&died);
        let sources = died["sources"].as_array().unwrap();
        assert!(
            !sources.is_empty() && sources.iter().all(|s| *s == "ebpf" || *s == "containerd"),
            "{died}"
        );
        // Each source named saw the death. The kernel sees it twice, the signal and the cgroup's
        // removal: under load (a full `cargo xtask test`) the event once carried the removal
        // alone, why is not known yet (the signal's observation never reached it).
        if confirm == Store::Cri {
            for (source, observations) in [
                ("ebpf", &["ebpf:signal=9", "ebpf:cgroup_removed"][..]),
                ("containerd", &["containerd:exit_code=137"][..]),
            ] {
                if sources.iter().any(|s| *s == source) {
                    assert!(
                        observations.iter().any(|o| seen.contains(&(*o).to_owned())),
                        "{died}"
                    );
                }
            }
        }
        // The other source's trigger, and CRI catching up, make no second event.
        cri.wait_state(&killed, ContainerState::ContainerExited, DEADLINE)
            .await
            .unwrap();
        plegd.drain(Duration::from_millis(500)).await;
        assert_eq!(
            support::types_of(&plegd.events, &killed),
            ["ContainerStarted", "ContainerDied"]
        );
        plegd.stop().await;
    }
}

/// A watcher that asks for kernel observations gets the kernel's view of a kill -9 as its own
/// type, unnumbered, before the `ContainerDied` that confirms it and carries the same fact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kernel_observations_reach_a_watcher_ahead_of_the_event_that_confirms_them() {
    let Node {
        containerd,
        cri,
        tasks,
    } = Node::start().await.unwrap();
    let (mut plegd, api) =
        RunningPlegd::start_serving_api(ebpf_config(&containerd, Mode::Ebpf, SLOW)).await;
    plegd.wait_sources_connected(1, DEADLINE).await;
    let pod = cri.run_pod("previewed").await.unwrap();
    let [id] = cri.run_sleepers(&pod, ["k"]).await.unwrap();
    plegd
        .wait_container(&id, &["ContainerStarted"], DEADLINE)
        .await;
    let mut client = api.client().await;
    let mut stream = client
        .watch(pb::WatchRequest {
            pod_uid: pod.uid.clone(),
            include_observations: true,
            include_kernel_observations: true,
            ..pb::WatchRequest::default()
        })
        .await
        .unwrap()
        .into_inner();
    // Read while the kill call is still returning (containerd answers once runc has killed).
    let kill = {
        let id = id.clone();
        tokio::spawn(async move { tasks.kill_init(&id).await })
    };
    let mut seen = Vec::new();
    let died = loop {
        let event = tokio::time::timeout(DEADLINE, stream.message())
            .await
            .expect("events within the deadline")
            .unwrap()
            .expect("stream open");
        if event.container_id != id {
            continue;
        }
        if event.r#type() == pb::EventType::ContainerDied {
            let emitted = std::time::SystemTime::try_from(event.emitted_at.unwrap()).unwrap();
            eprintln!(
                "ContainerDied emission to the watcher: {:?}",
                std::time::SystemTime::now()
                    .duration_since(emitted)
                    .unwrap_or_default()
            );
            break event;
        }
        seen.push((std::time::SystemTime::now(), event));
    };
    let signal_9 = |e: &pb::Event| {
        e.observations.iter().any(|o| {
            o.source() == pb::TriggerSource::Ebpf
                && o.kind == Some(pb::observation::Kind::Signal(9))
        })
    };
    let (arrived, observed) = seen
        .iter()
        .find(|(_, e)| e.r#type() == pb::EventType::KernelObservation && signal_9(e))
        .unwrap_or_else(|| panic!("no kernel observation of the kill before the event: {seen:#?}"));
    let seen_at = std::time::SystemTime::try_from(observed.observed_at.unwrap()).unwrap();
    let emitted = std::time::SystemTime::try_from(observed.emitted_at.unwrap()).unwrap();
    eprintln!(
        "kernel exit to the watcher: {:?} (to plegd's emission {:?})",
        arrived.duration_since(seen_at).unwrap_or_default(),
        emitted.duration_since(seen_at).unwrap_or_default()
    );
    assert_eq!(observed.sequence, 0);
    assert_eq!(observed.pod_uid, pod.uid);
    assert!(signal_9(&died), "{died:?}");
    assert!(died.sequence > 0);
    kill.await.unwrap().unwrap();
    plegd.stop().await;
    api.stopped();
}
