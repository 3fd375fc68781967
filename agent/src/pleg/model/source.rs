//! Where triggers, and so events, come from: one name for a source in the settings
//! (`--sources`), the triggers, the events, the API, the metrics and the output.

/// Where a trigger (and so an event) came from; `--sources` names the ones to run.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum Source {
    /// A kernel tracepoint seen by the eBPF programs.
    Ebpf,
    /// containerd's native event stream.
    Containerd,
    /// CRI `GetContainerEvents`.
    CriEvents,
    /// A relist that nothing specific asked for (the periodic safety net): always on;
    /// `--sources relist` alone means polling only.
    Relist,
}

impl Source {
    /// The lowercase name, as in the API, metrics and output.
    pub fn name(self) -> &'static str {
        match self {
            Self::Ebpf => "ebpf",
            Self::Containerd => "containerd",
            Self::CriEvents => "cri-events",
            Self::Relist => "relist",
        }
    }

    /// The sources that can be turned off. Which run by default depends on the runtime
    /// (`config::fit`): on containerd, not `cri-events`.
    pub const PUSH: [Self; 3] = [Self::Ebpf, Self::Containerd, Self::CriEvents];
}
