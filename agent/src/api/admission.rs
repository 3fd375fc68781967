//! What the API's peers may hold: connections per listener and per peer (a uid on the unix
//! socket, an address on TCP), RPCs in flight per peer, and how long a connection may go
//! without one. A peer of the TLS port with no certificate holds at most its share of
//! connections for a handshake's deadline; a leaking local client at most its share; and
//! every listener together stays within the file descriptors plegd does not keep for its own
//! work ([`crate::base::fds`]).
//!
//! [`Gate::admit`] decides at accept, before any byte is read; the [`Lease`] it gives rides
//! with the connection (in [`crate::api::cut::Cuttable`]) and gives everything back when the
//! connection goes. [`StreamLayer`] counts each connection's RPCs, refuses those past the
//! peer's share, and tells the connection when it last had one: a connection must open its
//! first stream within [`FIRST_STREAM_DEADLINE`] of its accept (the TLS handshake and the
//! HTTP/2 preface included) and may then go [`IDLE_LIMIT`] without any.
//!
//! What one connection may send is bounded too: frames of at most [`MAX_FRAME`] bytes, header
//! blocks of at most [`MAX_HEADER_LIST`] (both what plegd's servers advertise; on the unix
//! socket, where blocks are decoded before h2 sees them, see `crate::api::authority`), at most
//! [`RECEIVE_WINDOW`] bytes of request bodies in flight, and request messages of at most
//! [`MAX_REQUEST`] bytes, refused as their length prefix comes (RESOURCE_EXHAUSTED), before
//! tonic buffers them.

use std::{
    collections::HashMap,
    hash::Hash,
    net::IpAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    task::{Context, Poll},
    time::{Duration, Instant},
};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tracing::warn;

use crate::base::metrics::Metrics;

/// How long a new connection may take to open its first stream: the TLS handshake, the
/// HTTP/2 preface and the first request. Clients send all three at once.
pub const FIRST_STREAM_DEADLINE: Duration = Duration::from_secs(10);

/// How long a connection may stay open without any stream once it had one: a client that
/// keeps its channel for later calls reconnects when it makes one.
pub const IDLE_LIMIT: Duration = Duration::from_secs(5 * 60);

/// How long the TLS handshake may take; a peer that sends nothing is closed after it.
pub const HANDSHAKE_DEADLINE: Duration = Duration::from_secs(5);

/// HTTP/2 pings on every API connection: a peer that does not answer within the timeout is
/// gone, and its connection is closed.
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
pub const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long refusals of one kind are summed before the next log line.
const LOG_EVERY: Duration = Duration::from_secs(10);

/// The largest HTTP/2 frame plegd's servers accept (SETTINGS_MAX_FRAME_SIZE, set from this):
/// HTTP/2's initial value, so a client that has not read plegd's SETTINGS yet is held to the
/// same.
pub const MAX_FRAME: u32 = 16_384;

/// The largest header list plegd's servers accept (SETTINGS_MAX_HEADER_LIST_SIZE, set from
/// this; hyper's default), counted as RFC 7541 counts it: each field's name, value and 32.
/// gRPC clients send a few hundred bytes.
pub const MAX_HEADER_LIST: u32 = 16 << 10;

/// The HTTP/2 flow-control windows plegd gives its peers, per stream and per connection:
/// request bodies a connection may have sent and plegd not yet read (HTTP/2's initial
/// window; hyper's default of 1 MiB would let one connection pin sixteen times as much, and
/// plegd's requests are under [`MAX_REQUEST`]).
pub const RECEIVE_WINDOW: u32 = 65_535;

/// The largest request message plegd decodes. Its largest legitimate request, a
/// `WatchRequest` with every filter at Kubernetes' longest names and every event type, is
/// about 600 bytes (`the_largest_legitimate_request_fits` in `crate::api::server`);
/// reflection and health requests are smaller.
pub const MAX_REQUEST: usize = 4 << 10;

/// Who a connection comes from, for the per-peer shares.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Peer {
    /// A unix socket peer's uid.
    Uid(u32),
    /// A TCP peer's address.
    Address(IpAddr),
    /// The metrics listener: every peer counts toward the listener's limit alone.
    Anyone,
}

/// The limits of one listener (with the settings, a layer below the API).
pub use crate::config::ApiLimits as Limits;

/// Why a connection or a stream was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The listener holds its limit of connections.
    ListenerFull,
    /// The peer holds its share of connections or streams.
    PeerFull,
    /// Every descriptor the API may use is in use.
    Descriptors,
    /// A unix socket peer whose credentials the allow-list does not admit (or that cannot be
    /// read).
    NotAllowed,
    /// Input past its size limit: a frame, a header block, a request message.
    TooLarge,
    /// A request's repeated field with more entries than it can mean.
    TooMany,
}

impl Refusal {
    pub fn name(self) -> &'static str {
        match self {
            Self::ListenerFull => "listener-full",
            Self::PeerFull => "peer-full",
            Self::Descriptors => "descriptors",
            Self::NotAllowed => "not-allowed",
            Self::TooLarge => "too-large",
            Self::TooMany => "too-many",
        }
    }
}

/// Counts per key, each at most `cap`.
#[derive(Debug)]
struct Tally<K> {
    counts: HashMap<K, usize>,
    cap: usize,
}

impl<K: Hash + Eq> Tally<K> {
    fn new(cap: usize) -> Self {
        Self {
            counts: HashMap::new(),
            cap,
        }
    }

    /// Takes one for `key`, unless it holds its cap.
    fn take(&mut self, key: K) -> bool {
        let count = self.counts.entry(key).or_default();
        if *count >= self.cap {
            return false;
        }
        *count += 1;
        true
    }

    /// Gives one back for `key`; a key at zero is forgotten.
    fn give(&mut self, key: &K) {
        if let Some(count) = self.counts.get_mut(key) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                self.counts.remove(key);
            }
        }
    }

    #[cfg(test)]
    fn of(&self, key: &K) -> usize {
        self.counts.get(key).copied().unwrap_or(0)
    }
}

/// What was refused (a connection, a stream) and why ([`Refusal::name`], or an accept's error).
type Kind = (&'static str, &'static str);

/// Kinds a [`Quiet`] remembers before it forgets those it has not logged for a while.
const QUIET_KINDS: usize = 1024;

/// One log line per kind of refusal per [`LOG_EVERY`], with the count since the last.
#[derive(Debug)]
struct Quiet<K = Kind> {
    last: HashMap<K, (Instant, u64)>,
}

impl<K> Default for Quiet<K> {
    fn default() -> Self {
        Self {
            last: HashMap::new(),
        }
    }
}

impl<K: Hash + Eq> Quiet<K> {
    /// Whether to log `what` now, and how many went unlogged before it.
    fn speak(&mut self, what: K, now: Instant) -> Option<u64> {
        if self.last.len() >= QUIET_KINDS && !self.last.contains_key(&what) {
            // Kinds keyed by a peer come and go with the peers: the quiet ones are forgotten.
            self.last
                .retain(|_, (at, _)| now.saturating_duration_since(*at) < LOG_EVERY);
        }
        match self.last.get_mut(&what) {
            Some((at, held)) if now.saturating_duration_since(*at) < LOG_EVERY => {
                *held += 1;
                None
            }
            Some((at, held)) => {
                let before = std::mem::take(held);
                *at = now;
                Some(before)
            }
            None => {
                self.last.insert(what, (now, 0));
                Some(0)
            }
        }
    }
}

/// One listener's admission: its limits, the descriptors shared by every listener, and what
/// each peer holds.
#[derive(Clone, Debug)]
pub struct Gate(Arc<GateInner>);

#[derive(Debug)]
struct GateInner {
    listener: &'static str,
    limits: Limits,
    /// Descriptors the API's connections may hold, over every listener.
    descriptors: Arc<Semaphore>,
    slots: Arc<Semaphore>,
    connections: Mutex<Tally<Peer>>,
    streams: Mutex<Tally<Peer>>,
    quiet: Mutex<Quiet>,
    /// Refused unix peers, by uid (`None`: credentials unreadable) and reason.
    quiet_peers: Mutex<Quiet<(Option<u32>, &'static str)>>,
    metrics: Metrics,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Counts updated in single statements: a poisoned lock is still consistent.
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

impl Gate {
    /// The gate of `listener`, whose connections take descriptors from `descriptors`.
    pub fn new(
        listener: &'static str,
        limits: Limits,
        descriptors: Arc<Semaphore>,
        metrics: Metrics,
    ) -> Self {
        Self(Arc::new(GateInner {
            listener,
            slots: Arc::new(Semaphore::new(limits.connections)),
            connections: Mutex::new(Tally::new(limits.connections_per_peer)),
            streams: Mutex::new(Tally::new(limits.streams_per_peer)),
            limits,
            descriptors,
            quiet: Mutex::default(),
            quiet_peers: Mutex::default(),
            metrics,
        }))
    }

    /// A connection of `peer`, or why not (counted and logged once per burst).
    pub fn admit(&self, peer: Peer) -> Result<Lease, Refusal> {
        let admitted = self.try_admit(peer);
        if let Err(refusal) = admitted {
            self.refused("connection", refusal, peer);
        }
        admitted
    }

    fn try_admit(&self, peer: Peer) -> Result<Lease, Refusal> {
        let inner = &self.0;
        let slot = Arc::clone(&inner.slots)
            .try_acquire_owned()
            .map_err(|_| Refusal::ListenerFull)?;
        let descriptor = Arc::clone(&inner.descriptors)
            .try_acquire_owned()
            .map_err(|_| Refusal::Descriptors)?;
        if peer != Peer::Anyone && !lock(&inner.connections).take(peer) {
            return Err(Refusal::PeerFull);
        }
        inner.metrics.api_connection_opened(inner.listener);
        Ok(Lease {
            connection: Arc::new(Connection {
                gate: self.clone(),
                peer,
                streams: AtomicUsize::new(0),
                had_stream: AtomicBool::new(false),
                cut: AtomicBool::new(false),
                quiet_since: Mutex::new(Instant::now()),
            }),
            _slot: slot,
            _descriptor: descriptor,
        })
    }

    /// Logs and counts a refusal: the first of a kind at once, the others summed.
    fn refused(&self, what: &'static str, refusal: Refusal, peer: Peer) {
        let inner = &self.0;
        inner
            .metrics
            .api_refused(inner.listener, what, refusal.name());
        if let Some(before) = lock(&inner.quiet).speak((what, refusal.name()), Instant::now()) {
            warn!(
                listener = inner.listener,
                ?peer,
                reason = refusal.name(),
                refused_since_last_said = before,
                limits = ?inner.limits,
                "API {what} refused"
            );
        }
    }

    /// A unix socket peer the allow-list refused (`credentials`: its uid, gid and pid, or why
    /// they could not be read): counted per connection, logged once per burst per uid.
    pub fn refused_peer(&self, credentials: Result<(u32, u32, Option<i32>), &std::io::Error>) {
        let inner = &self.0;
        let refusal = Refusal::NotAllowed;
        inner
            .metrics
            .api_refused(inner.listener, "connection", refusal.name());
        let uid = credentials.as_ref().ok().map(|(uid, _, _)| *uid);
        let Some(before) = lock(&inner.quiet_peers).speak((uid, refusal.name()), Instant::now())
        else {
            return;
        };
        match credentials {
            Ok((uid, gid, pid)) => warn!(
                uid,
                gid,
                ?pid,
                refused_since_last_said = before,
                "API client refused: neither its uid nor its gid is in api-allow-uids or \
                 api-allow-gids; connection closed"
            ),
            Err(error) => warn!(
                %error,
                refused_since_last_said = before,
                "API client refused: cannot read its credentials; connection closed"
            ),
        }
    }

    /// Logs an accept that failed (out of descriptors, the kernel short of memory), once per
    /// burst, and counts it.
    pub fn accept_failed(&self, error: &std::io::Error) {
        let inner = &self.0;
        inner
            .metrics
            .api_refused(inner.listener, "connection", "accept-error");
        if let Some(before) =
            lock(&inner.quiet).speak(("connection", "accept-error"), Instant::now())
        {
            warn!(
                listener = inner.listener,
                %error,
                failed_since_last_said = before,
                "API listener: accept failed; retrying"
            );
        }
    }
}

/// What an admitted connection holds; given back when dropped.
#[derive(Debug)]
pub struct Lease {
    pub connection: Arc<Connection>,
    _slot: OwnedSemaphorePermit,
    _descriptor: OwnedSemaphorePermit,
}

/// An admitted connection as the gRPC layer sees it (in each request's extensions).
#[derive(Debug)]
pub struct Connection {
    gate: Gate,
    peer: Peer,
    streams: AtomicUsize,
    had_stream: AtomicBool,
    /// Closed by plegd for want of a stream (counted then, not again when it ends).
    cut: AtomicBool,
    /// Since when it has had no stream (its accept, before the first).
    quiet_since: Mutex<Instant>,
}

impl Connection {
    /// One more RPC on this connection, unless its peer holds its share.
    pub fn open_stream(self: &Arc<Self>) -> Result<StreamGuard, Refusal> {
        let inner = &self.gate.0;
        if self.peer != Peer::Anyone && !lock(&inner.streams).take(self.peer) {
            self.gate.refused("stream", Refusal::PeerFull, self.peer);
            return Err(Refusal::PeerFull);
        }
        self.streams.fetch_add(1, Ordering::Relaxed);
        self.had_stream.store(true, Ordering::Relaxed);
        Ok(StreamGuard(Arc::clone(self)))
    }

    /// Input of this connection refused for `refusal` (`what`: a frame, a header block, a
    /// request): counted, and logged once per burst.
    pub fn refuse(&self, what: &'static str, refusal: Refusal) {
        self.gate.refused(what, refusal, self.peer);
    }

    /// When it must be closed if it still has no stream then; `None` while it has one.
    pub fn deadline(&self) -> Option<Instant> {
        if self.streams.load(Ordering::Relaxed) > 0 {
            return None;
        }
        let since = *lock(&self.quiet_since);
        Some(
            since
                + if self.had_stream.load(Ordering::Relaxed) {
                    IDLE_LIMIT
                } else {
                    FIRST_STREAM_DEADLINE
                },
        )
    }

    /// The connection is closed for having no stream past its deadline.
    pub fn closed_quiet(&self) {
        let reason = if self.had_stream.load(Ordering::Relaxed) {
            "idle"
        } else {
            "no-first-stream"
        };
        self.cut.store(true, Ordering::Relaxed);
        let inner = &self.gate.0;
        inner.metrics.api_closed(inner.listener, reason);
    }

    /// The peers' RPCs in flight.
    #[cfg(test)]
    pub fn streams_of_peer(&self) -> usize {
        lock(&self.gate.0.streams).of(&self.peer)
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let connection = &self.connection;
        let inner = &connection.gate.0;
        if connection.peer != Peer::Anyone {
            lock(&inner.connections).give(&connection.peer);
        }
        // A flood of connections that never call shows here, whoever ended them: a TLS
        // handshake past its deadline or failed, a preface refused, a peer gone.
        if !connection.had_stream.load(Ordering::Relaxed) && !connection.cut.load(Ordering::Relaxed)
        {
            inner.metrics.api_closed(inner.listener, "no-call");
        }
        inner.metrics.api_connection_closed(inner.listener);
    }
}

/// An RPC in flight on a connection; ends it when dropped (with its response body).
#[derive(Debug)]
pub struct StreamGuard(Arc<Connection>);

impl Drop for StreamGuard {
    fn drop(&mut self) {
        let connection = &self.0;
        if connection.peer != Peer::Anyone {
            lock(&connection.gate.0.streams).give(&connection.peer);
        }
        if connection.streams.fetch_sub(1, Ordering::Relaxed) == 1 {
            *lock(&connection.quiet_since) = Instant::now();
        }
    }
}

/// A `tower` layer over the gRPC services: each request takes a stream of its connection
/// ([`Connection::open_stream`]) for as long as its response body lives, or is answered
/// `RESOURCE_EXHAUSTED` at once.
#[derive(Clone, Copy, Debug, Default)]
pub struct StreamLayer;

impl<S> tower::Layer<S> for StreamLayer {
    type Service = Streams<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Streams { inner }
    }
}

/// [`StreamLayer`]'s service.
#[derive(Clone, Debug)]
pub struct Streams<S> {
    inner: S,
}

type BoxFuture<T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send>>;

impl<S, B> tower::Service<http::Request<B>> for Streams<S>
where
    S: tower::Service<
            http::Request<tonic::body::Body>,
            Response = http::Response<tonic::body::Body>,
        >,
    S::Future: Send + 'static,
    B: hyper::body::Body<Data = hyper::body::Bytes> + Send + Unpin + 'static,
    B::Error: Into<tonic::codegen::StdError>,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let connection = connection_of(request.extensions());
        let guard = match connection.as_ref().map(|c| c.open_stream()) {
            Some(Err(refusal)) => {
                let status = tonic::Status::resource_exhausted(format!(
                    "{}: this peer holds its share of the API's streams (api-max-streams-per-peer)",
                    refusal.name()
                ));
                return Box::pin(async move { Ok(status.into_http()) });
            }
            Some(Ok(guard)) => Some(guard),
            None => None,
        };
        let request = request.map(|body| {
            tonic::body::Body::new(Bounded {
                body,
                messages: Messages::default(),
                connection,
            })
        });
        let response = self.inner.call(request);
        Box::pin(async move {
            let response = response.await?;
            Ok(match guard {
                Some(guard) => response.map(|body| {
                    tonic::body::Body::new(Guarded {
                        body,
                        _guard: guard,
                    })
                }),
                None => response,
            })
        })
    }
}

/// The admitted connection a request came on, from its connect info (unix socket or TLS).
pub(crate) fn connection_of(extensions: &http::Extensions) -> Option<Arc<Connection>> {
    use tonic::transport::server::TlsConnectInfo;
    extensions
        .get::<Admitted>()
        .or_else(|| {
            extensions
                .get::<TlsConnectInfo<Admitted>>()
                .map(TlsConnectInfo::get_ref)
        })
        .and_then(|admitted| admitted.0.clone())
}

/// The connect info of an admitted connection: its lease's connection, where it has one.
#[derive(Clone, Debug, Default)]
pub struct Admitted(pub Option<Arc<Connection>>);

/// Where a request body stands in its gRPC messages: each a 5-byte prefix (a compression
/// flag and a big-endian length) and that many bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Messages {
    /// Prefix bytes read of the next message (up to 5), and its length so far.
    prefix: usize,
    length: usize,
    /// Bytes of the current message still to come.
    rest: usize,
}

impl Messages {
    /// Follows `data`; the length of a message longer than [`MAX_REQUEST`], as soon as its
    /// prefix has come.
    fn follow(&mut self, mut data: &[u8]) -> Result<(), usize> {
        while let Some((&byte, after)) = data.split_first() {
            if self.rest > 0 {
                let n = self.rest.min(data.len());
                self.rest -= n;
                data = &data[n..];
                continue;
            }
            // The flag, then the four length bytes.
            if self.prefix > 0 {
                self.length = self.length << 8 | usize::from(byte);
            }
            self.prefix += 1;
            data = after;
            if self.prefix == 5 {
                if self.length > MAX_REQUEST {
                    return Err(self.length);
                }
                (self.rest, self.prefix, self.length) = (self.length, 0, 0);
            }
        }
        Ok(())
    }
}

/// A request body whose gRPC messages are held to [`MAX_REQUEST`]: one announced longer ends
/// the body with RESOURCE_EXHAUSTED (the RPC's answer), counted against its connection.
struct Bounded<B> {
    body: B,
    messages: Messages,
    connection: Option<Arc<Connection>>,
}

impl<B> hyper::body::Body for Bounded<B>
where
    B: hyper::body::Body<Data = hyper::body::Bytes> + Unpin,
    B::Error: Into<tonic::codegen::StdError>,
{
    type Data = hyper::body::Bytes;
    type Error = tonic::codegen::StdError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        let this = &mut *self;
        let frame = match std::task::ready!(std::pin::Pin::new(&mut this.body).poll_frame(cx)) {
            Some(Ok(frame)) => frame,
            Some(Err(e)) => return Poll::Ready(Some(Err(e.into()))),
            None => return Poll::Ready(None),
        };
        if let Some(data) = frame.data_ref()
            && let Err(length) = this.messages.follow(data)
        {
            if let Some(connection) = &this.connection {
                connection.refuse("request", Refusal::TooLarge);
            }
            let status = tonic::Status::resource_exhausted(format!(
                "a request message of {length} bytes; plegd takes at most {MAX_REQUEST}"
            ));
            return Poll::Ready(Some(Err(Box::new(status))));
        }
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

/// A response body that holds its RPC's stream until it is done.
struct Guarded {
    body: tonic::body::Body,
    _guard: StreamGuard,
}

impl hyper::body::Body for Guarded {
    type Data = hyper::body::Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        std::pin::Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests;
