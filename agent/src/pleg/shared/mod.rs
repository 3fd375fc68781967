//! What the PLEG keeps for its consumers: the pod cache (each pod's latest status, and a time
//! that vouches for all of them) and the health check (the age of the last full relist). Each
//! holds a lock and a notifier; neither does I/O.

pub mod cache;
pub mod health;
