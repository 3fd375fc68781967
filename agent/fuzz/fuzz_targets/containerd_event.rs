//! Any bytes as a containerd event (a topic and its payload, or a whole envelope): decoding
//! never panics, and a trigger names a container.
//! The property is plegd::fuzz::containerd_event, which `cargo test` also runs on generated inputs.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| plegd::fuzz::containerd_event(data));
