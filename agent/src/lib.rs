//! plegd: kubelet's Pod Lifecycle Event Generator as a standalone, event-driven node daemon.
//!
//! # Layout
//! - `api`: the plegd.v1 gRPC API (event bus with resume, server, client), grpc.health.v1 and
//!   Prometheus metrics.
//! - `check`: `plegd check`, what the node offers and which mode auto would pick.
//! - `cli`: the `plegd` command line (thin; each subcommand delegates to a module).
//! - `config`: `plegd run` settings from flags, `PLEGD_*` variables and a TOML file.
//! - `daemon`: the core wired to a runtime, the sync loop and the event output.
//! - `output`: events as text or JSON lines.
//! - `pleg`: the pure core: runtime records, diff into lifecycle events, cache, health,
//!   relist scheduling.
//! - `runtime`: the `Runtime` trait and its CRI and containerd backends.
//! - `sources`: where triggers come from; `sources::ebpf` loads the kernel probes.
//! - `sync_loop`: kubelet's sync loop: PLEG events, sync tick, housekeeping, per-pod workers.

pub mod api;
pub mod bus;
pub mod check;
pub mod cli;
pub mod config;
pub mod daemon;
pub mod metrics;
pub mod output;
pub mod pleg;
pub mod runtime;
pub mod sources;
pub mod state;
pub mod sync_loop;
