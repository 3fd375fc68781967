use ContainerState::{Created, Exited, Running};
use PodLifecycleEventType::*;
use futures::FutureExt as _;
use tokio::sync::mpsc::{self, UnboundedReceiver};

use super::*;
use crate::{
    pleg::{
        DEFAULT_RELIST_THRESHOLD,
        decide::{
            hints::{Hint, pod_hints},
            reconcile::Why,
        },
        model::{
            event::{PodLifecycleEvent, PodLifecycleEventType},
            record::{ContainerRecord, TaskRecord},
            source::Source,
            trigger::{Observation, ObservationKind, Scope},
        },
        shared::health::HealthError,
    },
    runtime::testing::{FakeRuntime, container},
};

struct Harness {
    runtime: FakeRuntime,
    cache: Arc<PodCache>,
    health: Arc<Health>,
    relister: Relister<FakeRuntime>,
    events: UnboundedReceiver<PodLifecycleEvent>,
}

fn harness(config: RelistConfig) -> Harness {
    let runtime = FakeRuntime::new();
    let cache = Arc::new(PodCache::new());
    let health = Arc::new(Health::new(DEFAULT_RELIST_THRESHOLD));
    let (tx, events) = mpsc::unbounded_channel();
    let relister = Relister::new(
        runtime.clone(),
        cache.clone(),
        health.clone(),
        Arc::new(tx),
        config,
    );
    Harness {
        runtime,
        cache,
        health,
        relister,
        events,
    }
}

fn default_harness() -> Harness {
    harness(RelistConfig::default())
}

fn uid(s: &str) -> PodUid {
    PodUid(s.to_owned())
}

fn cid(s: &str) -> ContainerId {
    ContainerId(s.to_owned())
}

/// A pod with a running sandbox `<pod>-sb` and running containers.
fn add_running_pod(runtime: &FakeRuntime, pod: &str, containers: &[&str]) {
    runtime.add_pod(pod, "ns", &format!("{pod}-name"));
    let mut sandbox = container(&format!("{pod}-sb"), "", Running);
    sandbox.sandbox = true;
    runtime.set_container(pod, sandbox);
    for id in containers {
        runtime.set_container(pod, container(id, &format!("{id}-name"), Running));
    }
}

fn drain(events: &mut UnboundedReceiver<PodLifecycleEvent>) -> Vec<PodLifecycleEvent> {
    std::iter::from_fn(|| events.try_recv().ok()).collect()
}

/// (pod, container, type) of each event, for compact assertions.
fn summary(events: &[PodLifecycleEvent]) -> Vec<(String, String, PodLifecycleEventType)> {
    events
        .iter()
        .map(|e| (e.pod.0.clone(), e.container_id.0.clone(), e.event_type))
        .collect()
}

/// A full relist's walk: committed and listed side by side, reinspections forced, the
/// unlisted gone, what moved on (or is new) to inspect.
#[test]
fn a_full_relist_inspects_what_moved_on_and_reads_the_unlisted_gone() {
    use crate::runtime::testing::{container, pod};
    let running = |uid: &str| pod(uid, uid, [container(&format!("{uid}-c"), "app", Running)]);
    let exited = |uid: &str| pod(uid, uid, [container(&format!("{uid}-c"), "app", Exited)]);
    let mut committed = Committed::default();
    for p in ["a", "b", "c", "d"] {
        committed.commit(&uid(p), Some(Arc::new(running(p))), false);
    }
    let to_reinspect: BTreeSet<PodUid> = [uid("b"), uid("bb")].into();
    // a unlisted, b as committed but awaiting reinspection, bb awaiting it but gone (sorted
    // in among the pods to inspect), c moved on, d as committed, e new.
    let listed = vec![running("b"), exited("c"), running("d"), running("e")];
    let node = node_pods(&committed, &to_reinspect, listed, &HashSet::new());
    let read: Vec<(&str, &PodReading)> = node.pods.iter().map(|(u, r)| (u.0.as_str(), r)).collect();
    use PodReading::{Failed as ToInspect, Gone};
    assert_eq!(
        read,
        [
            ("a", &Gone),
            ("b", &ToInspect),
            ("bb", &Gone),
            ("c", &ToInspect),
            ("e", &ToInspect),
        ]
    );
    let to_inspect: Vec<&PodUid> = node
        .to_inspect
        .iter()
        .map(|(at, _, _)| &node.pods[*at].0)
        .collect();
    assert_eq!(to_inspect, [&uid("b"), &uid("c"), &uid("e")]);
    let known: Vec<bool> = node
        .to_inspect
        .iter()
        .map(|(_, k, _)| k.is_some())
        .collect();
    assert_eq!(
        known,
        [true, true, false],
        "the committed record, where there is one"
    );
    let noted: Vec<&PodUid> = node.fingerprints.iter().map(|(u, _)| u).collect();
    assert_eq!(noted, [&uid("d")], "only the pod listed as committed");
}

/// A pod listed as it was last listed is not compared with its record again; a listing
/// that moved on, or a record committed since, is.
#[test]
fn a_pod_listed_as_last_time_is_compared_again_only_when_either_side_changed() {
    use crate::runtime::testing::{container, pod};
    let with = |state, layer| {
        let mut c = container("c", "app", state);
        c.confirmed_by = layer;
        pod("p", "web", [c])
    };
    let listed = with(Running, Store::Cri);
    let none = HashSet::new();
    let walk = |committed: &mut Committed, listed: &PodRecord| {
        let node = node_pods(committed, &BTreeSet::new(), vec![listed.clone()], &none);
        let counts = (node.to_inspect.len(), node.fingerprints.len());
        for (uid, listing) in &node.fingerprints {
            committed.note_listing(uid, *listing);
        }
        counts
    };
    let mut committed = Committed::default();
    committed.commit(&uid("p"), Some(Arc::new(listed.clone())), false);
    assert_eq!(walk(&mut committed, &listed), (0, 1), "compared, and noted");
    assert_eq!(
        walk(&mut committed, &listed),
        (0, 0),
        "as last listed: not compared"
    );
    // The runtime recorded its container deleted since: the listing that still shows it
    // is another listing.
    let tombstones = HashSet::from([cid("c")]);
    let node = node_pods(
        &committed,
        &BTreeSet::new(),
        vec![listed.clone()],
        &tombstones,
    );
    assert_eq!(node.to_inspect.len(), 1, "its only container deleted");
    let died = with(Exited, Store::Cri);
    assert_eq!(walk(&mut committed, &died), (1, 0), "the listing moved on");
    // The task service confirmed the start: the CRI store's listing, as it was, is now
    // worth an inspection (it confirms the start by its store).
    committed.commit(&uid("p"), Some(Arc::new(with(Running, Store::Task))), false);
    assert_eq!(walk(&mut committed, &listed), (1, 0), "the record changed");
}

fn ev(pod: &str, id: &str, t: PodLifecycleEventType) -> (String, String, PodLifecycleEventType) {
    (pod.to_owned(), id.to_owned(), t)
}

async fn relist_all(h: &mut Harness) -> RelistOutcome {
    h.relister
        .relist(&Scope::Node, &Hints::default(), true)
        .await
        .expect("relist")
}

async fn relist_on(h: &mut Harness, scope: &Scope, hints: &Hints) -> RelistOutcome {
    h.relister
        .relist(scope, hints, false)
        .await
        .expect("relist")
}

fn whys(outcome: &RelistOutcome) -> Vec<Why> {
    outcome.reread.iter().map(|a| a.why).collect()
}

/// Runtime calls so far: (lists, inspections, task statuses).
fn calls(h: &Harness) -> (usize, usize, usize) {
    (
        h.runtime.list_calls().len(),
        h.runtime.inspect_calls().len(),
        h.runtime.task_calls().len(),
    )
}

fn cached(h: &Harness, pod: &str, id: &str) -> ContainerRecord {
    h.cache
        .get(&uid(pod))
        .record
        .expect("cached pod")
        .containers[&cid(id)]
        .clone()
}

fn exit(code: i32, secs: u64) -> ObservationKind {
    ObservationKind::TaskExited {
        code,
        at: SystemTime::UNIX_EPOCH + Duration::from_secs(secs),
    }
}

/// After a restart from a saved reading, only what changed meanwhile is an event, numbered
/// after the saved sequence, and every pod is inspected again into the empty cache.
#[tokio::test]
async fn a_restored_reading_yields_only_what_changed_since() {
    let mut before = default_harness();
    add_running_pod(&before.runtime, "p", &["c1", "c2"]);
    add_running_pod(&before.runtime, "q", &["d"]);
    relist_all(&mut before).await;
    assert_eq!(drain(&mut before.events).len(), 5);
    let (records, sequence) = before.relister.into_saved();
    assert_eq!(sequence, 5);

    let mut after = default_harness();
    add_running_pod(&after.runtime, "p", &["c1", "c2"]);
    add_running_pod(&after.runtime, "q", &["d"]);
    after
        .runtime
        .set_container("p", container("c2", "c2-name", Exited));
    after.relister.restore(records, sequence);
    assert_eq!(after.relister.pod_of(&cid("d")), Some(uid("q")));
    relist_all(&mut after).await;
    let events = drain(&mut after.events);
    assert_eq!(summary(&events), [ev("p", "c2", ContainerDied)]);
    assert_eq!(events[0].sequence, 6);
    for pod in ["p", "q"] {
        assert!(
            after.cache.get(&uid(pod)).record.is_some(),
            "{pod} inspected"
        );
    }
}

/// However many events one pod yields, each is published once, in order.
#[tokio::test]
async fn every_event_of_a_large_pod_is_published_in_order() {
    let mut h = default_harness();
    let names: Vec<String> = (0..50).map(|i| format!("c{i:02}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    add_running_pod(&h.runtime, "p", &names);
    let outcome = relist_all(&mut h).await;
    assert_eq!(outcome.events_sent, 51);
    let events = drain(&mut h.events);
    assert_eq!(
        events.iter().map(|e| e.sequence).collect::<Vec<_>>(),
        (1..=51).collect::<Vec<_>>()
    );
    let outcome = relist_all(&mut h).await;
    assert_eq!((outcome.events_sent, outcome.reread.len()), (0, 0));
}

#[tokio::test]
async fn start_kill_remove() {
    let mut h = default_harness();
    add_running_pod(&h.runtime, "p", &["c"]);
    let outcome = relist_all(&mut h).await;
    assert_eq!((outcome.events_sent, outcome.read), (2, Read::Node));
    let events = drain(&mut h.events);
    assert_eq!(
        summary(&events),
        [
            ev("p", "c", ContainerStarted),
            ev("p", "p-sb", ContainerStarted)
        ]
    );
    assert_eq!(events[0].container_name, "c-name");
    assert_eq!(events[0].pod_name, "p-name");
    assert_eq!(events[0].sources, [Source::Relist]);
    assert_eq!(events[0].confirmed_by, Some(Store::Cri));
    assert_eq!(h.relister.pod_of(&cid("c")), Some(uid("p")));
    assert_eq!(h.health.check(), Ok(()));

    h.runtime.set_state("p", "c", Exited, Some(137));
    relist_all(&mut h).await;
    let events = drain(&mut h.events);
    assert_eq!(summary(&events), [ev("p", "c", ContainerDied)]);
    assert_eq!((events[0].sequence, events[0].exit_code), (3, Some(137)));
    assert_eq!(cached(&h, "p", "c").exit_code, Some(137));

    h.runtime.remove_container("p", "c");
    relist_all(&mut h).await;
    let events = drain(&mut h.events);
    assert_eq!(summary(&events), [ev("p", "c", ContainerRemoved)]);
    assert_eq!(events[0].exit_code, Some(137), "its last record's");
    assert_eq!(h.relister.pod_of(&cid("c")), None);

    // The sandbox vanishes while running: died, then removed.
    h.runtime.remove_pod("p");
    relist_all(&mut h).await;
    assert_eq!(
        summary(&drain(&mut h.events)),
        [
            ev("p", "p-sb", ContainerDied),
            ev("p", "p-sb", ContainerRemoved)
        ]
    );
    assert_eq!(h.cache.get(&uid("p")).record, None);

    // Nothing changed: nothing sent, nothing inspected.
    let before = calls(&h);
    assert_eq!(relist_all(&mut h).await.events_sent, 0);
    assert_eq!(calls(&h), (before.0 + 1, before.1, before.2));
}

/// While containerd's events come, a container whose whole life a full relist found over is
/// told whole, its start from the runtime's record of it (good_neighbour on 1.6: plegd frozen
/// while containers came and went; thawed, its full relist ran before their `/tasks/start`
/// reached it, and their starts were never told). The run's baseline keeps kubelet's rule:
/// one that died before plegd started is told dead only.
#[tokio::test]
async fn a_full_relist_after_the_baseline_tells_a_life_it_found_over_whole() {
    let mut h = default_harness();
    h.relister.set_runtime_events(true);
    let over = |id: &str| {
        let mut record = container(id, &format!("{id}-name"), Exited);
        record.started_at = Some(SystemTime::UNIX_EPOCH + Duration::from_secs(10));
        record.exit_code = Some(137);
        record
    };
    add_running_pod(&h.runtime, "p", &[]);
    h.runtime.set_container("p", over("before"));
    relist_all(&mut h).await;
    let baseline = summary(&drain(&mut h.events));
    assert!(
        baseline.contains(&ev("p", "before", ContainerDied))
            && !baseline.contains(&ev("p", "before", ContainerStarted)),
        "{baseline:?}"
    );

    h.runtime.set_container("p", over("meanwhile"));
    relist_all(&mut h).await;
    let events = drain(&mut h.events);
    assert_eq!(
        summary(&events),
        [
            ev("p", "meanwhile", ContainerStarted),
            ev("p", "meanwhile", ContainerDied)
        ]
    );
    assert_eq!(events[1].exit_code, Some(137));

    // Without the runtime's events, kubelet's rule.
    h.relister.set_runtime_events(false);
    h.runtime.set_container("p", over("unheard"));
    relist_all(&mut h).await;
    assert_eq!(
        summary(&drain(&mut h.events)),
        [ev("p", "unheard", ContainerDied)]
    );
}

#[tokio::test]
async fn a_failed_inspection_is_read_again_by_the_next_relist() {
    let mut h = default_harness();
    add_running_pod(&h.runtime, "p", &["c"]);
    h.runtime.fail_inspection("p", true);
    let outcome = relist_all(&mut h).await;
    assert_eq!((outcome.failed_inspections, outcome.events_sent), (1, 0));
    assert_eq!(h.cache.get(&uid("p")).record, None);

    h.runtime.fail_inspection("p", false);
    let outcome = relist_all(&mut h).await;
    assert_eq!((outcome.failed_inspections, outcome.events_sent), (0, 2));
    assert_eq!(h.runtime.inspect_calls(), [uid("p"), uid("p")]);
}

/// The container dies, the inspection fails, and it runs again by the next relist: its
/// listing shows no change, but the pod is inspected again.
#[tokio::test]
async fn a_failed_inspection_without_a_change_is_read_again() {
    let mut h = default_harness();
    add_running_pod(&h.runtime, "p", &["c"]);
    relist_all(&mut h).await;
    drain(&mut h.events);
    h.runtime.set_state("p", "c", Exited, Some(1));
    h.runtime.fail_inspection("p", true);
    relist_all(&mut h).await;
    h.runtime.fail_inspection("p", false);
    h.runtime.set_state("p", "c", Running, None);
    let before = h.runtime.inspect_calls().len();
    assert_eq!(relist_all(&mut h).await.events_sent, 0);
    assert_eq!(h.runtime.inspect_calls().len(), before + 1);
}

#[tokio::test]
async fn a_pod_that_vanishes_after_a_failed_inspection_is_forgotten() {
    let mut h = default_harness();
    add_running_pod(&h.runtime, "p", &["c"]);
    h.runtime.fail_inspection("p", true);
    relist_all(&mut h).await;
    h.runtime.remove_pod("p");
    let before = h.runtime.inspect_calls().len();
    for _ in 0..2 {
        assert_eq!(relist_all(&mut h).await.events_sent, 0);
    }
    assert_eq!(h.runtime.inspect_calls().len(), before);
    assert!(h.cache.pods().is_empty());
    assert!(format!("{:?}", h.relister).contains("to_reinspect: {}"));
}

/// A targeted relist inspects its pod, lists nothing, and leaves the others to the next
/// full relist.
#[tokio::test]
async fn a_targeted_relist_inspects_its_pod_only() {
    let mut h = default_harness();
    add_running_pod(&h.runtime, "a", &["ca"]);
    add_running_pod(&h.runtime, "b", &["cb"]);
    relist_all(&mut h).await;
    drain(&mut h.events);
    h.runtime.set_state("a", "ca", Exited, Some(0));
    h.runtime.set_state("b", "cb", Exited, Some(0));
    let (lists, inspections, _) = calls(&h);

    let outcome = relist_on(&mut h, &Scope::Pod(uid("a")), &pod_hints("a", &[])).await;
    assert_eq!((outcome.read, whys(&outcome)), (Read::Targeted, vec![]));
    assert_eq!(
        summary(&drain(&mut h.events)),
        [ev("a", "ca", ContainerDied)]
    );
    assert_eq!(h.runtime.inspect_calls()[inspections..], [uid("a")]);
    assert_eq!(h.runtime.list_calls().len(), lists, "no listing");
    assert_eq!(h.relister.pod_of(&cid("cb")), Some(uid("b")));
    relist_all(&mut h).await;
    assert_eq!(
        summary(&drain(&mut h.events)),
        [ev("b", "cb", ContainerDied)]
    );
}

fn exec_hint(id: &str) -> Hints {
    let mut hints = Hints::default();
    hints.insert(
        Scope::Container(cid(id)),
        Hint {
            sources: [Source::Ebpf].into(),
            observed_at: SystemTime::UNIX_EPOCH,
            observations: vec![(
                cid(id),
                Observation {
                    source: Source::Ebpf,
                    kind: ObservationKind::Exec("/app".into()),
                },
            )],
            unspecific: false,
        },
    );
    hints
}

/// The containers whose watched exits the relister handed over since the last call.
fn handed_over(h: &mut Harness) -> Vec<ContainerId> {
    h.relister
        .take_exit_watches()
        .into_iter()
        .map(|(id, _)| id)
        .collect()
}

/// A hint of CRI's events about container `id`, which carries no record of the runtime's.
fn cri_event_hint(id: &str) -> Hints {
    [(
        Scope::Container(cid(id)),
        Hint {
            sources: [Source::CriEvents].into(),
            observed_at: SystemTime::UNIX_EPOCH,
            observations: Vec::new(),
            unspecific: true,
        },
    )]
    .into_iter()
    .collect()
}

/// A container a source saw exec that the runtime does not hold yet is read again until it
/// does, and its start is then credited to that source.
#[tokio::test]
async fn a_new_container_is_read_again_until_the_runtime_holds_it() {
    let mut h = default_harness();
    add_running_pod(&h.runtime, "p", &[]);
    relist_all(&mut h).await;
    drain(&mut h.events);
    let scope = Scope::Container(cid("new"));
    let hints = exec_hint("new");
    let outcome = relist_on(&mut h, &scope, &hints).await;
    assert_eq!(whys(&outcome), [Why::Unreflected]);
    assert!(drain(&mut h.events).is_empty());

    h.runtime.set_container("p", container("new", "n", Created));
    let outcome = relist_on(&mut h, &scope, &hints).await;
    assert_eq!(whys(&outcome), [Why::Unreflected], "created, not running");
    assert_eq!(h.runtime.task_calls(), [cid("new")], "its task was asked");

    h.runtime.set_state("p", "new", Running, None);
    let outcome = relist_on(&mut h, &scope, &hints).await;
    assert_eq!(whys(&outcome), []);
    let events = drain(&mut h.events);
    assert_eq!(summary(&events), [ev("p", "new", ContainerStarted)]);
    assert_eq!(events[0].sources, [Source::Ebpf]);
    assert_eq!(events[0].observations.len(), 1);
}

/// Without the runtime's event stream (eBPF only), a new container's exec is confirmed by
/// its task status while the CRI store still shows it created.
#[tokio::test]
async fn an_exec_of_a_new_container_is_confirmed_by_its_task_status() {
    let mut h = default_harness();
    add_running_pod(&h.runtime, "p", &[]);
    relist_all(&mut h).await;
    drain(&mut h.events);
    h.runtime.set_container("p", container("new", "n", Created));
    h.runtime
        .set_task("new", Some(TaskRecord::Started { at: None }));
    let outcome = relist_on(&mut h, &Scope::Container(cid("new")), &exec_hint("new")).await;
    assert_eq!(whys(&outcome), []);
    let events = drain(&mut h.events);
    assert_eq!(summary(&events), [ev("p", "new", ContainerStarted)]);
    assert_eq!(events[0].confirmed_by, Some(Store::Task));
    assert!(
        outcome.settling.is_empty(),
        "a start awaits nothing of the CRI store"
    );
}

/// containerd's `/tasks/exit` confirms the death while its CRI store still shows the
/// container running: one ContainerDied, complete, and no runtime call; the pod is read
/// once more for CRI's reason, which reaches the cache without a second event.
#[tokio::test]
async fn a_task_exit_confirms_a_death_with_no_runtime_call() {
    let mut h = default_harness();
    add_running_pod(&h.runtime, "p", &["c"]);
    relist_all(&mut h).await;
    drain(&mut h.events);

    let hints = pod_hints("p", &[("c", Source::Containerd, exit(137, 7))]);
    let scope = Scope::Pod(uid("p"));
    let before = calls(&h);
    let outcome = relist_on(&mut h, &scope, &hints).await;
    assert_eq!(
        (outcome.read, whys(&outcome), outcome.settling),
        (Read::Nothing, vec![], vec![cid("c")])
    );
    assert_eq!(calls(&h), before, "the record answered it");
    let events = drain(&mut h.events);
    assert_eq!(summary(&events), [ev("p", "c", ContainerDied)]);
    assert_eq!(
        (events[0].exit_code, events[0].confirmed_by),
        (Some(137), Some(Store::Task))
    );
    let c = cached(&h, "p", "c");
    assert_eq!(
        (c.state, c.exit_code, c.confirmed_by),
        (Exited, Some(137), Store::Task)
    );

    // The settling read: CRI still lags; the confirmed death stands, and it settles on.
    let settle = Hints::default();
    let outcome = h
        .relister
        .relist(&scope, &settle, true)
        .await
        .expect("relist");
    assert_eq!(
        (outcome.read, outcome.settling),
        (Read::Targeted, vec![cid("c")])
    );
    assert!(drain(&mut h.events).is_empty());

    // CRI caught up, and showed another reason than the one told (plegd missed the OOM
    // kill): its reason reaches the cache, and a ContainerChanged says so.
    let mut record = cached(&h, "p", "c");
    assert_eq!(
        record.reason, "Error",
        "containerd's rule for 137 without an OOM kill"
    );
    record.reason = "OOMKilled".into();
    record.confirmed_by = Store::Cri;
    h.runtime.set_container("p", record);
    let outcome = h
        .relister
        .relist(&scope, &settle, true)
        .await
        .expect("relist");
    assert_eq!(
        (outcome.settling, outcome.read_containers),
        (vec![], vec![cid("c")])
    );
    let events = drain(&mut h.events);
    assert_eq!(summary(&events), [ev("p", "c", ContainerChanged)]);
    assert_eq!(
        (events[0].reason.as_str(), events[0].confirmed_by),
        ("OOMKilled", Some(Store::Cri))
    );
    let c = cached(&h, "p", "c");
    assert_eq!(
        (c.reason.as_str(), c.confirmed_by),
        ("OOMKilled", Store::Cri)
    );
}

/// A read in flight when the runtime's /tasks/exit came, showing the container still running
/// by its task record (the containerd backend), does not take the death back: no second
/// ContainerStarted (the soak saw one, with the containerd backend through a plegd restart).
#[tokio::test]
async fn a_read_begun_before_a_task_exit_does_not_take_it_back() {
    let mut h = default_harness();
    add_running_pod(&h.runtime, "p", &["c"]);
    let mut running = container("c", "c-name", Running);
    running.confirmed_by = Store::Task;
    h.runtime.set_container("p", running);
    relist_all(&mut h).await;
    drain(&mut h.events);

    let scope = Scope::Pod(uid("p"));
    let killed = pod_hints("p", &[("c", Source::Ebpf, ObservationKind::Signal(9))]);
    let Begun::Read(stale) = h
        .relister
        .begin(&scope, &killed, &Hints::default(), true, true)
    else {
        panic!("a read of the pod");
    };
    let exited = pod_hints("p", &[("c", Source::Containerd, exit(137, 7))]);
    relist_on(&mut h, &scope, &exited).await;
    assert_eq!(
        summary(&drain(&mut h.events)),
        [ev("p", "c", ContainerDied)]
    );

    let done = stale.run(Arc::clone(h.relister.runtime())).await;
    let _ = h.relister.finish(done, &Hints::default());
    assert!(
        drain(&mut h.events).is_empty(),
        "the stale reading's Running stays behind the exit"
    );
    assert_eq!(cached(&h, "p", "c").state, Exited);
}

/// A task record does not stand in for a reading when another trigger behind the relist
/// needs one (a container the runtime created): the pod is read and both changes found.
#[tokio::test]
async fn a_task_record_beside_an_unspecific_hint_still_reads() {
    let mut h = default_harness();
    add_running_pod(&h.runtime, "p", &["c"]);
    relist_all(&mut h).await;
    drain(&mut h.events);
    h.runtime.set_container("p", container("d", "d", Running));
    let mut hints = pod_hints("p", &[("c", Source::Containerd, exit(1, 0))]);
    for (target, hint) in pod_hints("p", &[]) {
        hints.insert(target, hint);
    }
    let inspections = h.runtime.inspect_calls().len();
    relist_on(&mut h, &Scope::Pod(uid("p")), &hints).await;
    assert_eq!(h.runtime.inspect_calls().len(), inspections + 1);
    assert_eq!(
        summary(&drain(&mut h.events)),
        [ev("p", "c", ContainerDied), ev("p", "d", ContainerStarted)]
    );
}

/// A container that started and exited before its relist read it: the runtime's
/// `/tasks/start` makes its `ContainerStarted` go out before its death. Without that
/// record, or confirming by the CRI store, it folds into the death as in kubelet's PLEG.
#[tokio::test]
async fn a_start_the_task_service_recorded_is_published_though_the_reading_shows_the_exit() {
    let started = ObservationKind::TaskStarted {
        at: SystemTime::UNIX_EPOCH + Duration::from_secs(3),
        pid: 0,
    };
    let runtime_said = |observations: &[ObservationKind]| {
        let observations: Vec<_> = observations
            .iter()
            .map(|o| ("d", Source::Containerd, o.clone()))
            .collect();
        let mut hints = pod_hints("p", &observations);
        for (target, hint) in pod_hints("p", &[]) {
            hints.insert(target, hint);
        }
        hints
    };
    let cri = RelistConfig {
        confirm: Store::Cri,
        ..RelistConfig::default()
    };
    let cases = [
        (
            RelistConfig::default(),
            runtime_said(&[started.clone(), exit(2, 4)]),
            vec![ContainerStarted, ContainerDied],
        ),
        (
            RelistConfig::default(),
            runtime_said(&[exit(2, 4)]),
            vec![ContainerDied],
        ),
        (
            cri,
            runtime_said(&[started, exit(2, 4)]),
            vec![ContainerDied],
        ),
    ];
    for (config, hints, wanted) in cases {
        let mut h = harness(config);
        add_running_pod(&h.runtime, "p", &["c"]);
        relist_all(&mut h).await;
        drain(&mut h.events);
        h.runtime.set_container("p", container("d", "d", Exited));
        relist_on(&mut h, &Scope::Pod(uid("p")), &hints).await;
        let got: Vec<_> = summary(&drain(&mut h.events))
            .into_iter()
            .map(|(_, id, t)| {
                assert_eq!(id, "d");
                t
            })
            .collect();
        assert_eq!(got, wanted, "hints {hints:?}");
    }
}

/// Pod `p` running `c`, committed; the relist scope and the kernel's hint that `c` died.
async fn kernel_death_of_running_container() -> (Harness, Scope, Hints) {
    let mut h = default_harness();
    add_running_pod(&h.runtime, "p", &["c"]);
    relist_all(&mut h).await;
    drain(&mut h.events);
    let hints = pod_hints("p", &[("c", Source::Ebpf, ObservationKind::Signal(9))]);
    (h, Scope::Pod(uid("p")), hints)
}

/// A death seen a moment before a stop, not in the runtime's reading yet, is read again
/// until it is, so that the saved reading holds it with its code.
#[tokio::test(start_paused = true)]
async fn the_relist_before_a_stop_reads_again_what_it_did_not_reflect() {
    let (mut h, _, hints) = kernel_death_of_running_container().await;
    h.runtime
        .set_task("c", Some(TaskRecord::Started { at: None }));
    let runtime = h.runtime.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        runtime.set_task(
            "c",
            Some(TaskRecord::Exited {
                code: 137,
                at: SystemTime::UNIX_EPOCH,
            }),
        );
    });
    let left = h
        .relister
        .relist_before_stop(&hints, STOP_CONFIRM)
        .await
        .expect("relist");
    assert!(left.is_empty(), "{left:?}");
    assert_eq!(
        summary(&drain(&mut h.events)),
        [ev("p", "c", ContainerDied)]
    );
    let (records, _) = h.relister.into_saved();
    let saved = &records[&uid("p")].containers[&cid("c")];
    assert_eq!((saved.state, saved.exit_code), (Exited, Some(137)));
}

/// What the runtime never reflects is given up on at the bound, and handed back.
#[tokio::test(start_paused = true)]
async fn the_relist_before_a_stop_is_bounded() {
    let (mut h, _, hints) = kernel_death_of_running_container().await;
    h.runtime
        .set_task("c", Some(TaskRecord::Started { at: None }));
    let started = Instant::now();
    let left = h
        .relister
        .relist_before_stop(&hints, STOP_CONFIRM)
        .await
        .expect("relist");
    assert_eq!(left.scopes().count(), 1);
    assert!(started.elapsed() <= STOP_CONFIRM, "{:?}", started.elapsed());
    assert!(drain(&mut h.events).is_empty());
}

/// A kernel hint is not a confirmation: the relist waits for the exit the task service
/// records, and only that (or the CRI store) confirms the death. The wait answers as the shim
/// reaps the init; one that does not answer in time (the kernel's false alarm, a shim stuck)
/// leaves the CRI store to tell, and the task is not asked again for a while.
#[tokio::test(start_paused = true)]
async fn a_kernel_death_is_confirmed_by_the_task_service_never_alone() {
    let (mut h, scope, hints) = kernel_death_of_running_container().await;
    h.runtime
        .set_task("c", Some(TaskRecord::Started { at: None }));
    let runtime = h.runtime.clone();
    let reaped = tokio::spawn(async move {
        tokio::time::sleep(TASK_EXIT_WAIT / 10).await;
        runtime.set_task(
            "c",
            Some(TaskRecord::Exited {
                code: 137,
                at: SystemTime::UNIX_EPOCH,
            }),
        );
    });
    let started = Instant::now();
    let outcome = relist_on(&mut h, &scope, &hints).await;
    reaped.await.unwrap();
    assert!(
        started.elapsed() < TASK_EXIT_WAIT,
        "answered as it was reaped"
    );
    assert_eq!((whys(&outcome), outcome.settling), (vec![], vec![cid("c")]));
    let events = drain(&mut h.events);
    assert_eq!(summary(&events), [ev("p", "c", ContainerDied)]);
    assert_eq!(events[0].confirmed_by, Some(Store::Task));
    assert_eq!(events[0].sources, [Source::Ebpf]);
    assert_eq!(h.runtime.task_calls(), [cid("c")]);

    // The task still runs past the wait: not confirmed, and not asked again at once.
    let (mut h, scope, hints) = kernel_death_of_running_container().await;
    h.runtime
        .set_task("c", Some(TaskRecord::Started { at: None }));
    for _ in 0..2 {
        let outcome = relist_on(&mut h, &scope, &hints).await;
        assert_eq!(whys(&outcome), [Why::Unreflected], "the task still runs");
    }
    assert!(drain(&mut h.events).is_empty());
    assert_eq!(h.runtime.task_calls(), [cid("c")]);
    h.runtime.set_state("p", "c", Exited, Some(137));
    relist_on(&mut h, &scope, &hints).await;
    let events = drain(&mut h.events);
    assert_eq!(summary(&events), [ev("p", "c", ContainerDied)]);
    assert_eq!(events[0].confirmed_by, Some(Store::Cri));
}

/// A task that did not answer in time is not asked again at once: the shim is busy.
#[tokio::test(start_paused = true)]
async fn a_busy_task_is_not_asked_again_until_its_backoff_passes() {
    let (mut h, scope, hints) = kernel_death_of_running_container().await;
    h.runtime.set_task(
        "c",
        Some(TaskRecord::Exited {
            code: 137,
            at: SystemTime::UNIX_EPOCH,
        }),
    );
    h.runtime.set_delay(Some(TASK_EXIT_WAIT * 2));
    for _ in 0..3 {
        let outcome = relist_on(&mut h, &scope, &hints).await;
        assert_eq!(whys(&outcome), [Why::Unreflected], "no answer in time");
    }
    assert_eq!(h.runtime.task_calls(), [cid("c")]);
    assert!(drain(&mut h.events).is_empty());

    h.runtime.set_delay(None);
    tokio::time::advance(TASK_BUSY_BACKOFF).await;
    relist_on(&mut h, &scope, &hints).await;
    assert_eq!(h.runtime.task_calls(), [cid("c"), cid("c")]);
    assert_eq!(
        summary(&drain(&mut h.events)),
        [ev("p", "c", ContainerDied)]
    );
}

/// Pod p with container `new` committed as created, its task started, each runtime call
/// answered after `delay`; the runtime's event stream connected or not.
async fn starting_container(events_connected: bool, delay: Duration) -> Harness {
    let mut h = default_harness();
    add_running_pod(&h.runtime, "p", &[]);
    relist_all(&mut h).await;
    h.runtime.set_container("p", container("new", "n", Created));
    relist_all(&mut h).await;
    drain(&mut h.events);
    h.relister.set_runtime_events(events_connected);
    h.runtime
        .set_task("new", Some(TaskRecord::Started { at: None }));
    h.runtime.set_delay(Some(delay));
    h
}

/// A start's status that missed its deadline (the shim busy starting) backs off that ask only:
/// the kill that follows within the backoff still has its exit waited for, and the death is
/// the task service's at once, not the CRI store's a few hundred ms later (eBPF-only mode
/// under churn: deaths 230-260 ms after `/tasks/exit` at the median).
#[tokio::test(start_paused = true)]
async fn a_busy_start_does_not_keep_the_exit_from_being_waited_for() {
    let mut h = starting_container(false, TASK_STATUS_DEADLINE_ALONE * 2).await;
    let outcome = relist_on(&mut h, &Scope::Container(cid("new")), &exec_hint("new")).await;
    assert_eq!(
        whys(&outcome),
        [Why::Unreflected],
        "the start's status missed"
    );
    assert_eq!(h.runtime.task_calls(), [cid("new")]);

    h.runtime.set_delay(None);
    h.runtime.set_state("p", "new", Running, None);
    h.runtime.set_task(
        "new",
        Some(TaskRecord::Exited {
            code: 137,
            at: SystemTime::UNIX_EPOCH,
        }),
    );
    let death = pod_hints("p", &[("new", Source::Ebpf, ObservationKind::Signal(9))]);
    relist_on(&mut h, &Scope::Pod(uid("p")), &death).await;
    assert_eq!(
        h.runtime.task_calls(),
        [cid("new"), cid("new")],
        "the exit's Wait"
    );
    let events = drain(&mut h.events);
    let died = events
        .iter()
        .find(|e| e.event_type == ContainerDied)
        .expect("a ContainerDied");
    assert_eq!(died.confirmed_by, Some(Store::Task));
}

/// A start the kernel saw has its exit watched: the kernel's hint of the death then finds the
/// exit already answered, not behind the shim's cleanup. While the runtime's events come, the
/// answer is also handed over to be told as the runtime's record (whichever of it and
/// `/tasks/exit` comes first). Not a start no kernel hint was about: no kernel hint will ask
/// for it, and no reader of the kernel's ring holds an OOM kill's account for it.
#[tokio::test(start_paused = true)]
async fn a_start_the_kernel_saw_has_its_exit_watched_and_told_while_runtime_events_come() {
    let by_the_runtime = cri_event_hint("new");
    for (events_connected, hints, watched, handed) in [
        (false, exec_hint("new"), vec![cid("new")], vec![]),
        (true, exec_hint("new"), vec![cid("new")], vec![cid("new")]),
        (false, by_the_runtime.clone(), vec![], vec![]),
        (true, by_the_runtime, vec![], vec![]),
    ] {
        let mut h = starting_container(events_connected, Duration::ZERO).await;
        h.runtime.set_state("p", "new", Running, None);
        relist_on(&mut h, &Scope::Container(cid("new")), &hints).await;
        let events = drain(&mut h.events);
        let answers = handed_over(&mut h);
        assert_eq!(
            (summary(&events), h.runtime.exit_watches(), answers),
            (vec![ev("p", "new", ContainerStarted)], watched, handed),
            "runtime events connected: {events_connected}, hints {hints:?}"
        );
    }
}

/// A start told before the kernel's exec of its init reached plegd (runc lets the init exec as
/// `start` returns, and the shim publishes `/tasks/start`) has its exit watched when the exec
/// comes (in a batch's hints, queued while the start's read ran, or as its trigger comes),
/// once; not a container no longer running.
#[tokio::test(start_paused = true)]
async fn a_start_told_before_the_kernels_exec_is_watched_when_the_exec_comes() {
    let by_the_runtime = cri_event_hint("new");
    for (running, watched) in [(true, vec![cid("new")]), (false, vec![])] {
        let mut h = starting_container(true, Duration::ZERO).await;
        h.runtime.set_state("p", "new", Running, None);
        relist_on(&mut h, &Scope::Container(cid("new")), &by_the_runtime).await;
        assert_eq!(
            summary(&drain(&mut h.events)),
            [ev("p", "new", ContainerStarted)]
        );
        assert_eq!(h.runtime.exit_watches(), [], "no kernel hint yet");
        if !running {
            h.runtime.set_state("p", "new", Exited, Some(137));
            relist_on(&mut h, &Scope::Container(cid("new")), &by_the_runtime).await;
            drain(&mut h.events);
        }
        for _ in 0..2 {
            relist_on(&mut h, &Scope::Container(cid("new")), &exec_hint("new")).await;
        }
        let answers = handed_over(&mut h);
        assert_eq!(
            (h.runtime.exit_watches(), answers),
            (watched.clone(), watched),
            "running: {running}"
        );
    }

    // The exec queued while the start's read ran: that read answers it, and watches.
    let mut h = starting_container(true, Duration::ZERO).await;
    h.runtime.set_state("p", "new", Running, None);
    let scope = Scope::Container(cid("new"));
    let Begun::Read(job) = h
        .relister
        .begin(&scope, &by_the_runtime, &Hints::default(), true, true)
    else {
        panic!("the start is read");
    };
    let done = job.run(Arc::clone(h.relister.runtime())).await;
    assert!(matches!(
        h.relister.finish(done, &exec_hint("new")),
        Finished::Done(Ok(_))
    ));
    assert_eq!(
        summary(&drain(&mut h.events)),
        [ev("p", "new", ContainerStarted)]
    );
    assert_eq!(h.runtime.exit_watches(), [cid("new")]);

    // The exec after it, as its trigger comes (the kernel's hint then waits out its grace).
    let mut h = starting_container(true, Duration::ZERO).await;
    h.runtime.set_state("p", "new", Running, None);
    relist_on(&mut h, &scope, &by_the_runtime).await;
    let exec = Trigger::about(
        cid("new"),
        Source::Ebpf,
        SystemTime::UNIX_EPOCH,
        [ObservationKind::Exec("/app".into())],
    );
    h.relister.kernel_saw(&exec);
    h.relister.kernel_saw(&exec);
    assert_eq!(h.runtime.exit_watches(), [cid("new")]);
    assert_eq!(h.relister.take_exit_watches().len(), 1);
}

/// A watched exit's ask that outlasted its wait (the shim still killing what was left of the
/// container) is made again by the next read: it costs no call, and that read takes the
/// watch's answer as it comes. An exit not watched backs off as before.
#[tokio::test(start_paused = true)]
async fn a_watched_exit_outlasting_its_wait_is_asked_again() {
    for (watched, confirmed) in [(true, Some(Store::Task)), (false, None)] {
        let mut h = starting_container(false, Duration::ZERO).await;
        h.runtime.set_state("p", "new", Running, None);
        let start = if watched {
            exec_hint("new")
        } else {
            pod_hints("p", &[("new", Source::Relist, ObservationKind::Present)])
        };
        relist_on(&mut h, &Scope::Container(cid("new")), &start).await;
        drain(&mut h.events);
        assert_eq!(h.runtime.exit_watches().is_empty(), !watched);
        let death = pod_hints("p", &[("new", Source::Ebpf, ObservationKind::Signal(9))]);
        let outcome = relist_on(&mut h, &Scope::Pod(uid("p")), &death).await;
        assert_eq!(whys(&outcome), [Why::Unreflected], "watched: {watched}");
        h.runtime.set_task(
            "new",
            Some(TaskRecord::Exited {
                code: 137,
                at: SystemTime::UNIX_EPOCH,
            }),
        );
        relist_on(&mut h, &Scope::Pod(uid("p")), &death).await;
        let died = drain(&mut h.events)
            .into_iter()
            .find(|e| e.event_type == ContainerDied);
        assert_eq!(
            died.and_then(|e| e.confirmed_by),
            confirmed,
            "watched: {watched}"
        );
    }
}

/// How long a start's task status is waited for depends on whether the runtime's own start
/// event is on its way: with the event stream connected, not past a short deadline (the event
/// answers); without it, long enough for a shim busy starting it. An exit is waited for the
/// same either way ([`TASK_EXIT_WAIT`]).
#[tokio::test(start_paused = true)]
async fn a_starts_status_is_waited_for_longer_when_no_runtime_event_will_come() {
    let slow = (TASK_STATUS_DEADLINE + TASK_STATUS_DEADLINE_ALONE) / 2;
    for (events_connected, started) in [(true, false), (false, true)] {
        let mut h = starting_container(events_connected, slow).await;
        let outcome = relist_on(&mut h, &Scope::Container(cid("new")), &exec_hint("new")).await;
        let events = drain(&mut h.events);
        assert_eq!(
            (outcome.reread.is_empty(), summary(&events)),
            (
                started,
                started
                    .then(|| ev("p", "new", ContainerStarted))
                    .into_iter()
                    .collect()
            ),
            "runtime events connected: {events_connected}"
        );
    }
}

/// Confirming by the CRI store, neither the runtime's records nor the task status make an
/// event before CRI shows the change.
#[tokio::test]
async fn confirming_by_the_cri_store_waits_for_it() {
    let mut h = harness(RelistConfig {
        confirm: Store::Cri,
        ..RelistConfig::default()
    });
    add_running_pod(&h.runtime, "p", &["c"]);
    relist_all(&mut h).await;
    drain(&mut h.events);
    let hints = pod_hints(
        "p",
        &[
            ("c", Source::Containerd, exit(137, 0)),
            ("c", Source::Ebpf, ObservationKind::Signal(9)),
        ],
    );
    h.runtime.set_task(
        "c",
        Some(TaskRecord::Exited {
            code: 137,
            at: SystemTime::UNIX_EPOCH,
        }),
    );
    let outcome = relist_on(&mut h, &Scope::Pod(uid("p")), &hints).await;
    assert_eq!(whys(&outcome), [Why::Unreflected]);
    assert!(drain(&mut h.events).is_empty());
    assert!(h.runtime.task_calls().is_empty());

    h.runtime.set_state("p", "c", Exited, Some(137));
    relist_on(&mut h, &Scope::Pod(uid("p")), &hints).await;
    let events = drain(&mut h.events);
    assert_eq!(summary(&events), [ev("p", "c", ContainerDied)]);
    assert_eq!(events[0].confirmed_by, Some(Store::Cri));
}

/// `/containers/delete` comes a moment before the CRI store forgets the container: a
/// listing taken meanwhile does not bring it back.
#[tokio::test]
async fn a_deleted_container_does_not_come_back_from_a_lagging_listing() {
    let mut h = default_harness();
    add_running_pod(&h.runtime, "p", &["c"]);
    h.runtime.set_state("p", "c", Exited, Some(0));
    relist_all(&mut h).await;
    drain(&mut h.events);
    let deleted = pod_hints("p", &[("c", Source::Containerd, ObservationKind::Deleted)]);
    let outcome = relist_on(&mut h, &Scope::Pod(uid("p")), &deleted).await;
    assert_eq!(outcome.read, Read::Nothing);
    assert_eq!(
        summary(&drain(&mut h.events)),
        [ev("p", "c", ContainerRemoved)]
    );
    relist_all(&mut h).await;
    assert!(drain(&mut h.events).is_empty(), "still listed, not back");
}

#[tokio::test]
async fn changed_events_only_when_asked_for() {
    for emit_changed in [false, true] {
        let mut h = harness(RelistConfig {
            emit_changed,
            ..RelistConfig::default()
        });
        h.runtime.add_pod("p", "ns", "p");
        h.runtime.set_container("p", container("c", "c", Created));
        relist_all(&mut h).await;
        let expected = if emit_changed {
            vec![ev("p", "c", ContainerChanged)]
        } else {
            Vec::new()
        };
        assert_eq!(summary(&drain(&mut h.events)), expected);
        assert!(h.cache.get(&uid("p")).record.is_some());
    }
}

#[tokio::test]
async fn a_failed_list_keeps_state_and_reports_the_error() {
    let mut h = default_harness();
    add_running_pod(&h.runtime, "p", &[]);
    h.runtime.fail_lists(true);
    let result = h
        .relister
        .relist(&Scope::Node, &Hints::default(), true)
        .await;
    assert!(matches!(result, Err(RelistError::List(_))));
    assert_eq!(h.health.check(), Err(HealthError::NeverSucceeded));
    h.runtime.fail_lists(false);
    assert_eq!(relist_all(&mut h).await.events_sent, 1);
}

#[tokio::test(start_paused = true)]
async fn a_hanging_relist_makes_health_fail() {
    let mut h = default_harness();
    relist_all(&mut h).await;
    h.runtime.set_hang(true);
    let stuck = h
        .relister
        .relist(&Scope::Node, &Hints::default(), true)
        .now_or_never();
    assert!(stuck.is_none());
    tokio::time::advance(DEFAULT_RELIST_THRESHOLD + Duration::from_secs(1)).await;
    match h.health.check() {
        Err(HealthError::Stale { running_for, .. }) => {
            assert_eq!(
                running_for,
                Some(DEFAULT_RELIST_THRESHOLD + Duration::from_secs(1))
            );
        }
        other => panic!("expected stale health, got {other:?}"),
    }
}

/// A node-sized load (10,000 pods of a sandbox and one container each): every start, then
/// every tenth death, in order, and an idle relist that inspects nothing. Its timing is
/// the relist bench's (`cargo xtask bench`).
#[tokio::test]
async fn ten_thousand_pods_are_relisted_in_order() {
    const PODS: usize = 10_000;
    let mut h = default_harness();
    for i in 0..PODS {
        add_running_pod(
            &h.runtime,
            &format!("pod-{i:05}"),
            &[&format!("ctr-{i:05}")],
        );
    }
    assert_eq!(relist_all(&mut h).await.events_sent, 2 * PODS);
    let events = drain(&mut h.events);
    assert!(
        events
            .windows(2)
            .all(|w| w[0].sequence + 1 == w[1].sequence && w[0].pod <= w[1].pod)
    );
    for i in (0..PODS).step_by(10) {
        let pod = format!("pod-{i:05}");
        h.runtime
            .set_state(&pod, &format!("ctr-{i:05}"), Exited, Some(1));
    }
    let inspections = h.runtime.inspect_calls().len();
    assert_eq!(relist_all(&mut h).await.events_sent, PODS / 10);
    assert_eq!(h.runtime.inspect_calls().len(), inspections + PODS / 10);
    assert!(
        drain(&mut h.events)
            .iter()
            .all(|e| e.event_type == ContainerDied)
    );
    let inspections = h.runtime.inspect_calls().len();
    assert_eq!(relist_all(&mut h).await.events_sent, 0);
    assert_eq!(h.runtime.inspect_calls().len(), inspections);
    assert_eq!(h.cache.pods().len(), PODS);
}
