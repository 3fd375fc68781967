//! plegd: kubelet's Pod Lifecycle Event Generator as a standalone, event-driven node daemon.
//!
//! # Layout
//!
//! Data flows one way: sources say where and when to look, the scheduler turns their triggers
//! into relists, the relist reads the runtime and diffs, the cache and the bus take the
//! result, and consumers read those.
//!
//! ```text
//! sources (eBPF, containerd events, CRI events) --Trigger--> generator + scheduler
//!     --> relist (runtime read, diff) --> cache + sink --> bus --> stdout, sync loop, API
//! ```
//!
//! Time is tokio's clock (`tokio::time::Instant`) for every age and deadline, so tests pause
//! and advance it (`#[tokio::test(start_paused = true)]`); wall time (`SystemTime`) only
//! stamps what users see.
//!
//! Modules by layer, lowest first; a module imports only its own layer and those below
//! (`tests/layers.rs` checks it):
//! 0. `pleg::{record, event}`: the types: runtime records, events, triggers, scopes;
//!    `backoff`: the one exponential backoff (optional jitter) every retry uses;
//!    `capabilities`: what `plegd run` keeps once its privileged start is over; `heap`: what
//!    keeps plegd's heap small on the node.
//! 1. `metrics` (kubelet's and plegd's Prometheus metrics), `bus` (the single fan-out, with
//!    history for resuming), and the pure core units `pleg::{diff, cache, health, hints,
//!    merge, committed, reconcile, scheduler, provenance, sink}`: what changed, what the
//!    triggers said, one container's record by the lifecycle's order, what was committed, the
//!    plan a reading makes (and what it leaves to read again), when to relist, who saw a
//!    change first, where events go.
//! 2. `runtime`: the `Runtime` trait and its CRI and containerd backends; inside it, imports
//!    point one way: `transport` (gRPC over a unix socket) <- `cri`, `containerd` <- `choice`
//!    (which backend, at which endpoint).
//! 3. `pleg::{relist, generator}`: the relist (read, reconcile, act) and the loop that runs
//!    it for the scheduler.
//! 4. `sources`: where triggers come from; `sources::ebpf` loads the kernel probes.
//! 5. The consumers: `output` (events on stdout), `sync_loop` (kubelet's sync loop, whose
//!    `SyncHandler` embedders bring, and the feed of the API's pod syncs), and
//!    `state` (the run saved at a clean shutdown and continued at the next start).
//! 6. `config`: `plegd run` settings from flags, `PLEGD_*` variables and a TOML file; `fuzz`:
//!    the fuzz targets' properties (over the parsers of `config` and `sources`).
//! 7. `api`: the plegd.v1 gRPC API, grpc.health.v1, `/metrics`, and the CLI's client side.
//! 8. `daemon` (everything wired for `plegd run`) and `check` (`plegd check`).
//! 9. `cli`: the `plegd` command line.
//!
//! Modules are public only where the binary, the end-to-end tests, the benchmarks or a
//! program embedding plegd reach in (the daemon's wiring, the config, the runtime's fake, the
//! core types, the sync loop's `SyncHandler`); the rest is `pub(crate)`.

pub mod api;
pub(crate) mod backoff;
pub(crate) mod bus;
pub(crate) mod capabilities;
pub mod check;
pub mod cli;
pub mod config;
pub mod daemon;
#[doc(hidden)]
pub mod fuzz;
pub mod heap;
pub mod metrics;
pub(crate) mod output;
pub mod pleg;
pub mod runtime;
pub mod sources;
pub(crate) mod state;
pub mod sync_loop;
