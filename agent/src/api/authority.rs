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
//!
//! Decoding is where a peer's bytes turn into plegd's memory (a 4 KB entry of the dynamic
//! table referred to by a one-byte index costs 4 KB per reference), so it is bounded before
//! anything is allocated (issue 53):
//! - a frame longer than [`MAX_FRAME`] (the largest plegd's servers accept) is not buffered:
//!   it and the rest of the connection pass on as they come, and h2 ends the connection at
//!   its header (FRAME_SIZE_ERROR);
//! - a header block is held across CONTINUATION frames up to [`MAX_HELD`] bytes, and decodes
//!   to at most [`MAX_HEADER_LIST`] (the header list size plegd's servers advertise), counted
//!   as RFC 7541 counts it (name, value and 32 bytes per field) as each field is decoded, so
//!   nothing past the limit is ever copied. A block past either limit ends the connection
//!   (RFC 9113 10.5.1 lets a server close one rather than decode what it will not handle):
//!   h2 would refuse such a block too, and its table follows the rewritten blocks, not the
//!   client's, so passing it on unchanged could not be decoded.
//!
//! Each refusal is counted in `plegd_api_refused_total{listener="unix"}` (`what` "frame" or
//! "header-block", reason "too-large") and logged once per burst.

use std::{
    io,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use loona_hpack::{Decoder, Encoder};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::transport::server::Connected;
use tracing::debug;

use crate::api::admission::{Connection, MAX_FRAME, MAX_HEADER_LIST, Refusal};

/// The client connection preface, passed on before the first frame.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const PREFACE_LEN: usize = PREFACE.len();
const FRAME_HEADER_LEN: usize = 9;
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// The bytes of a header block held across CONTINUATION frames: its fragment, which a block
/// h2 accepts keeps under [`MAX_HEADER_LIST`] (a field's encoding is never longer than the 32
/// bytes RFC 7541 counts for it beyond its name and value), and its frames' headers and
/// padding.
const MAX_HELD: usize = 2 * MAX_HEADER_LIST as usize;
/// What RFC 7541 (4.1) counts for a field beyond its name and value.
const FIELD_OVERHEAD: usize = 32;
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
    /// A header block past its limits came: the connection ends once `out` is read.
    closed: bool,
    /// What was refused and not yet counted.
    refused: Option<Refused>,
}

/// Input refused for its size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Refused {
    /// A frame longer than [`MAX_FRAME`]: passed on, for h2 to end the connection at.
    Frame,
    /// A header block past [`MAX_HELD`] or [`MAX_HEADER_LIST`]: the connection ends.
    Block,
}

impl Refused {
    /// What `plegd_api_refused_total` calls it.
    fn what(self) -> &'static str {
        match self {
            Self::Frame => "frame",
            Self::Block => "header-block",
        }
    }
}

/// A decoded header block.
enum Decoded {
    /// Encoded again, each authority h2 would refuse replaced.
    Rewritten(Vec<u8>),
    /// Not HPACK, or not for this table.
    Unreadable,
    /// Past [`MAX_HEADER_LIST`].
    TooLarge,
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
            closed: false,
            refused: None,
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
        if self.closed {
            return;
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
            if length > MAX_FRAME as usize {
                // Never held: h2 reads the header and ends the connection.
                self.refused = Some(Refused::Frame);
                let held = self.held.take();
                self.turn_off(held.as_ref().map_or(&[], |h| &h.original), out);
                break;
            }
            let end = at + FRAME_HEADER_LEN + length;
            if self.pending.len() < end {
                break;
            }
            let frame = self.pending[at..end].to_vec();
            at = end;
            self.frame(&frame, out);
            if self.off || self.closed {
                break;
            }
        }
        let rest = self.pending.split_off(at);
        self.pending = rest;
        if self.off {
            out.append(&mut self.pending);
        }
        if self.closed {
            self.pending = Vec::new();
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
                if held.original.len() + frame.len() > MAX_HELD {
                    return self.close();
                }
                held.fragment.extend_from_slice(payload);
                held.original.extend_from_slice(frame);
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
            Decoded::Rewritten(block) => write_block(&held, &block, out),
            Decoded::Unreadable => self.turn_off(&held.original, out),
            Decoded::TooLarge => self.close(),
        }
    }

    fn turn_off(&mut self, original: &[u8], out: &mut Vec<u8>) {
        debug!("unix socket: an HTTP/2 frame out of the expected order; passed on unchanged");
        self.off = true;
        out.extend_from_slice(original);
    }

    /// A header block past its limits: nothing more is read or passed on.
    fn close(&mut self) {
        self.refused = Some(Refused::Block);
        self.closed = true;
        self.held = None;
    }

    /// The block decoded, each `:authority` h2 would refuse replaced, and encoded again. The
    /// decoder goes through the whole block (its table must follow the client's), but no
    /// field is copied once the list is past [`MAX_HEADER_LIST`].
    fn rewrite_block(&mut self, block: &[u8]) -> Decoded {
        let mut headers: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        let mut size = 0usize;
        let decoded = self.decoder.decode_with_cb(block, |name, value| {
            size = size.saturating_add(name.len() + value.len() + FIELD_OVERHEAD);
            if size > MAX_HEADER_LIST as usize {
                return;
            }
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
        });
        if size > MAX_HEADER_LIST as usize {
            return Decoded::TooLarge;
        }
        if decoded.is_err() {
            return Decoded::Unreadable;
        }
        let mut out = Vec::with_capacity(block.len());
        match self.encoder.encode_into(
            headers.iter().map(|(n, v)| (n.as_slice(), v.as_slice())),
            &mut out,
        ) {
            Ok(()) => Decoded::Rewritten(out),
            Err(_) => Decoded::Unreadable,
        }
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
    let max_frame = MAX_FRAME as usize;
    let first = (max_frame - held.priority.len()).min(block.len());
    let (head, mut rest) = block.split_at(first);
    let mut payload = held.priority.clone();
    payload.extend_from_slice(head);
    let last = if rest.is_empty() { END_HEADERS } else { 0 };
    frame_header(payload.len(), HEADERS, held.flags | last, held.stream, out);
    out.extend_from_slice(&payload);
    while !rest.is_empty() {
        let (chunk, after) = rest.split_at(max_frame.min(rest.len()));
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
    /// Where refusals are counted.
    connection: Option<Arc<Connection>>,
}

impl<IO> AuthorityFix<IO> {
    /// `io`, rewritten; its refusals counted against `connection`.
    pub fn new(io: IO, connection: Option<Arc<Connection>>) -> Self {
        Self {
            io,
            rewriter: Rewriter::default(),
            ready: Vec::new(),
            read: 0,
            connection,
        }
    }

    fn count_refusal(&mut self) {
        if let Some(refused) = self.rewriter.refused.take()
            && let Some(connection) = &self.connection
        {
            connection.refuse(refused.what(), Refusal::TooLarge);
        }
    }
}

/// The header-block path of the unix socket over `data` as a client's
/// bytes after the preface, fed in pieces whose sizes the first byte picks: the fuzz target's
/// entry point, not an API. Returns what h2 would read.
#[doc(hidden)]
pub fn fuzz_header_blocks(data: &[u8]) -> FuzzOutcome {
    let Some((&piece, data)) = data.split_first() else {
        return FuzzOutcome::default();
    };
    let mut rewriter = Rewriter::default();
    let mut out = Vec::new();
    rewriter.feed(PREFACE, &mut out);
    let mut most_held = 0;
    for chunk in data.chunks(usize::from(piece).max(1) * 64) {
        rewriter.feed(chunk, &mut out);
        let held = rewriter
            .held
            .as_ref()
            .map_or(0, |h| h.original.len() + h.fragment.len());
        most_held = most_held.max(rewriter.pending.len() + held);
    }
    FuzzOutcome {
        passed_on: out.len(),
        most_held,
        may_hold: MAX_HELD * 2 + FRAME_HEADER_LEN + MAX_FRAME as usize + 255 * 64,
        refused: rewriter.closed,
        off: rewriter.off,
    }
}

/// What [`fuzz_header_blocks`] saw.
#[doc(hidden)]
#[derive(Debug, Default)]
pub struct FuzzOutcome {
    /// Bytes passed on to h2.
    pub passed_on: usize,
    /// The most bytes held at once between frames (a partial frame, a block awaiting its
    /// CONTINUATIONs).
    pub most_held: usize,
    /// The most it may hold: a held block's fragment and frames (each at most [`MAX_HELD`]),
    /// a partial frame and a piece read after it.
    pub may_hold: usize,
    /// The connection was ended for a header block past its limits.
    pub refused: bool,
    /// The rewriting turned off (bytes pass on unchanged).
    pub off: bool,
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
            if this.rewriter.closed {
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "a header block past plegd's header list limit",
                )));
            }
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
            this.count_refusal();
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
    fn a_block_written_past_one_frame_goes_on_in_continuations() {
        // Blocks within the list limit fit one frame with their priority fields (a field's
        // encoding is shorter than what the limit counts for it); written anyway as h2 takes
        // a longer one.
        let held = HeldBlock {
            stream: 1u32.to_be_bytes(),
            flags: PRIORITY,
            priority: vec![0, 0, 0, 0, 16],
            fragment: Vec::new(),
            original: Vec::new(),
        };
        let block: Vec<u8> = (0..40_000u32).map(|i| i as u8).collect();
        let mut out = PREFACE.to_vec();
        write_block(&held, &block, &mut out);
        let mut at = PREFACE_LEN;
        let (mut kinds, mut payload) = (Vec::new(), Vec::new());
        while at < out.len() {
            let length = usize::from(out[at]) << 16
                | usize::from(out[at + 1]) << 8
                | usize::from(out[at + 2]);
            assert!(length <= MAX_FRAME as usize);
            kinds.push((out[at + 3], out[at + 4]));
            payload.extend_from_slice(&out[at + FRAME_HEADER_LEN..at + FRAME_HEADER_LEN + length]);
            at += FRAME_HEADER_LEN + length;
        }
        assert_eq!(
            kinds,
            [
                (HEADERS, PRIORITY),
                (CONTINUATION, 0),
                (CONTINUATION, END_HEADERS)
            ]
        );
        assert_eq!(&payload[..5], &[0, 0, 0, 0, 16]);
        assert_eq!(&payload[5..], &block[..]);
    }

    /// A block of one `x-big` field whose list size (RFC 7541) is `size`.
    fn block_of_list_size(size: usize) -> Vec<u8> {
        let value = vec![b'x'; size - FIELD_OVERHEAD - b"x-big".len()];
        let mut block = vec![0x00];
        block.extend(literal(b"x-big"));
        block.extend(loona_hpack::encoder::encode_integer(value.len(), 7));
        block.extend_from_slice(&value);
        block
    }

    /// `block` as HEADERS and CONTINUATION frames of at most `max` bytes each.
    fn framed(stream: u32, block: &[u8], max: usize) -> Vec<u8> {
        let chunks: Vec<&[u8]> = block.chunks(max).collect();
        let mut out = Vec::new();
        for (i, chunk) in chunks.iter().enumerate() {
            let kind = if i == 0 { HEADERS } else { CONTINUATION };
            let last = if i + 1 == chunks.len() {
                END_HEADERS
            } else {
                0
            };
            out.extend(frame(kind, last, stream, chunk));
        }
        out
    }

    #[test]
    fn a_header_list_up_to_the_limit_passes_and_one_byte_more_ends_the_connection() {
        let limit = MAX_HEADER_LIST as usize;
        for (size, refused) in [(limit, false), (limit + 1, true)] {
            let block = block_of_list_size(size);
            let input = [PREFACE, &framed(1, &block, 8_192)].concat();
            let (out, rewriter) = fed(&[&input]);
            assert_eq!(rewriter.closed, refused, "list size {size}");
            assert_eq!(rewriter.refused, refused.then_some(Refused::Block));
            if refused {
                assert_eq!(out, PREFACE, "nothing of it passed on");
            } else {
                let value = size - FIELD_OVERHEAD - b"x-big".len();
                assert_eq!(as_h2_reads(&out).0[0][0].1.len(), value);
            }
        }
    }

    #[test]
    fn an_hpack_bomb_is_refused_without_copying_its_references() {
        // Issue 53: a 4,000-byte entry, then 200,000 one-byte references to it, in 16 KiB
        // frames: 800 MB decoded. Refused once its held bytes pass the limit, long before.
        let mut block = vec![0x40];
        block.extend(literal(b"x-bomb"));
        block.extend(loona_hpack::encoder::encode_integer(4_000, 7));
        block.extend(std::iter::repeat_n(b'b', 4_000));
        block.extend(std::iter::repeat_n(0xbe, 200_000));
        let input = [PREFACE, &framed(1, &block, MAX_FRAME as usize)].concat();
        let mut rewriter = Rewriter::default();
        let mut out = Vec::new();
        for chunk in input.chunks(8_192) {
            rewriter.feed(chunk, &mut out);
            assert!(rewriter.pending.len() <= MAX_FRAME as usize + FRAME_HEADER_LEN + 8_192);
        }
        assert!(rewriter.closed);
        assert_eq!(out, PREFACE);
        assert!(rewriter.pending.capacity() == 0 && rewriter.held.is_none());
        // Within the held bytes' limit, the references alone past the list limit.
        let mut small = vec![0x40];
        small.extend(literal(b"x-bomb"));
        small.extend(loona_hpack::encoder::encode_integer(4_000, 7));
        small.extend(std::iter::repeat_n(b'b', 4_000));
        small.extend(std::iter::repeat_n(0xbe, 5));
        let (out, rewriter) = fed(&[&[PREFACE, &framed(1, &small, 16_384)].concat()]);
        assert!(rewriter.closed);
        assert_eq!(out, PREFACE);
    }

    #[test]
    fn a_frame_past_the_maximum_size_is_passed_on_unbuffered_for_h2_to_refuse() {
        let settings = frame(0x4, 0, 0, &[]);
        let mut oversize = vec![0x00, 0x40, 0x01, HEADERS, END_HEADERS, 0, 0, 0, 1];
        oversize.extend([0xbe; 100]);
        let input = [PREFACE, &settings, &oversize].concat();
        let (out, rewriter) = fed(&[&input]);
        assert_eq!(out, input);
        assert!(rewriter.off && !rewriter.closed);
        assert_eq!(rewriter.refused, Some(Refused::Frame));
        // One byte less is a frame like any other.
        let mut largest = vec![0x00, 0x40, 0x00, 0x0, 0, 0, 0, 0, 1];
        largest.extend(vec![0; MAX_FRAME as usize]);
        let (_, rewriter) = fed(&[PREFACE, &largest]);
        assert!(!rewriter.off && rewriter.refused.is_none());
    }

    #[test]
    fn continuations_held_past_their_limit_end_the_connection() {
        let mut input = [PREFACE, &frame(HEADERS, 0, 1, &[0x82])].concat();
        // Empty CONTINUATIONs cost a frame header each.
        for _ in 0..MAX_HELD / FRAME_HEADER_LEN {
            input.extend(frame(CONTINUATION, 0, 1, &[]));
        }
        let (out, rewriter) = fed(&[&input]);
        assert!(rewriter.closed);
        assert_eq!(out, PREFACE);
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
