//! A ContainerDied leaves with its reason: the one containerd's CRI store shows once it has
//! caught up (kill -9, exit 0, exit 3, an OOM kill of the init, an OOM kill of a child then
//! the init's death), in the default mode (eBPF and containerd's events), on whichever
//! containerd release the harness runs (`PLEGD_TEST_CONTAINERD`: the suite runs this file on
//! 1.6, 1.7 and 2.1). And an OOM kill of a child whose init lives on is no death: at most one
//! runtime read, the container's status says it, and the init's death that follows carries it.

mod support;

use std::{collections::BTreeMap, time::Duration};

use k8s_cri::v1::ContainerState;
use plegd::{
    config::Mode,
    pleg::{ContainerId, PodUid, Source},
};
use plegd_tests::{
    Node, PrivateContainerd,
    cri::{ContainerSpec, Cri, Pod},
    wait,
};
use serde_json::Value;
use support::{RunningPlegd, push_config};

const DEADLINE: Duration = Duration::from_secs(30);

/// Far longer than the test: every event comes from the push sources.
const SLOW: Duration = Duration::from_secs(300);

/// One test at a time: each plegd's kernel probes see every container on the host, and the
/// runtime reads the other test's containers cost would be counted as this one's.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A 32 MiB container whose init lives on while a child it starts 3 s in is OOM-killed (after
/// the start has settled: the OOM kill's reads are counted alone).
fn oom_child(name: &str) -> ContainerSpec {
    ContainerSpec {
        memory_limit: Some(32 << 20),
        ..ContainerSpec::shell(
            name,
            "sleep 3; (dd if=/dev/zero of=/dev/null bs=200M count=1); exec sleep 2147483647",
        )
    }
}

/// plegd in its default mode (the kernel's probes and containerd's events, full relists far
/// apart) on `containerd`, its sources connected.
async fn start(containerd: &PrivateContainerd) -> RunningPlegd {
    let config = push_config(
        containerd,
        &[Source::Ebpf, Source::Containerd],
        Mode::Auto,
        SLOW,
    );
    let plegd = RunningPlegd::start(config).await;
    plegd.wait_sources_connected(1, DEADLINE).await;
    plegd
}

/// Waits until CRI shows `id` exited; its reason.
async fn cri_reason(cri: &Cri, id: &str) -> String {
    cri.wait_state(id, ContainerState::ContainerExited, DEADLINE)
        .await
        .unwrap()
        .reason
}

/// The reason `id`'s ContainerDied told, and that CRI shows; asserted equal.
async fn same_reason(plegd: &mut RunningPlegd, cri: &Cri, id: &str, what: &str) -> String {
    plegd
        .wait_container(id, &["ContainerStarted", "ContainerDied"], DEADLINE)
        .await;
    let died = plegd.last_of(id).clone();
    let shown = cri_reason(cri, id).await;
    assert_eq!(died["reason"], Value::from(shown.clone()), "{what}: {died}");
    assert!(
        died["confirmed_by"] == "task" || died["confirmed_by"] == "cri",
        "{what}: {died}"
    );
    eprintln!(
        "{what}: ContainerDied exit {} reason {} (CRI: {shown}), confirmed by {}",
        died["exit_code"], died["reason"], died["confirmed_by"]
    );
    shown
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_death_leaves_with_the_reason_cri_shows() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let Node {
        containerd,
        cri,
        tasks,
    } = Node::start().await.unwrap();
    let mut plegd = start(&containerd).await;
    let pod = cri.run_pod("reasons").await.unwrap();

    let killed = cri
        .run_container(&pod, &ContainerSpec::sleeper("killed"))
        .await
        .unwrap();
    plegd
        .wait_container(&killed, &["ContainerStarted"], DEADLINE)
        .await;
    tasks.kill_init(&killed).await.unwrap();
    assert_eq!(
        same_reason(&mut plegd, &cri, &killed, "kill -9").await,
        "Error"
    );

    for (code, expected) in [(0, "Completed"), (3, "Error")] {
        let exits = cri
            .run_container(&pod, &ContainerSpec::exiting(&format!("exit-{code}"), code))
            .await
            .unwrap();
        let what = format!("exit {code}");
        assert_eq!(same_reason(&mut plegd, &cri, &exits, &what).await, expected);
    }

    // containerd's shim misses an OOM event now and then on a loaded machine (cgroup v1's
    // event notification), and its CRI store then says Error, as plegd must too: a hog is
    // tried up to three times for one whose OOM kill the runtime saw. plegd's reason is held
    // to CRI's every time.
    let mut shown = Vec::new();
    for attempt in 0..3 {
        let hog = cri
            .run_container(&pod, &ContainerSpec::oom_init(&format!("hog-{attempt}")))
            .await
            .unwrap();
        let reason = same_reason(&mut plegd, &cri, &hog, "OOM kill of the init").await;
        assert_eq!(plegd.last_of(&hog)["exit_code"], 137);
        shown.push(reason);
        if shown.last().is_some_and(|r| r == "OOMKilled") {
            break;
        }
    }
    assert_eq!(
        shown.last().map(String::as_str),
        Some("OOMKilled"),
        "the runtime saw no OOM kill in three: {shown:?}"
    );

    // The deaths above were confirmed by containerd's task records: their pod is read again
    // once the CRI store has caught up, apart from the child's OOM kill below.
    reads_done(&plegd, &pod).await;
    let own = cri.run_pod("child-oom").await.unwrap();
    child_oom_then_kill(&mut plegd, &cri, &tasks, &own).await;
    plegd.stop().await;
}

/// Waits until no read of `pod` is still to come: its sandbox is read (the kernel sees a new
/// pod's sandbox while the CRI plugin is still making it, and its read comes back a while
/// later, after its pod's first container may have been read), and no record awaits the CRI
/// store (an exit only the task service confirmed is read again once the store catches up; a
/// start the task service confirmed is not, until the next full relist).
async fn reads_done(plegd: &RunningPlegd, pod: &Pod) {
    let cache = plegd.shared.pleg.cache().clone();
    let (uid, sandbox) = (PodUid(pod.uid.clone()), ContainerId(pod.id.clone()));
    wait::until("no read of the pod to come", DEADLINE, || {
        let behind: Vec<String> = cache.get(&uid).record.map_or_else(
            || vec!["no record of the pod".to_owned()],
            |pod| {
                let unread = (!pod.containers.contains_key(&sandbox))
                    .then(|| format!("the sandbox {} not read yet", sandbox.0));
                pod.containers
                    .iter()
                    .filter(|(_, c)| c.awaits_cri())
                    .map(|(id, c)| format!("{} awaits the CRI store: {c:?}", id.0))
                    .chain(unread)
                    .collect()
            },
        );
        async move {
            match behind.as_slice() {
                [] => Ok(Some(())),
                _ => Err(behind.join("; ")),
            }
        }
    })
    .await
    .unwrap();
}

/// A child's OOM kill: no ContainerDied, at most one runtime read, the container's status says
/// it; then a kill -9 of the init: ContainerDied 137, reason OOMKilled, as CRI says.
async fn child_oom_then_kill(
    plegd: &mut RunningPlegd,
    cri: &Cri,
    tasks: &plegd_tests::native::Native,
    pod: &Pod,
) {
    let worker = cri.run_container(pod, &oom_child("worker")).await.unwrap();
    plegd
        .wait_container(&worker, &["ContainerStarted"], DEADLINE)
        .await;
    let calls = |plegd: &RunningPlegd| -> BTreeMap<String, f64> {
        plegd
            .metrics()
            .into_iter()
            .filter(|(series, _)| series.starts_with("plegd_runtime_calls_total"))
            .collect()
    };
    let cache = plegd.shared.pleg.cache().clone();
    let (uid, id) = (PodUid(pod.uid.clone()), ContainerId(worker.clone()));
    // The start's own reads are over (its sandbox's among them): those are the start's, not
    // the OOM kill's.
    reads_done(plegd, pod).await;
    let before = calls(plegd);
    let oom_yet = cache
        .get(&uid)
        .record
        .and_then(|pod| pod.containers.get(&id).map(|c| c.oom_killed()));
    assert_eq!(
        oom_yet,
        Some(false),
        "the child's OOM kill comes after its start settled"
    );
    wait::until(
        "the child's OOM kill on the container's status",
        DEADLINE,
        || {
            let record = cache.get(&uid).record;
            let oom = record.and_then(|pod| pod.containers.get(&id).map(|c| c.oom_killed()));
            async move { anyhow::Ok(oom.filter(|oom| *oom)) }
        },
    )
    .await
    .unwrap();
    // The runtime's word the kill needs no more than one read of it; the grace of the kernel's
    // trigger and containerd's own event both have come and gone by now.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let made: BTreeMap<String, f64> = calls(plegd)
        .into_iter()
        .map(|(series, after)| {
            let rise = after - before.get(&series).copied().unwrap_or_default();
            (series, rise)
        })
        .filter(|(_, rise)| *rise > 0.0)
        .collect();
    let reads = made.values().fold(0.0, |sum, rise| sum + rise);
    eprintln!("OOM kill of a child: {reads} runtime calls {made:?}");
    assert!(
        reads <= 1.0,
        "{reads} runtime calls for a child's OOM kill: {made:?}"
    );
    plegd.drain(Duration::from_millis(200)).await;
    assert_eq!(
        support::types_of(&plegd.events, &worker),
        ["ContainerStarted"],
        "no death: the init lives on"
    );
    let status = cri.container_status(&worker).await.unwrap();
    assert_eq!(status.state, ContainerState::ContainerRunning as i32);

    tasks.kill_init(&worker).await.unwrap();
    let shown = same_reason(plegd, cri, &worker, "OOM kill of a child, then kill -9").await;
    assert_eq!(plegd.last_of(&worker)["exit_code"], 137);
    assert_eq!(shown, "OOMKilled");
}

/// Each death and start counts once, by reason, however many fall between two scrapes: `N`
/// OOM kills and `N` exits raise their counters by exactly what the CRI store shows of them
/// (an OOM kill containerd's shim missed is an `Error` there, and here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn termination_counters_rise_by_exactly_the_deaths() {
    const N: usize = 3;
    let _alone = ONE_AT_A_TIME.lock().await;
    let Node {
        containerd, cri, ..
    } = Node::start().await.unwrap();
    let mut plegd = start(&containerd).await;
    let pod = cri.run_pod("counted").await.unwrap();
    let total = |plegd: &RunningPlegd, family: &str, reason: Option<&str>| -> f64 {
        plegd
            .metrics()
            .iter()
            .filter(|(series, _)| series.starts_with(&format!("{family}{{")))
            .filter(|(series, _)| {
                series.contains(r#"pod="counted""#)
                    && reason.is_none_or(|r| series.contains(&format!(r#"reason="{r}""#)))
            })
            .map(|(_, value)| value)
            .sum()
    };
    // OOMKilled, Error, starts, and deaths whose reason was corrected after their event.
    let counts = |plegd: &RunningPlegd| {
        (
            total(
                plegd,
                "plegd_container_terminations_total",
                Some("OOMKilled"),
            ),
            total(plegd, "plegd_container_terminations_total", Some("Error")),
            total(plegd, "plegd_container_starts_total", None),
            plegd
                .metrics()
                .get("plegd_reason_corrections_total")
                .copied()
                .unwrap_or_default(),
        )
    };
    let before = counts(&plegd);
    let mut ids = Vec::new();
    for i in 0..N {
        ids.push(
            cri.run_container(&pod, &ContainerSpec::oom_init(&format!("hog-{i}")))
                .await
                .unwrap(),
        );
        let spec = ContainerSpec::exiting(&format!("fails-{i}"), 3);
        ids.push(cri.run_container(&pod, &spec).await.unwrap());
    }
    for id in &ids {
        plegd
            .wait_container(id, &["ContainerStarted", "ContainerDied"], DEADLINE)
            .await;
    }
    // What the deaths were, by the CRI store (the reason CRI shows once it has caught up): an
    // OOM kill containerd's shim missed is `Error` there too.
    let mut shown = (0.0, 0.0);
    let mut reasons = Vec::new();
    for id in &ids {
        let reason = cri_reason(&cri, id).await;
        match reason.as_str() {
            "OOMKilled" => shown.0 += 1.0,
            "Error" => shown.1 += 1.0,
            other => panic!("{id} died with reason {other}"),
        }
        reasons.push((id, reason));
    }
    // The counters count the reason on each ContainerDied, once. A death told `Error` before
    // containerd's /tasks/oom came (the shim sends it apart from /tasks/exit) keeps that count
    // and is corrected by a ContainerChanged (`plegd_reason_corrections_total`, a relist
    // later): against the store, every death is counted under its reason or corrected, exactly.
    let n = N as f64;
    let waited = plegd_tests::wait::until("the counters account for every death", DEADLINE, || {
        let after = counts(&plegd);
        let corrected = after.3 - before.3;
        async move { anyhow::Ok((after.0 - before.0 + corrected >= shown.0).then_some(after)) }
    })
    .await;
    let after = match waited {
        Ok(after) => after,
        Err(e) => {
            // Each death as CRI shows it now and as plegd told it, for the one that differs.
            plegd.drain(Duration::from_millis(200)).await;
            let told: Vec<String> = reasons
                .iter()
                .map(|(id, reason)| {
                    let events: Vec<String> = plegd
                        .events
                        .iter()
                        .filter(|event| event["container_id"] == id.as_str())
                        .map(|event| {
                            format!(
                                "{} {} {} {:?} at {}",
                                event["type"],
                                event["reason"],
                                event["confirmed_by"],
                                event["observations"],
                                event["emitted_at"]
                            )
                        })
                        .collect();
                    format!("{id}: CRI {reason}; plegd {events:?}")
                })
                .collect();
            panic!(
                "{e}: CRI shows {shown:?}; {before:?} -> {:?}; deaths: {told:#?}",
                counts(&plegd)
            )
        }
    };
    let corrected = after.3 - before.3;
    assert_eq!(
        (
            after.0 - before.0 + corrected,
            after.1 - before.1 - corrected,
            after.2 - before.2
        ),
        (shown.0, shown.1, 2.0 * n),
        "OOM kills (+ corrected), errors (- corrected) and starts, against CRI's {shown:?}: \
         {before:?} -> {after:?}"
    );
    assert!(shown.1 >= n, "the exits are errors: {shown:?}");
    plegd.stop().await;
}
