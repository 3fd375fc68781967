//! Hostile input (issue 53), each on as many connections at once as plegd's defaults admit,
//! against the `plegd` binary under its unit's memory limit; every case ends with
//! [`Target::assert_held`]: alive, RSS grown by less than 64 MiB, health answering, the next
//! kill seen by a new watcher. `cargo test -p plegd-tests --test hostile_input -- --nocapture`
//! prints each input's RSS before, at peak and after.

#[path = "hostile_input/data.rs"]
mod data;

use std::time::Duration;

use plegd::config::DEFAULT_API_MAX_CONNECTIONS_PER_PEER;
use plegd_tests::hostile::{Target, closed_by_plegd, connections, on_tcp, on_unix};

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
        .assert_held(
            "an HPACK bomb in 16 KiB frames",
            refused_on_every_connection(&target, &input),
        )
        .await
        .unwrap();
}

/// Sends `input` on as many unix socket connections as plegd admits of one peer and expects
/// plegd to close every one.
async fn refused_on_every_connection(
    target: &Target,
    input: &[u8],
) -> anyhow::Result<Vec<tokio::net::UnixStream>> {
    let connections = connections(DEFAULT_API_MAX_CONNECTIONS_PER_PEER);
    let mut streams = on_unix(target.socket(), connections, input).await?;
    let closed = closed_by_plegd(&mut streams, REFUSED_WITHIN).await;
    anyhow::ensure!(
        closed == connections,
        "plegd closed {closed} of {connections} connections"
    );
    Ok(streams)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hpack_bomb_in_one_oversize_frame_is_refused_before_it_is_buffered() {
    let target = Target::start(&[]).await.unwrap();
    // Issue 53's measurement: the bomb in one 204 KB frame.
    let mut input = preface();
    input.extend(headers(1, &hpack_bomb(), usize::MAX));
    target
        .assert_held(
            "the HPACK bomb in one 204 KB frame",
            refused_on_every_connection(&target, &input),
        )
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_16_mib_frame_is_refused_at_its_header() {
    let target = Target::start(&[]).await.unwrap();
    // A frame announcing the largest length a frame header can carry, 4 MiB of it sent.
    let mut input = preface();
    input.extend([0xff, 0xff, 0xff, 0x1, 0x4, 0, 0, 0, 1]);
    input.extend(std::iter::repeat_n(0xbe, 4 << 20));
    target
        .assert_held(
            "a 16 MiB frame, 4 MiB of it sent",
            refused_on_every_connection(&target, &input),
        )
        .await
        .unwrap();
}

/// Requests as bytes already encoded, responses as bytes: one large request shared by every
/// call without a copy of its own.
#[derive(Clone, Copy, Debug, Default)]
struct Raw;

impl tonic::codec::Codec for Raw {
    type Encode = bytes::Bytes;
    type Decode = bytes::Bytes;
    type Encoder = Raw;
    type Decoder = Raw;

    fn encoder(&mut self) -> Raw {
        Raw
    }

    fn decoder(&mut self) -> Raw {
        Raw
    }
}

impl tonic::codec::Encoder for Raw {
    type Item = bytes::Bytes;
    type Error = tonic::Status;

    fn encode(
        &mut self,
        item: bytes::Bytes,
        dst: &mut tonic::codec::EncodeBuf<'_>,
    ) -> Result<(), tonic::Status> {
        bytes::BufMut::put(dst, item);
        Ok(())
    }
}

impl tonic::codec::Decoder for Raw {
    type Item = bytes::Bytes;
    type Error = tonic::Status;

    fn decode(
        &mut self,
        src: &mut tonic::codec::DecodeBuf<'_>,
    ) -> Result<Option<bytes::Bytes>, tonic::Status> {
        let n = bytes::Buf::remaining(src);
        Ok(Some(bytes::Buf::copy_to_bytes(src, n)))
    }
}

/// Issue 53's Watch: 4,000,000 `types` entries (4 MB, under tonic's default 4 MiB limit).
fn huge_watch() -> bytes::Bytes {
    let request = plegd_proto::v1::WatchRequest {
        types: vec![plegd_proto::v1::EventType::ContainerDied as i32; 4_000_000],
        ..Default::default()
    };
    prost::Message::encode_to_vec(&request).into()
}

/// `request` as a Watch on each channel at once; the calls that did not fail (held open) and
/// the codes of those that did.
async fn watch_on_each(
    channels: Vec<tonic::transport::Channel>,
    request: bytes::Bytes,
) -> (Vec<tonic::Streaming<bytes::Bytes>>, Vec<tonic::Code>) {
    let mut calls = tokio::task::JoinSet::new();
    for channel in channels {
        let request = request.clone();
        calls.spawn(async move {
            let mut grpc = tonic::client::Grpc::new(channel);
            grpc.ready()
                .await
                .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
            let path = tonic::codegen::http::uri::PathAndQuery::from_static("/plegd.v1.Pleg/Watch");
            grpc.server_streaming(tonic::Request::new(request), path, Raw)
                .await
                .map(tonic::Response::into_inner)
        });
    }
    let (mut held, mut codes) = (Vec::new(), Vec::new());
    for result in calls.join_all().await {
        match result {
            Ok(stream) => held.push(stream),
            Err(status) => codes.push(status.code()),
        }
    }
    (held, codes)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_watch_request_on_every_connection_is_refused() {
    let target = Target::start(&[]).await.unwrap();
    let connections = connections(DEFAULT_API_MAX_CONNECTIONS_PER_PEER);
    target
        .assert_held("a 4 MB Watch request", async {
            let mut channels = Vec::new();
            for _ in 0..connections {
                channels.push(plegd_tests::unix_channel(target.socket()).await?);
            }
            let (held, codes) = watch_on_each(channels, huge_watch()).await;
            anyhow::ensure!(
                codes.len() == connections
                    && codes.iter().all(|c| *c == tonic::Code::ResourceExhausted),
                "{} calls held open; codes {codes:?}",
                held.len()
            );
            Ok(held)
        })
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_peers_without_a_client_certificate_get_nothing() {
    let pki = plegd_tests::pki::Pki::new("hostile").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let args = pki.listener_args(dir.path(), &port.to_string()).unwrap();
    // Without a client CA, by default, plegd does not start.
    let without_ca: Vec<&String> = args
        .iter()
        .zip(std::iter::once(&String::new()).chain(&args))
        .filter(|(arg, before)| {
            !arg.starts_with("--tls-client-ca") && !before.starts_with("--tls-client-ca")
        })
        .map(|(arg, _)| arg)
        .collect();
    let refused = tokio::time::timeout(
        Duration::from_secs(30),
        tokio::process::Command::new(plegd_tests::process::plegd_binary().unwrap())
            .arg("run")
            .args(without_ca)
            .args(["--socket", &dir.path().join("p.sock").display().to_string()])
            .output(),
    )
    .await
    .expect("plegd run without a client CA did not exit")
    .unwrap();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && stderr.contains("tls-allow-unauthenticated-clients"),
        "{}: {stderr}",
        refused.status
    );
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let target = Target::start(&args).await.unwrap();
    let connections = connections(DEFAULT_API_MAX_CONNECTIONS_PER_PEER);
    let ca = tonic::transport::Certificate::from_pem(&pki.ca_pem);
    target
        .assert_held("TLS peers without a client certificate", async {
            let mut channels = Vec::new();
            for _ in 0..connections {
                let tls = tonic::transport::ClientTlsConfig::new()
                    .ca_certificate(ca.clone())
                    .domain_name("localhost");
                let endpoint = tonic::transport::Endpoint::from_shared(format!("https://{port}"))?
                    .tls_config(tls)?;
                // The handshake is refused, or the first call on it.
                if let Ok(channel) = endpoint.connect().await {
                    channels.push(channel);
                }
            }
            let (held, _) = watch_on_each(channels, huge_watch()).await;
            anyhow::ensure!(
                held.is_empty(),
                "{} calls without a certificate",
                held.len()
            );
            Ok(held)
        })
        .await
        .unwrap();
}

/// `GET path` on `to` from `from`: the status code.
async fn http_get(
    from: std::net::IpAddr,
    to: std::net::SocketAddr,
    path: &str,
) -> anyhow::Result<u16> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind(std::net::SocketAddr::new(from, 0))?;
    let mut stream = tokio::time::timeout(Duration::from_secs(5), socket.connect(to)).await??;
    stream
        .write_all(
            format!("GET {path} HTTP/1.1\r\nHost: plegd\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await?;
    let mut response = String::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_string(&mut response)).await??;
    response
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("no status line: {response:?}"))
}

/// A request line whose headers never end.
const UNENDED: &[u8] = b"GET /metrics HTTP/1.1\r\nHost: plegd\r\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_metrics_listener_held_by_one_address_still_answers_others() {
    let target = Target::start(&[]).await.unwrap();
    let greedy: std::net::IpAddr = "127.0.0.1".parse().unwrap();
    let other: std::net::IpAddr = "127.0.0.2".parse().unwrap();
    target
        .assert_held(
            "200 unended requests to the metrics listener from one address",
            async {
                let streams = on_tcp(greedy, target.metrics(), 200, UNENDED).await?;
                let status = http_get(other, target.metrics(), "/healthz").await?;
                anyhow::ensure!(status == 200, "/healthz from another address: {status}");
                Ok(streams)
            },
        )
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_metrics_listener_held_by_a_crowd_lets_go_at_the_header_deadline() {
    let target = Target::start(&[]).await.unwrap();
    target
        .assert_held(
            "unended requests to the metrics listener from 64 addresses",
            async {
                let mut streams = Vec::new();
                for n in 0..64u8 {
                    let from = std::net::IpAddr::from([127, 0, 2, n + 1]);
                    streams.extend(on_tcp(from, target.metrics(), 8, UNENDED).await?);
                }
                let closed = closed_by_plegd(&mut streams, REFUSED_WITHIN).await;
                anyhow::ensure!(
                    closed == streams.len(),
                    "plegd closed {closed} of {} connections",
                    streams.len()
                );
                let status = http_get(
                    std::net::IpAddr::from([127, 0, 3, 1]),
                    target.metrics(),
                    "/healthz",
                )
                .await?;
                anyhow::ensure!(
                    status == 200,
                    "/healthz once the crowd was let go: {status}"
                );
                Ok(streams)
            },
        )
        .await
        .unwrap();
}
