//! The real-runtime harness for plegd's tests, demo and benchmarks.
//!
//! # Layout
//! - `audit`: the churn audit's checker (ground truth vs what a watcher received; pure).
//! - `bench`: what `cargo xtask bench` measures with: the release `plegd` and a `plegd watch`
//!   as processes, containerd's events and a CRI poller as anchors, CPU and memory from /proc.
//! - `churn`: the lifecycle driver (create, start, RUNNING, kill -9, EXITED, remove) with K
//!   lifecycles in flight, as issue 52 measured; the bench's cost, throughput and overload
//!   sections run it, with or without plegd.
//! - `containerd`: a private containerd daemon (start, restart, stop, cleanup of killed runs).
//! - `hostile`: hostile input against the `plegd` binary, and the one check each case ends with
//!   (alive, RSS grown by less than 64 MiB, health answering, the next kill seen).
//! - `image`: OCI image tarballs built from busybox-static (no registry needed).
//! - `demo`: what `cargo xtask demo` shows.
//! - `cri`: test-support calls through CRI v1 (pods with host networking, containers).
//! - `native`: test-support calls through containerd's own API (containers and tasks).
//! - `node`: the node check `cargo xtask node` runs in its VM (systemd, cgroup2, the systemd
//!   cgroup driver, plegd installed from deploy/), against the node's own containerd and plegd.
//! - `neighbours`: other agents' subscriptions (CRI `GetContainerEvents`, containerd
//!   `Events.Subscribe`) recording what they receive, and barriers, for the coexistence tests.
//! - `oom`: OOM kills for the OOM-scope tests: a pod cgroup's memory limit, and the kernel's
//!   log's own word on each kill (`oom_memcg=`), the oracle of plegd's scope.
//! - `otlp`: the OTLP/gRPC receiver (OpenTelemetry's Python protos over grpcio) of the export
//!   test and the bench.
//! - `process`: /proc, mount and cgroup helpers behind cleanup and the kill/cgroup helpers.
//! - `proxy`: a unix socket in front of containerd's that can make plegd's event stream go silent
//!   while connected.
//! - `release`: which containerd a run uses (`PLEGD_TEST_CONTAINERD`: 1.6, 1.7, 2.1) and its
//!   version.
//! - `soak`: the churn audit's runner (lifecycles against a `plegd` process and a watcher,
//!   modes, faults), behind `cargo xtask soak` and tests/soak.rs.
//! - `scenario`: the setup most end-to-end tests share (a containerd and its clients).
//! - `unit`: deploy/systemd/plegd.service's bounds (its `MemoryMax=`), as the tests hold plegd
//!   to them.
//! - `wait`: bounded waits on awaited conditions.

pub mod abuse;
pub mod audit;
pub mod bench;
pub mod churn;
pub mod containerd;
pub mod cri;
pub mod demo;
pub mod fake_cri;
pub mod hostile;
pub mod image;
pub mod native;
pub mod neighbours;
pub mod node;
pub mod oom;
pub mod otlp;
pub mod pki;
pub mod process;
pub mod proxy;
pub mod release;
pub mod scenario;
pub mod soak;
pub mod unit;
pub mod wait;

use std::path::{Path, PathBuf};

pub use containerd::{ContainerdOptions, HarnessError, PrivateContainerd};
pub use release::{Release, Version};
pub use scenario::Node;

/// A gRPC channel over a unix socket (tonic needs a dummy URI; the connector ignores it).
pub async fn unix_channel(
    socket: &Path,
) -> Result<tonic::transport::Channel, tonic::transport::Error> {
    unix_channel_with(
        socket,
        tonic::transport::Endpoint::from_static("http://[::]:50051"),
    )
    .await
}

/// [`unix_channel`] with `endpoint`'s settings (windows, timeouts, ...).
pub async fn unix_channel_with(
    socket: &Path,
    endpoint: tonic::transport::Endpoint,
) -> Result<tonic::transport::Channel, tonic::transport::Error> {
    let socket: PathBuf = socket.to_owned();
    endpoint
        .connect_with_connector(tower::service_fn(move |_| {
            let socket = socket.clone();
            async move {
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                    tokio::net::UnixStream::connect(socket).await?,
                ))
            }
        }))
        .await
}

/// Where a container's processes live: v1 hierarchies and the cgroup2 tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CgroupPaths {
    /// `(controllers, path below the hierarchy root)` per cgroup v1 hierarchy, e.g.
    /// `("memory", "/k8s.io/<id>")`.
    pub v1: Vec<(String, String)>,
    /// Path in the cgroup2 tree (hierarchy 0), e.g. `/k8s.io/<id>`.
    pub unified: Option<String>,
}

impl CgroupPaths {
    /// Reads `/proc/<pid>/cgroup`.
    pub fn of_pid(pid: i32) -> std::io::Result<Self> {
        Ok(Self::parse(&std::fs::read_to_string(format!(
            "/proc/{pid}/cgroup"
        ))?))
    }

    /// Parses the `hierarchy-id:controllers:path` lines of `/proc/<pid>/cgroup`.
    pub fn parse(text: &str) -> Self {
        let mut paths = Self {
            v1: Vec::new(),
            unified: None,
        };
        for line in text.lines() {
            let mut fields = line.splitn(3, ':');
            let (Some(id), Some(controllers), Some(path)) =
                (fields.next(), fields.next(), fields.next())
            else {
                continue;
            };
            if id == "0" && controllers.is_empty() {
                paths.unified = Some(path.to_owned());
            } else {
                paths.v1.push((controllers.to_owned(), path.to_owned()));
            }
        }
        paths
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hybrid_proc_cgroup_is_split_into_v1_and_unified() {
        let text = "12:pids:/k8s.io/abc\n4:cpu,cpuacct:/k8s.io/abc\n1:name=systemd:/k8s.io/abc\n0::/k8s.io/abc\n";
        let paths = CgroupPaths::parse(text);
        assert_eq!(paths.unified.as_deref(), Some("/k8s.io/abc"));
        assert_eq!(paths.v1.len(), 3);
        assert!(
            paths
                .v1
                .contains(&("cpu,cpuacct".into(), "/k8s.io/abc".into()))
        );
    }
}
