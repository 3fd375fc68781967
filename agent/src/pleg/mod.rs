//! The PLEG core: pure logic, no I/O.

pub mod cache;
pub mod confirm;
pub mod diff;
pub mod event;
pub mod generator;
pub mod health;
pub mod hints;
pub mod provenance;
pub mod record;
pub mod relist;
pub mod scheduler;
pub mod sink;
