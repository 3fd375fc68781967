//! plegd's eBPF programs. Each attach function only calls a `try_*` function returning
//! `Result<u32, u32>`, so the logic can use `?` and never panics.
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]

#[cfg(target_arch = "bpf")]
mod programs;

// On the host (e.g. `cargo clippy --workspace`) this crate is only type-checked: the real build
// is for bpfel-unknown-none, done by the agent's build.rs.
#[cfg(not(target_arch = "bpf"))]
fn main() {}
