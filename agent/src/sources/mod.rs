//! Trigger sources: the kernel (eBPF), runtime event streams and the relist timer.

pub mod ebpf;
