//! What the kernel's probe saw of an OOM kill: which limit it came from, and its victim.

use std::sync::Arc;

/// Which limit an OOM kill came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OomScope {
    /// The container's own limit.
    Container,
    /// The pod's cgroup's limit (a pod-level limit, KEP-2837, shared by its containers).
    Pod,
    /// A limit above the pod: its QoS class's cgroup, `kubepods`, a slice above them.
    Ancestor,
    /// No memory cgroup limit: the node ran out of memory and the kernel's global OOM killer
    /// chose this process.
    Node,
    /// The kernel's account was not enough to tell (a chain deeper than the probe reads, a
    /// victim gone before its cgroup could be named).
    Unknown,
}

impl OomScope {
    /// The lowercase name, as in the output, the metrics and the OTLP records.
    pub fn name(self) -> &'static str {
        match self {
            Self::Container => "container",
            Self::Pod => "pod",
            Self::Ancestor => "ancestor",
            Self::Node => "node",
            Self::Unknown => "unknown",
        }
    }
}

/// One OOM kill in a container, as the kernel's probe saw it at the kill.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct OomKill {
    pub scope: OomScope,
    /// The cgroup whose limit was hit, as a path in the memory controller's hierarchy
    /// (cgroup2's, or cgroup v1's memory hierarchy); `None` for a node OOM or when unknown.
    pub cgroup: Option<Arc<str>>,
    /// That cgroup's limit, in bytes.
    pub limit_bytes: Option<u64>,
    /// The victim's host pid (its thread-group id) and its `comm`.
    pub victim_pid: u32,
    pub victim_comm: String,
    /// Whether the victim was the container's init (its death is the container's).
    pub victim_init: bool,
}

/// `scope(cgroup,limit=...,victim=pid/comm,init)`, as an observation prints it.
impl std::fmt::Display for OomKill {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}(", self.scope.name())?;
        if let Some(cgroup) = &self.cgroup {
            write!(f, "{cgroup},")?;
        }
        if let Some(limit) = self.limit_bytes {
            write!(f, "limit={limit},")?;
        }
        write!(f, "victim={}/{}", self.victim_pid, self.victim_comm)?;
        if self.victim_init {
            f.write_str(",init")?;
        }
        f.write_str(")")
    }
}
