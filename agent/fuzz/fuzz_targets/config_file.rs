//! Any text as a `plegd run --config` file: loading it never panics, and an error says which
//! file (and, from toml, where in it).
#![no_main]

use libfuzzer_sys::fuzz_target;
use plegd::config::Config;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Err(e) = Config::fuzz_file(text) {
        assert!(!e.to_string().is_empty());
    }
});
