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
//! So [`AuthorityFix`] reads the client's side of each unix-socket connection as HTTP/2
//! frames and, in a request header block, replaces a literal `:authority` value that is not a
//! valid authority with `localhost`; every other byte reaches h2 as sent, and h2 still checks
//! everything else (the replaced value too). HPACK state stays in step: a replaced entry
//! that the client added to its dynamic table is added to h2's with the shorter value, so
//! h2's table holds at least every entry the client may refer to, at the same indices. A
//! value `localhost` would not fit in (shorter than 9 bytes), or one that is
//! Huffman-coded, is left as it is. Anything unexpected (a frame out of order, a block
//! that does not parse) turns the rewriting off for the connection and h2 gets the bytes
//! unchanged, to refuse as before: the rewriting never makes a request worse.

use std::{
    collections::VecDeque,
    io,
    pin::Pin,
    task::{Context, Poll},
};

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
/// Entries of the HPACK dynamic table followed: each takes at least 32 of its bytes, and
/// 64 KiB is far above what h2 allows (4 KiB).
const MAX_ENTRIES: usize = (64 << 10) / 32;
/// HPACK's static table ends here; index 1 is `:authority`.
const STATIC_ENTRIES: usize = 61;
const AUTHORITY: &[u8] = b":authority";
/// `:authority` Huffman-coded (RFC 7541 appendix B), as a literal name may arrive.
const AUTHORITY_HUFFMAN: &[u8] = &[0xb8, 0x3b, 0x53, 0x39, 0xec, 0x32, 0x7d, 0x7f];
const REPLACEMENT: &[u8] = b"localhost";

/// The rewriting of one connection's client-to-server bytes, without I/O.
#[derive(Debug, Default)]
struct Rewriter {
    /// Bytes read but not yet a whole frame.
    pending: Vec<u8>,
    /// Preface bytes passed on so far.
    preface: usize,
    /// A HEADERS frame and its CONTINUATIONs so far, waiting for END_HEADERS.
    held: Option<HeldBlock>,
    /// Per dynamic table entry, newest first: whether its name is `:authority`.
    entries: VecDeque<bool>,
    /// Something unexpected came: bytes are passed on unchanged from then on.
    off: bool,
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
            Some(None) => out.extend_from_slice(&held.original),
            Some(Some(block)) => {
                write_block(&held, &block, out);
            }
            None => self.turn_off(&held.original, out),
        }
    }

    fn turn_off(&mut self, original: &[u8], out: &mut Vec<u8>) {
        debug!("unix socket: an HTTP/2 frame out of the expected order; passed on unchanged");
        self.off = true;
        out.extend_from_slice(original);
    }

    /// The block with each bad literal `:authority` value replaced: `Some(None)` when
    /// nothing was replaced, `None` when it does not parse as HPACK.
    fn rewrite_block(&mut self, block: &[u8]) -> Option<Option<Vec<u8>>> {
        let mut out = Vec::with_capacity(block.len());
        let mut changed = false;
        let mut at = 0;
        while let Some(&first) = block.get(at) {
            let start = at;
            if first & 0x80 != 0 {
                // Indexed: refers to an entry whose value h2 already holds as rewritten.
                (_, at) = integer(block, at, 7)?;
                out.extend_from_slice(&block[start..at]);
                continue;
            }
            if first & 0xe0 == 0x20 {
                // A dynamic table size update: the client's encoder evicts; our entries are
                // a superset either way.
                (_, at) = integer(block, at, 5)?;
                out.extend_from_slice(&block[start..at]);
                continue;
            }
            let indexing = first & 0xc0 == 0x40;
            let (index, after) = integer(block, at, if indexing { 6 } else { 4 })?;
            at = after;
            let is_authority = if index == 0 {
                let (huffman, name, after) = string(block, at)?;
                at = after;
                name == if huffman {
                    AUTHORITY_HUFFMAN
                } else {
                    AUTHORITY
                }
            } else if index <= STATIC_ENTRIES {
                index == 1
            } else {
                self.entries
                    .get(index - STATIC_ENTRIES - 1)
                    .copied()
                    .unwrap_or(false)
            };
            let value_at = at;
            let (huffman, value, after) = string(block, at)?;
            at = after;
            if indexing {
                self.entries.push_front(is_authority);
                self.entries.truncate(MAX_ENTRIES);
            }
            if is_authority && !huffman && replaceable(value) {
                debug!(
                    authority = %String::from_utf8_lossy(value),
                    "unix socket: a request's :authority is not a valid authority; read as localhost"
                );
                out.extend_from_slice(&block[start..value_at]);
                out.push(u8::try_from(REPLACEMENT.len()).expect("a short literal"));
                out.extend_from_slice(REPLACEMENT);
                changed = true;
            } else {
                out.extend_from_slice(&block[start..at]);
            }
        }
        Some(changed.then_some(out))
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

/// Whether `value` is an authority h2 refuses and [`REPLACEMENT`] fits in its place.
fn replaceable(value: &[u8]) -> bool {
    value.len() >= REPLACEMENT.len() && http::uri::Authority::try_from(value).is_err()
}

/// An HPACK integer with an `prefix`-bit prefix at `at`: its value and where it ends.
fn integer(block: &[u8], at: usize, prefix: u32) -> Option<(usize, usize)> {
    let max = (1usize << prefix) - 1;
    let mut value = usize::from(*block.get(at)?) & max;
    let mut at = at + 1;
    if value < max {
        return Some((value, at));
    }
    let mut shift = 0;
    loop {
        let byte = *block.get(at)?;
        at += 1;
        value = value.checked_add(usize::from(byte & 0x7f).checked_shl(shift)?)?;
        if byte & 0x80 == 0 {
            return Some((value, at));
        }
        shift += 7;
        if shift > 28 {
            return None;
        }
    }
}

/// An HPACK string literal at `at`: whether it is Huffman-coded, its bytes, where it ends.
fn string(block: &[u8], at: usize) -> Option<(bool, &[u8], usize)> {
    let huffman = *block.get(at)? & 0x80 != 0;
    let (length, start) = integer(block, at, 7)?;
    let end = start.checked_add(length)?;
    Some((huffman, block.get(start..end)?, end))
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

    #[test]
    fn a_percent_encoded_path_becomes_localhost_and_the_table_stays_in_step() {
        let first = frame(HEADERS, END_HEADERS, 1, &grpcio_block(b"tmp%2Fs.sock"));
        // The second request refers to the first's entry (index 62) and names it again.
        let mut second_block = vec![0xbe];
        second_block.push(0x0f);
        second_block.push(62 - 15);
        second_block.extend(literal(b"/tmp/other.sock"));
        let second = frame(HEADERS, END_HEADERS | END_STREAM, 3, &second_block);
        let settings = frame(0x4, 0, 0, &[]);
        let input = [PREFACE, &settings, &first, &second].concat();
        // Byte by byte: frames cut anywhere come out whole.
        let chunks: Vec<&[u8]> = input.chunks(1).collect();
        let (out, _) = fed(&chunks);

        let mut expected_second = vec![0xbe, 0x0f, 62 - 15];
        expected_second.extend(literal(REPLACEMENT));
        let expected = [
            PREFACE,
            &settings,
            &frame(HEADERS, END_HEADERS, 1, &grpcio_block(REPLACEMENT)),
            &frame(HEADERS, END_HEADERS | END_STREAM, 3, &expected_second),
        ]
        .concat();
        assert_eq!(out, expected);
    }

    #[test]
    fn valid_authorities_and_other_frames_pass_unchanged() {
        let input = [
            PREFACE,
            &frame(HEADERS, END_HEADERS, 1, &grpcio_block(b"localhost")),
            &frame(HEADERS, END_HEADERS, 3, &grpcio_block(b"example.com:50051")),
            &frame(0x0, END_STREAM, 1, b"\0\0\0\0\0"),
        ]
        .concat();
        let (out, rewriter) = fed(&[&input]);
        assert_eq!(out, input);
        assert!(!rewriter.off);
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
        let mut expected_payload = vec![0, 0, 0, 0, 16];
        expected_payload.extend(grpcio_block(REPLACEMENT));
        let expected = [
            PREFACE,
            &frame(
                HEADERS,
                PRIORITY | END_STREAM | END_HEADERS,
                1,
                &expected_payload,
            )[..],
        ]
        .concat();
        assert_eq!(out, expected);
    }

    #[test]
    fn a_huffman_coded_name_is_recognised_and_a_huffman_value_left_alone() {
        let mut block = vec![0x00, 0x80 | 8];
        block.extend_from_slice(AUTHORITY_HUFFMAN);
        block.extend(literal(b"run%2Fplegd.sock"));
        let (out, _) = fed(&[PREFACE, &frame(HEADERS, END_HEADERS, 1, &block)]);
        let mut expected = vec![0x00, 0x80 | 8];
        expected.extend_from_slice(AUTHORITY_HUFFMAN);
        expected.extend(literal(REPLACEMENT));
        assert_eq!(
            out,
            [PREFACE, &frame(HEADERS, END_HEADERS, 1, &expected)[..]].concat()
        );

        // A Huffman-coded value: its decoded text is not read, so it is not replaced.
        let block = [&[0x01u8, 0x80 | 12][..], &[0xff; 12]].concat();
        let input = [PREFACE, &frame(HEADERS, END_HEADERS, 1, &block)].concat();
        assert_eq!(fed(&[&input]).0, input);
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
        // A block that does not parse as HPACK.
        let input = [PREFACE, &frame(HEADERS, END_HEADERS, 1, &[0x40, 0x7f])].concat();
        assert_eq!(fed(&[&input]).0, input);
    }

    #[test]
    fn integers_follow_rfc_7541() {
        // C.1.2: 1337 with a 5-bit prefix.
        assert_eq!(integer(&[0x1f, 0x9a, 0x0a], 0, 5), Some((1337, 3)));
        assert_eq!(integer(&[0x0a], 0, 5), Some((10, 1)));
        assert_eq!(integer(&[0x1f, 0xff, 0xff, 0xff, 0xff, 0xff], 0, 5), None);
    }
}
