use std::{collections::BTreeSet, time::SystemTime};

use super::*;
use crate::pleg::model::{
    record::PodUid,
    source::Source,
    trigger::{Observation, ObservationKind},
};

const MS: Duration = Duration::from_millis(1);

/// The most retries of any of a batch's targets (0 for first runs).
fn attempt(batch: &Batch) -> u32 {
    batch.attempts.values().copied().max().unwrap_or(0)
}

fn uid(s: &str) -> PodUid {
    PodUid(s.to_owned())
}

fn cid(s: &str) -> ContainerId {
    ContainerId(s.to_owned())
}

fn of(id: &str) -> Scope {
    Scope::Container(cid(id))
}

fn trigger(scope: Scope, source: Source, at_secs: u64) -> Trigger {
    Trigger {
        scope,
        source,
        observed_at: SystemTime::UNIX_EPOCH + Duration::from_secs(at_secs),
        observations: Vec::new(),
    }
}

fn observation(source: Source, kind: ObservationKind) -> Observation {
    Observation { source, kind }
}

fn exit_code(source: Source, code: i32) -> Observation {
    observation(source, ObservationKind::ExitCode(code))
}

/// A trigger of `source` about container `id` saying it exited.
fn exited(id: &str, source: Source) -> Trigger {
    let mut t = trigger(of(id), source, 1);
    t.observations = vec![exit_code(source, 137)];
    t
}

/// A scheduler that has just run its first full relist at `t0`, the next an hour away.
fn after_first_full(t0: Instant) -> RelistScheduler {
    let mut scheduler = RelistScheduler::new(SchedulerConfig::default(), t0);
    let first = scheduler.next_due(t0).expect("first full relist");
    assert_eq!((&first.scope, first.read), (&Scope::Node, true));
    scheduler.finished(&first.scope);
    scheduler.set_full_relist_period(Duration::from_secs(3600));
    scheduler
}

/// Takes every batch due at `now`, each finished at once.
fn drain(scheduler: &mut RelistScheduler, now: Instant) -> Vec<Scope> {
    std::iter::from_fn(|| {
        let batch = scheduler.next_due(now)?;
        scheduler.finished(&batch.scope);
        Some(batch.scope)
    })
    .collect()
}

/// A settling read of a container lends it the kernel's hint about it still in its grace:
/// a death the reading finds is credited to the kernel, whose hint stays where it was.
#[test]
fn a_batch_lends_the_hints_queued_for_what_it_reads_and_leaves_them_queued() {
    let t0 = Instant::now();
    let mut scheduler = after_first_full(t0);
    scheduler.push(exited("c", Source::Containerd), t0);
    let first = scheduler.next_due(t0).expect("c's exit");
    scheduler.finished(&first.scope);
    assert!(scheduler.settle(&first, cid("c"), t0));
    let grace = SETTLE_DELAYS[0] * 2;
    scheduler.set_kernel_grace(grace);
    scheduler.push(exited("c", Source::Ebpf), t0 + MS);
    let settling = scheduler
        .next_due(t0 + SETTLE_DELAYS[0])
        .expect("the settling read");
    assert_eq!((&settling.scope, settling.settle), (&of("c"), Some(1)));
    let targets = |hints: &Hints| hints.scopes().cloned().collect::<Vec<_>>();
    assert_eq!(targets(&settling.queued), [of("c")]);
    assert!(settling.hints.is_empty());
    scheduler.finished(&settling.scope);
    // The kernel's hint is still waiting as it was.
    assert_eq!(scheduler.next_deadline(), Some(t0 + MS + grace));
    let alone = scheduler
        .next_due(t0 + MS + grace)
        .expect("the hint, after its grace");
    assert_eq!(
        (&alone.scope, alone.hints.sources()),
        (&of("c"), BTreeSet::from([Source::Ebpf]))
    );
}

#[test]
fn full_relist_is_due_at_once_then_every_period() {
    let t0 = Instant::now();
    let mut scheduler = RelistScheduler::new(SchedulerConfig::default(), t0);
    let first = scheduler.next_due(t0).expect("first full relist");
    scheduler.finished(&first.scope);
    assert_eq!(scheduler.next_due(t0), None);
    assert_eq!(scheduler.next_deadline(), Some(t0 + DEFAULT_RELIST_PERIOD));
    assert!(!scheduler.full_relist_due(t0 + DEFAULT_RELIST_PERIOD - MS));
    let t1 = t0 + DEFAULT_RELIST_PERIOD;
    assert!(scheduler.full_relist_due(t1));
    let second = scheduler.next_due(t1).expect("the period's");
    assert_eq!((second.scope, second.required), (Scope::Node, true));
    assert_eq!(
        scheduler.next_deadline(),
        None,
        "nothing starts before the full relist in flight is done"
    );
    scheduler.finished(&Scope::Node);
    assert_eq!(scheduler.next_deadline(), Some(t1 + DEFAULT_RELIST_PERIOD));
}

#[test]
fn period_can_change_at_run_time() {
    let t0 = Instant::now();
    let mut scheduler = after_first_full(t0);
    scheduler.set_full_relist_period(Duration::from_secs(30));
    assert_eq!(
        scheduler.next_deadline(),
        Some(t0 + Duration::from_secs(30))
    );
    assert_eq!(scheduler.next_due(t0 + Duration::from_secs(29)), None);
    scheduler.set_full_relist_period(Duration::from_millis(500));
    assert!(scheduler.full_relist_due(t0 + Duration::from_millis(500)));
}

/// While the runtime's event stream is connected, a kernel trigger waits the grace for the
/// runtime's own event about its container, which runs at once and carries the kernel's hint
/// along; the runtime's event about another container leaves it waiting; without one, the
/// kernel's trigger runs when the grace ends; with no grace, at once.
#[test]
fn kernel_triggers_wait_the_grace_for_the_runtimes_event_about_their_container() {
    let t0 = Instant::now();
    let grace = 20 * MS;
    let mut scheduler = after_first_full(t0);
    scheduler.set_kernel_grace(grace);
    scheduler.push(exited("c1", Source::Ebpf), t0);
    assert_eq!(scheduler.next_due(t0 + grace - MS), None);

    scheduler.push(exited("c2", Source::Containerd), t0 + MS);
    let other = scheduler.next_due(t0 + MS).expect("c2's event at once");
    assert_eq!(
        (&other.scope, other.hints.sources()),
        (&of("c2"), BTreeSet::from([Source::Containerd])),
        "without c1's kernel hint"
    );
    scheduler.finished(&other.scope);
    assert_eq!(
        scheduler.next_deadline(),
        Some(t0 + grace),
        "c1 still waits"
    );

    scheduler.push(exited("c1", Source::Containerd), t0 + 5 * MS);
    let own = scheduler.next_due(t0 + 5 * MS).expect("c1's event at once");
    assert_eq!(
        own.hints.sources(),
        BTreeSet::from([Source::Ebpf, Source::Containerd]),
        "with c1's kernel hint"
    );
    scheduler.finished(&own.scope);
    assert_eq!(scheduler.next_due(t0 + grace), None, "nothing left waiting");

    scheduler.push(exited("c3", Source::Ebpf), t0);
    assert_eq!(scheduler.next_deadline(), Some(t0 + grace));
    let alone = scheduler
        .next_due(t0 + grace)
        .expect("alone, after the grace");
    assert_eq!(alone.scope, of("c3"));
    scheduler.finished(&alone.scope);

    scheduler.set_kernel_grace(Duration::ZERO);
    scheduler.push(exited("c4", Source::Ebpf), t0);
    assert!(scheduler.next_due(t0).is_some(), "no grace: at once");
}

/// The runtime's events that come late, in a kernel hint's grace or after it ended, stretch
/// the grace of the kernel hints that follow: those events would have answered them.
#[test]
fn late_runtime_events_stretch_the_kernel_grace() {
    let t0 = Instant::now();
    let grace = 250 * MS;
    let mut scheduler = after_first_full(t0);
    scheduler.set_kernel_grace(grace);
    scheduler.push(exited("c1", Source::Ebpf), t0);
    let alone = scheduler.next_due(t0 + grace).expect("c1 after its grace");
    scheduler.finished(&alone.scope);
    scheduler.push(exited("c1", Source::Containerd), t0 + 800 * MS);
    let answered = scheduler.next_due(t0 + 800 * MS).expect("c1's event");
    scheduler.finished(&answered.scope);

    let t1 = t0 + Duration::from_secs(1);
    scheduler.push(exited("c2", Source::Ebpf), t1);
    assert_eq!(
        scheduler.next_deadline(),
        Some(t1 + 1200 * MS),
        "800 ms late, with headroom"
    );
    scheduler.push(exited("c2", Source::Containerd), t1 + 10 * MS);
    let c2 = scheduler.next_due(t1 + 10 * MS).expect("c2's event");
    assert_eq!(
        c2.hints.sources(),
        BTreeSet::from([Source::Ebpf, Source::Containerd])
    );
    scheduler.finished(&c2.scope);

    // A calm event brings it an eighth of the way down; a kernel hint no runtime event
    // follows (another runtime's container) teaches nothing.
    let t2 = t1 + Duration::from_secs(1);
    scheduler.push(exited("foreign", Source::Ebpf), t2);
    let due = scheduler.next_deadline().unwrap();
    assert_eq!(due - t2, (800 * MS - 790 * MS / 8) * 3 / 2);
    let foreign = scheduler.next_due(due).expect("after its grace");
    scheduler.finished(&foreign.scope);
    let t3 = due + Duration::from_secs(1);
    scheduler.push(exited("c3", Source::Ebpf), t3);
    assert_eq!(scheduler.next_deadline(), Some(t3 + (due - t2)));
    let c3 = scheduler
        .next_due(t3 + (due - t2))
        .expect("after its grace");
    scheduler.finished(&c3.scope);

    // Nor does a runtime event about another step: an init's second exec, which no runtime
    // event answers, then its exit's `/tasks/exit`.
    let t4 = t3 + Duration::from_secs(2);
    let mut exec = trigger(of("c4"), Source::Ebpf, 1);
    exec.observations = vec![observation(
        Source::Ebpf,
        ObservationKind::Exec("/bin/sleep".into()),
    )];
    scheduler.push(exec, t4);
    let grace_then = scheduler.next_deadline().unwrap() - t4;
    let c4 = scheduler
        .next_due(t4 + grace_then)
        .expect("after its grace");
    scheduler.finished(&c4.scope);
    scheduler.push(
        exited("c4", Source::Containerd),
        t4 + Duration::from_secs(3),
    );
    let c4 = scheduler
        .next_due(t4 + Duration::from_secs(3))
        .expect("c4's exit");
    scheduler.finished(&c4.scope);
    let t5 = t4 + Duration::from_secs(4);
    scheduler.push(exited("c5", Source::Ebpf), t5);
    assert_eq!(scheduler.next_deadline(), Some(t5 + grace_then));
}

#[test]
fn triggers_coalesce_per_target() {
    let t0 = Instant::now();
    let mut scheduler = after_first_full(t0);
    scheduler.push(exited("c1", Source::Ebpf), t0);
    let mut later = trigger(of("c1"), Source::Containerd, 0);
    later.observations = vec![observation(Source::Containerd, ObservationKind::Deleted)];
    scheduler.push(later, t0);
    scheduler.push(trigger(of("c2"), Source::Containerd, 4), t0);

    let batch = scheduler.next_due(t0).expect("c1's batch");
    assert_eq!((&batch.scope, attempt(&batch)), (&of("c1"), 0));
    let hint = batch
        .hints
        .for_container(&uid("p"), &cid("c1"))
        .expect("c1's hint");
    assert_eq!(
        hint.sources,
        BTreeSet::from([Source::Ebpf, Source::Containerd])
    );
    assert_eq!(hint.observed_at, SystemTime::UNIX_EPOCH);
    assert_eq!(hint.observations.len(), 2);
    assert_eq!(
        scheduler.next_due(t0).map(|b| b.scope),
        Some(of("c2")),
        "c2's beside c1's"
    );
    assert_eq!(scheduler.next_due(t0), None);
}

/// One read in flight per target: the hints that come meanwhile are tried against the
/// runtime's records at once, and what those leave waits for the next read, which answers
/// them all together.
#[test]
fn hints_that_come_while_their_target_is_read_join_the_next_read() {
    let t0 = Instant::now();
    let mut scheduler = after_first_full(t0);
    scheduler.push(trigger(of("c"), Source::Containerd, 1), t0);
    let reading = scheduler.next_due(t0).expect("c's read");
    assert!(reading.read);

    for second in 2..5 {
        scheduler.push(exited("c", Source::Containerd), t0 + second * MS);
        let tried = scheduler
            .next_due(t0 + second * MS)
            .expect("tried against the records at once");
        assert_eq!((&tried.scope, tried.read), (&of("c"), false));
        scheduler.untried(tried, t0 + second * MS);
        assert_eq!(
            scheduler.next_due(t0 + 10 * MS),
            None,
            "not tried again, not read while c's read is in flight"
        );
    }
    assert_eq!(
        scheduler.next_deadline(),
        Some(t0 + Duration::from_secs(3600)),
        "nothing before the next full relist: c's read's end wakes us"
    );
    scheduler.finished(&reading.scope);
    let next = scheduler.next_due(t0 + 10 * MS).expect("the next read");
    assert!(next.read);
    assert_eq!(next.hints.observations().count(), 3, "every hint at once");
    assert_eq!(scheduler.next_due(t0 + 10 * MS), None);
}

#[test]
fn reads_of_different_containers_run_side_by_side_up_to_the_limit() {
    let t0 = Instant::now();
    let mut scheduler = RelistScheduler::new(
        SchedulerConfig {
            reads_in_flight: 2,
            ..SchedulerConfig::default()
        },
        t0,
    );
    let first = scheduler.next_due(t0).expect("first full relist");
    scheduler.finished(&first.scope);
    scheduler.set_full_relist_period(Duration::from_secs(3600));
    for id in ["a", "b", "c"] {
        scheduler.push(trigger(of(id), Source::Containerd, 1), t0);
    }
    let a = scheduler.next_due(t0).expect("a");
    let b = scheduler.next_due(t0).expect("b beside a");
    assert_eq!([&a.scope, &b.scope], [&of("a"), &of("b")]);
    assert_eq!(scheduler.next_due(t0), None, "two in flight at most");
    assert_eq!(
        scheduler.next_deadline(),
        Some(t0 + Duration::from_secs(3600))
    );
    scheduler.finished(&a.scope);
    assert_eq!(scheduler.next_due(t0).map(|b| b.scope), Some(of("c")));
}

/// The full relist runs beside the targeted reads: neither waits for the other. It carries
/// no hint (each goes on to its own read) but lends them all its credit.
#[test]
fn the_full_relist_runs_beside_targeted_reads_and_lends_their_hints_its_credit() {
    let t0 = Instant::now();
    let mut scheduler = after_first_full(t0);
    scheduler.push(trigger(of("a"), Source::Containerd, 1), t0);
    let a = scheduler.next_due(t0).expect("a");
    scheduler.push(trigger(Scope::Pod(uid("p")), Source::Ebpf, 1), t0);
    scheduler.push(trigger(Scope::Node, Source::Containerd, 2), t0);
    scheduler.push(trigger(of("b"), Source::CriEvents, 3), t0);
    let full = scheduler
        .next_due(t0)
        .expect("the full relist beside a's read");
    assert_eq!((&full.scope, full.hints.is_empty()), (&Scope::Node, true));
    let lent: Vec<&Scope> = full.queued.scopes().collect();
    assert_eq!(lent, [&Scope::Pod(uid("p")), &of("b")]);
    let mut beside = drain(&mut scheduler, t0);
    beside.sort();
    assert_eq!(
        beside,
        [Scope::Pod(uid("p")), of("b")],
        "their own reads, beside it"
    );
    scheduler.request_full_relist(t0);
    assert_eq!(scheduler.next_due(t0), None, "one full relist at a time");
    scheduler.finished(&full.scope);
    scheduler.finished(&a.scope);
    assert_eq!(drain(&mut scheduler, t0), [Scope::Node]);
}

#[test]
fn pod_wide_observations_are_dropped() {
    let t0 = Instant::now();
    let mut scheduler = after_first_full(t0);
    let mut pod_trigger = trigger(Scope::Pod(uid("p")), Source::Ebpf, 1);
    pod_trigger.observations = vec![exit_code(Source::Ebpf, 1)];
    scheduler.push(pod_trigger, t0);
    let batch = scheduler.next_due(t0).expect("batch");
    assert_eq!(batch.hints.observations().count(), 0);
}

/// Rereads back off by the policy that fits: short and doubling when only a reading answers,
/// long when the runtime's own events do; bounded either way.
#[test]
fn retries_back_off_by_whether_the_runtimes_events_answer_then_give_up() {
    let policies = [(Duration::ZERO, POLL_RETRY), (10 * MS, EVENT_RETRY)];
    for (grace, policy) in policies {
        let t0 = Instant::now();
        let mut scheduler = after_first_full(t0);
        scheduler.set_kernel_grace(grace);
        scheduler.push(trigger(of("c"), Source::Containerd, 1), t0);
        let mut now = t0;
        let mut batch = scheduler.next_due(now).expect("first run");
        let mut delays = Vec::new();
        for retries in 0..policy.max {
            assert_eq!(attempt(&batch), retries);
            scheduler.finished(&batch.scope);
            scheduler.retry(batch, now).expect("retry allowed");
            let due = scheduler.next_deadline().expect("the retry");
            delays.push((due - now).as_millis());
            assert_eq!(scheduler.next_due(due - MS), None);
            now = due;
            batch = scheduler.next_due(now).expect("retry due");
            assert_eq!(batch.scope, of("c"));
        }
        let expected: Vec<u128> = match grace.is_zero() {
            true => vec![10, 20, 40, 80, 160, 320, 640, 1000, 1000],
            false => vec![1000, 2000, 4000],
        };
        assert_eq!(delays, expected, "grace {grace:?}");
        let hints = batch.hints.clone();
        scheduler.finished(&batch.scope);
        assert_eq!(
            scheduler.retry(batch, now),
            Err(Exhausted {
                attempts: policy.max,
                hints
            })
        );
        assert_eq!(
            scheduler.next_deadline(),
            Some(t0 + Duration::from_secs(3600))
        );
    }
}

#[test]
fn a_new_trigger_during_backoff_runs_at_once_with_a_full_budget_and_the_retry_merged() {
    let t0 = Instant::now();
    let mut scheduler = after_first_full(t0);
    scheduler.push(trigger(of("c"), Source::Containerd, 1), t0);
    let mut batch = scheduler.next_due(t0).expect("first run");
    let mut now = t0;
    for _ in 0..POLL_RETRY.max - 1 {
        scheduler.finished(&batch.scope);
        scheduler.retry(batch, now).expect("retry allowed");
        now = scheduler.next_deadline().expect("retry");
        batch = scheduler.next_due(now).expect("retry due");
    }
    scheduler.finished(&batch.scope);
    scheduler.retry(batch, now).expect("last retry allowed");
    scheduler.push(trigger(of("c"), Source::Ebpf, 2), now);
    let batch = scheduler.next_due(now).expect("the fresh trigger at once");
    assert_eq!(attempt(&batch), 0);
    assert_eq!(
        batch.hints.sources(),
        BTreeSet::from([Source::Ebpf, Source::Containerd])
    );
}

/// A scheduler whose container "lagging" was read at `t0` and is being retried.
fn with_a_retry(t0: Instant) -> RelistScheduler {
    let mut scheduler = after_first_full(t0);
    scheduler.push(trigger(of("lagging"), Source::Containerd, 1), t0);
    let batch = scheduler.next_due(t0).expect("first run");
    scheduler.finished(&batch.scope);
    scheduler.retry(batch, t0).expect("retry allowed");
    scheduler
}

#[test]
fn a_fresh_trigger_runs_before_retries_due_earlier() {
    let t0 = Instant::now();
    let mut scheduler = with_a_retry(t0);
    let later = t0 + 50 * MS;
    scheduler.push(trigger(of("fresh"), Source::Containerd, 2), later);
    let first = scheduler.next_due(later).expect("both due");
    assert_eq!(first.scope, of("fresh"));
    let second = scheduler.next_due(later).expect("the retry next");
    assert_eq!((&second.scope, attempt(&second)), (&of("lagging"), 1));
}

#[test]
fn a_due_retry_is_passed_over_once_at_most() {
    let t0 = Instant::now();
    let mut scheduler = with_a_retry(t0);
    // Fresh triggers keep coming one at a time.
    let later = t0 + 50 * MS;
    let mut order = Vec::new();
    for (i, id) in ["a", "b", "c"].into_iter().enumerate() {
        scheduler.push(trigger(of(id), Source::Ebpf, 2 + i as u64), later);
        let batch = scheduler.next_due(later).expect("due");
        scheduler.finished(&batch.scope);
        order.push(batch.scope);
    }
    order.extend(drain(&mut scheduler, later));
    assert_eq!(order, ["a", "lagging", "b", "c"].map(of));
}

#[test]
fn requested_full_relist_is_due_before_the_period() {
    let t0 = Instant::now();
    let mut scheduler = RelistScheduler::new(SchedulerConfig::default(), t0);
    let first = scheduler.next_due(t0).expect("first full relist");
    scheduler.finished(&first.scope);
    scheduler.request_full_relist(t0 + 5 * MS);
    assert_eq!(scheduler.next_deadline(), Some(t0 + 5 * MS));
    let asked = scheduler.next_due(t0 + 5 * MS).expect("asked for");
    assert_eq!(asked.scope, Scope::Node);
    scheduler.finished(&asked.scope);
    assert_eq!(
        scheduler.next_deadline(),
        Some(t0 + 5 * MS + DEFAULT_RELIST_PERIOD)
    );
}

#[test]
fn a_container_awaiting_the_cri_store_is_read_twice_at_most_then_left_to_the_full_relist() {
    let t0 = Instant::now();
    let mut scheduler = after_first_full(t0);
    scheduler.push(exited("c", Source::Containerd), t0);
    let mut batch = scheduler.next_due(t0).expect("first run");
    scheduler.finished(&batch.scope);
    let mut now = t0;
    for (delay, count) in SETTLE_DELAYS.into_iter().zip(1..) {
        assert!(scheduler.settle(&batch, cid("c"), now));
        assert_eq!(scheduler.next_deadline(), Some(now + delay));
        assert_eq!(scheduler.next_due(now + delay - MS), None, "not yet");
        now += delay;
        batch = scheduler.next_due(now).expect("the settling read");
        assert_eq!(
            (
                &batch.scope,
                batch.hints.is_empty(),
                batch.required,
                batch.settle
            ),
            (&of("c"), true, true, Some(count))
        );
        scheduler.finished(&batch.scope);
    }
    assert!(!scheduler.settle(&batch, cid("c"), now));
    assert_eq!(scheduler.next_due(now + SETTLE_DELAYS[1]), None);
}

/// A settling read neither merges with the container's triggers (they stay answerable by the
/// runtime's records) nor comes twice; it comes soon once the task is deleted, and a reading
/// that found the store caught up drops it.
#[test]
fn a_settling_read_stands_apart_comes_soon_after_the_task_is_deleted_and_drops_once_settled() {
    let t0 = Instant::now();
    let mut scheduler = after_first_full(t0);
    scheduler.push(exited("c", Source::Containerd), t0);
    let batch = scheduler.next_due(t0).expect("first run");
    scheduler.finished(&batch.scope);
    assert!(scheduler.settle(&batch, cid("c"), t0));
    assert!(scheduler.settle(&batch, cid("c"), t0 + MS), "one stands");
    scheduler.push(exited("c", Source::Containerd), t0 + MS);
    let fresh = scheduler.next_due(t0 + MS).expect("the trigger, at once");
    assert_eq!((fresh.settle, fresh.required), (None, false));
    assert!(
        fresh.hints.iter().all(|(_, h)| !h.unspecific),
        "answerable by records: {fresh:?}"
    );
    scheduler.finished(&fresh.scope);
    assert_eq!(scheduler.next_deadline(), Some(t0 + SETTLE_DELAYS[0]));

    let mut deleted = trigger(of("c"), Source::Containerd, 2);
    deleted.observations = vec![observation(
        Source::Containerd,
        ObservationKind::TaskDeleted,
    )];
    scheduler.push(deleted, t0 + 2 * MS);
    let answered = scheduler.next_due(t0 + 2 * MS).expect("the deletion");
    scheduler.finished(&answered.scope);
    assert_eq!(
        scheduler.next_deadline(),
        Some(t0 + 2 * MS + SETTLE_AFTER_DELETE),
        "sooner once the task is deleted"
    );
    scheduler.settled(&cid("c"));
    assert_eq!(scheduler.next_due(t0 + SETTLE_DELAYS[0]), None);
}

/// While the runtime's events answer, a settling read waits for `/tasks/delete` (the CRI store
/// is written right after it), not on a timer that fires before the cleanup under churn: at
/// the latest after SETTLE_AWAITING_DELETE, soon after the delete when the batch carried it.
#[test]
fn with_the_runtimes_events_a_settling_read_waits_for_the_task_delete() {
    let t0 = Instant::now();
    let mut scheduler = after_first_full(t0);
    scheduler.set_kernel_grace(10 * MS);
    scheduler.push(exited("c", Source::Containerd), t0);
    let batch = scheduler.next_due(t0).expect("the exit");
    scheduler.finished(&batch.scope);
    assert!(scheduler.settle(&batch, cid("c"), t0));
    assert_eq!(scheduler.next_deadline(), Some(t0 + SETTLE_AWAITING_DELETE));
    scheduler.settled(&cid("c"));

    let mut gone = exited("c", Source::Containerd);
    gone.observations.push(observation(
        Source::Containerd,
        ObservationKind::TaskDeleted,
    ));
    scheduler.push(gone, t0 + MS);
    let batch = scheduler
        .next_due(t0 + MS)
        .expect("the exit and the delete");
    scheduler.finished(&batch.scope);
    assert!(scheduler.settle(&batch, cid("c"), t0 + MS));
    assert_eq!(
        scheduler.next_deadline(),
        Some(t0 + MS + SETTLE_AFTER_DELETE)
    );
    let read = scheduler
        .next_due(t0 + MS + SETTLE_AFTER_DELETE)
        .expect("the settling read");
    assert_eq!(read.settle, Some(1));
}

/// A run's first full relist is read alone: a trigger that comes meanwhile waits for its end,
/// and the loop is not woken for it. A target read beside it was committed before the
/// baseline, half-read, and a watcher resyncing on the listing missed containers the runtime
/// had (the soak's plegd-crash runs).
#[test]
fn nothing_is_read_beside_the_first_full_relist() {
    let t0 = Instant::now();
    let mut scheduler = RelistScheduler::new(SchedulerConfig::default(), t0);
    let first = scheduler.next_due(t0).expect("the first full relist");
    assert_eq!(first.scope, Scope::Node);
    scheduler.push(exited("c", Source::Containerd), t0 + MS);
    assert_eq!(scheduler.next_due(t0 + 2 * MS), None);
    assert_eq!(
        scheduler.next_deadline(),
        None,
        "woken by the full relist's end"
    );
    scheduler.finished(&first.scope);
    let read = scheduler
        .next_due(t0 + 3 * MS)
        .expect("c, once it has ended");
    assert_eq!((&read.scope, read.read), (&of("c"), true));
}
