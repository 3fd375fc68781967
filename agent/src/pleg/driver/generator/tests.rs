use std::{sync::Arc, time::SystemTime};

use tokio::sync::mpsc;

use super::*;
use crate::{
    pleg::{
        decide::scheduler::{DEFAULT_KERNEL_GRACE, POLL_RETRY, SchedulerConfig},
        driver::{
            relist::RelistConfig,
            sink::Notices,
            triggers::{TriggerSender, observed_trigger_channel},
        },
        model::{
            event::{Notice, PodLifecycleEvent, PodLifecycleEventType},
            record::{ContainerId, ContainerState, PodUid, Store, TaskRecord},
            source::Source,
            trigger::{Observation, ObservationKind},
        },
        shared::{cache::PodCache, health::Health},
    },
    runtime::testing::{FakeRuntime, container},
};

struct Harness {
    runtime: FakeRuntime,
    triggers: TriggerSender,
    events: mpsc::UnboundedReceiver<PodLifecycleEvent>,
    period: watch::Sender<Duration>,
    kernel_grace: watch::Sender<Duration>,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<Stopped<FakeRuntime>>,
    metrics: Metrics,
    turns: watch::Receiver<Instant>,
}

fn start(period: Duration) -> Harness {
    start_observed(period, None)
}

fn start_observed(period: Duration, notices: Option<Notices>) -> Harness {
    let runtime = FakeRuntime::new();
    let health = Arc::new(Health::new(Duration::from_secs(180)));
    let (tx, events) = mpsc::unbounded_channel();
    let relister = Relister::new(
        runtime.clone(),
        Arc::new(PodCache::new()),
        health,
        Arc::new(tx),
        RelistConfig::default(),
    );
    let metrics = Metrics::new();
    let scheduler = RelistScheduler::new(
        SchedulerConfig {
            full_relist_period: period,
            ..SchedulerConfig::default()
        },
        Instant::now(),
    );
    let (triggers, receiver) = observed_trigger_channel(notices, true);
    let (tuning, tuned) = tuning(period);
    let shutdown = CancellationToken::new();
    let (turned, turns) = watch::channel(Instant::now());
    let generator = Generator {
        relister,
        scheduler,
        triggers: receiver,
        tuned,
        metrics: metrics.clone(),
        turns: turned,
    };
    let task = tokio::spawn(generator.run(shutdown.clone()));
    Harness {
        runtime,
        triggers,
        events,
        period: tuning.period,
        kernel_grace: tuning.kernel_grace,
        shutdown,
        task,
        metrics,
        turns,
    }
}

#[tokio::test(start_paused = true)]
async fn the_loop_turns_at_least_every_longest_wait_and_its_end_is_seen() {
    // Nothing due for five minutes: the loop still turns.
    let mut h = start(Duration::from_secs(300));
    let started = Instant::now();
    for turn in 1..=5 {
        h.turns.changed().await.unwrap();
        let at = *h.turns.borrow_and_update();
        assert!(
            at - started <= LONGEST_WAIT * turn,
            "turn {turn} at {:?}",
            at - started
        );
    }
    assert!(Instant::now() - started >= LONGEST_WAIT * 3, "it waited");
    h.shutdown.cancel();
    let _stopped = h.task.await.unwrap();
    assert!(h.turns.changed().await.is_err(), "the loop's end is seen");
}

fn add_running(runtime: &FakeRuntime, pod: &str, id: &str) {
    runtime.add_pod(pod, "ns", pod);
    runtime.set_container(pod, container(id, "app", ContainerState::Running));
}

fn trigger(id: &str) -> Trigger {
    Trigger {
        scope: Scope::Container(ContainerId(id.into())),
        source: Source::Containerd,
        observed_at: SystemTime::now(),
        observations: Vec::new(),
    }
}

/// containerd's `/tasks/start` of `id`, whose init is `pid`.
fn task_started(id: &str, pid: u32) -> Trigger {
    let started = ObservationKind::TaskStarted {
        at: SystemTime::now(),
        pid,
    };
    said(Source::Containerd, id, vec![started])
}

/// A trigger of `source` about `id` carrying `kinds`.
fn said(source: Source, id: &str, kinds: Vec<ObservationKind>) -> Trigger {
    Trigger {
        source,
        observations: kinds
            .into_iter()
            .map(|kind| Observation { source, kind })
            .collect(),
        ..trigger(id)
    }
}

#[tokio::test]
async fn triggers_saying_only_presence_pass_only_where_presence_is_news() {
    let with = |kinds: &[ObservationKind]| Trigger {
        observations: kinds
            .iter()
            .map(|kind| Observation {
                source: Source::Containerd,
                kind: kind.clone(),
            })
            .collect(),
        ..trigger("c")
    };
    let started = ObservationKind::TaskStarted {
        at: SystemTime::now(),
        pid: 0,
    };
    let cases = [
        ("presence alone", vec![ObservationKind::Present], false),
        (
            "presence and a start",
            vec![ObservationKind::Present, started],
            true,
        ),
        ("no observation: something changed", vec![], true),
    ];
    for (name, kinds, passes) in cases {
        for presence in [false, true] {
            let (tx, mut rx) = observed_trigger_channel(None, presence);
            tx.send(with(&kinds));
            drop(tx);
            let passed = rx.recv().await.is_some();
            assert_eq!(
                passed,
                passes || presence,
                "{name}, presence news: {presence}"
            );
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_runtime_that_failed_is_read_whole_once_it_answers_again() {
    let mut h = start(Duration::from_secs(3600));
    // The first full relist, and every one while the runtime keeps failing, fails.
    h.runtime.fail_lists(true);
    let t0 = Instant::now();
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(h.events.try_recv().is_err());
    // Sources that lost the runtime are not told it answers.
    let answered = h.triggers.runtime_answered_since(t0);
    let mut answered = std::pin::pin!(answered);
    assert!(futures::poll!(&mut answered).is_pending());
    // It answers again, with a container no hint is left about.
    h.runtime.fail_lists(false);
    add_running(&h.runtime, "p", "c");
    let event = tokio::time::timeout(2 * FULL_RELIST_AFTER_ERROR, h.events.recv())
        .await
        .expect("a full relist soon after the runtime answers, not at the next period")
        .unwrap();
    assert_eq!(event.container_id, ContainerId("c".into()));
    assert_eq!(event.sources, vec![Source::Relist]);
    // Now they are.
    tokio::time::timeout(Duration::from_millis(1), answered)
        .await
        .expect("the sources are told the runtime answers");
    h.shutdown.cancel();
    h.task.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_change_read_by_a_relist_is_credited_to_a_trigger_that_came_while_it_ran() {
    let mut h = start(Duration::from_secs(1));
    add_running(&h.runtime, "p", "c");
    let started = h.events.recv().await.unwrap();
    assert_eq!(started.event_type, PodLifecycleEventType::ContainerStarted);
    // The next full relist (no hint of its own) waits on a slow runtime; meanwhile the
    // container is killed and the kernel's trigger comes.
    h.runtime.set_delay(Some(Duration::from_millis(50)));
    tokio::time::sleep(Duration::from_millis(1010)).await;
    h.runtime
        .set_state("p", "c", ContainerState::Exited, Some(137));
    let signal = Observation {
        source: Source::Ebpf,
        kind: ObservationKind::Signal(9),
    };
    h.triggers.send(Trigger {
        source: Source::Ebpf,
        observations: vec![signal.clone()],
        ..trigger("c")
    });
    let died = h.events.recv().await.unwrap();
    assert_eq!(died.event_type, PodLifecycleEventType::ContainerDied);
    assert_eq!(died.sources, vec![Source::Ebpf]);
    assert_eq!(died.observations, vec![signal]);
    h.shutdown.cancel();
    h.task.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn periodic_full_relist_finds_changes() {
    let mut h = start(Duration::from_secs(1));
    add_running(&h.runtime, "p", "c");
    let event = h.events.recv().await.unwrap();
    assert_eq!(event.event_type, PodLifecycleEventType::ContainerStarted);
    assert_eq!(event.sources, vec![Source::Relist]);
    h.shutdown.cancel();
    // Stopped, it hands back the reading to save.
    let (records, sequence) = h.task.await.unwrap().relister.into_saved();
    assert_eq!(sequence, 1);
    assert!(records.contains_key(&PodUid("p".into())));
}

/// A trigger not relisted when the generator stops is handed back with its hints, for
/// the last relist before saving; with none pending, nothing is.
#[tokio::test(start_paused = true)]
async fn triggers_not_relisted_at_the_stop_are_handed_back() {
    let mut h = start(Duration::from_secs(3600));
    add_running(&h.runtime, "p", "c");
    h.events.recv().await.unwrap();
    // Sent and stopped before the loop runs again: it sees the stop first.
    h.triggers.send(trigger("c"));
    h.shutdown.cancel();
    let stopped = h.task.await.unwrap();
    assert_eq!(
        stopped.pending.scopes().collect::<Vec<_>>(),
        [&Scope::Container(ContainerId("c".into()))]
    );

    let h = start(Duration::from_secs(3600));
    h.shutdown.cancel();
    assert!(h.task.await.unwrap().pending.is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_trigger_relists_long_before_the_period() {
    let mut h = start(Duration::from_secs(3600));
    add_running(&h.runtime, "p", "c");
    // The first full relist (due at start) sees the pod.
    assert_eq!(
        h.events.recv().await.unwrap().event_type,
        PodLifecycleEventType::ContainerStarted
    );
    let before = tokio::time::Instant::now();
    h.runtime
        .set_state("p", "c", ContainerState::Exited, Some(137));
    h.triggers.send(trigger("c"));
    let event = h.events.recv().await.unwrap();
    assert_eq!(event.event_type, PodLifecycleEventType::ContainerDied);
    assert_eq!(event.sources, vec![Source::Containerd]);
    assert!(tokio::time::Instant::now() - before < Duration::from_secs(1));
    h.shutdown.cancel();
    h.task.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_trigger_ahead_of_the_runtime_is_retried_until_reflected() {
    let mut h = start(Duration::from_secs(3600));
    // Let the first (empty) full relist run.
    tokio::time::sleep(Duration::from_millis(1)).await;
    // The task service started it: the CRI store must come to show it.
    h.triggers.send(task_started("late", 0));
    // The runtime learns of the container only after the first targeted relist.
    tokio::time::sleep(Duration::from_millis(15)).await;
    add_running(&h.runtime, "p", "late");
    let event = h.events.recv().await.unwrap();
    assert_eq!(event.container_id, ContainerId("late".into()));
    assert_eq!(event.sources, vec![Source::Containerd]);
    assert_eq!(event.pod, PodUid("p".into()));
    h.shutdown.cancel();
    h.task.await.unwrap();
}

/// Starts `id` in pod `p` (running in CRI and in the task service) as the kernel and
/// containerd both see it start; its `ContainerStarted`.
async fn start_seen_by_both(h: &mut Harness, id: &str) -> PodLifecycleEvent {
    h.runtime
        .set_container("p", container(id, "app", ContainerState::Running));
    h.runtime
        .set_task(id, Some(TaskRecord::Started { at: None }));
    let exec = ObservationKind::Exec("/bin/sleep".into());
    h.triggers.send(said(Source::Ebpf, id, vec![exec]));
    h.triggers.send(task_started(id, 4242));
    h.events.recv().await.unwrap()
}

/// While the runtime's events come, the exit of a start the kernel saw is watched, and the
/// watch's answer tells the death as the runtime's record, with no read: the shim answers it
/// apart from the queue its events wait in. The death waits for the kernel's ring to be read
/// up to it (the account of an OOM kill would be there), and containerd's `/tasks/exit` after
/// it tells nothing more. An OOM kill containerd has not told yet is left to its events.
#[tokio::test(start_paused = true)]
async fn a_watched_exit_tells_the_death_ahead_of_the_runtimes_event() {
    let mut h = start(Duration::from_secs(3600));
    h.kernel_grace.send_replace(DEFAULT_KERNEL_GRACE);
    // Let the first (empty) full relist run.
    tokio::time::sleep(Duration::from_millis(1)).await;
    let mut catch_ups = h.triggers.answer_catch_ups();
    h.runtime.add_pod("p", "ns", "p");
    let started = start_seen_by_both(&mut h, "c").await;
    assert_eq!(started.event_type, PodLifecycleEventType::ContainerStarted);
    assert_eq!(h.runtime.exit_watches(), [ContainerId("c".into())]);

    let reads = h.runtime.read_calls().len();
    let exit = TaskRecord::Exited {
        code: 137,
        at: SystemTime::now(),
    };
    h.runtime.set_task("c", Some(exit));
    let ask = tokio::time::timeout(Duration::from_secs(1), catch_ups.asked())
        .await
        .expect("the kernel's reader is asked to catch up");
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(h.events.try_recv().is_err(), "held for the kernel's ring");
    catch_ups.caught_up(ask);
    let died = tokio::time::timeout(Duration::from_secs(1), h.events.recv())
        .await
        .expect("the death is told on the watch's answer")
        .unwrap();
    assert_eq!(
        (died.event_type, died.exit_code, died.confirmed_by),
        (
            PodLifecycleEventType::ContainerDied,
            Some(137),
            Some(Store::Task)
        )
    );
    assert_eq!(h.runtime.read_calls().len(), reads, "told with no read");

    let TaskRecord::Exited { code, at } = exit else {
        unreachable!()
    };
    let exited = ObservationKind::TaskExited { code, at };
    h.triggers.send(said(Source::Containerd, "c", vec![exited]));
    let more = tokio::time::timeout(Duration::from_millis(200), h.events.recv()).await;
    assert!(more.is_err(), "told once: {more:?}");

    // The ring handed over the death first: the answer is told at once.
    start_seen_by_both(&mut h, "d").await;
    let killed = ObservationKind::Signal(9);
    h.triggers.send(said(Source::Ebpf, "d", vec![killed]));
    tokio::time::sleep(Duration::from_millis(1)).await;
    let told_at = Instant::now();
    h.runtime.set_task("d", Some(exit));
    let died = h.events.recv().await.unwrap();
    assert_eq!(
        (died.container_id.0.as_str(), died.event_type),
        ("d", PodLifecycleEventType::ContainerDied)
    );
    assert!(Instant::now() - told_at < Duration::from_millis(10));

    // The kernel accounted for an OOM kill containerd has not told (its `/tasks/oom` still
    // in the shim's queue): the answer is left to `/tasks/exit`, behind containerd's word,
    // which the death's reason follows.
    start_seen_by_both(&mut h, "o").await;
    h.triggers
        .send(said(Source::Ebpf, "o", vec![kernel_account()]));
    tokio::time::sleep(Duration::from_millis(1)).await;
    h.runtime.set_task("o", Some(exit));
    let early = tokio::time::timeout(Duration::from_millis(200), h.events.recv()).await;
    assert!(early.is_err(), "not told from the watch: {early:?}");
    runtime_oom_kill(&h, "o");
    let died = h.events.recv().await.unwrap();
    assert_eq!(
        (died.container_id.0.as_str(), died.event_type),
        ("o", PodLifecycleEventType::ContainerDied)
    );
    assert!(
        died.observations
            .iter()
            .any(|o| o.source == Source::Containerd && o.kind == ObservationKind::OomKilled),
        "{died:?}"
    );
    h.shutdown.cancel();
    h.task.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_hint_the_runtime_never_confirms_is_retried_then_counted() {
    let mut h = start(Duration::from_secs(3600));
    add_running(&h.runtime, "p", "c");
    h.events.recv().await.unwrap();
    let counted = "plegd_unconfirmed_hints_total{source=\"containerd\"} 1";
    assert!(!h.metrics.encode().contains(counted));
    // A source says c died; the runtime keeps showing it running.
    let reads_before = h.runtime.read_calls().len();
    h.triggers.send(said(
        Source::Containerd,
        "c",
        vec![ObservationKind::ExitCode(1)],
    ));
    // Well past the whole retry budget (about 3.3 s), in paused time.
    tokio::time::sleep(Duration::from_secs(30)).await;
    let retries = h.runtime.read_calls().len() - reads_before;
    assert_eq!(retries, 1 + POLL_RETRY.max as usize);
    assert!(
        h.metrics.encode().contains(counted),
        "{}",
        h.metrics.encode()
    );
    assert!(h.events.try_recv().is_err(), "no event: nothing changed");
    h.shutdown.cancel();
    h.task.await.unwrap();
}

/// A notice as a line: its kind, container and observations.
fn told(notice: &Notice) -> String {
    let kinds: Vec<_> = notice.observations.iter().map(|o| &o.kind).collect();
    format!("{:?} {} {kinds:?}", notice.kind, notice.container_id)
}

/// A kernel observation is told as the source hands it over, and told unconfirmed once the
/// relists that looked for it give up.
#[tokio::test(start_paused = true)]
async fn kernel_observations_are_told_ahead_then_unconfirmed() {
    let notices = Notices::new(Arc::new(PodCache::new()));
    let mut told_ones = notices.subscribe();
    let mut h = start_observed(Duration::from_secs(3600), Some(notices));
    add_running(&h.runtime, "p", "c");
    h.events.recv().await.unwrap();
    // Not a kernel trigger: no notice.
    h.triggers.send(trigger("c"));
    h.triggers.send(Trigger {
        source: Source::Ebpf,
        observations: vec![Observation {
            source: Source::Ebpf,
            kind: ObservationKind::Signal(9),
        }],
        ..trigger("c")
    });
    tokio::time::sleep(Duration::from_secs(30)).await;
    let mut lines = Vec::new();
    while let Ok(notice) = told_ones.try_recv() {
        lines.push(told(&notice));
    }
    assert_eq!(lines, ["Ahead c [Signal(9)]", "Unconfirmed c [Signal(9)]"]);
    assert!(h.events.try_recv().is_err(), "no event: nothing changed");
    h.shutdown.cancel();
    h.task.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn shortening_the_period_takes_effect_at_once() {
    let mut h = start(Duration::from_secs(3600));
    tokio::time::sleep(Duration::from_millis(1)).await;
    add_running(&h.runtime, "p", "c");
    h.period.send(Duration::from_secs(1)).unwrap();
    let started = tokio::time::Instant::now();
    h.events.recv().await.unwrap();
    assert!(tokio::time::Instant::now() - started <= Duration::from_secs(1));
    h.shutdown.cancel();
    h.task.await.unwrap();
}

/// A full relist that finds a new container already exited, while the targeted read its
/// start's hint began is still in flight, tells the start before the death: the hint in
/// flight counts as queued. (The 2.1 good-neighbour test lost the start this way: the burst
/// of a container's events went to a targeted read, the full relist beside it committed the
/// container `unknown → exited`, a death alone, and the targeted read then found it told.)
#[tokio::test(start_paused = true)]
async fn a_start_whose_read_is_in_flight_is_told_by_a_full_relist_that_finds_it_over() {
    let mut h = start(Duration::from_secs(1));
    // The first full relist, of an empty node, runs at once.
    tokio::time::sleep(Duration::from_millis(1)).await;
    // Every call from now on takes 50 ms: the next full relist lists at 1.05 s, inspects the
    // new pod until 1.10 s; the start's read begun at 1.06 s reads at 1.11 s.
    h.runtime.set_delay(Some(Duration::from_millis(50)));
    add_running(&h.runtime, "p", "c");
    tokio::time::sleep_until(Instant::now() + Duration::from_millis(1059)).await;
    h.triggers.send(task_started("c", 4242));
    tokio::time::sleep(Duration::from_millis(10)).await;
    h.runtime
        .set_state("p", "c", ContainerState::Exited, Some(137));
    let mut told = Vec::new();
    while let Ok(Some(event)) =
        tokio::time::timeout(Duration::from_millis(500), h.events.recv()).await
    {
        told.push(event.event_type);
    }
    assert_eq!(
        told,
        [
            PodLifecycleEventType::ContainerStarted,
            PodLifecycleEventType::ContainerDied
        ]
    );
    h.shutdown.cancel();
    h.task.await.unwrap();
}

/// The runtime's `/tasks/oom` then `/tasks/exit` of `id`, which the runtime shows exited.
fn runtime_oom_kill(h: &Harness, id: &str) {
    h.runtime
        .set_state("p", id, ContainerState::Exited, Some(137));
    h.triggers.send(said(
        Source::Containerd,
        id,
        vec![ObservationKind::OomKilled],
    ));
    let exited = ObservationKind::TaskExited {
        code: 137,
        at: SystemTime::now(),
    };
    h.triggers.send(said(Source::Containerd, id, vec![exited]));
}

fn kernel_account() -> ObservationKind {
    ObservationKind::OomKill(crate::runtime::testing::oom_kill())
}

#[tokio::test(start_paused = true)]
async fn an_oom_kills_death_the_runtime_told_first_waits_for_the_kernels_account() {
    let mut h = start(Duration::from_secs(3600));
    add_running(&h.runtime, "p", "c");
    h.runtime
        .set_container("p", container("late", "app", ContainerState::Running));
    for _ in 0..2 {
        h.events.recv().await.unwrap();
    }
    let mut catch_ups = h.triggers.answer_catch_ups();

    // The runtime's word before the kernel's ring was read up to the kill: the death waits
    // for the reader to catch up, and the account it hands over rides with the death.
    let asked_at = Instant::now();
    runtime_oom_kill(&h, "c");
    let ask = catch_ups.asked().await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(
        h.events.try_recv().is_err(),
        "held for the kernel's account"
    );
    h.triggers
        .send(said(Source::Ebpf, "c", vec![kernel_account()]));
    catch_ups.caught_up(ask);
    let died = h.events.recv().await.unwrap();
    assert_eq!(
        (died.container_id.0.as_str(), died.event_type),
        ("c", PodLifecycleEventType::ContainerDied)
    );
    assert!(
        died.observations.iter().any(|o| o.kind == kernel_account()),
        "{died:?}"
    );
    assert!(Instant::now() - asked_at < Duration::from_millis(100));

    // A reader that does not answer holds the death 100 ms at most: it goes without.
    let asked_at = Instant::now();
    runtime_oom_kill(&h, "late");
    catch_ups.asked().await;
    let died = h.events.recv().await.unwrap();
    assert_eq!(died.container_id.0, "late");
    let held = Instant::now() - asked_at;
    assert!(
        (Duration::from_millis(100)..Duration::from_millis(200)).contains(&held),
        "{held:?}"
    );
    h.shutdown.cancel();
    h.task.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn without_a_kernel_reader_an_oom_kills_death_is_told_at_once() {
    let mut h = start(Duration::from_secs(3600));
    add_running(&h.runtime, "p", "c");
    h.events.recv().await.unwrap();
    let told_at = Instant::now();
    runtime_oom_kill(&h, "c");
    let died = h.events.recv().await.unwrap();
    assert_eq!(died.event_type, PodLifecycleEventType::ContainerDied);
    assert!(Instant::now() - told_at < Duration::from_millis(10));
    h.shutdown.cancel();
    h.task.await.unwrap();
}
