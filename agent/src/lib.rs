//! plegd: kubelet's Pod Lifecycle Event Generator as a standalone, event-driven node daemon.
//!
//! # Layout
//! - `cli`: the `plegd` command line (thin; each subcommand delegates to a module).
//! - `pleg`: the pure core: runtime records, diff into lifecycle events, cache, health,
//!   relist scheduling.
//! - `runtime`: the `Runtime` trait and its CRI and containerd backends.
//! - `sources`: where triggers come from; `sources::ebpf` loads the kernel probes.

pub mod cli;
pub mod pleg;
pub mod runtime;
pub mod sources;
