//! The part of the PLEG that does I/O: the relist (read the runtime through the port, decide
//! with the pure core, act: commit, write the cache, publish), the generator loop that runs
//! it when the scheduler says, fed by the trigger channel every source writes into, and `run`,
//! which makes and wires them (and the sync loop) at start and stops them in order.

pub(crate) mod generator;
pub(crate) mod relist;
pub(crate) mod run;
pub(crate) mod sink;
pub(crate) mod triggers;
