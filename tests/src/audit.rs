//! The churn audit's checker: what a Watch client received, held against what the harness did
//! and what the runtime recorded. Pure: no I/O, no clock; `cargo xtask soak`, the soak tests and
//! the fault tests feed it and print its [`Report`].
//!
//! # Rules
//! For every container of the ground truth ([`Truth`]), the watcher must receive
//! `ContainerStarted`, `ContainerDied` and (once the harness removed it) `ContainerRemoved`,
//! each exactly once and in that order. `ContainerDied` carries the exit code CRI recorded last
//! (137 after `kill -9`, the code of a normal exit, 137 with reason `OOMKilled` after an OOM
//! kill). Its reason is the one CRI showed last (`Completed`, `Error`, `OOMKilled`); one that
//! differed when told is counted, not failed, when a `ContainerChanged` corrected it or it is
//! CRI's first word or one containerd's rule gives the code ([`Report::reasons_differing`]).
//! A container whose exit CRI never recorded before it was
//! removed (containerd 1.6 shows an exit racing its restart as UNKNOWN, exit 255, for a while)
//! still owes its death, with any exit code: kubelet's PLEG reports running or unknown ->
//! non-existent as died, then removed.
//!
//! Within one daemon run, sequence numbers must follow each other without gaps: a gap is a
//! silent loss, whatever the containers' transitions say.
//!
//! # Allowed foldings
//! plegd's events come from diffing runtime records, as kubelet's PLEG's do, so a state the
//! runtime held only between two looks is never seen. The checker counts such a transition as
//! folded, never as lost, only where the ground truth's timing shows the state lasted less than
//! the [`Folding::window`] of the mode (polling: the relist period plus a margin for a relist's
//! own duration; event-driven modes: the time a hint takes to become a relist under load):
//! - `ContainerStarted` of a container that ran for less than the window, when its
//!   `ContainerDied` arrives (running was never observed; kubelet's generic PLEG folds it the
//!   same way: `non-existent -> exited` is only `ContainerDied`). The death is still required.
//! - All three transitions of a container created and removed within the window: kubelet's
//!   relist never sees it (polling mode; the issue's own example).
//! - The exit code and reason of a `ContainerDied` for a container removed within the window
//!   after the runtime showed it exited (the harness's first `ContainerStatus` saying so; under
//!   load the CRI store shows an exit long after it happened, and no reading before could give
//!   its code): `running -> non-existent` has no status left to read the exit from.
//!
//! While plegd could not follow the runtime ([`Folding::outage`]), the first relist after diffs
//! what changed meanwhile against the last reading, as kubelet's first relist after a restart
//! does. The harness sets the outage for each fault:
//! - plegd stopped (SIGKILL, SIGTERM): from the signal to the restarted one's health, which
//!   waits for its first full relist (SIGTERM: the saved reading; after a SIGKILL the watcher
//!   resyncs on a listing taken after that relist, see below);
//! - containerd killed and restarted, or frozen (SIGSTOP): from the signal to containerd
//!   answering again (nothing can be read meanwhile); killed, where its event stream is the
//!   only push source (full relists minutes apart), on to plegd's first full relist of the new
//!   one (the stream replays nothing, and that relist follows its reconnect, after a backoff);
//! - containerd's event stream silent, the only push source: from the silence to the first
//!   full relist after plegd found it (the stream still looks connected until its heartbeat
//!   fails to come back).
//!
//! While plegd followed the runtime by full relists alone, its push source lost
//! ([`Folding::polled`]), a state that overlaps that span folds as in polling mode, within
//! the span's relist period plus polling's margin:
//! - plegd stopped: the outage. What its push sources said then is lost, so a container that
//!   exited then is found by the restarted one's full relists alone, a second apart until its
//!   sources are healthy: the CRI store may show the exit just after the first, and the
//!   container go before the next;
//! - containerd's event stream silent: from the first fast full relist after plegd found it
//!   to the stream connected again;
//! - kernel events lost in a full ring buffer, the kernel the only push source: from a loss
//!   check before the first losses counted to the full relist after the last (plegd reads
//!   its loss counter every second and relists in full when it grew: one relist per second,
//!   the hints lost unknown until then).
//!
//! What the first relist after an outage cannot see:
//! - `ContainerStarted` of a container that started then, or within the window before (the
//!   look that would have found it running fell in the outage), and died then
//!   (`non-existent -> exited` is one `ContainerDied`);
//! - all three transitions of a container started and removed then (created before or
//!   after plegd stopped: a created container has no event): never seen;
//! - the exit code of a container that exited then, or within the window before (the
//!   runtime's event about the exit, and the look that would have read it, came in the
//!   outage), and was removed then: the restarted plegd finds it gone (`running ->
//!   non-existent` from the saved reading), or lists it and finds it gone before its status
//!   call, so its `ContainerDied` (or the resync listing) has no code.
//!
//! # Restarts of plegd
//! A watcher of a daemon that crashed (SIGKILL) cannot resume: the new run's sequences start
//! again, so `plegd watch` lists the pods and follows from that listing ([`Record::Resync`]).
//! The listing is the watcher's new baseline: a container it shows running has started, one it
//! shows exited has died (its exit is checked like a `ContainerDied`'s; it may lack the code of
//! a container removed before the listing came: the new run's first relist listed it and found
//! it gone at its status call), one it does not show
//! either has been removed (only when the harness had asked to remove it before the listing
//! arrived) or owes every transition from then on. What the watcher received before a resync
//! is not held against what it receives after (the old run's `ContainerStarted` may come again
//! from the new run). A clean restart (SIGTERM, saved state) continues the run: no resync, no
//! gap, nothing folded but what changed while no plegd ran (the outage above).

use std::{
    collections::{BTreeMap, HashMap},
    fmt,
    time::{Duration, SystemTime},
};

use crate::cri::PidMode;

/// What the harness did to end a container's run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// `kill -9` of its init process.
    Kill,
    /// It exited by itself with this code.
    Exit(u8),
    /// Its memory limit made the kernel OOM-kill it.
    Oom,
    /// It ran for about 0.1 s and exited 0.
    Brief,
    /// CRI `StopContainer`.
    Stop,
    /// CRI `StopPodSandbox` of its whole pod.
    StopPod,
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Kill => f.write_str("kill -9"),
            Self::Exit(code) => write!(f, "exit {code}"),
            Self::Oom => f.write_str("oom"),
            Self::Brief => f.write_str("0.1 s"),
            Self::Stop => f.write_str("cri stop"),
            Self::StopPod => f.write_str("pod stop"),
        }
    }
}

/// How a container ended, as the runtime recorded it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Exit {
    pub code: i32,
    /// CRI's reason ("Completed", "Error", "OOMKilled"; may be empty).
    pub reason: String,
}

/// The reason CRI showed for a death once more, read just before the container's removal:
/// containerd's CRI plugin handles an OOM kill's event apart from the exit, and may show
/// "Error" first and "OOMKilled" a moment later.
pub type LaterReason = Option<String>;

/// One container's ground truth: what the harness did and what the runtime said.
#[derive(Clone, Debug)]
pub struct Truth {
    pub container_id: String,
    /// Its pod's name.
    pub pod: String,
    pub pid_mode: PidMode,
    pub action: Action,
    /// CRI's record of its exit when it first showed it; `None` when CRI never showed it exited.
    pub exit: Option<Exit>,
    /// CRI's reason read again before its removal (`None`: not read again).
    pub later_reason: LaterReason,
    /// Whether the harness removed it.
    pub removed: bool,
    pub timing: Timing,
}

/// Wall-clock facts about a container the foldings depend on (`None`: not known).
#[derive(Clone, Copy, Debug, Default)]
pub struct Timing {
    /// When the harness asked to create it.
    pub created: Option<SystemTime>,
    /// When CRI says it started.
    pub started: Option<SystemTime>,
    /// When CRI says it finished.
    pub finished: Option<SystemTime>,
    /// When the harness first saw CRI show it exited (polling: up to 50 ms late). Under load
    /// the CRI store shows an exit long after `finished`, and no reading before it could
    /// give the exit code.
    pub exit_shown: Option<SystemTime>,
    /// When the harness asked to remove it (it or its pod).
    pub removed: Option<SystemTime>,
}

/// A lifecycle transition of a container.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Transition {
    Started,
    Died,
    Removed,
}

impl Transition {
    const ALL: [Transition; 3] = [Self::Started, Self::Died, Self::Removed];

    /// The plegd event type naming it.
    pub fn event_type(self) -> &'static str {
        match self {
            Self::Started => "ContainerStarted",
            Self::Died => "ContainerDied",
            Self::Removed => "ContainerRemoved",
        }
    }

    fn from_event_type(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.event_type() == name)
    }
}

/// One event as the watcher received it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Received {
    pub sequence: u64,
    /// The daemon run, as `plegd watch` prints it (hex).
    pub run_id: String,
    /// plegd's event type ("ContainerStarted", "PodSync", ...).
    pub event_type: String,
    /// Empty for pod-level events.
    pub container_id: String,
    pub exit_code: Option<i32>,
    pub reason: String,
}

/// A container as a resync's listing showed it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Listed {
    /// Created, not started, or state unknown: no transition yet.
    Waiting,
    Running,
    Exited(Option<Exit>),
}

/// The fresh listing a watcher took after its daemon's run changed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Resync {
    /// When the watcher had it.
    pub at: Option<SystemTime>,
    /// The run it follows from then on (hex).
    pub run_id: String,
    /// The last sequence the listing covers.
    pub sequence: u64,
    pub containers: HashMap<String, Listed>,
}

/// What the watcher recorded, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Record {
    Event(Received),
    Resync(Resync),
}

impl Record {
    /// Reads one line of `plegd watch --output json`, received at `at`: an event, or a resync
    /// (`{"resync": <what plegd pods --output json prints>}`). `None` for anything else.
    pub fn from_watch_line(line: &str, at: SystemTime) -> Option<Self> {
        let value: serde_json::Value = serde_json::from_str(line).ok()?;
        let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_owned();
        let exit_code = |v: &serde_json::Value| v.as_i64().and_then(|c| i32::try_from(c).ok());
        if let Some(listing) = value.get("resync") {
            let containers = listing["pods"]
                .as_array()?
                .iter()
                .flat_map(|pod| pod["containers"].as_array().into_iter().flatten())
                .map(|c| {
                    let listed = match c["state"].as_str() {
                        Some("running") => Listed::Running,
                        Some("exited") => {
                            Listed::Exited(exit_code(&c["exit_code"]).map(|code| Exit {
                                code,
                                reason: text(&c["reason"]),
                            }))
                        }
                        _ => Listed::Waiting,
                    };
                    (text(&c["id"]), listed)
                })
                .collect();
            return Some(Self::Resync(Resync {
                at: Some(at),
                run_id: text(&listing["run_id"]),
                sequence: listing["sequence"].as_u64()?,
                containers,
            }));
        }
        Some(Self::Event(Received {
            sequence: value["sequence"].as_u64()?,
            run_id: text(&value["run_id"]),
            event_type: value["type"].as_str()?.to_owned(),
            container_id: text(&value["container_id"]),
            exit_code: exit_code(&value["exit_code"]),
            reason: text(&value["reason"]),
        }))
    }
}

/// Which foldings a mode allows (see the module doc).
#[derive(Clone, Copy, Debug)]
pub struct Folding {
    /// How long a state may last and still go unseen.
    pub window: Duration,
    /// When plegd could not follow the runtime (see the module doc for each fault): the first
    /// relist after it diffs what changed meanwhile, so a container that started and died then
    /// is one `ContainerDied` (`non-existent -> exited`), one created and removed then is never
    /// seen, as for kubelet restarting, and one that exited and was removed then left no status
    /// to read its exit from.
    pub outage: Option<(SystemTime, SystemTime)>,
    /// When plegd followed the runtime by full relists alone, though the mode has a push
    /// source (see the module doc for each fault): a state that overlaps it folds as in
    /// polling mode, within the longer window given here.
    pub polled: Option<Polled>,
}

/// A span of [`Folding::polled`].
#[derive(Clone, Copy, Debug)]
pub struct Polled {
    pub from: SystemTime,
    pub to: SystemTime,
    /// The relist period then, plus the margin of polling mode's window.
    pub window: Duration,
}

impl Folding {
    /// The window for a state held from `from` to `to`: the polled span's if they overlap.
    fn window_over(&self, from: Option<SystemTime>, to: Option<SystemTime>) -> Duration {
        let overlaps =
            |p: &Polled| from.is_none_or(|from| from <= p.to) && to.is_none_or(|to| to >= p.from);
        match self.polled {
            Some(p) if overlaps(&p) => p.window.max(self.window),
            _ => self.window,
        }
    }
}

/// One finding about one container (or one stretch of sequence numbers).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    pub container_id: String,
    pub transition: Option<Transition>,
    pub detail: String,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.transition {
            Some(t) => write!(
                f,
                "{} {}: {}",
                short(&self.container_id),
                t.event_type(),
                self.detail
            ),
            None => write!(f, "{}: {}", short(&self.container_id), self.detail),
        }
    }
}

fn short(id: &str) -> &str {
    id.get(..12).unwrap_or(id)
}

/// The audit's outcome.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// Containers in the ground truth.
    pub lifecycles: usize,
    /// Transitions the ground truth calls for.
    pub expected: usize,
    /// Events received about the ground truth's containers.
    pub received: usize,
    /// Transitions a resync's listing stood for.
    pub resynced: usize,
    /// Never received, and no folding allows it.
    pub lost: Vec<Finding>,
    /// Received more than once.
    pub duplicated: Vec<Finding>,
    /// Received after a later transition of the same container.
    pub out_of_order: Vec<Finding>,
    /// A `ContainerDied` (or a listed exit) with the wrong exit code or reason.
    pub mismatched: Vec<Finding>,
    /// Deaths whose reason when they were told is not the one CRI showed last: corrected
    /// since by a ContainerChanged, or one CRI showed first, or one containerd's rule gives
    /// the code (an OOM kill one of plegd and CRI saw and the other did not). Not wrong:
    /// counted, as the churn audit's answer to how often the reason at emission differs.
    pub reasons_differing: Vec<Finding>,
    /// Of those, the deaths whose reason a ContainerChanged corrected.
    pub reasons_corrected: usize,
    /// Sequence numbers missing within a run.
    pub gaps: Vec<Finding>,
    /// Legitimately not received (see the module doc).
    pub folded: Vec<Finding>,
    /// Lifecycles per action and pid-namespace mode.
    pub by_action: BTreeMap<String, usize>,
}

impl Report {
    /// Nothing lost, duplicated, reordered, wrong or skipped.
    pub fn is_clean(&self) -> bool {
        self.lost.is_empty()
            && self.duplicated.is_empty()
            && self.out_of_order.is_empty()
            && self.mismatched.is_empty()
            && self.gaps.is_empty()
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "lifecycles {}, transitions expected {}, received {}, resynced {}, folded {}, \
             lost {}, duplicated {}, out of order {}, wrong exit {}, sequence gaps {}, \
             reasons differing from CRI's {} ({} corrected by a ContainerChanged)",
            self.lifecycles,
            self.expected,
            self.received,
            self.resynced,
            self.folded.len(),
            self.lost.len(),
            self.duplicated.len(),
            self.out_of_order.len(),
            self.mismatched.len(),
            self.gaps.len(),
            self.reasons_differing.len(),
            self.reasons_corrected,
        )?;
        let actions: Vec<String> = self
            .by_action
            .iter()
            .map(|(k, n)| format!("{k}: {n}"))
            .collect();
        writeln!(f, "  lifecycles by action: {}", actions.join(", "))?;
        for (what, findings) in [
            ("lost", &self.lost),
            ("duplicated", &self.duplicated),
            ("out of order", &self.out_of_order),
            ("wrong exit", &self.mismatched),
            ("sequence gap", &self.gaps),
            ("reason differing", &self.reasons_differing),
            ("folded", &self.folded),
        ] {
            for finding in findings {
                writeln!(f, "  {what}: {finding}")?;
            }
        }
        Ok(())
    }
}

/// Audits `records` (what one watcher received, in order) against `truth`.
pub fn check(truth: &[Truth], records: &[Record], folding: Folding) -> Report {
    let mut report = Report {
        lifecycles: truth.len(),
        ..Report::default()
    };
    report.gaps = sequence_gaps(records);
    let mut by_container: HashMap<&str, Vec<&Record>> = HashMap::new();
    for record in records {
        match record {
            Record::Event(event) => by_container
                .entry(event.container_id.as_str())
                .or_default()
                .push(record),
            // Every container's account sees every resync, in its place.
            Record::Resync(_) => {
                for t in truth {
                    by_container
                        .entry(t.container_id.as_str())
                        .or_default()
                        .push(record);
                }
            }
        }
    }
    for t in truth {
        *report
            .by_action
            .entry(format!("{} ({:?} pid ns)", t.action, t.pid_mode))
            .or_default() += 1;
        let records = by_container
            .get(t.container_id.as_str())
            .map_or(&[][..], Vec::as_slice);
        audit_container(t, records, folding, &mut report);
    }
    report
}

/// Where one container's account stands.
#[derive(Default)]
struct Account {
    /// Received (or stood for by a listing) since the last resync.
    got: [bool; 3],
    /// The next transition in order.
    next: usize,
}

fn audit_container(truth: &Truth, records: &[&Record], folding: Folding, report: &mut Report) {
    let id = &truth.container_id;
    let finding = |transition: Option<Transition>, detail: String| Finding {
        container_id: id.clone(),
        transition,
        detail,
    };
    let owed = if truth.removed { 3 } else { 2 };
    report.expected += owed;
    let mut account = Account::default();
    for (at, record) in records.iter().enumerate() {
        match record {
            Record::Event(event) => {
                let Some(transition) = Transition::from_event_type(&event.event_type) else {
                    continue;
                };
                report.received += 1;
                let k = transition as usize;
                if account.got[k] {
                    report.duplicated.push(finding(
                        Some(transition),
                        format!("again at sequence {}", event.sequence),
                    ));
                    continue;
                }
                account.got[k] = true;
                if k < account.next {
                    report.out_of_order.push(finding(
                        Some(transition),
                        format!(
                            "at sequence {}, after {}",
                            event.sequence,
                            Transition::ALL[account.next - 1].event_type()
                        ),
                    ));
                    continue;
                }
                account.next = k + 1;
                if transition == Transition::Died {
                    let told = Told {
                        reason: &event.reason,
                        corrected: corrected_reason(&records[at + 1..]),
                    };
                    check_exit(truth, event.exit_code, told, folding, report);
                }
            }
            Record::Resync(resync) => {
                let baseline = match resync.containers.get(id.as_str()) {
                    Some(Listed::Waiting) => 0,
                    Some(Listed::Running) => 1,
                    Some(Listed::Exited(exit)) => {
                        match exit {
                            Some(exit) => check_exit(
                                truth,
                                Some(exit.code),
                                Told::listed(&exit.reason),
                                folding,
                                report,
                            ),
                            // Listed by the new run's first relist, removed before its status
                            // call: no status was left to read the exit from.
                            None if truth
                                .timing
                                .removed
                                .zip(resync.at)
                                .is_some_and(|(removed, at)| removed <= at) =>
                            {
                                report.folded.push(Finding {
                                    container_id: truth.container_id.clone(),
                                    transition: Some(Transition::Died),
                                    detail: "no exit code in the listing: removed before it came"
                                        .to_owned(),
                                })
                            }
                            None => check_exit(truth, None, Told::listed(""), folding, report),
                        }
                        2
                    }
                    // Gone before the listing, or not there yet.
                    None => match (truth.timing.removed, resync.at) {
                        (Some(removed), Some(at)) if removed <= at => 3,
                        _ => 0,
                    },
                };
                report.resynced += (0..baseline).filter(|&k| !account.got[k]).count();
                account.got = std::array::from_fn(|k| k < baseline);
                account.next = baseline;
            }
        }
    }
    for (k, transition) in Transition::ALL.into_iter().enumerate().take(owed) {
        if account.got[k] {
            continue;
        }
        match fold(truth, transition, &account, folding) {
            Some(why) => report.folded.push(finding(Some(transition), why)),
            None => report.lost.push(finding(
                Some(transition),
                format!(
                    "never received ({}, {:?} pid ns{})",
                    truth.action,
                    truth.pid_mode,
                    against_outage(&truth.timing, folding)
                ),
            )),
        }
    }
}

/// Where a container's run fell against the outage, for a report (empty without one).
fn against_outage(timing: &Timing, folding: Folding) -> String {
    let Some((down, up)) = folding.outage else {
        return String::new();
    };
    let from_down = |t: Option<SystemTime>| match t.map(|t| t.duration_since(down)) {
        Some(Ok(after)) => format!("+{:.2} s", after.as_secs_f64()),
        Some(Err(before)) => format!("-{:.2} s", before.duration().as_secs_f64()),
        None => "unknown".to_owned(),
    };
    format!(
        "; from the outage's start: started {}, finished {}, the outage {:.2} s long",
        from_down(timing.started),
        from_down(timing.finished),
        up.duration_since(down).unwrap_or_default().as_secs_f64()
    )
}

/// Why a transition never received may be folded (`None`: it may not).
fn fold(
    truth: &Truth,
    transition: Transition,
    account: &Account,
    folding: Folding,
) -> Option<String> {
    let Timing {
        created,
        started,
        finished,
        removed,
        ..
    } = truth.timing;
    if let Some(lived) = elapsed(created, removed)
        && lived < folding.window_over(created, removed)
        && !account.got.iter().any(|&g| g)
    {
        return Some(format!(
            "created and removed within {lived:?}, between two looks"
        ));
    }
    if transition == Transition::Started
        && account.got[Transition::Died as usize]
        && let Some(ran) = elapsed(started, finished)
        && ran < folding.window_over(started, finished)
    {
        return Some(format!("ran {ran:?}: died before running was seen"));
    }
    // Created before plegd stopped is no matter: `created` has no event (it is unknown to
    // kubelet's PLEG), so nothing was owed before the start.
    if let Some((down, up)) = folding.outage
        && !account.got.iter().any(|&g| g)
        && started.is_some_and(|t| t >= down)
        && removed.is_some_and(|t| t <= up)
    {
        return Some("started and removed while plegd could not follow the runtime".to_owned());
    }
    // A start within the window before the outage is as unseen: the look that would have
    // found it running fell in the outage (containerd killed right after it started a task).
    if transition == Transition::Started
        && account.got[Transition::Died as usize]
        && let Some((down, up)) = folding.outage
        && started.is_some_and(|t| t + folding.window >= down)
        && finished.is_some_and(|t| t <= up + folding.window)
    {
        return Some(
            "started then or just before, and died while plegd could not follow the runtime"
                .to_owned(),
        );
    }
    None
}

/// From `from` to `to`; zero when `to` came first (containerd records a brief container's
/// start after its exit: `StartContainer` returns after the process ended).
fn elapsed(from: Option<SystemTime>, to: Option<SystemTime>) -> Option<Duration> {
    Some(to?.duration_since(from?).unwrap_or_default())
}

/// A death's reason as a consumer was told it.
#[derive(Clone, Copy)]
struct Told<'a> {
    /// On the ContainerDied, or in a listing.
    reason: &'a str,
    /// By a ContainerChanged after the ContainerDied, where the CRI store showed another.
    corrected: Option<&'a str>,
}

impl<'a> Told<'a> {
    fn listed(reason: &'a str) -> Self {
        Self {
            reason,
            corrected: None,
        }
    }
}

/// The reason the last ContainerChanged of a container's `later` records carries (they follow
/// its ContainerDied), if one does.
fn corrected_reason<'a>(later: &[&'a Record]) -> Option<&'a str> {
    later.iter().rev().find_map(|record| match record {
        Record::Event(e) if e.event_type == "ContainerChanged" && !e.reason.is_empty() => {
            Some(e.reason.as_str())
        }
        _ => None,
    })
}

/// When a container finished, showed its exit and went, from the outage's start when there
/// was one (else from its exit): what a wrong exit needs to be explained.
fn timeline(truth: &Truth, folding: Folding) -> String {
    let origin = folding
        .outage
        .map(|(down, _)| down)
        .or(truth.timing.finished);
    let at = |t: Option<SystemTime>| match (t, origin) {
        (Some(t), Some(origin)) => match t.duration_since(origin) {
            Ok(after) => format!("+{:.3} s", after.as_secs_f64()),
            Err(before) => format!("-{:.3} s", before.duration().as_secs_f64()),
        },
        _ => "never".to_owned(),
    };
    let outage = folding.outage.map_or_else(
        || "no outage".to_owned(),
        |(down, up)| format!("outage {}..{}", at(Some(down)), at(Some(up))),
    );
    format!(
        "finished {}, exit shown {}, removed {}; {outage}",
        at(truth.timing.finished),
        at(truth.timing.exit_shown),
        at(truth.timing.removed)
    )
}

/// Holds a reported exit against the runtime's.
fn check_exit(
    truth: &Truth,
    code: Option<i32>,
    told: Told<'_>,
    folding: Folding,
    report: &mut Report,
) {
    let reason = told.reason;
    let wrong = |detail: String| Finding {
        container_id: truth.container_id.clone(),
        transition: Some(Transition::Died),
        detail,
    };
    // CRI never recorded the exit: any code will do.
    let Some(exit) = &truth.exit else { return };
    let during_outage = |t: Option<SystemTime>, margin: Duration| {
        folding
            .outage
            .zip(t)
            .is_some_and(|((down, up), t)| down <= t && t <= up + margin)
    };
    // containerd records an exit it lost across its own restart as 255 "Unknown", after
    // plegd reported the runtime's record of it from before the restart.
    if folding.outage.is_some() && exit.code == 255 && exit.reason == "Unknown" {
        if code.is_some_and(|code| code != 255) {
            report.folded.push(Finding {
                detail: format!("exit {code:?}: the runtime lost it across its restart"),
                ..wrong(String::new())
            });
        }
        return;
    }
    let shown = truth.timing.exit_shown.or(truth.timing.finished);
    // An exit within the window before the outage is as unseen as one in it, as a start is:
    // the runtime's event about it came after the exit (tens of ms under churn), in the
    // outage, and so did the look that would have read its code.
    let exited_then = truth.timing.finished.is_some_and(|t| {
        folding
            .outage
            .is_some_and(|(down, up)| t + folding.window >= down && t <= up)
    });
    match code {
        None if exited_then && during_outage(truth.timing.removed, folding.window) => {
            report.folded.push(Finding {
                detail: "no exit code: exited and removed while plegd could not follow the runtime"
                    .to_owned(),
                ..wrong(String::new())
            })
        }
        None => match elapsed(shown, truth.timing.removed) {
            // The exited state began when the container ended, whenever CRI showed it: an exit
            // in a polled span (a restarted plegd's sources heard nothing of it) is found by
            // full relists alone, even once CRI shows it after the span.
            Some(gone)
                if gone
                    < folding
                        .window_over(truth.timing.finished.or(shown), truth.timing.removed) =>
            {
                report.folded.push(Finding {
                    detail: format!(
                        "no exit code: removed {gone:?} after the runtime showed its exit"
                    ),
                    ..wrong(String::new())
                })
            }
            _ => report.mismatched.push(wrong(format!(
                "no exit code, the runtime recorded {} {} ({})",
                exit.code,
                exit.reason,
                timeline(truth, folding)
            ))),
        },
        Some(code) if code != exit.code => report.mismatched.push(wrong(format!(
            "exit {code} {reason:?}, the runtime recorded {} {:?} ({})",
            exit.code, exit.reason, truth.action
        ))),
        Some(code) => check_reason(truth, exit, code, told, report),
    }
}

/// Holds a death's reason against the one CRI showed last (empty: told by an older plegd, or
/// by a listing without one). One that differs when told is counted; the last a consumer
/// was told (a ContainerChanged's correction, else the death's) is wrong unless it is CRI's
/// last word, its first, or another containerd's rule gives the code (an OOM kill plegd saw
/// and CRI never recorded, or one CRI recorded and plegd never learned of: across a restart
/// of plegd, a ring buffer overflow).
fn check_reason(truth: &Truth, exit: &Exit, code: i32, told: Told<'_>, report: &mut Report) {
    let last = truth.later_reason.as_deref().unwrap_or(&exit.reason);
    if told.reason.is_empty() || told.reason == last {
        return;
    }
    let finally = told.corrected.unwrap_or(told.reason);
    let finding = Finding {
        container_id: truth.container_id.clone(),
        transition: Some(Transition::Died),
        detail: format!(
            "exit {code} {:?}{}, CRI showed {:?} then {last:?} ({})",
            told.reason,
            told.corrected
                .map(|c| format!(" corrected to {c:?}"))
                .unwrap_or_default(),
            exit.reason,
            truth.action
        ),
    };
    report.reasons_corrected += usize::from(told.corrected.is_some());
    let by_rule =
        finally == "OOMKilled" || finally == if code == 0 { "Completed" } else { "Error" };
    if finally == last || finally == exit.reason || by_rule {
        report.reasons_differing.push(finding);
    } else {
        report.mismatched.push(finding);
    }
}

/// Missing sequence numbers within each run (a resync starts the count again).
fn sequence_gaps(records: &[Record]) -> Vec<Finding> {
    let mut gaps = Vec::new();
    let mut last: Option<(&str, u64)> = None;
    for record in records {
        match record {
            Record::Resync(resync) => last = Some((resync.run_id.as_str(), resync.sequence)),
            // Kernel observations are not numbered.
            Record::Event(event) if event.sequence == 0 => {}
            Record::Event(event) => {
                let gap = match last {
                    Some((run, previous)) if run != event.run_id => Some(format!(
                        "run {} follows run {run} at sequence {previous} without a resync",
                        event.run_id
                    )),
                    Some((run, previous)) if event.sequence != previous + 1 => Some(format!(
                        "sequence {} follows {previous} in run {run}",
                        event.sequence
                    )),
                    _ => None,
                };
                if let Some(detail) = gap {
                    gaps.push(Finding {
                        container_id: event.container_id.clone(),
                        transition: None,
                        detail,
                    });
                }
                last = Some((event.run_id.as_str(), event.sequence));
            }
        }
    }
    gaps
}

#[cfg(test)]
mod tests {
    use super::*;

    const WINDOW: Folding = Folding {
        window: Duration::from_millis(1500),
        outage: None,
        polled: None,
    };

    fn at(ms: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000) + Duration::from_millis(ms)
    }

    /// A container created at 0, started at 100 ms, finished at `finished` ms, removal asked
    /// at `removed` ms, which exited `code` with `reason`.
    fn truth(id: &str, code: i32, reason: &str, finished: u64, removed: u64) -> Truth {
        Truth {
            container_id: id.to_owned(),
            pod: "p".to_owned(),
            pid_mode: PidMode::Container,
            action: Action::Kill,
            exit: Some(Exit {
                code,
                reason: reason.to_owned(),
            }),
            later_reason: None,
            removed: true,
            timing: Timing {
                created: Some(at(0)),
                started: Some(at(100)),
                finished: Some(at(finished)),
                exit_shown: None,
                removed: Some(at(removed)),
            },
        }
    }

    /// Events of run "a" numbered from 1 in order.
    fn events(list: &[(&str, &str, Option<i32>, &str)]) -> Vec<Record> {
        list.iter()
            .enumerate()
            .map(|(i, (id, kind, code, reason))| event("a", i as u64 + 1, id, kind, *code, reason))
            .collect()
    }

    fn event(
        run: &str,
        sequence: u64,
        id: &str,
        kind: &str,
        code: Option<i32>,
        reason: &str,
    ) -> Record {
        Record::Event(Received {
            sequence,
            run_id: run.to_owned(),
            event_type: kind.to_owned(),
            container_id: id.to_owned(),
            exit_code: code,
            reason: reason.to_owned(),
        })
    }

    fn lifecycle<'a>(
        id: &'a str,
        code: i32,
        reason: &'a str,
    ) -> Vec<(&'a str, &'a str, Option<i32>, &'a str)> {
        vec![
            (id, "ContainerStarted", None, ""),
            (id, "ContainerDied", Some(code), reason),
            (id, "ContainerRemoved", Some(code), reason),
        ]
    }

    /// `id`'s `ContainerDied` as received without its exit code.
    fn without_exit(list: &mut [(&str, &str, Option<i32>, &str)], id: &str) {
        for (about, kind, code, reason) in list {
            if *about == id && *kind == "ContainerDied" {
                (*code, *reason) = (None, "");
            }
        }
    }

    fn transitions(findings: &[Finding]) -> Vec<(&str, Option<Transition>)> {
        findings
            .iter()
            .map(|f| (f.container_id.as_str(), f.transition))
            .collect()
    }

    #[test]
    fn a_full_lifecycle_in_order_is_clean() {
        let mut list = lifecycle("c1", 137, "Error");
        list.insert(1, ("", "PodSync", None, ""));
        let report = check(
            &[truth("c1", 137, "Error", 3000, 5000)],
            &events(&list),
            WINDOW,
        );
        assert!(report.is_clean(), "{report}");
        assert_eq!(
            (report.lifecycles, report.expected, report.received),
            (1, 3, 3)
        );
        assert!(report.folded.is_empty());
    }

    #[test]
    fn a_missing_death_is_lost() {
        let mut list = lifecycle("c1", 137, "Error");
        list.remove(1);
        let report = check(
            &[truth("c1", 137, "Error", 3000, 5000)],
            &events(&list),
            WINDOW,
        );
        assert_eq!(transitions(&report.lost), [("c1", Some(Transition::Died))]);
        assert!(!report.is_clean());
    }

    #[test]
    fn a_second_start_is_a_duplicate() {
        let mut list = lifecycle("c1", 0, "Completed");
        list.insert(1, ("c1", "ContainerStarted", None, ""));
        let report = check(
            &[truth("c1", 0, "Completed", 3000, 5000)],
            &events(&list),
            WINDOW,
        );
        assert_eq!(
            transitions(&report.duplicated),
            [("c1", Some(Transition::Started))]
        );
        assert!(report.lost.is_empty() && report.out_of_order.is_empty());
    }

    #[test]
    fn a_start_after_the_death_is_out_of_order() {
        let mut list = lifecycle("c1", 0, "Completed");
        list.swap(0, 1);
        let report = check(
            &[truth("c1", 0, "Completed", 3000, 5000)],
            &events(&list),
            WINDOW,
        );
        assert_eq!(
            transitions(&report.out_of_order),
            [("c1", Some(Transition::Started))]
        );
        assert!(report.lost.is_empty() && report.duplicated.is_empty());
    }

    #[test]
    fn a_death_must_carry_the_runtime_exit_code_and_reason_or_no_reason() {
        let truths = [
            truth("ok", 3, "Error", 3000, 5000),
            truth("task", 137, "OOMKilled", 3000, 5000),
            truth("code", 137, "Error", 3000, 5000),
            truth("reason", 137, "OOMKilled", 3000, 5000),
        ];
        let mut list = lifecycle("ok", 3, "Error");
        // Confirmed by the task service: the code, no reason yet.
        list.extend(lifecycle("task", 137, ""));
        list.extend(lifecycle("code", 143, "Error"));
        // No rule gives a code of 137 "Completed".
        list.extend(lifecycle("reason", 137, "Completed"));
        let report = check(&truths, &events(&list), WINDOW);
        assert_eq!(
            transitions(&report.mismatched),
            [
                ("code", Some(Transition::Died)),
                ("reason", Some(Transition::Died))
            ]
        );
        assert!(report.lost.is_empty());
    }

    /// containerd's CRI plugin may show a death's "Error" first and its "OOMKilled" a moment
    /// later (it handles the OOM event apart): the last word is the one, the first a
    /// correction; an OOM kill CRI never recorded too; a reason neither CRI nor containerd's
    /// rule gives the code is wrong.
    #[test]
    fn a_deaths_reason_is_cris_last_word() {
        let later = |mut t: Truth, reason: &str| {
            t.later_reason = Some(reason.to_owned());
            t
        };
        let unrecorded = truth("unrecorded", 137, "Error", 3000, 5000);
        let truths = [
            later(truth("late-oom", 137, "Error", 3000, 5000), "OOMKilled"),
            later(truth("first-word", 137, "Error", 3000, 5000), "OOMKilled"),
            unrecorded,
            later(truth("never", 137, "Error", 3000, 5000), "Error"),
            later(truth("corrected", 137, "Error", 3000, 5000), "OOMKilled"),
            later(truth("miscorrected", 137, "Error", 3000, 5000), "OOMKilled"),
        ];
        let mut list = lifecycle("late-oom", 137, "OOMKilled");
        list.extend(lifecycle("first-word", 137, "Error"));
        list.extend(lifecycle("unrecorded", 137, "OOMKilled"));
        list.extend(lifecycle("never", 137, "Completed"));
        list.extend(lifecycle("corrected", 137, "Error"));
        list.push(("corrected", "ContainerChanged", Some(137), "OOMKilled"));
        list.extend(lifecycle("miscorrected", 137, "Error"));
        list.push(("miscorrected", "ContainerChanged", Some(137), "Completed"));
        let report = check(&truths, &events(&list), WINDOW);
        assert_eq!(
            transitions(&report.reasons_differing),
            [
                ("first-word", Some(Transition::Died)),
                ("unrecorded", Some(Transition::Died)),
                ("corrected", Some(Transition::Died))
            ]
        );
        assert_eq!(report.reasons_corrected, 2);
        assert_eq!(
            transitions(&report.mismatched),
            [
                ("never", Some(Transition::Died)),
                ("miscorrected", Some(Transition::Died))
            ]
        );
        assert!(!report.is_clean());
    }

    #[test]
    fn an_exit_cri_never_recorded_accepts_any_code() {
        let mut t = truth("c1", 0, "", 3000, 5000);
        t.exit = None;
        let list = lifecycle("c1", 255, "Unknown");
        let report = check(&[t], &events(&list), WINDOW);
        assert!(report.is_clean(), "{report}");
    }

    #[test]
    fn a_start_folds_only_into_the_death_of_a_brief_run() {
        // CRI says it started after it finished.
        let mut backwards = truth("backwards", 0, "Completed", 90, 5000);
        backwards.action = Action::Brief;
        let truths = [
            backwards,
            truth("brief", 0, "Completed", 200, 5000),
            truth("long", 0, "Completed", 3000, 5000),
            truth("brief-undead", 0, "Completed", 200, 5000),
        ];
        let mut list = lifecycle("backwards", 0, "Completed");
        list.extend(lifecycle("brief", 0, "Completed"));
        list.extend(lifecycle("long", 0, "Completed"));
        list.extend(lifecycle("brief-undead", 0, "Completed"));
        list.retain(|(id, kind, ..)| {
            *kind != "ContainerStarted" && !(*id == "brief-undead" && *kind == "ContainerDied")
        });
        let report = check(&truths, &events(&list), WINDOW);
        assert_eq!(
            transitions(&report.folded),
            [
                ("backwards", Some(Transition::Started)),
                ("brief", Some(Transition::Started))
            ]
        );
        assert_eq!(
            transitions(&report.lost),
            [
                ("long", Some(Transition::Started)),
                ("brief-undead", Some(Transition::Started)),
                ("brief-undead", Some(Transition::Died))
            ]
        );
    }

    /// A container that started and died while no plegd ran, or started within the window
    /// before, owes only its death; one that started longer before plegd stopped still owes
    /// its start.
    #[test]
    fn a_start_folds_into_a_death_while_no_plegd_ran() {
        // Started at 100, died at 4000 (longer than the window): only the outage folds it.
        let truths = [truth("meanwhile", 1, "Error", 4000, 6000)];
        let mut list = lifecycle("meanwhile", 1, "Error");
        list.retain(|(_, kind, ..)| *kind != "ContainerStarted");
        let outage = |from: u64| Folding {
            outage: Some((at(from), at(3500))),
            ..WINDOW
        };
        for (from, folded) in [(50, true), (1600, true), (1700, false)] {
            let report = check(&truths, &events(&list), outage(from));
            let (expected, other) = if folded {
                (&report.folded, &report.lost)
            } else {
                (&report.lost, &report.folded)
            };
            let what = format!("outage from {from} ms");
            assert_eq!(
                transitions(expected),
                [("meanwhile", Some(Transition::Started))],
                "{what}"
            );
            assert!(other.is_empty(), "{what}");
        }
    }

    /// The window for a missing exit code runs from when the runtime first showed the exit.
    #[test]
    fn a_missing_exit_code_folds_by_when_the_runtime_showed_the_exit() {
        let shown = |id: &str, shown_ms: u64| {
            let mut truth = truth(id, 1, "Error", 1000, 4000);
            truth.timing.exit_shown = Some(at(shown_ms));
            truth
        };
        let truths = [shown("shown-late", 3000), shown("shown-early", 1050)];
        let mut list = lifecycle("shown-late", 1, "Error");
        list.extend(lifecycle("shown-early", 1, "Error"));
        without_exit(&mut list, "shown-late");
        without_exit(&mut list, "shown-early");
        let report = check(&truths, &events(&list), WINDOW);
        assert_eq!(
            transitions(&report.folded),
            [("shown-late", Some(Transition::Died))]
        );
        assert_eq!(
            transitions(&report.mismatched),
            [("shown-early", Some(Transition::Died))]
        );
    }

    /// While plegd followed the runtime by full relists alone, what overlaps that span folds
    /// within the polled window; the same outside it does not.
    #[test]
    fn a_polled_span_folds_with_its_own_window_only_where_it_overlaps() {
        // Shown exited at 1000, removed at 2000: a second with no exit code.
        let truths = [truth("gone-fast", 1, "Error", 1000, 2000)];
        let mut list = lifecycle("gone-fast", 1, "Error");
        without_exit(&mut list, "gone-fast");
        let tight = Folding {
            window: Duration::from_millis(500),
            ..WINDOW
        };
        let polled = |from: u64, to: u64| Folding {
            polled: Some(Polled {
                from: at(from),
                to: at(to),
                window: Duration::from_millis(1500),
            }),
            ..tight
        };
        let mismatched = |folding| check(&truths, &events(&list), folding).mismatched.len();
        assert_eq!(mismatched(tight), 1);
        assert_eq!(mismatched(polled(1800, 5000)), 0);
        assert_eq!(mismatched(polled(0, 900)), 1, "before the exit");
        assert_eq!(mismatched(polled(2100, 5000)), 1, "after the removal");
        // Ended in the span (plegd down), shown exited by CRI after it.
        let mut late = truths[0].clone();
        late.timing.exit_shown = Some(at(1000));
        late.timing.finished = Some(at(700));
        let report = check(&[late], &events(&list), polled(500, 800));
        assert!(report.mismatched.is_empty(), "{report}");
        let report = check(&truths, &events(&list), polled(1800, 5000));
        assert_eq!(
            transitions(&report.folded),
            [("gone-fast", Some(Transition::Died))]
        );
    }

    /// Exits the runtime could not show: one that came and went while it was down, and one it
    /// lost across its restart (containerd's 255 "Unknown"). Outside an outage, neither folds.
    #[test]
    fn exits_the_runtime_could_not_show_during_an_outage_fold() {
        let truths = [
            truth("gone-meanwhile", 1, "Error", 3000, 4900),
            truth("lost-by-runtime", 255, "Unknown", 3000, 9000),
        ];
        let mut list = lifecycle("gone-meanwhile", 1, "Error");
        without_exit(&mut list, "gone-meanwhile");
        list.extend(lifecycle("lost-by-runtime", 137, "OOMKilled"));
        let outage = Folding {
            outage: Some((at(2500), at(3500))),
            ..WINDOW
        };
        let report = check(&truths, &events(&list), outage);
        assert!(report.mismatched.is_empty(), "{:?}", report.mismatched);
        assert_eq!(
            transitions(&report.folded),
            [
                ("gone-meanwhile", Some(Transition::Died)),
                ("lost-by-runtime", Some(Transition::Died))
            ]
        );
        let report = check(&truths, &events(&list), WINDOW);
        assert_eq!(
            transitions(&report.mismatched),
            [
                ("gone-meanwhile", Some(Transition::Died)),
                ("lost-by-runtime", Some(Transition::Died))
            ]
        );
    }

    /// A container that started and was removed while no plegd ran is never seen (created
    /// before it stopped or not); one that started before plegd stopped, or was removed after
    /// it was back, still owes its transitions.
    #[test]
    fn a_container_started_and_removed_while_no_plegd_ran_folds_whole() {
        // Created at 0, started at 100.
        let truths = [
            truth("meanwhile", 0, "Completed", 3000, 5000),
            truth("before", 0, "Completed", 3000, 5000),
            truth("after", 0, "Completed", 3000, 9000),
        ];
        let outage = |from: u64| Folding {
            outage: Some((at(from), at(6000))),
            ..WINDOW
        };
        let report = check(&truths[..1], &[], outage(50));
        assert_eq!(report.folded.len(), 3, "{report}");
        assert!(report.is_clean(), "{report}");
        for (t, from) in [(&truths[1], 150), (&truths[2], 50)] {
            let report = check(std::slice::from_ref(t), &[], outage(from));
            assert_eq!(report.lost.len(), 3, "{report}");
            assert!(report.folded.is_empty(), "{report}");
        }
    }

    #[test]
    fn a_container_gone_between_two_looks_folds_whole() {
        let truths = [
            truth("fleeting", 0, "Completed", 200, 1000),
            truth("lasting", 0, "Completed", 200, 5000),
        ];
        let report = check(&truths, &[], WINDOW);
        assert_eq!(
            transitions(&report.folded),
            [
                ("fleeting", Some(Transition::Started)),
                ("fleeting", Some(Transition::Died)),
                ("fleeting", Some(Transition::Removed))
            ]
        );
        assert_eq!(report.lost.len(), 3);
        assert!(report.lost.iter().all(|f| f.container_id == "lasting"));
    }

    #[test]
    fn a_death_without_exit_code_folds_only_when_removed_soon_after() {
        let truths = [
            truth("soon", 1, "Error", 3000, 3500),
            truth("late", 1, "Error", 3000, 9000),
        ];
        let mut list = lifecycle("soon", 1, "Error");
        list.extend(lifecycle("late", 1, "Error"));
        without_exit(&mut list, "soon");
        without_exit(&mut list, "late");
        let report = check(&truths, &events(&list), WINDOW);
        assert_eq!(
            transitions(&report.folded),
            [("soon", Some(Transition::Died))]
        );
        assert_eq!(
            transitions(&report.mismatched),
            [("late", Some(Transition::Died))]
        );
    }

    #[test]
    fn a_death_without_exit_code_folds_when_exited_and_removed_while_no_plegd_ran() {
        // The outage from 2000 to 5000, the window 1500: an exit at 1800 is as unseen (its
        // event came in the outage), one at 200 had a window's time to be read.
        let truths = [
            truth("meanwhile", 1, "Error", 3000, 4000),
            truth("just-before", 1, "Error", 1800, 4000),
            truth("before", 1, "Error", 200, 4000),
        ];
        let mut list = lifecycle("meanwhile", 1, "Error");
        list.extend(lifecycle("just-before", 1, "Error"));
        list.extend(lifecycle("before", 1, "Error"));
        for entry in &mut list {
            if entry.1 == "ContainerDied" {
                entry.2 = None;
                entry.3 = "";
            }
        }
        let outage = Folding {
            outage: Some((at(2000), at(5000))),
            ..WINDOW
        };
        let report = check(&truths, &events(&list), outage);
        assert_eq!(
            transitions(&report.folded),
            [
                ("meanwhile", Some(Transition::Died)),
                ("just-before", Some(Transition::Died))
            ]
        );
        assert_eq!(
            transitions(&report.mismatched),
            [("before", Some(Transition::Died))]
        );
    }

    #[test]
    fn a_container_left_in_place_owes_no_removal() {
        let mut t = truth("c1", 0, "Completed", 3000, 5000);
        t.removed = false;
        t.timing.removed = None;
        let mut list = lifecycle("c1", 0, "Completed");
        list.pop();
        let report = check(&[t], &events(&list), WINDOW);
        assert!(report.is_clean(), "{report}");
        assert_eq!(report.expected, 2);
    }

    #[test]
    fn skipped_sequences_and_an_unannounced_new_run_are_gaps() {
        let records = [
            event("a", 7, "c1", "ContainerStarted", None, ""),
            event("a", 9, "c1", "ContainerDied", Some(0), "Completed"),
            event("b", 1, "c1", "ContainerRemoved", Some(0), "Completed"),
            // Kernel observations are not numbered.
            event("b", 0, "c1", "KernelObservation", None, ""),
            event("b", 2, "", "PodSync", None, ""),
        ];
        let report = check(&[truth("c1", 0, "Completed", 3000, 5000)], &records, WINDOW);
        let gaps: Vec<&str> = report.gaps.iter().map(|f| f.detail.as_str()).collect();
        assert_eq!(
            gaps,
            [
                "sequence 9 follows 7 in run a",
                "run b follows run a at sequence 9 without a resync"
            ]
        );
        assert!(report.lost.is_empty() && report.duplicated.is_empty());
    }

    fn resync(ms: u64, sequence: u64, containers: &[(&str, Listed)]) -> Record {
        Record::Resync(Resync {
            at: Some(at(ms)),
            run_id: "b".to_owned(),
            sequence,
            containers: containers
                .iter()
                .map(|(id, l)| ((*id).to_owned(), l.clone()))
                .collect(),
        })
    }

    #[test]
    fn a_resync_listing_is_the_new_baseline() {
        let truths = [
            truth("running", 137, "Error", 3000, 5000),
            truth("exited", 2, "Error", 1000, 5000),
            truth("wrong", 2, "Error", 1000, 5000),
            truth("gone", 0, "Completed", 1000, 1500),
            truth("later", 0, "Completed", 3000, 5000),
            truth("owed", 0, "Completed", 1000, 2500),
            truth("code-gone", 1, "Error", 200, 1900),
            truth("code-missing", 1, "Error", 200, 2500),
        ];
        let exited = |code| {
            Listed::Exited(Some(Exit {
                code,
                reason: "Error".to_owned(),
            }))
        };
        let records = vec![
            event("a", 1, "running", "ContainerStarted", None, ""),
            event("a", 2, "gone", "ContainerStarted", None, ""),
            event("a", 3, "owed", "ContainerStarted", None, ""),
            // plegd crashed; the watcher listed the new run's pods at 2 s.
            resync(
                2000,
                10,
                &[
                    ("running", Listed::Running),
                    ("exited", exited(2)),
                    ("wrong", exited(3)),
                    ("later", Listed::Waiting),
                    // Removed before the listing came, and after: only the first may lack its
                    // exit code.
                    ("code-gone", Listed::Exited(None)),
                    ("code-missing", Listed::Exited(None)),
                ],
            ),
            event("b", 11, "running", "ContainerDied", Some(137), "Error"),
            event("b", 12, "running", "ContainerRemoved", Some(137), ""),
            event("b", 13, "exited", "ContainerRemoved", Some(2), ""),
            event("b", 14, "wrong", "ContainerRemoved", Some(2), ""),
            // Not listed yet, then seen by the new run: not a duplicate of the old run's.
            event("b", 15, "later", "ContainerStarted", None, ""),
            event("b", 16, "later", "ContainerDied", Some(0), "Completed"),
            event("b", 17, "later", "ContainerRemoved", Some(0), "Completed"),
            event("b", 18, "code-gone", "ContainerRemoved", None, ""),
            event("b", 19, "code-missing", "ContainerRemoved", None, ""),
        ];
        let report = check(&truths, &records, WINDOW);
        assert!(
            report.gaps.is_empty() && report.duplicated.is_empty(),
            "{report}"
        );
        assert_eq!(
            transitions(&report.mismatched),
            [
                ("wrong", Some(Transition::Died)),
                ("code-missing", Some(Transition::Died))
            ]
        );
        assert_eq!(
            transitions(&report.folded),
            [("code-gone", Some(Transition::Died))]
        );
        // Removed only after the listing, yet missing from it and from what followed: lost.
        assert_eq!(
            transitions(&report.lost),
            [
                ("owed", Some(Transition::Started)),
                ("owed", Some(Transition::Died)),
                ("owed", Some(Transition::Removed))
            ]
        );
        // exited, wrong: started, died; gone: died, removed (running's and gone's starts came
        // before the listing).
        assert_eq!(report.resynced, 2 + 2 + 2 + 2 + 2);
    }

    #[test]
    fn watch_lines_parse_into_events_and_resyncs() {
        let line = r#"{"sequence":4,"run_id":"ab","type":"ContainerDied","pod_uid":"u","container_id":"c1","exit_code":137,"reason":"Error","observations":[]}"#;
        assert_eq!(
            Record::from_watch_line(line, at(0)),
            Some(event("ab", 4, "c1", "ContainerDied", Some(137), "Error"))
        );
        let line = r#"{"resync":{"run_id":"b","sequence":10,"pods":[{"uid":"u","containers":[{"id":"c1","state":"running","exit_code":null,"reason":""},{"id":"c2","state":"exited","exit_code":2,"reason":"Error"},{"id":"c3","state":"created","exit_code":null,"reason":""}]}]}}"#;
        assert_eq!(
            Record::from_watch_line(line, at(2000)),
            Some(resync(
                2000,
                10,
                &[
                    ("c1", Listed::Running),
                    (
                        "c2",
                        Listed::Exited(Some(Exit {
                            code: 2,
                            reason: "Error".to_owned()
                        }))
                    ),
                    ("c3", Listed::Waiting)
                ]
            ))
        );
        assert_eq!(Record::from_watch_line("# resynced", at(0)), None);
    }
}
