//! The container runtime's adapters: the backends of the PLEG's [`Runtime`] port, the one
//! place plegd reads state from.
//!
//! Two real backends: CRI v1 (`cri`) and containerd's native API (`containerd`). A relist asks
//! for the pods within a scope; every call has a timeout and its errors name the endpoint and
//! the call.
//!
//! Files import one way, lowest first: this file (shared helpers and types) and `labels`;
//! `transport` (gRPC over a unix socket, deadlines); `tasks` (containerd's task service and
//! namespaces); the backends `cri` and `containerd` (which asks CRI on the same socket for
//! what containerd forgets); `choice` (which backend, at which endpoint). `testing` holds the
//! fake.

pub(crate) mod choice;
pub(crate) mod containerd;
pub(crate) mod cri;
pub(crate) mod labels;
pub(crate) mod tasks;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub(crate) mod transport;

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt,
    time::Duration,
};

pub use choice::{AnyRuntime, EndpointError, RuntimeKind, RuntimeOptions, UnknownRuntimeKind};
pub use containerd::{ConnectError, ContainerdRuntime};
pub use cri::CriRuntime;
pub use tasks::{CRI_NAMESPACE, InvalidNamespace};

use crate::pleg::{ContainerRecord, PodRecord, Store};

/// Default deadline of one runtime call.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// The runtime's own name and version, for the start-up log line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuntimeVersion {
    pub name: String,
    pub version: String,
}

impl fmt::Display for RuntimeVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.name, self.version)
    }
}

/// Which of a pod's labels (or annotations) its record keeps.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Keys {
    /// None: the default, so a record costs nothing more.
    #[default]
    None,
    /// Those of these keys the pod has.
    These(BTreeSet<String>),
    /// Every one.
    All,
}

impl Keys {
    /// The keys a `--pod-labels` value names: `*` for all, none for an empty list.
    pub fn from_list(list: &[String]) -> Self {
        if list.iter().any(|key| key == "*") {
            Self::All
        } else if list.is_empty() {
            Self::None
        } else {
            Self::These(list.iter().cloned().collect())
        }
    }

    /// What of `map` is kept.
    pub fn keep<'a>(
        &self,
        map: impl IntoIterator<Item = (&'a String, &'a String)>,
    ) -> BTreeMap<String, String> {
        let kept = |key: &String| match self {
            Self::None => false,
            Self::These(keys) => keys.contains(key),
            Self::All => true,
        };
        if *self == Self::None {
            return BTreeMap::new();
        }
        map.into_iter()
            .filter(|(key, _)| kept(key))
            .map(|(key, value)| (key.clone(), value.clone()))
            .collect()
    }
}

/// Which of its pods' metadata a backend keeps in their records.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodMetadata {
    pub labels: Keys,
    pub annotations: Keys,
}

/// `listed`'s record in `known` when a status call would only repeat it: the runtime's status
/// of a container (exit code, reason, times) does not change while its state does not. A
/// record the task service confirmed ahead of the CRI store is read again, for CRI's reason.
pub fn known_status<'a>(
    known: Option<&'a PodRecord>,
    listed: &ContainerRecord,
) -> Option<&'a ContainerRecord> {
    known?
        .containers
        .get(&listed.id)
        .filter(|k| k.state == listed.state && k.confirmed_by == Store::Cri)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        pleg::ContainerState::{Exited, Running},
        runtime::testing::{container, exited, pod},
    };

    #[test]
    fn a_known_status_is_reused_only_in_the_same_state_as_the_cri_store_confirmed_it() {
        let mut by_task = exited("by-task", "app", 137, "");
        by_task.confirmed_by = Store::Task;
        let known = pod(
            "p",
            "web",
            [
                container("running", "app", Running),
                exited("exited", "app", 1, "Error"),
                by_task,
            ],
        );
        let cases = [
            ("same state", container("running", "app", Running), true),
            ("exited since", container("running", "app", Exited), false),
            ("still exited", container("exited", "app", Exited), true),
            (
                "confirmed by the task service",
                container("by-task", "app", Exited),
                false,
            ),
            ("not known", container("new", "app", Running), false),
        ];
        for (name, listed, reused) in cases {
            assert_eq!(
                known_status(Some(&known), &listed).is_some(),
                reused,
                "{name}"
            );
        }
        assert!(known_status(None, &container("running", "app", Running)).is_none());
    }
}
