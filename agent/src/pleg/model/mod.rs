//! The PLEG's words, as types: the runtime's records of pods and containers (`record`), the
//! events the PLEG emits (`event`), the triggers and observations that drive it (`trigger`),
//! and the port it reads the runtime through (`runtime`). Behaviour here is what a type says
//! of itself, plus the port's default readings, written in terms of its required calls
//! (inspecting a listed pod, reading containers by id through their pod) for backends that
//! have nothing cheaper.

pub mod event;
pub mod oom;
pub mod record;
pub mod runtime;
pub mod source;
pub mod trigger;
