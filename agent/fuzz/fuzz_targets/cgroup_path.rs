//! Any byte string as a cgroup path: the parser never panics, and a container id it returns is
//! part of the path.
#![no_main]

use libfuzzer_sys::fuzz_target;
use plegd::sources::ebpf::fuzz_cgroup_path;

fuzz_target!(|data: &[u8]| {
    let path = String::from_utf8_lossy(data);
    let namespaces = ["k8s.io".to_owned(), "default".to_owned()];
    if let Some(owner) = fuzz_cgroup_path(&path, &namespaces) {
        assert!(path.contains(&owner.container_id));
        if let Some(uid) = owner.pod_uid {
            assert!(path.contains(&uid) || path.contains(&uid.replace('-', "_")));
        }
    }
});
