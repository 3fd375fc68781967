//! Any bytes as ring buffer records of the kernel probes: decoding never panics, and every
//! trigger names a container.
//! The property is plegd::fuzz::kernel_events, which `cargo test` also runs on generated inputs.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| plegd::fuzz::kernel_events(data));
