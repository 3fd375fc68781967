//! The PLEG core: pure logic, no I/O.

pub mod cache;
pub(crate) mod confirm;
pub(crate) mod diff;
pub mod event;
pub mod generator;
pub mod health;
pub mod hints;
pub(crate) mod provenance;
pub mod record;
pub mod relist;
pub(crate) mod scheduler;
pub(crate) mod sink;
