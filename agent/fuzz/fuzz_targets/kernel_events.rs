//! Any bytes as ring buffer records of the kernel probes: decoding never panics, and every
//! trigger names a container.
#![no_main]

use libfuzzer_sys::fuzz_target;
use plegd::{pleg::event::Scope, sources::ebpf::fuzz_decode};

fuzz_target!(|data: &[u8]| {
    let namespaces = ["k8s.io".to_owned()];
    for trigger in fuzz_decode(data, &namespaces) {
        assert!(matches!(&trigger.scope, Scope::Container(id) if !id.0.is_empty()));
    }
});
