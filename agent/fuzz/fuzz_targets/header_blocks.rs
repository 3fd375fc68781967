//! Any bytes as what a client sends on the API's unix socket after the HTTP/2 preface: the
//! header-block rewriting never panics and never holds more than its limits allow.
//! The property is plegd::fuzz::header_blocks, which `cargo test` also runs on generated inputs.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| plegd::fuzz::header_blocks(data));
