//! What every layer may use, knowing nothing of the PLEG's logic: the one backoff every retry
//! uses, the event bus (the fan-out of lifecycle events, with history for resuming), the
//! capabilities `plegd run` keeps once its privileged start is over, the file descriptors it
//! keeps for its own work, what keeps the heap small on the node, and the Prometheus metrics.
//! The metrics are the one module here that knows pods: per-pod series, labelled by a pod's
//! namespace and name as plain strings. No wire type (the API's, the runtime's) comes here.

pub(crate) mod backoff;
pub mod bus;
pub(crate) mod capabilities;
pub mod fds;
pub mod heap;
pub mod host;
pub mod metrics;
