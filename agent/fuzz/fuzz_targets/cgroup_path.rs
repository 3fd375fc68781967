//! Any byte string as a cgroup path: the parser never panics, and a container id it returns is
//! part of the path.
//! The property is plegd::fuzz::cgroup_path, which `cargo test` also runs on generated inputs.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| plegd::fuzz::cgroup_path(data));
