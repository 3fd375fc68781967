//! Trigger sources: the kernel (eBPF), runtime event streams and the relist timer. Each push
//! source hands triggers to the generator through a [`crate::pleg::generator::TriggerSender`]
//! and reports its state in the [`status::SourceRegistry`].

pub mod containerd_events;
pub mod cri_events;
pub mod ebpf;
pub(crate) mod reconnect;
pub mod status;
