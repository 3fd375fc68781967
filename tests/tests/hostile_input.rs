//! Hostile input (issue 53), each on as many connections at once as plegd's defaults admit,
//! against the `plegd` binary under its unit's memory limit; every case ends with
//! [`Target::assert_held`]: alive, RSS grown by less than 64 MiB, health answering, the next
//! kill seen by a new watcher. `cargo test -p plegd-tests --test hostile_input -- --nocapture`
//! prints each input's RSS before, at peak and after.

#[path = "hostile_input/data.rs"]
mod data;

use std::time::Duration;

use plegd::config::DEFAULT_API_MAX_CONNECTIONS_PER_PEER;
use plegd_tests::hostile::{Target, closed_by_plegd, connections, on_unix};

/// How long plegd may take to close the connections of an input it refuses.
const REFUSED_WITHIN: Duration = Duration::from_secs(20);

/// HTTP/2's client connection preface and an empty SETTINGS frame.
fn preface() -> Vec<u8> {
    let mut bytes = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    bytes.extend(frame(0x4, 0, 0, &[]));
    bytes
}

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let length = u32::try_from(payload.len()).unwrap().to_be_bytes();
    let mut bytes = length[1..].to_vec();
    bytes.extend([kind, flags]);
    bytes.extend(stream.to_be_bytes());
    bytes.extend(payload);
    bytes
}

/// An HPACK integer with an `n`-bit prefix (RFC 7541 5.1) after `first`'s high bits.
fn integer(first: u8, n: u32, value: usize) -> Vec<u8> {
    let max = (1usize << n) - 1;
    if value < max {
        return vec![first | value as u8];
    }
    let mut bytes = vec![first | max as u8];
    let mut rest = value - max;
    while rest >= 128 {
        bytes.push((rest % 128) as u8 | 0x80);
        rest /= 128;
    }
    bytes.push(rest as u8);
    bytes
}

/// The header block: a 4,000-byte literal added to the dynamic table, then 200,000
/// one-byte references to it (index 62, the newest entry): 204 KB that decode to 800 MB.
fn hpack_bomb() -> Vec<u8> {
    let mut block = vec![0x40];
    block.extend(integer(0, 7, 6));
    block.extend(b"x-bomb");
    block.extend(integer(0, 7, 4_000));
    block.extend(std::iter::repeat_n(b'b', 4_000));
    block.extend(std::iter::repeat_n(0xbe, 200_000));
    block
}

/// A header block as HEADERS and CONTINUATION frames of at most `max_frame` bytes each.
fn headers(stream: u32, block: &[u8], max_frame: usize) -> Vec<u8> {
    const HEADERS: u8 = 0x1;
    const CONTINUATION: u8 = 0x9;
    const END_HEADERS: u8 = 0x4;
    let chunks: Vec<&[u8]> = block.chunks(max_frame).collect();
    let mut bytes = Vec::new();
    for (i, chunk) in chunks.iter().enumerate() {
        let kind = if i == 0 { HEADERS } else { CONTINUATION };
        let flags = if i + 1 == chunks.len() {
            END_HEADERS
        } else {
            0
        };
        bytes.extend(frame(kind, flags, stream, chunk));
    }
    bytes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_hpack_bomb_on_every_connection_costs_plegd_nothing() {
    let target = Target::start(&[]).await.unwrap();
    let mut input = preface();
    input.extend(headers(1, &hpack_bomb(), 16_384));
    target
        .assert_held("an HPACK bomb in 16 KiB frames", async {
            let connections = connections(DEFAULT_API_MAX_CONNECTIONS_PER_PEER);
            let mut streams = on_unix(target.socket(), connections, &input).await?;
            let closed = closed_by_plegd(&mut streams, REFUSED_WITHIN).await;
            anyhow::ensure!(
                closed == connections,
                "plegd closed {closed} of {connections} connections"
            );
            Ok(streams)
        })
        .await
        .unwrap();
}
