//! Where the API is served: the unix socket (always), TCP with TLS (optional), the metrics
//! HTTP listener (optional); and grpc.health.v1 kept in step with the PLEG's health.
//!
//! Everything is bound by [`Listeners::bind`] before the daemon starts, so a socket in use or
//! a bad certificate stops `plegd run` at once; [`Listeners::serve`] then serves until shutdown.
//! Binding needs no async runtime: `plegd run` binds before it drops its capabilities and
//! starts the runtime's threads (see `capabilities`).
//!
//! The unix socket is opened as wide as its allow-list needs and no wider (see
//! [`PeerAllowList`]); each connection's credentials are checked before any gRPC. What each
//! listener's peers may hold is bounded by [`Gate`]s (see [`crate::api::admission`]).

use std::{
    future::Future,
    io::ErrorKind,
    net::SocketAddr,
    os::unix::fs::{DirBuilderExt as _, FileTypeExt as _, MetadataExt as _, PermissionsExt as _},
    path::{Path, PathBuf},
    pin::Pin,
    sync::Arc,
    time::Duration,
};

use futures::Stream;
use http_body_util::Full;
use hyper::{Method, StatusCode, body::Bytes};
use plegd_proto::v1::pleg_server::PlegServer;
use tokio::{
    net::{TcpListener, UnixListener},
    sync::Semaphore,
};
use tokio_util::sync::CancellationToken;
use tonic::{
    server::NamedService,
    service::Routes,
    transport::{Certificate, Identity, Server, ServerTlsConfig},
};
use tonic_health::{
    ServingStatus,
    pb::health_server::{Health, HealthServer},
    server::HealthReporter,
};
use tracing::{debug, info, warn};

pub use crate::config::DEFAULT_SOCKET;
use crate::{
    api::{
        Shared,
        admission::{
            Gate, HANDSHAKE_DEADLINE, KEEPALIVE_INTERVAL, KEEPALIVE_TIMEOUT, Lease, Limits,
            MAX_FRAME, MAX_HEADER_LIST, MAX_REQUEST, Peer, RECEIVE_WINDOW, StreamLayer,
        },
        authority::AuthorityFix,
        cut::Cuttable,
        peers::{PeerAllowList, SocketAccess},
        server::PlegService,
    },
    base::fds,
    config::Config,
};

/// How long a listener waits after an accept failed for want of descriptors or memory
/// before it tries again.
const ACCEPT_PAUSE: Duration = Duration::from_millis(100);

/// The metrics listener's limits: scrapers are few, and each address (a Prometheus, a
/// kubelet's probes) holds an eighth of the listener at most, so that no one of them starves
/// the others.
pub const METRICS_LIMITS: Limits = Limits {
    connections: 64,
    connections_per_peer: 8,
    streams_per_peer: 8,
};

/// How long a metrics client may take to send a request's headers: scrapers and probes send
/// them at once. A connection past it is closed (`plegd_api_closed_total{reason=
/// "header-deadline"}`).
pub const METRICS_HEADER_DEADLINE: Duration = Duration::from_secs(5);

/// How often grpc.health.v1 statuses follow the PLEG's health.
const HEALTH_UPDATE_PERIOD: Duration = Duration::from_secs(1);

/// How long shutdown waits for watch streams to deliver their final status before cutting the
/// connections of watchers that stopped reading.
pub const DRAIN_GRACE: Duration = Duration::from_secs(3);

/// The gRPC service name, as grpc.health.v1 and clients know it.
pub const SERVICE_NAME: &str = <PlegServer<PlegService> as NamedService>::NAME;

/// The API cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    #[error("creating the socket directory {path}: {source}")]
    SocketDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "the socket directory {path} (mode {mode:04o}, group {gid}) does not let the allowed \
         peers reach the socket: it needs mode {needed:04o}{group_hint}, or remove it and plegd \
         creates it so"
    )]
    SocketDirTooNarrow {
        path: PathBuf,
        mode: u32,
        gid: u32,
        needed: u32,
        group_hint: String,
    },
    #[error("{path} is in use by a running plegd (or another server)")]
    InUse { path: PathBuf },
    #[error("{path} exists and is not a socket; not removing it")]
    NotASocket { path: PathBuf },
    #[error("binding {what} {address}: {source}")]
    Bind {
        what: &'static str,
        address: String,
        #[source]
        source: std::io::Error,
    },
    #[error("reading {path}: {source}")]
    ReadTls {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("TLS configuration: {0}")]
    Tls(#[source] tonic::transport::Error),
}

/// A server stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("registering the listener of {what}: {source}")]
    Register {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("gRPC server on {what}: {source}")]
    Grpc {
        what: String,
        #[source]
        source: tonic::transport::Error,
    },
    #[error("describing the API for gRPC reflection: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
}

/// The API's bound listeners.
#[derive(Debug)]
pub struct Listeners {
    unix: std::os::unix::net::UnixListener,
    socket: PathBuf,
    peers: PeerAllowList,
    tcp: Option<(std::net::TcpListener, ServerTlsConfig)>,
    metrics: Option<std::net::TcpListener>,
    limits: Limits,
}

impl Listeners {
    /// Binds the unix socket (modes from the allow-list, see [`PeerAllowList::access`]; a
    /// stale socket removed), the TLS listener and the metrics listener that `config` asks
    /// for.
    pub fn bind(config: &Config) -> Result<Self, BindError> {
        let peers = PeerAllowList::new(
            config.api_allow_uids.iter().copied(),
            config.api_allow_gids.iter().copied(),
        );
        // The TLS files are checked first and the TCP ports bound before the socket: a failure
        // leaves nothing behind.
        let tcp = match config.listen {
            Some(address) => {
                let tls = tls_config(config)?;
                if config.tls_client_ca.is_none() {
                    warn!(
                        %address,
                        "the TLS listener serves every call, every pod's events and statuses, \
                         to any client that reaches it, with no certificate asked \
                         (tls-allow-unauthenticated-clients); give tls-client-ca to ask for one"
                    );
                }
                Some((bind_tcp("the gRPC TCP address", address)?, tls))
            }
            None => None,
        };
        let metrics = match config.metrics_address {
            Some(address) => Some(bind_tcp("the metrics address", address)?),
            None => None,
        };
        let access = peers.access(nix::unistd::geteuid().as_raw());
        Ok(Self {
            unix: bind_unix(&config.socket, access)?,
            socket: config.socket.clone(),
            peers,
            tcp,
            metrics,
            limits: config.api_limits,
        })
    }

    /// The metrics listener's address (with the port chosen when 0 was asked for).
    pub fn metrics_address(&self) -> Option<SocketAddr> {
        self.metrics.as_ref().and_then(|l| l.local_addr().ok())
    }

    /// The TLS gRPC listener's address.
    pub fn tcp_address(&self) -> Option<SocketAddr> {
        self.tcp.as_ref().and_then(|(l, _)| l.local_addr().ok())
    }

    /// Serves the API of `shared` until `shutdown`; ends every watch stream (UNAVAILABLE)
    /// then, cuts the connections still open [`DRAIN_GRACE`] later, and removes the socket.
    pub async fn serve(
        self,
        shared: Shared,
        shutdown: CancellationToken,
    ) -> Result<(), ServeError> {
        // Registered with the runtime first: a failure leaves no task behind.
        let socket_name = self.socket.display().to_string();
        let unix = register_unix(self.unix, &socket_name)?;
        let tcp = self
            .tcp
            .map(|(listener, tls)| Ok::<_, ServeError>((register_tcp(listener)?, tls)))
            .transpose()?;
        let metrics = self.metrics.map(register_tcp).transpose()?;
        // Every listener's connections together leave plegd the descriptors it keeps.
        let soft = fds::raise_nofile_limit();
        let budget = fds::api_budget(soft);
        let descriptors = Arc::new(Semaphore::new(budget));
        let gate = |listener, limits| {
            Gate::new(
                listener,
                limits,
                Arc::clone(&descriptors),
                shared.metrics.clone(),
            )
        };
        let (unix_gate, tls_gate) = (gate("unix", self.limits), gate("tls", self.limits));
        let metrics_gate = gate("metrics", METRICS_LIMITS);
        info!(
            open_file_limit = soft,
            api_descriptors = budget,
            reserved = fds::RESERVED,
            limits = ?self.limits,
            "API limits"
        );
        let (reporter, health) = tonic_health::server::health_reporter();
        let health_task = tokio::spawn(drive_grpc_health(
            reporter,
            shared.clone(),
            shutdown.clone(),
        ));
        let metrics_task = metrics.map(|listener| {
            tokio::spawn(serve_metrics(
                listener,
                metrics_gate,
                shared.clone(),
                shutdown.clone(),
            ))
        });
        let served = Served {
            routes: routes(health, PlegServer::new(PlegService::new(shared.clone())))?,
            stopping: stopping(&shared),
            cut: CancellationToken::new(),
        };
        info!(socket = %socket_name, "serving the plegd.v1 API");
        let (unix, tcp) = tokio::select! {
            served = async {
                tokio::join!(
                    served.unix(unix, self.peers, unix_gate),
                    served.tls(tcp, tls_gate),
                )
            } => served,
            never = served.cut_stragglers(&shutdown) => match never {},
        };
        if let Err(e) = std::fs::remove_file(&self.socket)
            && e.kind() != ErrorKind::NotFound
        {
            warn!(socket = %self.socket.display(), error = %e, "cannot remove the API socket");
        }
        health_task.abort();
        if let Some(task) = metrics_task {
            let _ = task.await;
        }
        unix.map_err(|source| ServeError::Grpc {
            what: socket_name,
            source,
        })?;
        tcp
    }
}

/// Resolves once serving is to stop: when the PLEG's events close.
type Stopping = futures::future::Shared<Pin<Box<dyn Future<Output = ()> + Send>>>;

/// Watch streams end when the events close: the daemon closes them once the generator has
/// stopped and every event is published, so watchers get them all before UNAVAILABLE.
fn stopping(shared: &Shared) -> Stopping {
    let events = shared.pleg.events().clone();
    futures::FutureExt::shared(Box::pin(async move { events.closed().await }))
}

/// Every gRPC service of the API's listeners: plegd.v1, grpc.health.v1, and server reflection
/// describing both, as v1 and as v1alpha (grpcurl before 1.8.8, and other tools built on older
/// grpc-go, speak only v1alpha): generic clients need no .proto file.
fn routes<H: Health>(
    health: HealthServer<H>,
    service: PlegServer<PlegService>,
) -> Result<Routes, tonic_reflection::server::Error> {
    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(plegd_proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    // Each also held to MAX_REQUEST by tonic: StreamLayer refuses a longer message first
    // (RESOURCE_EXHAUSTED, counted), this is what stands should a request come another way.
    Ok(Routes::new(health.max_decoding_message_size(MAX_REQUEST))
        .add_service(service.max_decoding_message_size(MAX_REQUEST))
        .add_service(
            reflection()
                .build_v1()?
                .max_decoding_message_size(MAX_REQUEST),
        )
        .add_service(
            reflection()
                .build_v1alpha()?
                .max_decoding_message_size(MAX_REQUEST),
        ))
}

/// What every gRPC listener serves, and how it stops.
struct Served {
    routes: Routes,
    stopping: Stopping,
    /// Cuts the connections still open after the drain.
    cut: CancellationToken,
}

impl Served {
    /// The unix socket: a refused peer's connection is dropped before any gRPC.
    async fn unix(
        &self,
        unix: UnixListener,
        peers: PeerAllowList,
        gate: Gate,
    ) -> Result<(), tonic::transport::Error> {
        let incoming = admitted(gate, self.cut.clone(), (unix, peers), |io, lease| {
            AuthorityFix::new(io, Some(Arc::clone(&lease.connection)))
        });
        grpc_server()
            .layer(StreamLayer)
            .add_routes(self.routes.clone())
            .serve_with_incoming_shutdown(incoming, self.stopping.clone())
            .await
    }

    /// TCP with TLS, where configured.
    async fn tls(
        &self,
        tcp: Option<(TcpListener, ServerTlsConfig)>,
        gate: Gate,
    ) -> Result<(), ServeError> {
        let Some((listener, tls)) = tcp else {
            return Ok(());
        };
        let address = listener
            .local_addr()
            .map_or_else(|_| "tcp".to_owned(), |a| a.to_string());
        info!(%address, "serving the plegd.v1 API over TLS");
        let grpc = |source| ServeError::Grpc {
            what: address.clone(),
            source,
        };
        grpc_server()
            .tls_config(tls.timeout(HANDSHAKE_DEADLINE))
            .map_err(grpc)?
            .layer(StreamLayer)
            .add_routes(self.routes.clone())
            .serve_with_incoming_shutdown(
                admitted(gate, self.cut.clone(), listener, |io, _| io),
                self.stopping.clone(),
            )
            .await
            .map_err(grpc)
    }

    /// After shutdown and [`DRAIN_GRACE`], cuts the connections of watchers that stopped
    /// reading. Never returns.
    async fn cut_stragglers(&self, shutdown: &CancellationToken) -> std::convert::Infallible {
        shutdown.cancelled().await;
        tokio::time::sleep(DRAIN_GRACE).await;
        warn!(
            grace = ?DRAIN_GRACE,
            "watchers that stopped reading kept their streams open; cutting their connections"
        );
        self.cut.cancel();
        std::future::pending().await
    }
}

/// The unix listener, registered with the async runtime.
fn register_unix(
    listener: std::os::unix::net::UnixListener,
    name: &str,
) -> Result<UnixListener, ServeError> {
    let register = |source| ServeError::Register {
        what: name.to_owned(),
        source,
    };
    listener.set_nonblocking(true).map_err(register)?;
    UnixListener::from_std(listener).map_err(register)
}

/// Every gRPC listener's server: HTTP/2 pings end the connections of peers that are gone;
/// frames, header lists and request bodies in flight bounded as
/// [`crate::api::admission`] says.
fn grpc_server() -> Server {
    Server::builder()
        .http2_keepalive_interval(Some(KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(KEEPALIVE_TIMEOUT))
        .max_frame_size(MAX_FRAME)
        .http2_max_header_list_size(MAX_HEADER_LIST)
        .initial_stream_window_size(RECEIVE_WINDOW)
        .initial_connection_window_size(RECEIVE_WINDOW)
}

/// A listener whose accepted connections come with their peer.
trait Accept: Send + 'static {
    type Io: Send + 'static;
    /// The next connection and its peer; `None` for one refused before admission (counted by
    /// `gate`).
    fn accept_peer(
        &self,
        gate: &Gate,
    ) -> impl Future<Output = std::io::Result<Option<(Self::Io, Peer)>>> + Send;
}

impl Accept for (UnixListener, PeerAllowList) {
    type Io = tokio::net::UnixStream;

    async fn accept_peer(&self, gate: &Gate) -> std::io::Result<Option<(Self::Io, Peer)>> {
        let (io, _) = self.0.accept().await?;
        Ok(allowed_uid(&self.1, &io, gate).map(|uid| (io, Peer::Uid(uid))))
    }
}

impl Accept for TcpListener {
    type Io = tokio::net::TcpStream;

    async fn accept_peer(&self, _: &Gate) -> std::io::Result<Option<(Self::Io, Peer)>> {
        let (io, address) = self.accept().await?;
        Ok(Some((io, Peer::Address(address.ip()))))
    }
}

/// The connections of `listener` as a server takes them: each admitted by `gate` (a refused
/// one is closed at once), wrapped by `wrap` (with its lease) and made [`Cuttable`]. An accept that fails (out
/// of descriptors, the kernel short of memory) is counted, logged once per burst and tried
/// again after [`ACCEPT_PAUSE`]: it never ends the server.
fn admitted<L: Accept, W: Send + 'static>(
    gate: Gate,
    cut: CancellationToken,
    listener: L,
    wrap: fn(L::Io, &Lease) -> W,
) -> impl Stream<Item = std::io::Result<Cuttable<W>>> + Send + 'static {
    futures::stream::unfold(listener, move |listener| {
        let (gate, cut) = (gate.clone(), cut.clone());
        async move {
            loop {
                match listener.accept_peer(&gate).await {
                    Ok(Some((io, peer))) => {
                        if let Ok(lease) = gate.admit(peer) {
                            let io = wrap(io, &lease);
                            return Some((Ok(Cuttable::new(io, &cut, Some(lease))), listener));
                        }
                    }
                    Ok(None) => {}
                    // The peer gave up before its accept: nothing to count.
                    Err(e)
                        if matches!(
                            e.kind(),
                            ErrorKind::ConnectionAborted
                                | ErrorKind::ConnectionReset
                                | ErrorKind::Interrupted
                        ) => {}
                    Err(e) => {
                        gate.accept_failed(&e);
                        tokio::time::sleep(ACCEPT_PAUSE).await;
                    }
                }
            }
        }
    })
}

/// The uid of a new unix socket peer if it is allowed; a refused one is counted, and logged
/// with its credentials once per burst (by `gate`).
fn allowed_uid(peers: &PeerAllowList, io: &tokio::net::UnixStream, gate: &Gate) -> Option<u32> {
    match io.peer_cred() {
        Ok(peer) if peers.allows(peer.uid(), peer.gid()) => {
            debug!(uid = peer.uid(), gid = peer.gid(), pid = ?peer.pid(), "API client accepted");
            Some(peer.uid())
        }
        Ok(peer) => {
            gate.refused_peer(Ok((peer.uid(), peer.gid(), peer.pid())));
            None
        }
        Err(error) => {
            gate.refused_peer(Err(&error));
            None
        }
    }
}

/// A TCP listener bound the way tokio binds (`SO_REUSEADDR`, so a restarted plegd gets its
/// port back while old connections linger in TIME_WAIT), without needing its runtime.
fn bind_tcp(what: &'static str, address: SocketAddr) -> Result<std::net::TcpListener, BindError> {
    use socket2::{Domain, Socket, Type};
    let bind = || -> std::io::Result<std::net::TcpListener> {
        let socket = Socket::new(Domain::for_address(address), Type::STREAM, None)?;
        socket.set_reuse_address(true)?;
        socket.bind(&address.into())?;
        socket.listen(1024)?;
        Ok(socket.into())
    };
    bind().map_err(|source| BindError::Bind {
        what,
        address: address.to_string(),
        source,
    })
}

fn register_tcp(listener: std::net::TcpListener) -> Result<TcpListener, ServeError> {
    let what = listener
        .local_addr()
        .map_or_else(|_| "tcp".to_owned(), |a| a.to_string());
    listener
        .set_nonblocking(true)
        .and_then(|()| TcpListener::from_std(listener))
        .map_err(|source| ServeError::Register { what, source })
}

/// Makes the socket's directory as `access` says if it is missing; an existing one is left
/// as it is (it may be shared, `/run` or `/tmp`) but must let the allowed peers through.
fn socket_dir(dir: &Path, access: SocketAccess) -> Result<(), BindError> {
    let dir_error = |source| BindError::SocketDir {
        path: dir.to_owned(),
        source,
    };
    match std::fs::metadata(dir) {
        Ok(meta) => {
            let mode = meta.mode() & 0o7777;
            if access.directory_lets_peers_through(mode, meta.gid()) {
                return Ok(());
            }
            Err(BindError::SocketDirTooNarrow {
                path: dir.to_owned(),
                mode,
                gid: meta.gid(),
                needed: access.dir_mode,
                group_hint: access
                    .group
                    .map(|g| format!(" with group {g}"))
                    .unwrap_or_default(),
            })
        }
        Err(_) => {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(dir_error)?;
            // Set after creation: the umask may have narrowed the mode asked for.
            std::os::unix::fs::chown(dir, None, access.group).map_err(dir_error)?;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(access.dir_mode))
                .map_err(dir_error)
        }
    }
}

fn bind_unix(
    path: &Path,
    access: SocketAccess,
) -> Result<std::os::unix::net::UnixListener, BindError> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        socket_dir(dir, access)?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(meta) if !meta.file_type().is_socket() => {
            return Err(BindError::NotASocket {
                path: path.to_owned(),
            });
        }
        Ok(_) => {
            // Someone answering means a live server; a refused connection, a stale socket.
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                return Err(BindError::InUse {
                    path: path.to_owned(),
                });
            }
            info!(socket = %path.display(), "removing a stale socket");
            let _ = std::fs::remove_file(path);
        }
        Err(_) => {}
    }
    let bind_error = |source| BindError::Bind {
        what: "the API socket",
        address: path.display().to_string(),
        source,
    };
    // Bound under a temporary name, given its group and mode, then renamed: never reachable
    // with other permissions.
    let mut temporary = path.as_os_str().to_owned();
    temporary.push(format!(".{}.tmp", std::process::id()));
    let temporary = PathBuf::from(temporary);
    let _ = std::fs::remove_file(&temporary);
    let listener = std::os::unix::net::UnixListener::bind(&temporary).map_err(bind_error)?;
    std::os::unix::fs::chown(&temporary, None, access.group)
        .and_then(|()| {
            std::fs::set_permissions(
                &temporary,
                std::fs::Permissions::from_mode(access.socket_mode),
            )
        })
        .and_then(|()| std::fs::rename(&temporary, path))
        .map_err(|e| {
            let _ = std::fs::remove_file(&temporary);
            bind_error(e)
        })?;
    Ok(listener)
}

fn tls_config(config: &Config) -> Result<ServerTlsConfig, BindError> {
    let read = |path: &Path| {
        std::fs::read(path).map_err(|source| BindError::ReadTls {
            path: path.to_owned(),
            source,
        })
    };
    // Validation made sure both are given with --listen.
    let (Some(cert), Some(key)) = (&config.tls_cert, &config.tls_key) else {
        return Err(BindError::ReadTls {
            path: PathBuf::from("--tls-cert/--tls-key"),
            source: std::io::Error::new(ErrorKind::NotFound, "not given"),
        });
    };
    let mut tls = ServerTlsConfig::new().identity(Identity::from_pem(read(cert)?, read(key)?));
    if let Some(ca) = &config.tls_client_ca {
        // Clients must then present a certificate signed by this CA (mTLS).
        tls = tls.client_ca_root(Certificate::from_pem(read(ca)?));
    }
    // Building the acceptor checks the PEM files now rather than at the first connection.
    Server::builder()
        .tls_config(tls.clone())
        .map_err(BindError::Tls)?;
    Ok(tls)
}

/// Who may reach the API's network listeners, as `plegd check` shows it: (subject, whether
/// that is as it should be, what).
pub fn exposure(config: &Config) -> Vec<(&'static str, bool, String)> {
    let mut lines = Vec::new();
    if let Some(address) = config.listen {
        lines.push(match config.tls_client_ca {
            Some(_) => (
                "TLS listener",
                true,
                format!("{address}: clients need a certificate tls-client-ca signed"),
            ),
            None => (
                "TLS listener",
                false,
                format!(
                    "{address}: serves every call to any client, no certificate asked \
                     (tls-allow-unauthenticated-clients)"
                ),
            ),
        });
    }
    if let Some(address) = config.metrics_address {
        let whom = if address.ip().is_loopback() {
            "this host"
        } else {
            "whoever reaches it (every pod's per-container counters)"
        };
        lines.push((
            "metrics listener",
            true,
            format!("{address}: /metrics, /healthz and /readyz to {whom}"),
        ));
    }
    lines
}

/// Keeps grpc.health.v1 services "" and "plegd.v1.Pleg" SERVING while the PLEG is healthy,
/// NOT_SERVING otherwise: SERVING from the relist that makes it healthy (as `GetHealth` says),
/// NOT_SERVING within a period of it going stale.
async fn drive_grpc_health(reporter: HealthReporter, shared: Shared, shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(HEALTH_UPDATE_PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut successes = shared.pleg.health().successes();
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = tick.tick() => {}
            Ok(()) = successes.changed() => {}
        }
        let status = match shared.pleg.healthy() {
            Ok(()) => ServingStatus::Serving,
            Err(_) => ServingStatus::NotServing,
        };
        for service in ["", SERVICE_NAME] {
            reporter.set_service_status(service, status).await;
        }
    }
}

/// `/metrics`, `/healthz` and `/readyz` over HTTP/1.1.
async fn serve_metrics(
    listener: TcpListener,
    gate: Gate,
    shared: Shared,
    shutdown: CancellationToken,
) {
    use futures::StreamExt as _;
    use tonic::transport::server::Connected as _;
    if let Ok(address) = listener.local_addr() {
        info!(%address, "serving /metrics, /healthz and /readyz");
    }
    let mut connections = tokio::task::JoinSet::new();
    // Cut only by their deadlines: shutdown ends their tasks.
    let mut incoming = std::pin::pin!(admitted(
        gate,
        CancellationToken::new(),
        listener,
        |io, _| io
    ));
    loop {
        let stream = tokio::select! {
            () = shutdown.cancelled() => break,
            Some(Ok(stream)) = incoming.next() => stream,
        };
        // Reap finished connections so the set stays small.
        while connections.try_join_next().is_some() {}
        let shared = shared.clone();
        let shutdown = shutdown.clone();
        let connection = stream.connect_info().0;
        let metrics = shared.metrics.clone();
        connections.spawn(async move {
            let service = hyper::service::service_fn(move |request| {
                // A request is the connection's stream while it is answered.
                let _stream = connection.as_ref().and_then(|c| c.open_stream().ok());
                let accept = request
                    .headers()
                    .get(hyper::header::ACCEPT)
                    .and_then(|v| v.to_str().ok());
                let format = crate::base::metrics::Format::negotiate(accept);
                let response =
                    http_response(&shared, request.method(), request.uri().path(), format);
                async move { Ok::<_, std::convert::Infallible>(response) }
            });
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(METRICS_HEADER_DEADLINE)
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
            tokio::select! {
                served = connection => {
                    if served.is_err_and(|e| e.is_timeout()) {
                        metrics.api_closed("metrics", "header-deadline");
                    }
                }
                () = shutdown.cancelled() => {}
            }
        });
    }
    connections.join_all().await;
}

/// The answer to one HTTP request; `/metrics` in `format` (negotiated from its `Accept`).
pub fn http_response(
    shared: &Shared,
    method: &Method,
    path: &str,
    format: crate::base::metrics::Format,
) -> hyper::Response<Full<Bytes>> {
    let reply = |status: StatusCode, content_type: &'static str, body: String| {
        let mut response = hyper::Response::new(Full::new(Bytes::from(body)));
        *response.status_mut() = status;
        response.headers_mut().insert(
            hyper::header::CONTENT_TYPE,
            hyper::header::HeaderValue::from_static(content_type),
        );
        response
    };
    const TEXT: &str = "text/plain; charset=utf-8";
    if method != Method::GET && method != Method::HEAD {
        return reply(StatusCode::METHOD_NOT_ALLOWED, TEXT, "GET only\n".into());
    }
    match path {
        "/metrics" => {
            refresh_snapshot(shared);
            reply(
                StatusCode::OK,
                format.content_type(),
                shared.metrics.encode_as(format),
            )
        }
        // Live: the process answers. Ready: the PLEG is healthy (kubelet's PLEG check, in the
        // words of kubelet's runtime state: "PLEG is not healthy: pleg was last seen ...").
        "/healthz" => reply(StatusCode::OK, TEXT, "ok\n".into()),
        "/readyz" => match shared.pleg.healthy() {
            Ok(()) => reply(StatusCode::OK, TEXT, "ok\n".into()),
            Err(e) => reply(
                StatusCode::SERVICE_UNAVAILABLE,
                TEXT,
                format!("PLEG is not healthy: {e}\n"),
            ),
        },
        _ => reply(
            StatusCode::NOT_FOUND,
            TEXT,
            "not found: try /metrics\n".into(),
        ),
    }
}

/// Sets the gauges that are read from the cache and the bus at scrape time.
fn refresh_snapshot(shared: &Shared) {
    use crate::pleg::ContainerState;
    let pods = shared.pleg.cache().pods();
    let mut containers = std::collections::BTreeMap::new();
    for record in pods.iter().filter_map(|(_, p)| p.record.as_ref()) {
        for container in record.containers.values() {
            let state = match container.state {
                ContainerState::Created => "created",
                ContainerState::Running => "running",
                ContainerState::Exited => "exited",
                ContainerState::Unknown => "unknown",
            };
            *containers.entry(state).or_insert(0) += 1;
        }
    }
    let live_pods = pods.iter().filter(|(_, p)| p.record.is_some()).count();
    shared.metrics.set_snapshot(
        shared.pleg.events().subscriber_count(),
        live_pods,
        &containers,
    );
    shared.forget_gone_pods();
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    #[tokio::test]
    async fn socket_is_0600_in_a_0700_directory_and_stale_sockets_are_replaced() {
        let root_only = PeerAllowList::new([nix::unistd::geteuid().as_raw()], []);
        let access = root_only.access(nix::unistd::geteuid().as_raw());
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run/plegd.sock");
        let listener = bind_unix(&path, access).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&path), 0o600);
        assert_eq!(mode(path.parent().unwrap()), 0o700);
        // In use while the listener lives.
        assert!(matches!(
            bind_unix(&path, access),
            Err(BindError::InUse { .. })
        ));
        drop(listener);
        // The file is left behind, as by a killed plegd: stale, replaced.
        assert!(path.exists());
        let _listener = bind_unix(&path, access).unwrap();

        let file = dir.path().join("file");
        std::fs::write(&file, "").unwrap();
        assert!(matches!(
            bind_unix(&file, access),
            Err(BindError::NotASocket { .. })
        ));
    }

    #[tokio::test]
    async fn an_allowed_group_gets_a_group_socket_and_a_directory_it_can_search() {
        let me = nix::unistd::geteuid().as_raw();
        // Root can give the socket any group: one nobody is in shows the chown happened.
        let group = if nix::unistd::geteuid().is_root() {
            4242
        } else {
            nix::unistd::getegid().as_raw()
        };
        let access = PeerAllowList::new([me], [group]).access(me);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run/plegd.sock");
        let _listener = bind_unix(&path, access).unwrap();
        let meta = |p: &Path| std::fs::metadata(p).unwrap();
        assert_eq!(
            (meta(&path).mode() & 0o777, meta(&path).gid()),
            (0o660, group)
        );
        let parent = path.parent().unwrap();
        assert_eq!(
            (meta(parent).mode() & 0o777, meta(parent).gid()),
            (0o710, group)
        );
        // An existing directory that would stop the group is refused, not changed.
        let narrow = dir.path().join("narrow");
        std::fs::create_dir(&narrow).unwrap();
        std::fs::set_permissions(&narrow, std::fs::Permissions::from_mode(0o700)).unwrap();
        let error = bind_unix(&narrow.join("plegd.sock"), access).unwrap_err();
        assert!(
            matches!(error, BindError::SocketDirTooNarrow { .. }),
            "{error}"
        );
        assert_eq!(meta(&narrow).mode() & 0o777, 0o700);
    }

    #[test]
    fn tls_without_client_authentication_shows_as_not_ok() {
        let config = |ca: Option<&str>| {
            Config::load(&crate::config::RunArgs {
                listen: Some("0.0.0.0:9810".parse().unwrap()),
                tls_cert: Some("server.pem".into()),
                tls_key: Some("server.key".into()),
                tls_client_ca: ca.map(PathBuf::from),
                tls_allow_unauthenticated_clients: Some(true),
                metrics_address: Some("127.0.0.1:9809".parse().unwrap()),
                ..Default::default()
            })
            .unwrap()
        };
        let oks = |config: &Config| -> Vec<(&str, bool)> {
            exposure(config)
                .into_iter()
                .map(|(s, ok, _)| (s, ok))
                .collect()
        };
        assert_eq!(
            oks(&config(None)),
            [("TLS listener", false), ("metrics listener", true)]
        );
        assert_eq!(
            oks(&config(Some("ca.pem"))),
            [("TLS listener", true), ("metrics listener", true)]
        );
        let quiet = Config::load(&crate::config::RunArgs::default()).unwrap();
        assert!(exposure(&quiet).is_empty());
    }

    #[tokio::test]
    async fn a_failed_bind_leaves_no_socket_behind() {
        let dir = tempfile::tempdir().unwrap();
        let junk = dir.path().join("junk.pem");
        std::fs::write(&junk, "not a PEM").unwrap();
        let socket = dir.path().join("run/plegd.sock");
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let bad_tls = crate::config::RunArgs {
            listen: Some("127.0.0.1:0".parse().unwrap()),
            tls_cert: Some(junk.clone()),
            tls_key: Some(junk.clone()),
            tls_client_ca: Some(junk),
            ..Default::default()
        };
        let port_taken = crate::config::RunArgs {
            metrics_address: Some(taken.local_addr().unwrap()),
            ..Default::default()
        };
        for args in [bad_tls, port_taken] {
            let run = crate::config::RunArgs {
                socket: Some(socket.clone()),
                ..args
            };
            let config = Config::load(&run).unwrap();
            let error = Listeners::bind(&config).unwrap_err();
            assert!(
                matches!(error, BindError::Tls(_) | BindError::Bind { .. }),
                "{error:?}"
            );
            assert!(!socket.exists(), "{error}: the socket was left behind");
        }
    }
}
