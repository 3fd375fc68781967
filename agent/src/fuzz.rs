//! The fuzz targets' properties, one function each, so that one definition serves both runs:
//! libFuzzer calls them from agent/fuzz/fuzz_targets (`cargo xtask fuzz`, nightly, for as long
//! as asked), and the tests below call them on every `cargo test` with a few thousand inputs
//! generated from the shapes each parser meets (valid records and envelopes with random
//! fields, kubelet's cgroup layouts, the example config's keys with random values, HTTP/2
//! frames with HPACK blocks) and with arbitrary bytes. A property that does not hold panics.
//! Not an API.

use crate::{
    api::fuzz_header_blocks,
    config::Config,
    pleg::Scope,
    sources::{ebpf, fuzz_containerd_event},
};

/// Any byte string as a cgroup path: the parser never panics, and a container id (and pod
/// uid) it returns is part of the path.
pub fn cgroup_path(data: &[u8]) {
    let path = String::from_utf8_lossy(data);
    let namespaces = ["k8s.io".to_owned(), "default".to_owned()];
    if let Some(owner) = ebpf::fuzz_cgroup_path(&path, &namespaces) {
        assert!(path.contains(&owner.container_id), "{path:?}: {owner:?}");
        if let Some(uid) = owner.pod_uid {
            assert!(
                path.contains(&uid) || path.contains(&uid.replace('-', "_")),
                "{path:?}: pod uid {uid}"
            );
        }
    }
}

/// Any text as a `plegd run --config` file: loading it never panics, and an error says
/// something.
pub fn config_file(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Err(e) = Config::fuzz_file(text) {
        assert!(!e.to_string().is_empty(), "{text:?}: an empty error");
    }
}

/// Any bytes as ring buffer records of the kernel probes: decoding never panics, and every
/// trigger names a container.
pub fn kernel_events(data: &[u8]) {
    let namespaces = ["k8s.io".to_owned()];
    for trigger in ebpf::fuzz_decode(data, &namespaces) {
        assert!(
            matches!(&trigger.scope, Scope::Container(id) if !id.0.is_empty()),
            "{trigger:?}"
        );
    }
}

/// Any bytes as a containerd event (the first byte picks a topic, the rest is its payload, or
/// a whole envelope): decoding never panics, and a trigger names a container.
pub fn containerd_event(data: &[u8]) {
    if let Some(trigger) = fuzz_containerd_event(data) {
        assert!(
            matches!(&trigger.scope, Scope::Container(id) if !id.0.is_empty()),
            "{trigger:?}"
        );
    }
}

/// Any bytes as what a client sends on the unix socket after the preface (the first byte
/// picks the size of the pieces they come in): the header-block rewriting never panics, and
/// never holds more than its limits allow, whatever the frames and header blocks say.
pub fn header_blocks(data: &[u8]) {
    let outcome = fuzz_header_blocks(data);
    assert!(
        outcome.most_held <= outcome.may_hold,
        "held {} bytes: {outcome:?}",
        outcome.most_held
    );
}

#[cfg(test)]
mod tests {
    use containerd_client::{
        events::{ContainerDelete, TaskExit, TaskOom, TaskStart},
        types::Envelope,
    };
    use plegd_common::{EVENT_PATH_BYTES, KernelEvent};
    use proptest::{collection::vec, prelude::*};
    use prost::Message as _;

    use super::*;
    use crate::sources::containerd_events::TOPICS;

    /// The example config shipped in deploy/, whose keys the config generator draws from.
    const EXAMPLE_CONFIG: &str = include_str!("../../deploy/plegd.toml");

    /// The keys of [`EXAMPLE_CONFIG`] (its `# key = value` lines).
    fn example_keys() -> Vec<&'static str> {
        EXAMPLE_CONFIG
            .lines()
            .filter_map(|line| line.strip_prefix("# ")?.split_once(" = "))
            .map(|(key, _)| key)
            .filter(|key| {
                key.chars()
                    .all(|c| c.is_ascii_lowercase() || c == '-' || c == '_')
            })
            .collect()
    }

    /// Generated inputs per shape: a few thousand per target in all, a second or two.
    const CASES: u32 = 1000;

    fn config() -> ProptestConfig {
        ProptestConfig {
            cases: CASES,
            // A failure is a panic in the parser: the shrunk input is what to report, not a
            // file of regressions beside the source.
            failure_persistence: None,
            ..ProptestConfig::default()
        }
    }

    /// A container id as containerd makes them (or a short one, which must still not panic).
    fn container_id() -> impl Strategy<Value = String> {
        prop_oneof!["[0-9a-f]{64}", "[0-9a-z-]{0,12}"]
    }

    fn pod_uid() -> impl Strategy<Value = String> {
        "[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}"
    }

    /// Cgroup paths in every layout the parser knows, pieces of them, and noise between.
    fn cgroup_path_text() -> impl Strategy<Value = String> {
        let segment = prop_oneof![
            Just("kubepods".to_owned()),
            Just("kubepods.slice".to_owned()),
            "(burstable|besteffort|guaranteed)",
            "kubepods-(burstable|besteffort)\\.slice",
            pod_uid().prop_map(|uid| format!("pod{uid}")),
            pod_uid()
                .prop_map(|uid| format!("kubepods-besteffort-pod{}.slice", uid.replace('-', "_"))),
            container_id(),
            container_id().prop_map(|id| format!("cri-containerd-{id}.scope")),
            container_id().prop_map(|id| format!("crio-{id}.scope")),
            container_id().prop_map(|id| format!("docker-{id}.scope")),
            "(k8s.io|default|system.slice)",
            "\\PC{0,16}",
        ];
        (any::<bool>(), vec(segment, 0..7)).prop_map(|(leading, segments)| {
            let path = segments.join("/");
            if leading { format!("/{path}") } else { path }
        })
    }

    /// One ring buffer record of any kind (including unknown ones) with random fields and a
    /// cgroup path (or an exec's file name) for its path.
    fn kernel_record() -> impl Strategy<Value = Vec<u8>> {
        (
            0u32..8,
            any::<u32>(),
            any::<u64>(),
            any::<u64>(),
            any::<i32>(),
            any::<u32>(),
            cgroup_path_text(),
        )
            .prop_map(
                |(kind, pid, cgroup_id, ktime_ns, exit_status, flags, path)| {
                    let mut bytes = [0; EVENT_PATH_BYTES];
                    let len = path.len().min(EVENT_PATH_BYTES);
                    bytes[..len].copy_from_slice(&path.as_bytes()[..len]);
                    let event = KernelEvent {
                        kind,
                        pid,
                        cgroup_id,
                        ktime_ns,
                        exit_status,
                        flags,
                        path: bytes,
                    };
                    // SAFETY: KernelEvent is plain old data (repr(C), integers and a byte array).
                    unsafe {
                        std::slice::from_raw_parts(
                            (&raw const event).cast::<u8>(),
                            std::mem::size_of::<KernelEvent>(),
                        )
                    }
                    .to_vec()
                },
            )
    }

    /// A containerd event's bytes as [`fuzz_containerd_event`] reads them: a topic's index
    /// and a payload of that topic (or of another one), or a whole envelope.
    fn containerd_bytes() -> impl Strategy<Value = Vec<u8>> {
        let timestamp = (any::<i64>(), any::<i32>())
            .prop_map(|(seconds, nanos)| Some(prost_types::Timestamp { seconds, nanos }));
        let payload = prop_oneof![
            (
                container_id(),
                container_id(),
                any::<u32>(),
                any::<u32>(),
                timestamp.clone()
            )
                .prop_map(|(container_id, id, pid, exit_status, exited_at)| TaskExit {
                    container_id,
                    id,
                    pid,
                    exit_status,
                    exited_at,
                }
                .encode_to_vec()),
            (container_id(), any::<u32>()).prop_map(|(container_id, pid)| TaskStart {
                container_id,
                pid,
            }
            .encode_to_vec()),
            container_id().prop_map(|container_id| TaskOom { container_id }.encode_to_vec()),
            container_id().prop_map(|id| ContainerDelete { id }.encode_to_vec()),
            vec(any::<u8>(), 0..64),
        ];
        let topic_count = u8::try_from(TOPICS.len()).expect("ten topics");
        prop_oneof![
            (0..topic_count, payload.clone()).prop_map(|(pick, payload)| {
                let mut bytes = vec![pick];
                bytes.extend(payload);
                bytes
            }),
            ("\\PC{0,20}", payload, timestamp).prop_map(|(topic, value, timestamp)| {
                let topic = TOPICS
                    .iter()
                    .find(|t| t.len() == topic.len())
                    .map_or(topic, |t| (*t).to_owned());
                let mut bytes = vec![u8::MAX];
                bytes.extend(
                    Envelope {
                        timestamp,
                        namespace: "k8s.io".to_owned(),
                        topic,
                        event: Some(prost_types::Any {
                            type_url: String::new(),
                            value,
                        }),
                    }
                    .encode_to_vec(),
                );
                bytes
            }),
        ]
    }

    /// A client's frames after the preface as [`header_blocks`] reads them: HEADERS,
    /// CONTINUATION and other frames with random flags, whose payloads are HPACK fields
    /// (literals added to the table, references to it, in bombs of many), random bytes, or
    /// a frame header announcing more than a frame may hold.
    fn client_frames() -> impl Strategy<Value = Vec<u8>> {
        let literal = ("[a-z-]{0,12}", 0usize..5_000).prop_map(|(name, length)| {
            let mut field = vec![0x40, u8::try_from(name.len()).expect("short")];
            field.extend(name.bytes());
            field.extend(loona_hpack::encoder::encode_integer(length, 7));
            field.extend(std::iter::repeat_n(b'v', length));
            field
        });
        let references = (0x80u8..=0xff, 0usize..40_000).prop_map(|(index, n)| vec![index; n]);
        let field = prop_oneof![literal, references, vec(any::<u8>(), 0..64)];
        let frame = (
            prop_oneof![Just(0x1u8), Just(0x9), Just(0x0), Just(0x4), any::<u8>()],
            any::<u8>(),
            0u32..4,
            vec(field, 0..4),
        )
            .prop_map(|(kind, flags, stream, fields)| {
                let payload = fields.concat();
                let length = u32::try_from(payload.len())
                    .unwrap_or(u32::MAX)
                    .min(0xff_ffff);
                let mut bytes = length.to_be_bytes()[1..].to_vec();
                bytes.extend([kind, flags]);
                bytes.extend(stream.to_be_bytes());
                bytes.extend(payload);
                bytes
            });
        let oversize = (16_385u32..0xff_ffff, vec(any::<u8>(), 0..64)).prop_map(|(n, rest)| {
            let mut bytes = n.to_be_bytes()[1..].to_vec();
            bytes.extend([0x1, 0x4, 0, 0, 0, 1]);
            bytes.extend(rest);
            bytes
        });
        (
            any::<u8>(),
            vec(prop_oneof![4 => frame, 1 => oversize], 0..8),
        )
            .prop_map(|(piece, frames)| {
                let mut bytes = vec![piece];
                bytes.extend(frames.concat());
                bytes
            })
    }

    /// Config text: keys of the example config (and unknown ones) with values of every TOML
    /// type plegd's keys take, or mistakes in them.
    fn config_text() -> impl Strategy<Value = String> {
        let keys = example_keys();
        let key = prop_oneof![
            proptest::sample::select(keys).prop_map(str::to_owned),
            "[a-z-]{1,12}",
        ];
        let value = prop_oneof![
            "\"[0-9]{0,4}(ms|s|m|h|x)?\"",
            "\"(cri|containerd|auto|ebpf|polling|relist|unix:///run/x.sock|/tmp/\\PC{0,10})\"",
            "\\[(\"(ebpf|containerd|cri-events|relist|k8s.io|\\PC{0,6})\", ?){0,4}\\]",
            any::<i64>().prop_map(|n| n.to_string()),
            any::<bool>().prop_map(|b| b.to_string()),
            "\\PC{0,12}",
        ];
        vec((key, value), 0..8).prop_map(|pairs| {
            pairs
                .into_iter()
                .map(|(key, value)| format!("{key} = {value}\n"))
                .collect()
        })
    }

    #[test]
    fn the_example_configs_keys_are_found() {
        let keys = example_keys();
        assert!(keys.contains(&"relist-period"), "{keys:?}");
        assert!(keys.len() >= 10, "{keys:?}");
    }

    proptest! {
        #![proptest_config(config())]

        #[test]
        fn cgroup_paths(path in cgroup_path_text()) {
            cgroup_path(path.as_bytes());
        }

        #[test]
        fn cgroup_path_bytes(data in vec(any::<u8>(), 0..300)) {
            cgroup_path(&data);
        }

        #[test]
        fn config_files(text in config_text()) {
            config_file(text.as_bytes());
        }

        #[test]
        fn config_file_bytes(data in vec(any::<u8>(), 0..200)) {
            config_file(&data);
        }

        #[test]
        fn kernel_records(records in vec(kernel_record(), 1..4), cut in any::<prop::sample::Index>()) {
            let data = records.concat();
            kernel_events(&data);
            // And cut short anywhere: a partial record is skipped.
            kernel_events(&data[..cut.index(data.len() + 1)]);
        }

        #[test]
        fn kernel_event_bytes(data in vec(any::<u8>(), 0..1000)) {
            kernel_events(&data);
        }

        #[test]
        fn containerd_events(data in containerd_bytes()) {
            containerd_event(&data);
        }

        #[test]
        fn containerd_event_bytes(data in vec(any::<u8>(), 0..200)) {
            containerd_event(&data);
        }

        #[test]
        fn client_header_blocks(data in client_frames()) {
            header_blocks(&data);
        }

        #[test]
        fn header_block_bytes(data in vec(any::<u8>(), 0..300)) {
            header_blocks(&data);
        }
    }
}
