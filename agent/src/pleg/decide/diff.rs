//! The pure heart of the PLEG: a container's state before and after, lifecycle events out
//! (kubelet's `generateEvents`). No runtime, no clock, no channel.

use crate::pleg::model::{event::PodLifecycleEventType, record::ContainerState};

/// A container's state as far as the PLEG cares. `NonExistent` makes "appeared" and "vanished"
/// ordinary transitions of the same table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PlegState {
    Running,
    Exited,
    Unknown,
    NonExistent,
}

impl From<Option<ContainerState>> for PlegState {
    fn from(state: Option<ContainerState>) -> Self {
        match state {
            Some(ContainerState::Running) => Self::Running,
            Some(ContainerState::Exited) => Self::Exited,
            // A created container has not run yet: kubelet maps it to unknown too.
            Some(ContainerState::Created | ContainerState::Unknown) => Self::Unknown,
            None => Self::NonExistent,
        }
    }
}

/// Kubelet's transition table: the events of a container that went from `from` to `to`
/// (`None`: it does not exist). `ContainerDied` precedes `ContainerRemoved` for a container
/// that vanished while running. `ContainerChanged` is included: the caller decides whether to
/// send it.
pub fn transition(
    from: Option<ContainerState>,
    to: Option<ContainerState>,
) -> &'static [PodLifecycleEventType] {
    use PlegState::*;
    use PodLifecycleEventType::*;
    let (from, to) = (PlegState::from(from), PlegState::from(to));
    if from == to {
        return &[];
    }
    match (from, to) {
        (_, Running) => &[ContainerStarted],
        (_, Exited) => &[ContainerDied],
        (_, Unknown) => &[ContainerChanged],
        (Exited, NonExistent) => &[ContainerRemoved],
        // Vanished without being seen exited: it died, then it was removed.
        (Running | Unknown, NonExistent) => &[ContainerDied, ContainerRemoved],
        // from == to was handled above.
        (NonExistent, NonExistent) => &[],
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn transition_table() {
        use ContainerState::*;
        use PodLifecycleEventType::*;
        // (old state, new state, expected events); None = the container does not exist.
        let table: &[(
            Option<ContainerState>,
            Option<ContainerState>,
            &[PodLifecycleEventType],
        )] = &[
            (None, None, &[]),
            (None, Some(Created), &[ContainerChanged]),
            (None, Some(Running), &[ContainerStarted]),
            (None, Some(Exited), &[ContainerDied]),
            (None, Some(Unknown), &[ContainerChanged]),
            (Some(Created), Some(Created), &[]),
            (Some(Created), Some(Unknown), &[]),
            (Some(Created), Some(Running), &[ContainerStarted]),
            (Some(Created), Some(Exited), &[ContainerDied]),
            (Some(Created), None, &[ContainerDied, ContainerRemoved]),
            (Some(Running), Some(Running), &[]),
            (Some(Running), Some(Exited), &[ContainerDied]),
            (Some(Running), Some(Unknown), &[ContainerChanged]),
            (Some(Running), Some(Created), &[ContainerChanged]),
            (Some(Running), None, &[ContainerDied, ContainerRemoved]),
            (Some(Exited), Some(Exited), &[]),
            (Some(Exited), Some(Running), &[ContainerStarted]),
            (Some(Exited), Some(Unknown), &[ContainerChanged]),
            (Some(Exited), None, &[ContainerRemoved]),
            (Some(Unknown), Some(Unknown), &[]),
            (Some(Unknown), Some(Running), &[ContainerStarted]),
            (Some(Unknown), Some(Exited), &[ContainerDied]),
            (Some(Unknown), None, &[ContainerDied, ContainerRemoved]),
        ];
        for &(from, to, expected) in table {
            assert_eq!(transition(from, to), expected, "{from:?} -> {to:?}");
        }
    }

    /// Replays events on a container's state, as a consumer would.
    fn apply(state: PlegState, events: &[PodLifecycleEventType]) -> PlegState {
        events.iter().fold(state, |_, event| match event {
            PodLifecycleEventType::ContainerStarted => PlegState::Running,
            PodLifecycleEventType::ContainerDied => PlegState::Exited,
            PodLifecycleEventType::ContainerChanged => PlegState::Unknown,
            PodLifecycleEventType::ContainerRemoved => PlegState::NonExistent,
        })
    }

    fn any_state() -> impl Strategy<Value = Option<ContainerState>> {
        prop_oneof![
            Just(None),
            Just(Some(ContainerState::Created)),
            Just(Some(ContainerState::Running)),
            Just(Some(ContainerState::Exited)),
            Just(Some(ContainerState::Unknown)),
        ]
    }

    proptest! {
        /// Whatever states a container goes through, replaying the events of each step ends
        /// where the container is, and a step that changes nothing yields nothing.
        #[test]
        fn events_replay_to_the_last_state(states in prop::collection::vec(any_state(), 1..8)) {
            let mut state = PlegState::from(states[0]);
            for pair in states.windows(2) {
                let events = transition(pair[0], pair[1]);
                let mut unique = events.to_vec();
                unique.dedup();
                prop_assert_eq!(unique.len(), events.len(), "duplicate events: {:?}", events);
                state = apply(state, events);
                prop_assert_eq!(state, PlegState::from(pair[1]));
                if PlegState::from(pair[0]) == PlegState::from(pair[1]) {
                    prop_assert!(events.is_empty());
                }
            }
        }
    }
}
