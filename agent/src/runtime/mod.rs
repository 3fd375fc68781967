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
    sync::Arc,
    time::Duration,
};

pub use choice::{AnyRuntime, EndpointError, RuntimeKind, RuntimeOptions, UnknownRuntimeKind};
pub use containerd::{ConnectError, ContainerdRuntime};
pub use cri::CriRuntime;
pub use tasks::{CRI_NAMESPACE, InvalidNamespace};

use crate::{
    base::metrics::RuntimeCalls,
    pleg::{ContainerRecord, PodRecord, Store},
};

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

/// `--pod-metadata-max-bytes`: the bytes (keys and values) a pod's kept labels and annotations
/// carry together. Every event and pod status carries a copy, and the history keeps thousands
/// of events: 16 KiB holds every label kubelet and the usual controllers set and a few
/// annotations, where Kubernetes lets a pod's annotations alone reach 256 KiB.
pub const DEFAULT_POD_METADATA_MAX_BYTES: usize = 16 * 1024;

/// The largest `--pod-metadata-max-bytes`: a pod's every label and annotation, by Kubernetes'
/// own limits (256 KiB of annotations, labels far less), and room to spare.
pub const MAX_POD_METADATA_MAX_BYTES: usize = 1024 * 1024;

/// The entry a pod's labels (or annotations) get when some were left out to stay within
/// `--pod-metadata-max-bytes`; its value says how many.
pub const TRUNCATED_KEY: &str = "plegd.io/truncated";

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

    fn keeps(&self, key: &str) -> bool {
        match self {
            Self::None => false,
            Self::These(keys) => keys.contains(key),
            Self::All => true,
        }
    }

    /// The entries of `map` these keys name, in key order, not copied.
    fn select<'a>(
        &self,
        map: impl IntoIterator<Item = (&'a String, &'a String)>,
    ) -> BTreeMap<&'a String, &'a String> {
        if *self == Self::None {
            return BTreeMap::new();
        }
        map.into_iter().filter(|(key, _)| self.keeps(key)).collect()
    }
}

/// Which of its pods' metadata a backend keeps in their records, and how much of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodMetadata {
    pub labels: Keys,
    pub annotations: Keys,
    /// Bytes of keys and values the labels and annotations kept carry together at most.
    pub max_bytes: usize,
}

impl Default for PodMetadata {
    fn default() -> Self {
        Self {
            labels: Keys::None,
            annotations: Keys::None,
            max_bytes: DEFAULT_POD_METADATA_MAX_BYTES,
        }
    }
}

/// What a pod's record keeps of its labels and annotations.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Kept {
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    /// Entries left out to stay within the budget.
    pub left_out: usize,
}

impl PodMetadata {
    /// Whether records keep any label or annotation at all.
    pub fn keeps_any(&self) -> bool {
        self.labels != Keys::None || self.annotations != Keys::None
    }

    /// What a record keeps of a pod's `labels` and `annotations`: those the keys name, labels
    /// first, each in key order, whole while they fit in [`PodMetadata::max_bytes`]. An entry
    /// that does not fit is left out whole (a value cut in the middle, a JSON document or a
    /// URL, would mislead where its absence does not) and later, smaller ones may still fit;
    /// a map that lost entries gets [`TRUNCATED_KEY`], saying how many. Sizes are checked
    /// before anything is copied.
    pub fn keep<'a>(
        &self,
        labels: impl IntoIterator<Item = (&'a String, &'a String)>,
        annotations: impl IntoIterator<Item = (&'a String, &'a String)>,
    ) -> Kept {
        let mut room = self.max_bytes;
        let mut fit = |selected: BTreeMap<&String, &String>| {
            let mut kept = BTreeMap::new();
            let mut left_out = 0;
            for (key, value) in selected {
                let cost = key.len() + value.len();
                if cost <= room {
                    room -= cost;
                    kept.insert(key.clone(), value.clone());
                } else {
                    left_out += 1;
                }
            }
            if left_out > 0 {
                kept.insert(
                    TRUNCATED_KEY.to_owned(),
                    format!(
                        "{left_out} left out: over pod-metadata-max-bytes ({})",
                        self.max_bytes
                    ),
                );
            }
            (kept, left_out)
        };
        let (labels, labels_left_out) = fit(self.labels.select(labels));
        let (annotations, annotations_left_out) = fit(self.annotations.select(annotations));
        Kept {
            labels,
            annotations,
            left_out: labels_left_out + annotations_left_out,
        }
    }
}

/// A backend's [`PodMetadata`], counting each pod's metadata it cuts.
#[derive(Clone, Debug, Default)]
pub(crate) struct MetadataKeeper {
    /// Shared: each backend holds one (a clone of the containerd backend's is its CRI's).
    pub(crate) kept: Arc<PodMetadata>,
    pub(crate) calls: RuntimeCalls,
}

impl MetadataKeeper {
    /// [`PodMetadata::keep`], counted in `plegd_pod_metadata_truncated_total` when it left
    /// something out.
    pub(crate) fn keep<'a>(
        &self,
        labels: impl IntoIterator<Item = (&'a String, &'a String)>,
        annotations: impl IntoIterator<Item = (&'a String, &'a String)>,
    ) -> Kept {
        let kept = self.kept.keep(labels, annotations);
        if kept.left_out > 0 {
            self.calls.metadata_truncated();
        }
        kept
    }
}

/// `listed`'s record in `known` when a status call would only repeat it: the runtime's status
/// of a container (exit code, reason, times) does not change while its state does not. A
/// record the task service confirmed ahead of the CRI store is read again, for CRI's reason,
/// and so is one awaiting the OOM kill containerd told ([`ContainerRecord::awaits_cri`]).
pub fn known_status<'a>(
    known: Option<&'a PodRecord>,
    listed: &ContainerRecord,
) -> Option<&'a ContainerRecord> {
    known?
        .containers
        .get(&listed.id)
        .filter(|k| k.state == listed.state && k.confirmed_by == Store::Cri && !k.awaits_cri())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        pleg::ContainerState::{Exited, Running},
        runtime::testing::{container, exited, pod},
    };

    fn map(entries: &[(&str, usize)]) -> BTreeMap<String, String> {
        entries
            .iter()
            .map(|(key, len)| ((*key).to_owned(), "v".repeat(*len)))
            .collect()
    }

    #[test]
    fn labels_and_annotations_are_kept_whole_within_the_byte_budget() {
        let labels = map(&[("app", 7), ("tier", 6)]);
        let annotations = map(&[("a", 99), ("b", 9), ("c", 39)]);
        let metadata = |labels: Keys, annotations: Keys, max_bytes| PodMetadata {
            labels,
            annotations,
            max_bytes,
        };
        let keys = |keys: &[&str]| Keys::These(keys.iter().map(|k| (*k).to_owned()).collect());
        // (case, settings, labels kept, annotations kept, left out)
        let cases = [
            (
                "nothing asked for",
                metadata(Keys::None, Keys::None, 100),
                vec![],
                vec![],
                0,
            ),
            (
                "everything fits",
                metadata(Keys::All, Keys::All, 1000),
                vec!["app", "tier"],
                vec!["a", "b", "c"],
                0,
            ),
            (
                // app 10 + tier 10; a (100) does not fit in the 30 left, b (10) does, c (40)
                // not in the 20 left then.
                "labels first, then annotations that fit, in key order",
                metadata(Keys::All, Keys::All, 50),
                vec!["app", "tier"],
                vec!["b", TRUNCATED_KEY],
                2,
            ),
            (
                "exactly full",
                metadata(Keys::All, Keys::All, 30),
                vec!["app", "tier"],
                vec!["b", TRUNCATED_KEY],
                2,
            ),
            (
                "labels cut too",
                metadata(Keys::All, Keys::All, 12),
                vec!["app", TRUNCATED_KEY],
                vec![TRUNCATED_KEY],
                4,
            ),
            (
                "only the keys named count",
                metadata(keys(&["tier", "absent"]), keys(&["c"]), 50),
                vec!["tier"],
                vec!["c"],
                0,
            ),
        ];
        for (case, settings, want_labels, want_annotations, left_out) in cases {
            let kept = settings.keep(&labels, &annotations);
            let names = |m: &BTreeMap<String, String>| m.keys().cloned().collect::<Vec<_>>();
            assert_eq!(names(&kept.labels), want_labels, "{case}: labels");
            assert_eq!(
                names(&kept.annotations),
                want_annotations,
                "{case}: annotations"
            );
            assert_eq!(kept.left_out, left_out, "{case}: left out");
            let spent: usize = kept
                .labels
                .iter()
                .chain(&kept.annotations)
                .filter(|(key, _)| *key != TRUNCATED_KEY)
                .map(|(key, value)| key.len() + value.len())
                .sum();
            assert!(spent <= settings.max_bytes, "{case}: {spent} bytes");
            for (key, value) in kept.labels.iter().chain(&kept.annotations) {
                if key != TRUNCATED_KEY {
                    assert!(
                        labels.get(key).or(annotations.get(key)) == Some(value),
                        "{case}: {key} kept whole"
                    );
                }
            }
        }
        let kept = metadata(Keys::All, Keys::All, 12).keep(&labels, &annotations);
        assert_eq!(
            kept.annotations[TRUNCATED_KEY],
            "3 left out: over pod-metadata-max-bytes (12)"
        );
    }

    #[test]
    fn a_keeper_counts_each_reading_it_cut() {
        let calls = RuntimeCalls::default();
        let metrics = crate::base::metrics::Metrics::counting(calls.clone());
        let keeper = MetadataKeeper {
            kept: Arc::new(PodMetadata {
                labels: Keys::All,
                annotations: Keys::All,
                max_bytes: 10,
            }),
            calls,
        };
        let small = map(&[("a", 1)]);
        let large = map(&[("a", 1), ("b", 100)]);
        keeper.keep(&small, &small);
        keeper.keep(&large, &small);
        keeper.keep(&large, &large);
        let text = metrics.encode();
        assert!(
            text.contains("plegd_pod_metadata_truncated_total 2"),
            "{text}"
        );
    }

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
