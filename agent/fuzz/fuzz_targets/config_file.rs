//! Any text as a `plegd run --config` file: loading it never panics, and an error says which
//! file (and, from toml, where in it).
//! The property is plegd::fuzz::config_file, which `cargo test` also runs on generated inputs.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| plegd::fuzz::config_file(data));
