//! Which runtime plegd reads and where: endpoint parsing, socket auto-detection and the choice
//! of backend at run time ([`RuntimeKind`], [`AnyRuntime`]). The top of `runtime`: it knows
//! both backends, and neither knows it.

use std::{
    fmt,
    os::unix::fs::FileTypeExt as _,
    path::{Path, PathBuf},
    str::FromStr,
    time::Duration,
};

use crate::{
    base::metrics::RuntimeCalls,
    pleg::{
        ContainerId, ContainerRead, ExitWatch, PodRecord, PodUid, Runtime, RuntimeError, Scope,
        TaskRecord,
    },
    runtime::{
        CRI_NAMESPACE, DEFAULT_CALL_TIMEOUT, PodMetadata, RuntimeVersion,
        containerd::{ConnectError, ContainerdRuntime},
        cri::CriRuntime,
    },
};

/// Sockets tried, in order, when no endpoint is configured: containerd, CRI-O, k3s's containerd
/// (with and without the `/var/run -> /run` symlink some distributions lack).
pub const WELL_KNOWN_SOCKETS: [&str; 5] = [
    "/run/containerd/containerd.sock",
    "/var/run/containerd/containerd.sock",
    "/run/crio/crio.sock",
    "/var/run/crio/crio.sock",
    "/run/k3s/containerd/containerd.sock",
];

/// A runtime endpoint that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    #[error("empty runtime endpoint")]
    Empty,
    #[error(
        "unsupported runtime endpoint {endpoint:?}: only unix sockets are supported (unix:///path or /path)"
    )]
    UnsupportedScheme { endpoint: String },
    #[error("no container runtime socket found (tried {}); pass --runtime-endpoint", display_paths(.tried))]
    NotFound { tried: Vec<PathBuf> },
}

fn display_paths(paths: &[PathBuf]) -> String {
    paths
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Parses a runtime endpoint as kubelet's `--container-runtime-endpoint` accepts it:
/// `unix:///run/containerd/containerd.sock` or a plain path.
pub fn parse_endpoint(endpoint: &str) -> Result<PathBuf, EndpointError> {
    let path = match endpoint.split_once("://") {
        Some(("unix", path)) => path,
        Some(_) => {
            return Err(EndpointError::UnsupportedScheme {
                endpoint: endpoint.to_owned(),
            });
        }
        None => endpoint,
    };
    if path.is_empty() {
        return Err(EndpointError::Empty);
    }
    Ok(PathBuf::from(path))
}

/// The first candidate that is a unix socket. A path that exists but is not a socket (a stale
/// directory left by a package) is skipped, not returned.
pub fn detect(candidates: &[impl AsRef<Path>]) -> Result<PathBuf, EndpointError> {
    candidates
        .iter()
        .map(AsRef::as_ref)
        .find(|path| std::fs::metadata(path).is_ok_and(|m| m.file_type().is_socket()))
        .map(Path::to_path_buf)
        .ok_or_else(|| EndpointError::NotFound {
            tried: candidates.iter().map(|p| p.as_ref().to_owned()).collect(),
        })
}

/// Which API plegd reads the runtime through.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RuntimeKind {
    /// CRI v1: containerd, CRI-O, anything kubelet talks to.
    #[default]
    Cri,
    /// containerd's own API: also sees containers made without CRI (nerdctl, ctr, buildkit).
    Containerd,
}

/// A runtime kind that is neither `cri` nor `containerd`.
#[derive(Debug, thiserror::Error)]
#[error("unknown runtime kind {0:?}: expected `cri` or `containerd`")]
pub struct UnknownRuntimeKind(String);

impl FromStr for RuntimeKind {
    type Err = UnknownRuntimeKind;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "cri" => Ok(Self::Cri),
            "containerd" => Ok(Self::Containerd),
            _ => Err(UnknownRuntimeKind(s.to_owned())),
        }
    }
}

impl fmt::Display for RuntimeKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Cri => "cri",
            Self::Containerd => "containerd",
        })
    }
}

/// How to talk to the runtime, whichever backend.
#[derive(Clone, Debug)]
pub struct RuntimeOptions {
    /// Deadline of every call (and of connecting).
    pub call_timeout: Duration,
    /// containerd namespaces to read (containerd backend only; CRI has a single view).
    pub namespaces: Vec<String>,
    /// Where the backend counts its calls ([`crate::base::metrics::Metrics::runtime_calls`]).
    pub calls: RuntimeCalls,
    /// Which of a pod's labels and annotations its record keeps.
    pub pod_metadata: PodMetadata,
}

impl Default for RuntimeOptions {
    fn default() -> Self {
        Self {
            call_timeout: DEFAULT_CALL_TIMEOUT,
            namespaces: vec![CRI_NAMESPACE.to_owned()],
            calls: RuntimeCalls::default(),
            pod_metadata: PodMetadata::default(),
        }
    }
}

/// Either backend, chosen at run time; an enum rather than `dyn Runtime` because the trait's
/// async methods are not object safe.
#[derive(Clone, Debug)]
pub enum AnyRuntime {
    Cri(CriRuntime),
    Containerd(ContainerdRuntime),
}

impl AnyRuntime {
    pub async fn connect(
        kind: RuntimeKind,
        socket: &Path,
        options: RuntimeOptions,
    ) -> Result<Self, ConnectError> {
        Ok(match kind {
            RuntimeKind::Cri => Self::Cri(CriRuntime::connect(socket, &options).await?),
            RuntimeKind::Containerd => {
                Self::Containerd(ContainerdRuntime::connect(socket, &options).await?)
            }
        })
    }

    /// Asks the runtime who it is: the start-up check that it answers at all.
    pub async fn version(&self) -> Result<RuntimeVersion, RuntimeError> {
        match self {
            Self::Cri(runtime) => runtime.version().await,
            Self::Containerd(runtime) => runtime.version().await,
        }
    }
}

impl Runtime for AnyRuntime {
    fn endpoint(&self) -> &str {
        match self {
            Self::Cri(runtime) => runtime.endpoint(),
            Self::Containerd(runtime) => runtime.endpoint(),
        }
    }

    fn calls(&self) -> RuntimeCalls {
        match self {
            Self::Cri(runtime) => runtime.calls(),
            Self::Containerd(runtime) => runtime.calls(),
        }
    }

    async fn list_pods(&self, scope: &Scope) -> Result<Vec<PodRecord>, RuntimeError> {
        match self {
            Self::Cri(runtime) => runtime.list_pods(scope).await,
            Self::Containerd(runtime) => runtime.list_pods(scope).await,
        }
    }

    async fn inspect_pod(
        &self,
        pod: &PodUid,
        known: Option<&PodRecord>,
    ) -> Result<Option<PodRecord>, RuntimeError> {
        match self {
            Self::Cri(runtime) => runtime.inspect_pod(pod, known).await,
            Self::Containerd(runtime) => runtime.inspect_pod(pod, known).await,
        }
    }

    async fn task_exit(&self, container: &ContainerId) -> Result<Option<TaskRecord>, RuntimeError> {
        match self {
            Self::Cri(runtime) => runtime.task_exit(container).await,
            Self::Containerd(runtime) => runtime.task_exit(container).await,
        }
    }

    async fn inspect_listed(
        &self,
        listed: PodRecord,
        known: Option<&PodRecord>,
    ) -> Result<Option<PodRecord>, RuntimeError> {
        match self {
            Self::Cri(runtime) => runtime.inspect_listed(listed, known).await,
            Self::Containerd(runtime) => runtime.inspect_listed(listed, known).await,
        }
    }

    async fn read_containers(
        &self,
        ids: &[ContainerId],
        committed: Option<&PodRecord>,
    ) -> Result<Vec<ContainerRead>, RuntimeError> {
        match self {
            Self::Cri(runtime) => runtime.read_containers(ids, committed).await,
            Self::Containerd(runtime) => runtime.read_containers(ids, committed).await,
        }
    }

    async fn task_record(
        &self,
        container: &ContainerId,
    ) -> Result<Option<TaskRecord>, RuntimeError> {
        match self {
            Self::Cri(runtime) => runtime.task_record(container).await,
            Self::Containerd(runtime) => runtime.task_record(container).await,
        }
    }

    fn watch_exit(&self, container: &ContainerId) -> Option<ExitWatch> {
        match self {
            Self::Cri(runtime) => runtime.watch_exit(container),
            Self::Containerd(runtime) => runtime.watch_exit(container),
        }
    }

    fn exit_watched(&self, container: &ContainerId) -> bool {
        match self {
            Self::Cri(runtime) => runtime.exit_watched(container),
            Self::Containerd(runtime) => runtime.exit_watched(container),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_unix_urls_or_plain_paths() {
        assert_eq!(
            parse_endpoint("unix:///run/containerd/containerd.sock").unwrap(),
            PathBuf::from("/run/containerd/containerd.sock")
        );
        assert_eq!(
            parse_endpoint("/run/crio/crio.sock").unwrap(),
            PathBuf::from("/run/crio/crio.sock")
        );
        assert_eq!(
            parse_endpoint("relative.sock").unwrap(),
            PathBuf::from("relative.sock")
        );
    }

    #[test]
    fn other_schemes_and_empty_endpoints_are_rejected() {
        assert!(matches!(
            parse_endpoint("tcp://localhost:1234"),
            Err(EndpointError::UnsupportedScheme { .. })
        ));
        assert!(matches!(
            parse_endpoint("npipe:////./pipe/containerd"),
            Err(EndpointError::UnsupportedScheme { .. })
        ));
        assert!(matches!(parse_endpoint(""), Err(EndpointError::Empty)));
        assert!(matches!(
            parse_endpoint("unix://"),
            Err(EndpointError::Empty)
        ));
    }

    #[tokio::test]
    async fn detection_picks_the_first_socket_and_skips_other_files() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.sock");
        let not_a_socket = dir.path().join("dir.sock");
        std::fs::create_dir(&not_a_socket).unwrap();
        let first = dir.path().join("first.sock");
        let second = dir.path().join("second.sock");
        let _first = tokio::net::UnixListener::bind(&first).unwrap();
        let _second = tokio::net::UnixListener::bind(&second).unwrap();

        let found = detect(&[&missing, &not_a_socket, &first, &second]).unwrap();
        assert_eq!(found, first);
    }

    #[test]
    fn failed_detection_names_every_path_tried() {
        let err = detect(&["/nonexistent/a.sock", "/nonexistent/b.sock"]).unwrap_err();
        let message = err.to_string();
        assert!(
            message.contains("/nonexistent/a.sock, /nonexistent/b.sock"),
            "{message}"
        );
        assert!(matches!(err, EndpointError::NotFound { tried } if tried.len() == 2));
    }

    #[test]
    fn runtime_kinds_parse_and_print() {
        assert_eq!("cri".parse::<RuntimeKind>().unwrap(), RuntimeKind::Cri);
        assert_eq!(
            "Containerd".parse::<RuntimeKind>().unwrap(),
            RuntimeKind::Containerd
        );
        assert!("docker".parse::<RuntimeKind>().is_err());
        assert_eq!(RuntimeKind::Containerd.to_string(), "containerd");
    }
}
