//! The push sources: the kernel's probes (`ebpf`) and the runtime's event streams
//! (`containerd_events`, `cri_events`, over `reconnect`'s sessions). Each hands its triggers to
//! the PLEG through a [`crate::pleg::TriggerSender`] and reports its state in the
//! [`status::SourceRegistry`], which tunes the PLEG's periodic relist (its own timer, in the
//! scheduler).

pub mod containerd_events;
pub mod cri_events;
pub mod ebpf;
pub(crate) mod reconnect;
pub mod status;

#[doc(hidden)]
pub use containerd_events::fuzz_containerd_event;
