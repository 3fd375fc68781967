//! The part of the PLEG that does I/O: the relist (read the runtime through the port, decide
//! with the pure core, act: commit, write the cache, publish) and the generator loop that runs
//! it when the scheduler says, fed by the trigger channel every source writes into.

pub(crate) mod generator;
pub(crate) mod relist;
pub(crate) mod sink;
pub(crate) mod triggers;
