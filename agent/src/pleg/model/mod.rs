//! The PLEG's words, as types: the runtime's records of pods and containers (`record`), the
//! events the PLEG emits (`event`), the triggers and observations that drive it (`trigger`),
//! and the port it reads the runtime through (`runtime`). No behaviour beyond what a type says
//! of itself.

pub mod event;
pub mod record;
pub mod runtime;
pub mod trigger;
