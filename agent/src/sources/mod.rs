//! The push sources: the kernel's probes (`ebpf`) and the runtime's event streams
//! (`containerd_events`, `cri_events`, over `reconnect`'s sessions). Each hands its triggers to
//! the PLEG through a [`crate::pleg::TriggerSender`] and reports its state in the
//! [`status::SourceRegistry`], which tunes the PLEG's periodic relist (its own timer, in the
//! scheduler).

pub mod containerd_events;
pub mod cri_events;
pub mod ebpf;
pub(crate) mod reconnect;
pub mod status;

/// One containerd event through the decoder of its stream: the fuzz target's entry point, not
/// an API. The first byte picks a topic (or, past the topics, decodes the rest as a whole
/// envelope); the rest is the event's payload.
#[doc(hidden)]
pub fn fuzz_containerd_event(data: &[u8]) -> Option<crate::pleg::Trigger> {
    use containerd_client::types::Envelope;
    use prost::Message as _;

    let (&pick, rest) = data.split_first()?;
    let envelope = match containerd_events::TOPICS.get(usize::from(pick)) {
        Some(topic) => Envelope {
            topic: (*topic).to_owned(),
            event: Some(prost_types::Any {
                type_url: String::new(),
                value: rest.to_vec(),
            }),
            ..Envelope::default()
        },
        None => Envelope::decode(rest).ok()?,
    };
    containerd_events::trigger_of(&envelope, std::time::SystemTime::UNIX_EPOCH)
        .ok()
        .flatten()
}
