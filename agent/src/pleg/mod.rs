//! The PLEG core: pure logic, no I/O.

pub mod record;
