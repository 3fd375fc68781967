//! What every tier may use, knowing nothing of pods: the one backoff every retry uses, the
//! event bus (the single fan-out, with history for resuming), the capabilities `plegd run`
//! keeps once its privileged start is over, the file descriptors it keeps for its own work,
//! what keeps the heap small on the node, and the Prometheus metrics.

pub(crate) mod backoff;
pub mod bus;
pub(crate) mod capabilities;
pub mod fds;
pub mod heap;
pub mod metrics;
