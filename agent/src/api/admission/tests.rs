use super::*;

const LIMITS: Limits = Limits {
    connections: 3,
    connections_per_peer: 2,
    streams_per_peer: 2,
};

fn gate(limits: Limits, descriptors: usize) -> (Gate, Metrics) {
    let metrics = Metrics::new();
    let gate = Gate::new(
        "unix",
        limits,
        Arc::new(Semaphore::new(descriptors)),
        metrics.clone(),
    );
    (gate, metrics)
}

fn refused(metrics: &Metrics, what: &str, reason: &str) -> f64 {
    let text = metrics.encode_as(crate::base::metrics::Format::Text);
    let series = format!(
        "plegd_api_refused_total{{listener=\"unix\",what=\"{what}\",reason=\"{reason}\"}} "
    );
    text.lines()
        .find_map(|l| l.strip_prefix(&series))
        .map_or(0.0, |v| v.parse().unwrap())
}

#[test]
fn a_tally_holds_each_key_to_its_cap_and_forgets_keys_at_zero() {
    let mut tally = Tally::new(2);
    assert!(tally.take("a"));
    assert!(tally.take("a"));
    assert!(!tally.take("a"), "a holds its cap");
    assert!(tally.take("b"), "b has its own");
    tally.give(&"a");
    assert!(tally.take("a"));
    tally.give(&"b");
    assert_eq!(tally.of(&"b"), 0);
    assert!(!tally.counts.contains_key("b"));
    tally.give(&"nobody");
}

#[test]
fn a_peer_holds_its_share_and_the_listener_its_limit() {
    let (gate, metrics) = gate(LIMITS, 100);
    let first = gate.admit(Peer::Uid(7)).unwrap();
    let _second = gate.admit(Peer::Uid(7)).unwrap();
    assert_eq!(gate.admit(Peer::Uid(7)).unwrap_err(), Refusal::PeerFull);
    let _other = gate.admit(Peer::Uid(8)).unwrap();
    assert_eq!(gate.admit(Peer::Uid(9)).unwrap_err(), Refusal::ListenerFull);
    drop(first);
    let _again = gate.admit(Peer::Uid(7)).unwrap();
    assert_eq!(refused(&metrics, "connection", "peer-full"), 1.0);
    assert_eq!(refused(&metrics, "connection", "listener-full"), 1.0);
}

#[test]
fn the_descriptors_every_listener_shares_bound_them_all() {
    let descriptors = Arc::new(Semaphore::new(2));
    let metrics = Metrics::new();
    let unix = Gate::new("unix", LIMITS, Arc::clone(&descriptors), metrics.clone());
    let tls = Gate::new("tls", LIMITS, Arc::clone(&descriptors), metrics.clone());
    let _a = unix.admit(Peer::Uid(1)).unwrap();
    let _b = tls.admit(Peer::Address([127, 0, 0, 1].into())).unwrap();
    assert_eq!(
        tls.admit(Peer::Address([127, 0, 0, 2].into())).unwrap_err(),
        Refusal::Descriptors
    );
}

#[test]
fn a_peers_streams_are_held_to_its_share_over_its_connections() {
    let (gate, metrics) = gate(LIMITS, 100);
    let (one, two) = (
        gate.admit(Peer::Uid(7)).unwrap(),
        gate.admit(Peer::Uid(7)).unwrap(),
    );
    let s1 = one.connection.open_stream().unwrap();
    let _s2 = two.connection.open_stream().unwrap();
    assert_eq!(one.connection.open_stream().unwrap_err(), Refusal::PeerFull);
    assert_eq!(one.connection.streams_of_peer(), 2);
    drop(s1);
    let _s3 = two.connection.open_stream().unwrap();
    assert_eq!(refused(&metrics, "stream", "peer-full"), 1.0);
}

#[test]
fn a_connection_has_a_deadline_only_while_it_has_no_stream() {
    let (gate, _) = gate(LIMITS, 100);
    let lease = gate.admit(Peer::Uid(7)).unwrap();
    let accepted = Instant::now();
    let first = lease.connection.deadline().unwrap();
    let near = |at: Instant, want: Instant| {
        at <= want + Duration::from_secs(1) && at + Duration::from_secs(1) >= want
    };
    assert!(near(first, accepted + FIRST_STREAM_DEADLINE));
    let stream = lease.connection.open_stream().unwrap();
    assert_eq!(lease.connection.deadline(), None);
    drop(stream);
    let idle = lease.connection.deadline().unwrap();
    assert!(
        near(idle, Instant::now() + IDLE_LIMIT),
        "the idle limit, from the stream's end"
    );
}

#[test]
fn a_burst_of_refusals_is_said_once_then_summed() {
    const A: Kind = ("connection", "peer-full");
    const B: Kind = ("stream", "peer-full");
    let mut quiet = Quiet::default();
    let t0 = Instant::now();
    assert_eq!(quiet.speak(A, t0), Some(0));
    assert_eq!(quiet.speak(A, t0 + Duration::from_secs(1)), None);
    assert_eq!(quiet.speak(A, t0 + Duration::from_secs(2)), None);
    assert_eq!(
        quiet.speak(B, t0 + Duration::from_secs(2)),
        Some(0),
        "another kind"
    );
    assert_eq!(quiet.speak(A, t0 + LOG_EVERY), Some(2));
    assert_eq!(
        quiet.speak(A, t0 + LOG_EVERY + Duration::from_secs(1)),
        None
    );
}

#[test]
fn a_quiet_keyed_by_peers_forgets_the_quiet_ones_past_its_size() {
    let mut quiet: Quiet<(Option<u32>, &str)> = Quiet::default();
    let t0 = Instant::now();
    for uid in 0..u32::try_from(QUIET_KINDS).unwrap() {
        assert_eq!(quiet.speak((Some(uid), "not-allowed"), t0), Some(0));
    }
    // Still speaking for uid 0 within the period: summed.
    assert_eq!(quiet.speak((Some(0), "not-allowed"), t0), None);
    let later = t0 + LOG_EVERY;
    assert_eq!(quiet.speak((Some(u32::MAX), "not-allowed"), later), Some(0));
    assert_eq!(quiet.last.len(), 1, "the others had gone quiet");
}

#[test]
fn refused_unix_peers_are_counted_per_connection() {
    let (gate, metrics) = gate(LIMITS, 100);
    let error = std::io::Error::other("no credentials");
    for _ in 0..3 {
        gate.refused_peer(Ok((1000, 1000, Some(42))));
    }
    gate.refused_peer(Err(&error));
    assert_eq!(refused(&metrics, "connection", "not-allowed"), 4.0);
    let quiet = lock(&gate.0.quiet_peers);
    assert_eq!(
        quiet.last[&(Some(1000), "not-allowed")].1,
        2,
        "said once, two summed"
    );
}

#[test]
fn a_connections_refused_input_is_counted_by_what_and_why() {
    let (gate, metrics) = gate(LIMITS, 100);
    let lease = gate.admit(Peer::Uid(7)).unwrap();
    lease.connection.refuse("header-block", Refusal::TooLarge);
    lease.connection.refuse("request", Refusal::TooMany);
    assert_eq!(refused(&metrics, "header-block", "too-large"), 1.0);
    assert_eq!(refused(&metrics, "request", "too-many"), 1.0);
}

#[test]
fn request_messages_are_followed_across_frames_and_refused_at_their_prefix() {
    let prefix = |length: usize| {
        let mut bytes = vec![0];
        bytes.extend(u32::try_from(length).unwrap().to_be_bytes());
        bytes
    };
    let small = [prefix(3), vec![1, 2, 3]].concat();
    let large = prefix(MAX_REQUEST + 1);
    for (pieces, expected) in [
        (vec![small.clone(), small.clone()], Ok(())),
        (vec![prefix(MAX_REQUEST)], Ok(())),
        (vec![small.clone(), large.clone()], Err(MAX_REQUEST + 1)),
        // The prefix cut anywhere, after a whole message.
        (
            vec![
                [small.clone(), large[..2].to_vec()].concat(),
                large[2..].to_vec(),
            ],
            Err(MAX_REQUEST + 1),
        ),
        (
            vec![
                large[..1].to_vec(),
                large[1..4].to_vec(),
                large[4..].to_vec(),
            ],
            Err(MAX_REQUEST + 1),
        ),
        // A message's bytes that look like a prefix are not one.
        (vec![prefix(5), large.clone()], Ok(())),
    ] {
        let mut messages = Messages::default();
        let result = pieces.iter().try_for_each(|piece| messages.follow(piece));
        assert_eq!(result, expected, "{pieces:?}");
    }
}
