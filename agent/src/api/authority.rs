//! The `:authority` of requests on the unix socket, made one h2 accepts.
//!
//! gRPC C-core since 1.58 (grpcio from PyPI, C++, Ruby, PHP) sends the socket's path,
//! percent-encoded, as the `:authority` of a `unix:` target (`run%2Fplegd%2Fplegd.sock` for
//! `unix:/run/plegd/plegd.sock`; grpc/grpc#33571); grpc-java and others send the path itself.
//! RFC 3986 allows a percent-encoded reg-name, but h2 parses `:authority` with the `http`
//! crate, which refuses `%` and `/` in a host, and resets every such stream
//! (`PROTOCOL_ERROR`, seen by the client as `INTERNAL: Stream removed`). h2 checks the
//! authority so that a request's URI is well-formed; on a unix socket nothing is addressed by
//! it (plegd serves one API, routes on the path only, and no TLS name is checked there).
//!
//! gRPC-Go (grpcurl, Go agents) sends the path too, Huffman-coded, and may refer to it later
//! through the dynamic table.
//!
//! So [`AuthorityFix`] reads the client's side of each unix-socket connection as HTTP/2
//! frames and decodes every request header block with an HPACK decoder that follows the
//! client's dynamic table (`loona-hpack`); an `:authority` that is not a valid authority
//! becomes `localhost`, whatever its encoding (literal or Huffman, new, indexed or from the
//! table); the block is encoded again by an encoder of the connection's own, whose table is
//! the one h2's decoder follows from then on. Every other frame reaches h2 as sent, and h2
//! still checks everything else. A block that does not decode is passed on as it came, and the
//! rest of the connection too: h2 refuses it (COMPRESSION_ERROR) as it would have; the
//! rewriting never makes a request worse. Headers the client marked never-indexed are indexed
//! by the re-encoding: that marking guards against intermediaries that compress across
//! clients, and the block goes no further than h2 in this process.

use std::{
    io,
    pin::Pin,
    task::{Context, Poll},
};

use loona_hpack::{Decoder, Encoder};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::transport::server::Connected;
use tracing::debug;

/// The client connection preface, passed on before the first frame.
const PREFACE_LEN: usize = 24;
const FRAME_HEADER_LEN: usize = 9;
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// The largest frame every HTTP/2 peer accepts (SETTINGS_MAX_FRAME_SIZE's initial value).
const MAX_FRAME: usize = 16_384;
/// A header block held across CONTINUATION frames beyond this turns the rewriting off.
const MAX_BLOCK: usize = 1 << 20;
/// The HPACK dynamic table size h2 advertises (SETTINGS_HEADER_TABLE_SIZE's initial value,
/// which h2 keeps): the most the client's encoder may use, and what ours uses.
const TABLE_SIZE: usize = 4_096;
const AUTHORITY: &[u8] = b":authority";
const REPLACEMENT: &[u8] = b"localhost";

/// The rewriting of one connection's client-to-server bytes, without I/O.
struct Rewriter {
    /// Bytes read but not yet a whole frame.
    pending: Vec<u8>,
    /// Preface bytes passed on so far.
    preface: usize,
    /// A HEADERS frame and its CONTINUATIONs so far, waiting for END_HEADERS.
    held: Option<HeldBlock>,
    /// Follows the client's dynamic table.
    decoder: Decoder<'static>,
    /// Makes the blocks h2 decodes: h2's table follows this one.
    encoder: Encoder<'static>,
    /// Something unexpected came: bytes are passed on unchanged from then on.
    off: bool,
}

impl Default for Rewriter {
    fn default() -> Self {
        let mut decoder = Decoder::new();
        decoder.set_max_allowed_table_size(TABLE_SIZE);
        let mut encoder = Encoder::new();
        encoder.set_max_table_size(TABLE_SIZE);
        Self {
            pending: Vec::new(),
            preface: 0,
            held: None,
            decoder,
            encoder,
            off: false,
        }
    }
}

#[derive(Debug)]
struct HeldBlock {
    stream: [u8; 4],
    /// END_STREAM and PRIORITY of the HEADERS frame.
    flags: u8,
    /// Its priority fields, if it had PRIORITY.
    priority: Vec<u8>,
    fragment: Vec<u8>,
    /// The frames as they came, for when the rewriting turns off.
    original: Vec<u8>,
}

impl Rewriter {
    /// Takes bytes the client sent; appends to `out` what h2 is to read.
    fn feed(&mut self, mut input: &[u8], out: &mut Vec<u8>) {
        if self.preface < PREFACE_LEN {
            let n = input.len().min(PREFACE_LEN - self.preface);
            out.extend_from_slice(&input[..n]);
            self.preface += n;
            input = &input[n..];
        }
        if self.off {
            out.extend_from_slice(input);
            return;
        }
        self.pending.extend_from_slice(input);
        let mut at = 0;
        while let Some(header) = self.pending.get(at..at + FRAME_HEADER_LEN) {
            let length = (usize::from(header[0]) << 16)
                | (usize::from(header[1]) << 8)
                | usize::from(header[2]);
            let end = at + FRAME_HEADER_LEN + length;
            if self.pending.len() < end {
                break;
            }
            let frame = self.pending[at..end].to_vec();
            at = end;
            self.frame(&frame, out);
            if self.off {
                break;
            }
        }
        let rest = self.pending.split_off(at);
        self.pending = rest;
        if self.off {
            out.append(&mut self.pending);
        }
    }

    fn frame(&mut self, frame: &[u8], out: &mut Vec<u8>) {
        let (kind, flags) = (frame[3], frame[4]);
        let stream: [u8; 4] = frame[5..9].try_into().expect("a frame header is 9 bytes");
        let payload = &frame[FRAME_HEADER_LEN..];
        match (kind, self.held.take()) {
            (HEADERS, None) => {
                let Some((priority, fragment)) = headers_payload(flags, payload) else {
                    return self.turn_off(frame, out);
                };
                let held = HeldBlock {
                    stream,
                    flags: flags & (END_STREAM | PRIORITY),
                    priority: priority.to_vec(),
                    fragment: fragment.to_vec(),
                    original: frame.to_vec(),
                };
                self.block(held, flags & END_HEADERS != 0, out);
            }
            (CONTINUATION, Some(mut held)) if held.stream == stream => {
                held.fragment.extend_from_slice(payload);
                held.original.extend_from_slice(frame);
                if held.original.len() > MAX_BLOCK {
                    return self.turn_off(&held.original, out);
                }
                self.block(held, flags & END_HEADERS != 0, out);
            }
            (_, Some(held)) => {
                let mut original = held.original;
                original.extend_from_slice(frame);
                self.turn_off(&original, out);
            }
            (_, None) => out.extend_from_slice(frame),
        }
    }

    /// A header block so far: held until it ends, then passed on, rewritten if need be.
    fn block(&mut self, held: HeldBlock, ended: bool, out: &mut Vec<u8>) {
        if !ended {
            self.held = Some(held);
            return;
        }
        match self.rewrite_block(&held.fragment) {
            Some(block) => write_block(&held, &block, out),
            None => self.turn_off(&held.original, out),
        }
    }

    fn turn_off(&mut self, original: &[u8], out: &mut Vec<u8>) {
        debug!("unix socket: an HTTP/2 frame out of the expected order; passed on unchanged");
        self.off = true;
        out.extend_from_slice(original);
    }

    /// The block decoded, each `:authority` h2 would refuse replaced, and encoded again;
    /// `None` when it does not decode.
    fn rewrite_block(&mut self, block: &[u8]) -> Option<Vec<u8>> {
        let mut headers: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        self.decoder
            .decode_with_cb(block, |name, value| {
                let value = if name.as_ref() == AUTHORITY && !valid_authority(&value) {
                    debug!(
                        authority = %String::from_utf8_lossy(&value),
                        "unix socket: a request's :authority is not a valid authority; read as localhost"
                    );
                    REPLACEMENT.to_vec()
                } else {
                    value.into_owned()
                };
                headers.push((name.into_owned(), value));
            })
            .ok()?;
        let mut out = Vec::with_capacity(block.len());
        self.encoder
            .encode_into(
                headers.iter().map(|(n, v)| (n.as_slice(), v.as_slice())),
                &mut out,
            )
            .ok()?;
        Some(out)
    }
}

/// A HEADERS payload's priority fields and header block fragment, padding removed.
fn headers_payload(flags: u8, payload: &[u8]) -> Option<(&[u8], &[u8])> {
    let (padding, payload) = if flags & PADDED != 0 {
        let (&padding, rest) = payload.split_first()?;
        (usize::from(padding), rest)
    } else {
        (0, payload)
    };
    let payload = payload.get(..payload.len().checked_sub(padding)?)?;
    if flags & PRIORITY != 0 {
        Some((payload.get(..5)?, payload.get(5..)?))
    } else {
        Some((&[], payload))
    }
}

/// A header block as a HEADERS frame and as many CONTINUATIONs as it needs, no padding.
fn write_block(held: &HeldBlock, block: &[u8], out: &mut Vec<u8>) {
    let first = (MAX_FRAME - held.priority.len()).min(block.len());
    let (head, mut rest) = block.split_at(first);
    let mut payload = held.priority.clone();
    payload.extend_from_slice(head);
    let last = if rest.is_empty() { END_HEADERS } else { 0 };
    frame_header(payload.len(), HEADERS, held.flags | last, held.stream, out);
    out.extend_from_slice(&payload);
    while !rest.is_empty() {
        let (chunk, after) = rest.split_at(MAX_FRAME.min(rest.len()));
        rest = after;
        let last = if rest.is_empty() { END_HEADERS } else { 0 };
        frame_header(chunk.len(), CONTINUATION, last, held.stream, out);
        out.extend_from_slice(chunk);
    }
}

fn frame_header(length: usize, kind: u8, flags: u8, stream: [u8; 4], out: &mut Vec<u8>) {
    let length = u32::try_from(length)
        .expect("a frame under 16 KiB")
        .to_be_bytes();
    out.extend_from_slice(&length[1..]);
    out.extend_from_slice(&[kind, flags]);
    out.extend_from_slice(&stream);
}

/// Whether h2 takes `value` as a request's authority.
fn valid_authority(value: &[u8]) -> bool {
    http::uri::Authority::try_from(value).is_ok()
}

/// A unix-socket connection whose requests' `:authority` is made one h2 accepts.
pub struct AuthorityFix<IO> {
    io: IO,
    rewriter: Rewriter,
    /// Rewritten bytes h2 has not read yet.
    ready: Vec<u8>,
    read: usize,
}

impl<IO> AuthorityFix<IO> {
    pub fn new(io: IO) -> Self {
        Self {
            io,
            rewriter: Rewriter::default(),
            ready: Vec::new(),
            read: 0,
        }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for AuthorityFix<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        while this.read == this.ready.len() {
            this.ready.clear();
            this.read = 0;
            let mut bytes = [0; 8192];
            let mut incoming = ReadBuf::new(&mut bytes);
            std::task::ready!(Pin::new(&mut this.io).poll_read(cx, &mut incoming))?;
            if incoming.filled().is_empty() {
                // End of stream; a frame cut short is h2's to report.
                if let Some(held) = this.rewriter.held.take() {
                    this.ready.extend_from_slice(&held.original);
                }
                this.ready.append(&mut this.rewriter.pending);
                if this.ready.is_empty() {
                    return Poll::Ready(Ok(()));
                }
                break;
            }
            this.rewriter.feed(incoming.filled(), &mut this.ready);
        }
        let n = buf.remaining().min(this.ready.len() - this.read);
        buf.put_slice(&this.ready[this.read..this.read + n]);
        this.read += n;
        Poll::Ready(Ok(()))
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for AuthorityFix<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

impl<IO: Connected> Connected for AuthorityFix<IO> {
    type ConnectInfo = IO::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    /// `/a` Huffman-coded (RFC 7541 appendix B: `/` 011000, `a` 00011, EOS padding).
    const SLASH_A_HUFFMAN: [u8; 2] = [0x60, 0x7f];

    type Headers = Vec<(Vec<u8>, Vec<u8>)>;

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        frame_header(payload.len(), kind, flags, stream.to_be_bytes(), &mut out);
        out.extend_from_slice(payload);
        out
    }

    fn literal(bytes: &[u8]) -> Vec<u8> {
        let mut out = vec![u8::try_from(bytes.len()).unwrap()];
        out.extend_from_slice(bytes);
        out
    }

    /// What grpcio 1.85 sends for `unix:/tmp/s.sock`: `:authority` as a new literal name,
    /// added to the dynamic table, then `:path`.
    fn grpcio_block(authority: &[u8]) -> Vec<u8> {
        let mut block = vec![0x40];
        block.extend(literal(AUTHORITY));
        block.extend(literal(authority));
        block.push(0x84); // :path /
        block
    }

    fn fed(chunks: &[&[u8]]) -> (Vec<u8>, Rewriter) {
        let mut rewriter = Rewriter::default();
        let mut out = Vec::new();
        for chunk in chunks {
            rewriter.feed(chunk, &mut out);
        }
        (out, rewriter)
    }

    /// What h2 reads of `bytes` (after the preface): each header block decoded with one
    /// decoder as h2's follows the connection, and the other frames' kinds.
    fn as_h2_reads(bytes: &[u8]) -> (Vec<Headers>, Vec<u8>) {
        assert_eq!(&bytes[..PREFACE_LEN], PREFACE);
        let mut decoder = Decoder::new();
        let (mut blocks, mut others) = (Vec::new(), Vec::new());
        let mut block = Vec::new();
        let mut at = PREFACE_LEN;
        while at < bytes.len() {
            let header = &bytes[at..at + FRAME_HEADER_LEN];
            let length = (usize::from(header[0]) << 16)
                | (usize::from(header[1]) << 8)
                | usize::from(header[2]);
            let (kind, flags) = (header[3], header[4]);
            let payload = &bytes[at + FRAME_HEADER_LEN..at + FRAME_HEADER_LEN + length];
            at += FRAME_HEADER_LEN + length;
            match kind {
                HEADERS => block.extend_from_slice(headers_payload(flags, payload).unwrap().1),
                CONTINUATION => block.extend_from_slice(payload),
                other => others.push(other),
            }
            if matches!(kind, HEADERS | CONTINUATION) && flags & END_HEADERS != 0 {
                let mut headers = Vec::new();
                decoder
                    .decode_with_cb(&block, |n, v| {
                        headers.push((n.into_owned(), v.into_owned()))
                    })
                    .expect("h2 decodes the block");
                blocks.push(headers);
                block.clear();
            }
        }
        (blocks, others)
    }

    fn authorities(blocks: &[Headers]) -> Vec<String> {
        blocks
            .iter()
            .flatten()
            .filter(|(n, _)| n == AUTHORITY)
            .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
            .collect()
    }

    #[test]
    fn a_percent_encoded_path_becomes_localhost_also_when_the_table_refers_to_it() {
        let first = frame(HEADERS, END_HEADERS, 1, &grpcio_block(b"tmp%2Fs.sock"));
        // The second request refers to the first's entry (index 62), then names it again
        // with a new value.
        let mut second_block = vec![0xbe];
        second_block.push(0x0f);
        second_block.push(62 - 15);
        second_block.extend(literal(b"/tmp/other.sock"));
        let second = frame(HEADERS, END_HEADERS | END_STREAM, 3, &second_block);
        let settings = frame(0x4, 0, 0, &[]);
        let input = [PREFACE, &settings, &first, &second].concat();
        // Byte by byte: frames cut anywhere come out whole.
        let chunks: Vec<&[u8]> = input.chunks(1).collect();
        let (out, rewriter) = fed(&chunks);
        assert!(!rewriter.off);
        let (blocks, others) = as_h2_reads(&out);
        assert_eq!(
            authorities(&blocks),
            ["localhost", "localhost", "localhost"]
        );
        assert_eq!(others, [0x4]);
        assert_eq!(blocks[0][1], (b":path".to_vec(), b"/".to_vec()));
    }

    #[test]
    fn a_huffman_coded_path_as_grpc_go_sends_it_becomes_localhost() {
        // :authority by its static index (1), value Huffman-coded, added to the table; then
        // a request that refers to the entry (62).
        let mut block = vec![0x41, 0x80 | 2];
        block.extend_from_slice(&SLASH_A_HUFFMAN);
        let input = [
            PREFACE,
            &frame(HEADERS, END_HEADERS, 1, &block),
            &frame(HEADERS, END_HEADERS, 3, &[0xbe]),
        ]
        .concat();
        let (out, _) = fed(&[&input]);
        let (blocks, _) = as_h2_reads(&out);
        assert_eq!(authorities(&blocks), ["localhost", "localhost"]);
    }

    #[test]
    fn valid_authorities_and_other_headers_and_frames_reach_h2_as_sent() {
        let mut with_more = grpcio_block(b"example.com:50051");
        with_more.push(0x00);
        with_more.extend(literal(b"grpc-timeout"));
        with_more.extend(literal(b"5S"));
        let input = [
            PREFACE,
            &frame(HEADERS, END_HEADERS, 1, &grpcio_block(b"localhost")),
            &frame(HEADERS, END_HEADERS, 3, &with_more),
            &frame(0x0, END_STREAM, 1, b"\0\0\0\0\0"),
        ]
        .concat();
        let (out, rewriter) = fed(&[&input]);
        assert!(!rewriter.off);
        let (blocks, others) = as_h2_reads(&out);
        assert_eq!(blocks, as_h2_reads(&input).0);
        assert_eq!(authorities(&blocks), ["localhost", "example.com:50051"]);
        assert_eq!(others, [0x0]);
    }

    #[test]
    fn padding_priority_and_continuations_are_read_and_written_as_one_block() {
        let block = grpcio_block(b"/run/plegd/plegd.sock");
        let (head, tail) = block.split_at(5);
        let mut payload = vec![2]; // pad length
        payload.extend_from_slice(&[0, 0, 0, 0, 16]); // priority: stream 0, weight 16
        payload.extend_from_slice(head);
        payload.extend_from_slice(&[0, 0]);
        let input = [
            PREFACE,
            &frame(HEADERS, PADDED | PRIORITY | END_STREAM, 1, &payload),
            &frame(CONTINUATION, END_HEADERS, 1, tail),
        ]
        .concat();
        let (out, _) = fed(&[&input]);
        let flags = out[PREFACE_LEN + 4];
        assert_eq!(flags, PRIORITY | END_STREAM | END_HEADERS);
        assert_eq!(
            &out[PREFACE_LEN + FRAME_HEADER_LEN..][..5],
            &[0, 0, 0, 0, 16]
        );
        assert_eq!(authorities(&as_h2_reads(&out).0), ["localhost"]);
    }

    #[test]
    fn a_block_re_encoded_past_one_frame_goes_on_in_continuations() {
        // A header of 40,000 bytes beside the authority.
        let big = vec![b'x'; 40_000];
        let mut block = grpcio_block(b"/run/plegd/plegd.sock");
        block.push(0x00);
        block.extend(literal(b"x-big"));
        block.extend(loona_hpack::encoder::encode_integer(big.len(), 7));
        block.extend_from_slice(&big);
        let mut input = PREFACE.to_vec();
        let chunks: Vec<&[u8]> = block.chunks(MAX_FRAME).collect();
        for (i, chunk) in chunks.iter().enumerate() {
            let kind = if i == 0 { HEADERS } else { CONTINUATION };
            let flags = if i + 1 == chunks.len() {
                END_HEADERS
            } else {
                0
            };
            input.extend(frame(kind, flags, 1, chunk));
        }
        let (out, _) = fed(&[&input]);
        let (blocks, _) = as_h2_reads(&out);
        assert_eq!(authorities(&blocks), ["localhost"]);
        assert_eq!(blocks[0].last().unwrap().1.len(), big.len());
    }

    #[test]
    fn anything_unexpected_passes_every_byte_on_unchanged() {
        // A DATA frame between HEADERS and its CONTINUATION, then a bad authority.
        let block = grpcio_block(b"tmp%2Fs.sock");
        let input = [
            PREFACE,
            &frame(HEADERS, 0, 1, &block[..3]),
            &frame(0x0, 0, 1, b"x"),
            &frame(HEADERS, END_HEADERS, 3, &block),
        ]
        .concat();
        let (out, rewriter) = fed(&[&input]);
        assert_eq!(out, input);
        assert!(rewriter.off);
        // A block that does not decode as HPACK: an index past every table.
        let input = [PREFACE, &frame(HEADERS, END_HEADERS, 1, &[0xff, 0x7f])].concat();
        assert_eq!(fed(&[&input]).0, input);
        // A table size past what h2 advertised.
        let input = [
            PREFACE,
            &frame(HEADERS, END_HEADERS, 1, &[0x3f, 0xe1, 0x7f]),
        ]
        .concat();
        assert_eq!(fed(&[&input]).0, input);
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        // A small xorshift: header blocks of random bytes, in valid frames and not.
        let mut state = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for _ in 0..2_000 {
            let length = (next() % 64) as usize;
            let block: Vec<u8> = (0..length).map(|_| next() as u8).collect();
            let framed = [PREFACE, &frame(HEADERS, END_HEADERS, 1, &block)].concat();
            fed(&[&framed]);
            fed(&[PREFACE, &block]);
        }
    }
}
