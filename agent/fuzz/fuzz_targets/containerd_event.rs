//! Any bytes as a containerd event (a topic and its payload, or a whole envelope): decoding
//! never panics, and a trigger names a container.
#![no_main]

use libfuzzer_sys::fuzz_target;
use plegd::{pleg::event::Scope, sources::fuzz_containerd_event};

fuzz_target!(|data: &[u8]| {
    if let Some(trigger) = fuzz_containerd_event(data) {
        assert!(matches!(&trigger.scope, Scope::Container(id) if !id.0.is_empty()));
    }
});
