//! plegd: kubelet's Pod Lifecycle Event Generator as a standalone, event-driven node daemon.
//!
//! # Layout
//!
//! Data flows one way: sources say where and when to look, the scheduler turns their triggers
//! into relists, the relist reads the runtime and diffs, the cache and the bus take the
//! result, and consumers read those.
//!
//! ```text
//! sources (eBPF, containerd events, CRI events) --Trigger--> pleg: generator + scheduler
//!     --> relist (read the runtime, reconcile, act) --> cache + event bus
//!     --> sync loop, stdout (output), API watchers (converted to plegd.v1 at the edge)
//! ```
//!
//! Time is tokio's clock (`tokio::time::Instant`) for every age and deadline, so tests pause
//! and advance it (`#[tokio::test(start_paused = true)]`); wall time (`SystemTime`) only
//! stamps what users see.
//!
//! The folders are the layers, lowest first; a module imports only its own layer and those
//! below (`tests/layers.rs` checks it):
//! 0. `base`: what every layer may use, knowing nothing of pods: the backoff, the event bus,
//!    capabilities, the heap, the Prometheus metrics.
//! 1. `pleg`: the PLEG itself, whose top module is its face (the contract, the types, the
//!    design's assumptions); inside, lowest first: `model` (the types and the `Runtime` port
//!    the core reads the runtime through), `decide` (the pure core), `shared` (the cache and
//!    health consumers read), `driver` (the relist and the generator loop, which do I/O) and
//!    `sync_loop` (kubelet's sync loop).
//! 2. The adapters: `runtime` (the CRI and containerd backends of the `Runtime` port, and a
//!    fake), `sources` (triggers from the kernel's probes and the runtime's event streams).
//! 3. `output`: events and pods as people and scripts read them.
//! 4. `config`: `plegd run` settings from flags, `PLEGD_*` variables and a TOML file.
//! 5. `api`: the plegd.v1 gRPC API, grpc.health.v1, `/metrics`, the conversion between
//!    plegd's types and the API's messages, and the CLI's client side; `export`: the events
//!    as OpenTelemetry log records, sent to an OTLP receiver; `fuzz`: the fuzz targets'
//!    properties (over the parsers of `config` and `sources`).
//! 6. `daemon`: `plegd run` (booted in one place; everything, the API's servers included,
//!    started, owned and stopped by one `Daemon`) and `plegd check`.
//! 7. `cli`: the `plegd` command line.
//!
//! Modules are public only where the binary, the end-to-end tests, the benchmarks or a
//! program embedding plegd reach in; inside `pleg`, only through its face.

// The 80-line ceiling (clippy.toml) is for the daemon's code; a test's table of cases reads
// best whole.
#![cfg_attr(test, allow(clippy::too_many_lines))]

pub mod api;
pub mod base;
pub mod cli;
pub mod config;
pub mod daemon;
pub mod export;
#[doc(hidden)]
pub mod fuzz;
pub mod output;
pub mod pleg;
pub mod runtime;
pub mod sources;
