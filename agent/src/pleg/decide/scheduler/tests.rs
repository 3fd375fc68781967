use std::{collections::BTreeSet, time::SystemTime};

use super::*;
use crate::pleg::model::trigger::{Observation, ObservationKind, TriggerSource};

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

fn trigger(scope: Scope, source: TriggerSource, at_secs: u64) -> Trigger {
    Trigger {
        scope,
        source,
        observed_at: SystemTime::UNIX_EPOCH + Duration::from_secs(at_secs),
        observations: Vec::new(),
    }
}

fn exit_code(source: TriggerSource, code: i32) -> Observation {
    Observation {
        source,
        kind: ObservationKind::ExitCode(code),
    }
}

fn no_index(_: &ContainerId) -> Option<PodUid> {
    None
}

/// A scheduler that has just run its first full relist at `t0`.
fn after_first_full(t0: Instant) -> RelistScheduler {
    let mut scheduler = RelistScheduler::new(SchedulerConfig::default(), t0);
    let first = scheduler.next_due(t0).expect("first full relist");
    assert_eq!(first.scope, Scope::All);
    scheduler
}

/// A scheduler past its first full relist, the next an hour away, with one trigger from
/// `source` for pod `p` pushed at `t0`.
fn one_pod_trigger(t0: Instant, source: TriggerSource) -> RelistScheduler {
    let mut scheduler = after_first_full(t0);
    scheduler.set_full_relist_period(Duration::from_secs(3600));
    scheduler.push(trigger(Scope::Pod(uid("p")), source, 1), t0, no_index);
    scheduler
}

#[test]
fn a_batch_lends_the_hints_queued_for_what_it_reads_and_leaves_them_queued() {
    let t0 = Instant::now();
    let mut scheduler = after_first_full(t0);
    scheduler.set_full_relist_period(Duration::from_secs(3600));
    // Pod q's hint, read once and not reflected yet: queued for its retry.
    scheduler.push(
        trigger(Scope::Pod(uid("q")), TriggerSource::Ebpf, 1),
        t0,
        no_index,
    );
    let first = scheduler.next_due(t0).expect("q's first run");
    assert!(first.queued.is_empty(), "{first:?}");
    scheduler.retry(first, t0).expect("retry allowed");
    let retry_due = scheduler.next_deadline();
    assert!(retry_due > t0);
    // Three other pods due at once: one full listing serves them, and reads q too.
    for pod in ["a", "b", "c"] {
        scheduler.push(
            trigger(Scope::Pod(uid(pod)), TriggerSource::Ebpf, 2),
            t0,
            no_index,
        );
    }
    let batch = scheduler.next_due(t0).expect("the three at once");
    assert_eq!(batch.scope, Scope::All);
    let targets = |hints: &Hints| hints.scopes().cloned().collect::<Vec<_>>();
    assert_eq!(targets(&batch.queued), [Scope::Pod(uid("q"))]);
    assert!(!targets(&batch.hints).contains(&Scope::Pod(uid("q"))));
    // q's retry is still queued as it was: due when it was, one retry spent.
    assert_eq!(scheduler.next_deadline(), retry_due);
    let retry = scheduler.next_due(retry_due).expect("q's retry");
    assert_eq!((&retry.scope, attempt(&retry)), (&Scope::Pod(uid("q")), 1));
    assert!(retry.queued.is_empty());
}

#[test]
fn full_relist_is_due_at_once_then_every_period() {
    let t0 = Instant::now();
    let mut scheduler = after_first_full(t0);
    assert_eq!(scheduler.next_due(t0), None);
    assert_eq!(scheduler.next_deadline(), t0 + DEFAULT_RELIST_PERIOD);
    assert!(!scheduler.full_relist_due(t0 + DEFAULT_RELIST_PERIOD - MS));
    let t1 = t0 + DEFAULT_RELIST_PERIOD;
    assert!(scheduler.full_relist_due(t1));
    assert_eq!(scheduler.next_due(t1).map(|b| b.scope), Some(Scope::All));
    assert_eq!(scheduler.next_deadline(), t1 + DEFAULT_RELIST_PERIOD);
}

#[test]
fn period_can_change_at_run_time() {
    let t0 = Instant::now();
    let mut scheduler = after_first_full(t0);
    scheduler.set_full_relist_period(Duration::from_secs(30));
    assert_eq!(scheduler.next_deadline(), t0 + Duration::from_secs(30));
    assert_eq!(scheduler.next_due(t0 + Duration::from_secs(29)), None);
    scheduler.set_full_relist_period(Duration::from_millis(500));
    assert!(scheduler.full_relist_due(t0 + Duration::from_millis(500)));
}

/// While the runtime's event stream is connected, a kernel trigger waits the grace for the
/// runtime's own event, which runs at once and carries the kernel's hint along; without
/// one, the kernel's trigger runs when the grace ends; with no grace, at once.
#[test]
fn kernel_triggers_wait_the_grace_for_the_runtimes_event() {
    let t0 = Instant::now();
    let grace = 20 * MS;
    let kernel = || {
        let mut t = trigger(Scope::Pod(uid("p")), TriggerSource::Ebpf, 1);
        t.scope = Scope::Container(cid("c"));
        t.observations = vec![exit_code(TriggerSource::Ebpf, 137)];
        t
    };
    let pod_of = |_: &ContainerId| Some(uid("p"));

    let mut scheduler = one_pod_trigger(t0, TriggerSource::Relist);
    scheduler.next_due(t0).expect("the setup's trigger");
    scheduler.set_kernel_grace(grace);
    scheduler.push(kernel(), t0, pod_of);
    assert_eq!(scheduler.next_due(t0 + grace - MS), None);
    scheduler.push(
        trigger(Scope::Pod(uid("p")), TriggerSource::Containerd, 2),
        t0 + 5 * MS,
        no_index,
    );
    let batch = scheduler
        .next_due(t0 + 5 * MS)
        .expect("the runtime's event runs at once");
    assert_eq!(
        batch.hints.sources(),
        BTreeSet::from([TriggerSource::Ebpf, TriggerSource::Containerd])
    );

    scheduler.push(kernel(), t0, pod_of);
    assert_eq!(scheduler.next_deadline(), t0 + grace);
    assert!(
        scheduler.next_due(t0 + grace).is_some(),
        "alone, after the grace"
    );

    scheduler.set_kernel_grace(Duration::ZERO);
    scheduler.push(kernel(), t0, pod_of);
    assert!(scheduler.next_due(t0).is_some(), "no grace: at once");
}

/// The runtime's event about one container of a pod leaves the kernel's hint about another
/// container of the pod waiting: read with it, before the runtime had recorded that
/// other change, the read found nothing and was retried.
#[test]
fn a_kernel_hint_waits_for_the_runtimes_event_about_its_own_container() {
    let t0 = Instant::now();
    let grace = 20 * MS;
    let in_pod = |_: &ContainerId| Some(uid("p"));
    let container = |id: &str, source| {
        let mut t = trigger(Scope::Container(cid(id)), source, 1);
        t.observations = vec![exit_code(source, 137)];
        t
    };
    let mut scheduler = after_first_full(t0);
    scheduler.set_kernel_grace(grace);
    scheduler.push(container("c1", TriggerSource::Ebpf), t0, in_pod);

    scheduler.push(container("c2", TriggerSource::Containerd), t0 + MS, in_pod);
    let other = scheduler
        .next_due(t0 + MS)
        .expect("c2's event runs at once");
    assert_eq!(
        other
            .hints
            .observations()
            .map(|(id, _)| id)
            .collect::<Vec<_>>(),
        [&cid("c2")],
        "without c1's kernel hint"
    );
    assert_eq!(scheduler.next_deadline(), t0 + grace, "c1's still waits");

    scheduler.push(
        container("c1", TriggerSource::Containerd),
        t0 + 5 * MS,
        in_pod,
    );
    let own = scheduler
        .next_due(t0 + 5 * MS)
        .expect("c1's event runs at once");
    assert_eq!(
        own.hints.sources(),
        BTreeSet::from([TriggerSource::Ebpf, TriggerSource::Containerd]),
        "with c1's kernel hint"
    );
    assert_eq!(scheduler.next_due(t0 + grace), None, "nothing left waiting");

    scheduler.push(container("c3", TriggerSource::Ebpf), t0, in_pod);
    assert_eq!(scheduler.next_due(t0 + grace - MS), None);
    let alone = scheduler
        .next_due(t0 + grace)
        .expect("alone, after the grace");
    assert_eq!(alone.scope, Scope::Pod(uid("p")));
}

#[test]
fn triggers_coalesce_per_pod() {
    let t0 = Instant::now();
    let mut scheduler = after_first_full(t0);
    let mut from_kernel = trigger(Scope::Container(cid("c1")), TriggerSource::Ebpf, 5);
    from_kernel.observations = vec![exit_code(TriggerSource::Ebpf, 137)];
    scheduler.push(from_kernel, t0, |c| (c == &cid("c1")).then(|| uid("p")));
    scheduler.push(
        trigger(Scope::Pod(uid("p")), TriggerSource::Containerd, 3),
        t0,
        no_index,
    );
    scheduler.push(
        trigger(Scope::Pod(uid("q")), TriggerSource::Containerd, 4),
        t0,
        no_index,
    );

    let batch = scheduler.next_due(t0).expect("a batch for p");
    assert_eq!(batch.scope, Scope::Pod(uid("p")));
    assert_eq!(attempt(&batch), 0);
    let hint = batch
        .hints
        .for_container(&uid("p"), &cid("c1"))
        .expect("hint for c1");
    assert_eq!(
        hint.sources,
        BTreeSet::from([TriggerSource::Ebpf, TriggerSource::Containerd])
    );
    assert_eq!(
        hint.observed_at,
        SystemTime::UNIX_EPOCH + Duration::from_secs(3)
    );
    assert_eq!(
        hint.observations,
        [(cid("c1"), exit_code(TriggerSource::Ebpf, 137))]
    );
    // Another container of the pod shares the sources, not the observations.
    let other = batch
        .hints
        .for_container(&uid("p"), &cid("c2"))
        .expect("pod hint");
    assert!(other.observations.is_empty());

    assert_eq!(
        scheduler.next_due(t0).map(|b| b.scope),
        Some(Scope::Pod(uid("q")))
    );
    assert_eq!(scheduler.next_due(t0), None);
}

#[test]
fn unknown_container_is_relisted_by_container() {
    let t0 = Instant::now();
    let mut scheduler = after_first_full(t0);
    scheduler.push(
        trigger(Scope::Container(cid("new")), TriggerSource::CriEvents, 1),
        t0,
        no_index,
    );
    let batch = scheduler.next_due(t0).expect("batch");
    assert_eq!(batch.scope, Scope::Container(cid("new")));
    assert!(
        batch
            .hints
            .for_container(&uid("any"), &cid("new"))
            .is_some()
    );
}

#[test]
fn full_relist_subsumes_targeted_ones() {
    let t0 = Instant::now();
    let mut scheduler = after_first_full(t0);
    scheduler.push(
        trigger(Scope::Pod(uid("p")), TriggerSource::Ebpf, 1),
        t0,
        no_index,
    );
    scheduler.push(
        trigger(Scope::All, TriggerSource::Containerd, 2),
        t0,
        no_index,
    );
    scheduler.push(
        trigger(Scope::Container(cid("c")), TriggerSource::CriEvents, 3),
        t0,
        no_index,
    );
    let batch = scheduler.next_due(t0).expect("full relist");
    assert_eq!(batch.scope, Scope::All);
    assert!(batch.hints.for_container(&uid("p"), &cid("x")).is_some());
    assert!(
        batch
            .hints
            .for_container(&uid("other"), &cid("c"))
            .is_some()
    );
    assert_eq!(scheduler.next_due(t0), None);
}

#[test]
fn pod_wide_observations_are_dropped() {
    let t0 = Instant::now();
    let mut scheduler = after_first_full(t0);
    let mut pod_trigger = trigger(Scope::Pod(uid("p")), TriggerSource::Ebpf, 1);
    pod_trigger.observations = vec![exit_code(TriggerSource::Ebpf, 1)];
    scheduler.push(pod_trigger, t0, no_index);
    let batch = scheduler.next_due(t0).expect("batch");
    assert_eq!(batch.hints.observations().count(), 0);
}

#[test]
fn retry_backs_off_exponentially_then_gives_up() {
    let t0 = Instant::now();
    let mut scheduler = one_pod_trigger(t0, TriggerSource::Containerd);
    let mut now = t0;
    let mut batch = scheduler.next_due(now).expect("first run");
    // 5 ms ten times, then doubling, capped at MAX_RETRY_DELAY.
    let delays = [5; 10]
        .into_iter()
        .chain([10, 20, 40, 80, 160, 320, 640, 1000, 1000, 1000]);
    for (retries, delay_ms) in delays.enumerate() {
        assert_eq!(attempt(&batch), retries as u32);
        scheduler.retry(batch, now).expect("retry allowed");
        assert_eq!(scheduler.next_deadline(), now + delay_ms * MS);
        assert_eq!(scheduler.next_due(now + (delay_ms - 1) * MS), None);
        now += delay_ms * MS;
        batch = scheduler.next_due(now).expect("retry due");
        assert_eq!(batch.scope, Scope::Pod(uid("p")));
    }
    let hints = batch.hints.clone();
    assert_eq!(
        scheduler.retry(batch, now),
        Err(Exhausted {
            attempts: DEFAULT_MAX_RETRIES,
            hints
        })
    );
    assert_eq!(scheduler.next_deadline(), t0 + Duration::from_secs(3600));
}

#[test]
fn a_new_trigger_gets_a_full_retry_budget_even_merged_into_an_old_one() {
    let t0 = Instant::now();
    let mut scheduler = one_pod_trigger(t0, TriggerSource::Ebpf);
    let mut batch = scheduler.next_due(t0).expect("first run");
    let mut now = t0;
    for _ in 0..DEFAULT_MAX_RETRIES - 1 {
        scheduler.retry(batch, now).expect("retry allowed");
        now = scheduler.next_deadline();
        batch = scheduler.next_due(now).expect("retry due");
    }
    // Nearly exhausted; a fresh trigger for the same pod arrives and merges.
    scheduler.retry(batch, now).expect("last retry allowed");
    scheduler.push(
        trigger(Scope::Pod(uid("p")), TriggerSource::Ebpf, 2),
        now,
        no_index,
    );
    let batch = scheduler.next_due(now).expect("fresh trigger runs at once");
    assert_eq!(attempt(&batch), 0);
}

#[test]
fn a_new_trigger_during_backoff_runs_at_once_with_the_retry_merged() {
    let t0 = Instant::now();
    let mut scheduler = after_first_full(t0);
    scheduler.push(
        trigger(Scope::Pod(uid("p")), TriggerSource::Containerd, 1),
        t0,
        no_index,
    );
    let batch = scheduler.next_due(t0).expect("first run");
    scheduler.retry(batch, t0).expect("retry allowed");
    scheduler.push(
        trigger(Scope::Pod(uid("p")), TriggerSource::Ebpf, 2),
        t0,
        no_index,
    );
    let batch = scheduler.next_due(t0).expect("due at once");
    // The merged batch has the fresh trigger's full budget.
    assert_eq!(attempt(&batch), 0);
    let hint = batch
        .hints
        .for_container(&uid("p"), &cid("c"))
        .expect("hint");
    assert_eq!(
        hint.sources,
        BTreeSet::from([TriggerSource::Ebpf, TriggerSource::Containerd])
    );
}

/// A scheduler whose pod "lagging" ran at `t0` and is being retried.
fn with_a_retry(t0: Instant) -> RelistScheduler {
    let mut scheduler = after_first_full(t0);
    scheduler.push(
        trigger(Scope::Pod(uid("lagging")), TriggerSource::Containerd, 1),
        t0,
        no_index,
    );
    let batch = scheduler.next_due(t0).expect("first run");
    scheduler.retry(batch, t0).expect("retry allowed");
    scheduler
}

#[test]
fn a_fresh_trigger_runs_before_retries_due_earlier() {
    let t0 = Instant::now();
    let mut scheduler = with_a_retry(t0);
    let later = t0 + 50 * MS;
    scheduler.push(
        trigger(Scope::Pod(uid("fresh")), TriggerSource::Containerd, 2),
        later,
        no_index,
    );
    let first = scheduler.next_due(later).expect("both due");
    assert_eq!(first.scope, Scope::Pod(uid("fresh")));
    let second = scheduler.next_due(later).expect("the retry next");
    assert_eq!(second.scope, Scope::Pod(uid("lagging")));
    assert_eq!(attempt(&second), 1);
}

#[test]
fn a_due_retry_is_passed_over_once_at_most() {
    let t0 = Instant::now();
    let mut scheduler = with_a_retry(t0);
    // Fresh triggers keep coming one at a time, fewer than a batch's worth due at once.
    let later = t0 + 50 * MS;
    let mut order = Vec::new();
    for (i, pod) in ["a", "b", "c"].into_iter().enumerate() {
        scheduler.push(
            trigger(Scope::Pod(uid(pod)), TriggerSource::Ebpf, 2 + i as u64),
            later,
            no_index,
        );
        order.push(scheduler.next_due(later).expect("due").scope);
    }
    order.extend(std::iter::from_fn(|| scheduler.next_due(later)).map(|b| b.scope));
    assert_eq!(
        order,
        ["a", "lagging", "b", "c"].map(|p| Scope::Pod(uid(p)))
    );
}

#[test]
fn targets_due_together_share_one_full_relist_and_retry_each_on_its_own() {
    let t0 = Instant::now();
    let mut scheduler = after_first_full(t0);
    let push = |scheduler: &mut RelistScheduler, pod: &str, at: Instant| {
        scheduler.push(
            trigger(Scope::Pod(uid(pod)), TriggerSource::Containerd, 1),
            at,
            no_index,
        );
    };
    // Fewer than BATCH_TARGETS due: one targeted relist each.
    push(&mut scheduler, "a", t0);
    let a = scheduler.next_due(t0).expect("a due");
    assert_eq!(a.scope, Scope::Pod(uid("a")));
    scheduler.retry(a, t0).expect("a retried");

    let later = t0 + 50 * MS;
    push(&mut scheduler, "b", later);
    push(&mut scheduler, "c", later);
    let batch = scheduler.next_due(later).expect("three due");
    assert_eq!(batch.scope, Scope::All);
    assert_eq!(batch.hints.scopes().count(), BATCH_TARGETS);
    assert_eq!(attempt(&batch), 1, "a's retry keeps its count");
    assert!(
        !batch.required,
        "read only for what the runtime's records leave"
    );
    assert_eq!(
        scheduler.full_deadline(),
        t0 + DEFAULT_RELIST_PERIOD,
        "not the period's full relist until it reads"
    );
    scheduler.full_relisted(later);
    assert_eq!(scheduler.full_deadline(), later + DEFAULT_RELIST_PERIOD);

    // Only what the reading did not reflect comes back, with its own count.
    let mut unreflected = batch.clone();
    unreflected.hints = batch
        .hints
        .clone()
        .into_iter()
        .filter(|(target, _)| *target != Scope::Pod(uid("b")))
        .fold(Hints::default(), |mut hints, (target, hint)| {
            hints.insert(target, hint);
            hints
        });
    scheduler.retry(unreflected, later).expect("retried");
    let due = later + 10 * MS;
    let first = scheduler.next_due(due).expect("a, second retry");
    let second = scheduler.next_due(due).expect("c, first retry");
    assert_eq!(
        [
            (attempt(&first), first.scope),
            (attempt(&second), second.scope)
        ],
        [(2, Scope::Pod(uid("a"))), (1, Scope::Pod(uid("c")))]
    );
    assert_eq!(scheduler.next_due(due), None, "b was reflected");
}

#[test]
fn requested_full_relist_is_due_before_the_period() {
    let t0 = Instant::now();
    let mut scheduler = after_first_full(t0);
    scheduler.request_full_relist(t0 + 5 * MS);
    assert_eq!(scheduler.next_deadline(), t0 + 5 * MS);
    assert_eq!(
        scheduler.next_due(t0 + 5 * MS).map(|b| b.scope),
        Some(Scope::All)
    );
    assert_eq!(
        scheduler.next_deadline(),
        t0 + 5 * MS + DEFAULT_RELIST_PERIOD
    );
}

#[test]
fn a_pod_awaiting_the_cri_store_is_read_twice_at_most_then_left_to_the_full_relist() {
    let t0 = Instant::now();
    let mut scheduler = one_pod_trigger(t0, TriggerSource::Containerd);
    let mut batch = scheduler.next_due(t0).expect("first run");
    let mut now = t0;
    for (delay, count) in SETTLE_DELAYS.into_iter().zip(1..) {
        assert!(scheduler.settle(&batch, uid("p"), now));
        assert_eq!(scheduler.next_deadline(), now + delay);
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
            (&Scope::Pod(uid("p")), true, true, Some(count))
        );
    }
    assert!(!scheduler.settle(&batch, uid("p"), now));
    assert_eq!(scheduler.next_due(now + SETTLE_DELAYS[1]), None);
}

/// A settling read neither merges with the pod's triggers (they stay answerable by the
/// runtime's records) nor comes twice; a reading that found the store caught up drops it.
#[test]
fn a_settling_read_stands_apart_from_triggers_and_is_dropped_once_settled() {
    let t0 = Instant::now();
    let mut scheduler = one_pod_trigger(t0, TriggerSource::Containerd);
    let batch = scheduler.next_due(t0).expect("first run");
    assert!(scheduler.settle(&batch, uid("p"), t0));
    assert!(scheduler.settle(&batch, uid("p"), t0 + MS), "one stands");
    let mut exit = trigger(Scope::Container(cid("c")), TriggerSource::Containerd, 2);
    exit.observations = vec![exit_code(TriggerSource::Containerd, 137)];
    scheduler.push(exit, t0 + MS, |_| Some(uid("p")));
    let fresh = scheduler.next_due(t0 + MS).expect("the trigger, at once");
    assert_eq!((fresh.settle, fresh.required), (None, false));
    assert!(
        fresh.hints.iter().all(|(_, h)| !h.unspecific),
        "answerable by records: {fresh:?}"
    );
    let due = t0 + SETTLE_DELAYS[0];
    assert_eq!(scheduler.next_deadline(), due);
    scheduler.settled(&uid("p"));
    assert_eq!(scheduler.next_due(due), None);
}
