//! A death the runtime says was an OOM kill waits for the kernel's account of the kill (its
//! scope, limit and victim) when that account is not in yet.
//!
//! The kernel records the kill (`mark_victim`) before the victim dies, so the account is in the
//! kernel's ring before the runtime can tell the death. But the ring is read by a task of its
//! own, and on a loaded node the runtime's `/tasks/oom` and `/tasks/exit` can reach the
//! generator first: the death went out without the account. So a runtime's death of a
//! container it said was OOM-killed, with no account from the kernel yet, is held while the
//! source reading the ring hands over everything it holds
//! (`crate::pleg::driver::triggers::TriggerReceiver::ask_catch_up`), [`CATCH_UP_LIMIT`] at
//! most. Pure bookkeeping, by container.

use std::{collections::BTreeMap, time::Duration};

use tokio::time::Instant;

use crate::pleg::model::{
    record::ContainerId,
    source::Source,
    trigger::{Observation, ObservationKind, Says},
};

/// The longest a death waits for the kernel's ring to be read up to it: a reader this far
/// behind loses the account (the death goes out as before), not the death's pace.
pub const CATCH_UP_LIMIT: Duration = Duration::from_millis(100);

/// How long what was said of a container's OOM kill is remembered: its death follows within
/// milliseconds, seconds on a node that is busy.
const REMEMBER: Duration = Duration::from_secs(10);

/// A death held for the kernel's account.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Held {
    /// The ask to catch up it waits for.
    ask: u64,
    /// Released then, whatever the answer.
    until: Instant,
}

/// What the runtime and the kernel said of OOM kills, and the deaths held meanwhile.
#[derive(Debug, Default)]
pub struct OomAccounts {
    /// Containers the runtime said were OOM-killed, and when.
    told: BTreeMap<ContainerId, Instant>,
    /// Containers whose kill the kernel accounted for, and when.
    accounted: BTreeMap<ContainerId, Instant>,
    /// Containers whose death the kernel's ring handed over, and when: the account of an OOM
    /// kill, in the ring before the death, is in by then if there is one.
    passed: BTreeMap<ContainerId, Instant>,
    held: BTreeMap<ContainerId, Held>,
}

impl OomAccounts {
    /// Takes in what a trigger of `source` said of `id` at `now`; `true` when it is the
    /// runtime's word of the OOM kill or of the death that follows, while the kernel has not
    /// given its account of that kill yet: hold its reading ([`Self::hold`]) if the kernel's
    /// reader can be asked to catch up. The OOM kill's own word too: its reading may find the
    /// container dead already.
    pub fn observe(
        &mut self,
        id: &ContainerId,
        source: Source,
        observations: &[Observation],
        now: Instant,
    ) -> bool {
        self.forget_before(now);
        let runtime = source != Source::Ebpf;
        let mut tells = false;
        for observation in observations {
            match (&observation.kind, runtime) {
                (ObservationKind::OomKill(_), false) => {
                    self.accounted.insert(id.clone(), now);
                }
                (ObservationKind::OomKilled, true) => {
                    self.told.insert(id.clone(), now);
                    tells = true;
                }
                (kind, true) if kind.says() == Says::Died => tells = true,
                (kind, false) if kind.says() == Says::Died => {
                    self.passed.insert(id.clone(), now);
                }
                _ => {}
            }
        }
        if !self.awaits_kernel(id) {
            self.held.remove(id);
            return false;
        }
        tells && self.told.contains_key(id) && !self.held.contains_key(id)
    }

    /// Whether the kernel's ring may still hold an account of `id`'s OOM kill: it handed over
    /// neither the account nor the death.
    pub fn awaits_kernel(&self, id: &ContainerId) -> bool {
        !self.accounted.contains_key(id) && !self.passed.contains_key(id)
    }

    /// Whether the kernel accounted for an OOM kill of `id` that the runtime has not told.
    pub fn untold(&self, id: &ContainerId) -> bool {
        self.accounted.contains_key(id) && !self.told.contains_key(id)
    }

    /// Holds `id`'s death until the answer to `ask`, [`CATCH_UP_LIMIT`] after `now` at the
    /// latest.
    pub fn hold(&mut self, id: ContainerId, ask: u64, now: Instant) {
        self.held.insert(
            id,
            Held {
                ask,
                until: now + CATCH_UP_LIMIT,
            },
        );
    }

    /// The kernel's reader handed over what it held when ask `answered` came (`None`: no
    /// reader answers any more): the deaths waiting on it or on an earlier ask go.
    pub fn caught_up(&mut self, answered: Option<u64>) {
        self.held
            .retain(|_, held| answered.is_some_and(|answered| held.ask > answered));
    }

    /// Until when `id`'s reading waits, if it does.
    pub fn held_until(&self, id: &ContainerId) -> Option<Instant> {
        self.held.get(id).map(|held| held.until)
    }

    fn forget_before(&mut self, now: Instant) {
        let recent = |at: &mut Instant| now.saturating_duration_since(*at) < REMEMBER;
        self.told.retain(|_, at| recent(at));
        self.accounted.retain(|_, at| recent(at));
        self.passed.retain(|_, at| recent(at));
        self.held.retain(|_, held| held.until > now);
    }
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use super::*;

    fn id() -> ContainerId {
        ContainerId("c".into())
    }

    fn said(source: Source, kind: ObservationKind) -> (Source, Vec<Observation>) {
        (source, vec![Observation { source, kind }])
    }

    fn account() -> ObservationKind {
        ObservationKind::OomKill(crate::runtime::testing::oom_kill())
    }

    fn exit() -> ObservationKind {
        ObservationKind::TaskExited {
            code: 137,
            at: SystemTime::UNIX_EPOCH,
        }
    }

    /// Feeds `said` in order, a millisecond apart; whether the last one is to be held.
    fn holds(said: &[(Source, Vec<Observation>)]) -> bool {
        let mut accounts = OomAccounts::default();
        let start = Instant::now();
        let mut hold = false;
        for (at, (source, observations)) in said.iter().enumerate() {
            let now = start + Duration::from_millis(at as u64);
            hold = accounts.observe(&id(), *source, observations, now);
        }
        hold
    }

    #[test]
    fn a_runtime_death_after_its_oom_kill_waits_only_for_an_account_not_in_yet() {
        use Source::{Containerd, Ebpf};
        let cases = [
            // The ring read behind the runtime's events: held.
            (
                vec![
                    said(Containerd, ObservationKind::OomKilled),
                    said(Containerd, exit()),
                ],
                true,
            ),
            // The kernel's account came first (the ring's usual pace): not held.
            (
                vec![
                    said(Ebpf, account()),
                    said(Containerd, ObservationKind::OomKilled),
                    said(Containerd, exit()),
                ],
                false,
            ),
            (
                vec![
                    said(Containerd, ObservationKind::OomKilled),
                    said(Ebpf, account()),
                    said(Containerd, exit()),
                ],
                false,
            ),
            // No OOM kill said: a death is not held.
            (vec![said(Containerd, exit())], false),
            // The kernel's own death hint is no runtime's word.
            (
                vec![
                    said(Containerd, ObservationKind::OomKilled),
                    said(Ebpf, ObservationKind::Signal(9)),
                ],
                false,
            ),
            // The ring handed over the death: an account would have come before it.
            (
                vec![
                    said(Containerd, ObservationKind::OomKilled),
                    said(Ebpf, ObservationKind::Signal(9)),
                    said(Containerd, exit()),
                ],
                false,
            ),
            // The runtime's OOM kill alone: its reading may find the death.
            (vec![said(Containerd, ObservationKind::OomKilled)], true),
            // A runtime's word that is neither: not held.
            (
                vec![
                    said(Containerd, ObservationKind::OomKilled),
                    said(Containerd, ObservationKind::Present),
                ],
                false,
            ),
        ];
        for (said, expected) in cases {
            assert_eq!(holds(&said), expected, "{said:?}");
        }
    }

    #[test]
    fn a_held_death_goes_at_the_answer_to_its_ask_or_the_limit() {
        let start = Instant::now();
        let mut accounts = OomAccounts::default();
        let (source, oom) = said(Source::Containerd, ObservationKind::OomKilled);
        let (_, died) = said(Source::Containerd, exit());
        accounts.observe(&id(), source, &oom, start);
        assert!(accounts.observe(&id(), source, &died, start));
        accounts.hold(id(), 3, start);
        assert_eq!(accounts.held_until(&id()), Some(start + CATCH_UP_LIMIT));
        // Held once: a second trigger about the death asks nothing more.
        assert!(!accounts.observe(&id(), source, &died, start));
        // An earlier ask's answer does not release it; its own (or a later one's) does.
        accounts.caught_up(Some(2));
        assert!(accounts.held_until(&id()).is_some());
        accounts.caught_up(Some(3));
        assert_eq!(accounts.held_until(&id()), None);
        // No reader any more: released.
        accounts.hold(id(), 4, start);
        accounts.caught_up(None);
        assert_eq!(accounts.held_until(&id()), None);
        // Past the limit: forgotten at the next trigger.
        accounts.hold(id(), 5, start);
        accounts.observe(
            &ContainerId("other".into()),
            source,
            &oom,
            start + CATCH_UP_LIMIT,
        );
        assert_eq!(accounts.held_until(&id()), None);
        // The account coming while held releases it.
        accounts.hold(id(), 6, start);
        let (ebpf, account) = said(Source::Ebpf, account());
        accounts.observe(&id(), ebpf, &account, start);
        assert_eq!(accounts.held_until(&id()), None);
    }
}
