//! The pure core: every decision of the PLEG, as functions of what it was told and what it
//! read. No runtime, no clock, no lock, no channel: each is tested by tables.
//!
//! - `diff`: kubelet's transitions, one container's old state to its new one.
//! - `merge`: one container's record by the lifecycle's order, from what the stores said.
//! - `committed`: what the PLEG last committed of each pod, laid out for the full relist.
//! - `hints`: what the triggers about one scope said, merged.
//! - `reconcile`: a reading against the committed records, into each pod's plan and what is
//!   left to follow up.
//! - `provenance`: which sources an event is credited to.
//! - `scheduler`: when to relist what.

pub(crate) mod committed;
pub(crate) mod diff;
pub(crate) mod hints;
pub(crate) mod merge;
pub(crate) mod provenance;
pub(crate) mod reconcile;
pub(crate) mod scheduler;
