//! Reaching the runtime at start: found (or given), connected, asked what it is; retried with
//! backoff while it is not there.

use std::{path::PathBuf, time::Duration};

use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::{
    base::backoff::{Backoff, Exponential},
    config::{
        Config,
        fit::{self, RuntimeInfo},
    },
    pleg::RuntimeError,
    runtime::{
        AnyRuntime, ConnectError, EndpointError, InvalidNamespace, RuntimeOptions,
        choice::{WELL_KNOWN_SOCKETS, detect, parse_endpoint},
        transport::with_causes,
    },
};

/// A start-up problem that retrying cannot fix.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Endpoint(#[from] EndpointError),
    #[error(transparent)]
    Namespace(#[from] InvalidNamespace),
}

/// A runtime reached by [`connect`], the socket it answers on (where the event sources
/// subscribe) and what it said it is.
#[derive(Clone, Debug)]
pub struct Connected {
    pub runtime: AnyRuntime,
    pub socket: PathBuf,
    pub info: RuntimeInfo,
}

impl Connected {
    /// The push sources that fit this runtime ([`fit::choose`]): `config` with only those,
    /// and why each push source runs or not. An error when `config` asks for one that would
    /// take events from other agents (`cri-events` on containerd before 2.0).
    pub fn fit_sources(&self, config: &Config) -> Result<(Config, fit::Plan), fit::Refused> {
        let plan = fit::choose(&self.info, &config.source_request())?;
        for (source, why) in &plan.why {
            info!(source = ?source, on = plan.runs(*source), "{why}");
        }
        Ok((config.clone().with_plan(&plan), plan))
    }
}

/// First wait between two attempts to reach the runtime at start, doubling after each.
const CONNECT_BACKOFF_BASE: Duration = Duration::from_secs(1);
/// Longest wait between two attempts to reach the runtime at start.
const CONNECT_BACKOFF_MAX: Duration = Duration::from_secs(30);

/// Finds and connects to the runtime, retrying with backoff while it is not there (a node's
/// runtime may start after plegd). Each failed attempt logs why. `Ok(None)`: shut down while
/// waiting.
pub async fn connect(
    config: &Config,
    shutdown: &CancellationToken,
) -> Result<Option<Connected>, StartError> {
    let options = RuntimeOptions {
        call_timeout: config.runtime_timeout,
        namespaces: config.namespaces.clone(),
        pod_metadata: config.pod_metadata.clone(),
        ..RuntimeOptions::default()
    };
    let mut backoff = Backoff::new(Exponential::doubling(
        CONNECT_BACKOFF_BASE,
        CONNECT_BACKOFF_MAX,
    ));
    loop {
        match try_connect(config, &options).await {
            Ok((runtime, socket)) => {
                let info = match runtime.version().await {
                    Ok(version) => {
                        info!(
                            endpoint = %socket.display(),
                            runtime = %version,
                            "connected to the runtime"
                        );
                        RuntimeInfo::from_version(&version.name, &version.version)
                    }
                    // Connected but not answering (yet): relists retry, and health reports an
                    // outage once it lasts past the threshold. A socket that is not a runtime's
                    // (an HTTP/1 server, a proxy) fails here with an HTTP/2 error that does not
                    // say so by itself.
                    Err(error) => {
                        warn!(
                            %error,
                            "the runtime socket accepted a connection but did not answer \
                             Version; if it is not a container runtime's (CRI or containerd) \
                             socket, fix --runtime-endpoint; relists will retry"
                        );
                        RuntimeInfo::Unknown {
                            why: format!("Version failed: {error}"),
                        }
                    }
                };
                return Ok(Some(Connected {
                    runtime,
                    socket,
                    info,
                }));
            }
            Err(Retry::Never(e)) => return Err(e),
            Err(Retry::After(unreachable)) => {
                let delay = backoff.next_delay();
                error!("cannot reach the runtime: {unreachable}; retrying in {delay:?}");
                tokio::select! {
                    () = shutdown.cancelled() => return Ok(None),
                    () = tokio::time::sleep(delay) => {}
                }
            }
        }
    }
}

enum Retry {
    Never(StartError),
    After(Unreachable),
}

/// Why the runtime cannot be reached yet; retried.
#[derive(Debug, thiserror::Error)]
enum Unreachable {
    #[error(transparent)]
    NoSocket(EndpointError),
    /// Shown with every cause: tonic's own text is often just "transport error".
    #[error("{}", with_causes(.0.to_string(), .0))]
    Runtime(RuntimeError),
}

async fn try_connect(
    config: &Config,
    options: &RuntimeOptions,
) -> Result<(AnyRuntime, PathBuf), Retry> {
    let socket = match &config.runtime_endpoint {
        Some(given) => parse_endpoint(given).map_err(|e| Retry::Never(e.into()))?,
        None => detect(&WELL_KNOWN_SOCKETS).map_err(|e| Retry::After(Unreachable::NoSocket(e)))?,
    };
    match AnyRuntime::connect(config.runtime, &socket, options.clone()).await {
        Ok(runtime) => Ok((runtime, socket)),
        Err(ConnectError::Namespace(e)) => Err(Retry::Never(e.into())),
        Err(ConnectError::Runtime(e)) => Err(Retry::After(Unreachable::Runtime(e))),
    }
}
