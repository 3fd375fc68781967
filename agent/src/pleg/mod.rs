//! The PLEG core: what the runtime holds, what changed, and when to look again.
//!
//! A relist reads, decides and acts. `relist` gathers a *reading* of the runtime (a targeted
//! relist reads the containers its hints name, each by its id, or a pod whole when a hint
//! names none; a full one lists the node and inspects what moved on) beside the runtime's own
//! records that the triggers carried (`hints`), and reads only what those leave unanswered.
//! `reconcile` merges each container by the one lifecycle order (`merge`) against what was
//! `committed`, and decides a *plan* per pod: complete events (kubelet's transitions, `diff`)
//! and the record to commit and cache, handed to the relist to carry out at once (`Act`);
//! then what to read again, with why. The `scheduler` and the `generator` loop decide when to
//! relist what. Everything here but
//! `relist` and `generator` is pure.

pub mod cache;
pub mod committed;
pub(crate) mod diff;
pub mod event;
pub mod generator;
pub mod health;
pub mod hints;
pub(crate) mod merge;
pub(crate) mod provenance;
pub mod reconcile;
pub mod record;
pub mod relist;
pub(crate) mod scheduler;
pub mod sink;
