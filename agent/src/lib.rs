//! plegd: kubelet's Pod Lifecycle Event Generator as a standalone, event-driven node daemon.
//!
//! # Layout
//! - `cli`: the `plegd` command line (thin; each subcommand delegates to a module).
//! - `sources`: where triggers come from; `sources::ebpf` loads the kernel probes.

pub mod cli;
pub mod sources;
