//! A private containerd for tests, the demo and benchmarks: its own config, root, state, runc
//! root and sockets in one directory, never the node's containerd. Which release runs (1.6, 1.7,
//! 2.x) is chosen per run, see [`crate::release`]; the config is written for its version.
//!
//! Lifecycle: [`PrivateContainerd::start`] writes the config, starts the daemon in its own
//! session (so a terminal's Ctrl-C reaches the harness, which cleans up, not the daemon), waits
//! until the CRI plugin reports the runtime ready, and imports the local images. Dropping the
//! guard (also on a failing test's unwind), a SIGINT/SIGTERM to the harness, or the next start
//! after a killed run all end in [`cleanup`]: daemon, shims and container processes killed,
//! mounts detached, cgroups and shim sockets removed, the directory deleted.

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::{Mutex, Once},
    time::{Duration, Instant, SystemTime},
};

use k8s_cri::v1::{StatusRequest, VersionRequest, runtime_service_client::RuntimeServiceClient};

use crate::{
    image::{self, ImageTarballs},
    process,
    release::{self, Release, Version},
    unix_channel,
};

/// The namespace containerd's CRI plugin uses.
pub const CRI_NAMESPACE: &str = "k8s.io";
/// The namespace the harness uses for containers made through containerd's own API.
pub const NATIVE_NAMESPACE: &str = "plegd-native";

/// How long a fresh daemon may take to report the CRI runtime ready.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the daemon may take to exit after SIGTERM before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// Why the private containerd could not be started, used or stopped.
#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    #[error("the containerd harness must run as root (it starts runc containers)")]
    NotRoot,
    #[error(
        "`{binary}` not found in PATH: run `cargo xtask setup` (it installs containerd, runc and busybox-static)"
    )]
    MissingBinary { binary: &'static str },
    #[error(
        "{} = {asked:?}: expected 1.6 (the system's containerd), another MAJOR.MINOR unpacked by `cargo xtask setup` (1.7, 2.1) or an absolute directory",
        release::ENV
    )]
    UnknownRelease { asked: String },
    #[error(
        "containerd {release} is not unpacked ({} is missing): run `cargo xtask setup`",
        missing.display()
    )]
    ReleaseNotUnpacked { release: String, missing: PathBuf },
    #[error("{} = {asked} but {} is containerd {found}", release::ENV, binary.display())]
    ReleaseMismatch {
        asked: String,
        found: Version,
        binary: PathBuf,
    },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("containerd instance {dir} is already running (pid {pid}); stop it first")]
    AlreadyRunning { dir: PathBuf, pid: i32 },
    #[error("containerd exited during start-up ({status}); last log lines:\n{log_tail}")]
    EarlyExit { status: String, log_tail: String },
    #[error(
        "containerd did not become ready within {timeout:?}: {last_error}; last log lines:\n{log_tail}"
    )]
    NotReady {
        timeout: Duration,
        last_error: String,
        log_tail: String,
    },
    #[error("building images: {0}")]
    Image(#[from] image::ImageError),
    #[error("`{command}` failed ({status}): {stderr}")]
    Command {
        command: String,
        status: String,
        stderr: String,
    },
}

/// Where instances live: one directory per instance.
pub fn default_base_dir() -> PathBuf {
    std::env::temp_dir().join("plegd-harness")
}

/// What to start.
#[derive(Clone, Debug)]
pub struct ContainerdOptions {
    /// Directory holding one directory per instance.
    pub base_dir: PathBuf,
    /// The instance's name (its directory). Keep it short: socket paths are limited to 108 bytes.
    pub name: String,
    /// Directory where the image tarballs are built (shared across instances).
    pub image_dir: PathBuf,
    /// Which containerd to run; `None`: the one [`release::ENV`] names when it starts.
    pub release: Option<Release>,
}

impl ContainerdOptions {
    /// Options for a fresh, uniquely named instance owned by this process.
    pub fn unique() -> Self {
        static COUNTER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Self::named(&format!("t{}-{n}", std::process::id()))
    }

    /// Options for an instance with a fixed name (e.g. `dev` for `cargo xtask containerd`).
    pub fn named(name: &str) -> Self {
        let base_dir = default_base_dir();
        Self {
            image_dir: base_dir.join("images"),
            base_dir,
            name: name.to_owned(),
            release: None,
        }
    }
}

/// The files of one instance.
#[derive(Clone, Debug)]
pub struct InstancePaths {
    pub dir: PathBuf,
}

impl InstancePaths {
    pub fn new(dir: PathBuf) -> Self {
        Self { dir }
    }
    pub fn config(&self) -> PathBuf {
        self.dir.join("config.toml")
    }
    pub fn socket(&self) -> PathBuf {
        self.dir.join("containerd.sock")
    }
    pub fn log(&self) -> PathBuf {
        self.dir.join("containerd.log")
    }
    pub fn pid_file(&self) -> PathBuf {
        self.dir.join("containerd.pid")
    }
    /// Holds the pid of the owning process, or `detached` for an instance meant to outlive it.
    pub fn owner_file(&self) -> PathBuf {
        self.dir.join("owner")
    }
    /// Pod cgroups the harness made, one per line: containerd removes container cgroups but not
    /// pod cgroups (the kubelet's to remove), so cleanup does.
    pub fn cgroup_parents_file(&self) -> PathBuf {
        self.dir.join("cgroup-parents")
    }
    /// Records a cgroup parent (path below the hierarchy roots) for cleanup to remove.
    pub fn record_cgroup_parent(&self, parent: &str) -> std::io::Result<()> {
        use std::io::Write as _;
        let mut file = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.cgroup_parents_file())?;
        writeln!(file, "{parent}")
    }
    pub fn runc_root(&self) -> PathBuf {
        self.dir.join("runc")
    }
    fn state(&self) -> PathBuf {
        self.dir.join("state")
    }

    fn daemon_pid(&self) -> Option<i32> {
        read_pid(&self.pid_file())
    }
}

/// A running private containerd. Stopped and cleaned up when dropped.
pub struct PrivateContainerd {
    paths: InstancePaths,
    images: ImageTarballs,
    release: Release,
    version: Version,
    detached: bool,
}

impl PrivateContainerd {
    /// Starts a private containerd and imports the local images into the namespaces the
    /// harness uses. Stale instances of killed runs are cleaned up first.
    pub async fn start(options: &ContainerdOptions) -> Result<Self, HarnessError> {
        let release = match &options.release {
            Some(release) => release.clone(),
            None => Release::from_env()?,
        };
        let (version, runc) = preflight(&release)?;
        recover_stale(&options.base_dir);
        let paths = InstancePaths::new(options.base_dir.join(&options.name));
        if let Some(pid) = paths.daemon_pid().filter(|&pid| process::is_alive(pid)) {
            return Err(HarnessError::AlreadyRunning {
                dir: paths.dir,
                pid,
            });
        }
        // A leftover directory of a dead instance with this name.
        if paths.dir.exists() {
            cleanup(&paths.dir);
        }
        let images = image::build_images(&options.image_dir)?;
        create_dir(&paths.dir)?;
        write_file(&paths.owner_file(), &std::process::id().to_string())?;
        write_file(&paths.config(), &config_toml(&paths, version, &runc))?;
        install_signal_cleanup();
        register_live(&paths.dir);
        let instance = Self {
            paths,
            images,
            release,
            version,
            detached: false,
        };
        instance.spawn_daemon().await?;
        for namespace in [CRI_NAMESPACE, NATIVE_NAMESPACE] {
            for tarball in [&instance.images.busybox, &instance.images.pause] {
                instance.import_image(namespace, tarball)?;
            }
        }
        Ok(instance)
    }

    /// The containerd gRPC socket (CRI and containerd API).
    pub fn socket(&self) -> PathBuf {
        self.paths.socket()
    }

    pub fn paths(&self) -> &InstancePaths {
        &self.paths
    }

    /// Which containerd runs.
    pub fn release(&self) -> &Release {
        &self.release
    }

    /// The running containerd's version (what `containerd --version` said).
    pub fn version(&self) -> Version {
        self.version
    }

    /// The images built for this instance (the layer's diff id is the snapshot parent).
    pub fn images(&self) -> &ImageTarballs {
        &self.images
    }

    /// The daemon's pid.
    pub fn pid(&self) -> Option<i32> {
        self.paths.daemon_pid()
    }

    /// Lets the daemon outlive this process (for `cargo xtask containerd start`);
    /// [`stop_instance`] stops it later.
    pub fn detach(mut self) -> InstancePaths {
        self.detached = true;
        // Best effort: without the marker the next start would take the instance for stale.
        let _ = fs::write(self.paths.owner_file(), "detached");
        unregister_live(&self.paths.dir);
        self.paths.clone()
    }

    /// Stops the daemon (SIGTERM, as a node's service manager would), leaving its containers'
    /// shims running, and starts it again on the same state.
    pub async fn restart(&self) -> Result<(), HarnessError> {
        if let Some(pid) = self.paths.daemon_pid() {
            process::terminate(pid, STOP_TIMEOUT);
        }
        self.spawn_daemon().await
    }

    /// Kills the daemon (SIGKILL: a crash, nothing flushed), leaving its containers' shims
    /// running, and starts it again on the same state. Returns when the killed one was gone:
    /// whatever answers after that is the new one.
    pub async fn crash_and_restart(&self) -> Result<SystemTime, HarnessError> {
        let gone = self.crash();
        self.spawn_daemon().await?;
        Ok(gone)
    }

    /// Kills the daemon (SIGKILL), leaving its containers' shims running, and starts it again
    /// on the same state after `outage` (an upgrade, a crash loop). Returns once the new one
    /// answers CRI.
    pub async fn crash_for(&self, outage: Duration) -> Result<(), HarnessError> {
        self.crash();
        tokio::time::sleep(outage).await;
        self.spawn_daemon().await
    }

    /// SIGKILLs the daemon, its shims left running; returns when it was gone.
    fn crash(&self) -> SystemTime {
        if let Some(pid) = self.paths.daemon_pid() {
            process::kill_all(&[pid], STOP_TIMEOUT);
        }
        SystemTime::now()
    }

    async fn spawn_daemon(&self) -> Result<(), HarnessError> {
        let log = fs::File::create(self.paths.log()).map_err(io_err(&self.paths.log()))?;
        let log_err = log.try_clone().map_err(io_err(&self.paths.log()))?;
        let mut command = Command::new(self.release.program("containerd"));
        command
            .env("PATH", self.release.daemon_path())
            .arg("--config")
            .arg(self.paths.config())
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err);
        // Its own session: a Ctrl-C in the terminal reaches the harness (which cleans up), not
        // the daemon.
        process::new_session(&mut command);
        let mut child = command.spawn().map_err(|source| {
            if source.kind() == std::io::ErrorKind::NotFound {
                HarnessError::MissingBinary {
                    binary: "containerd",
                }
            } else {
                io_err(Path::new("containerd"))(source)
            }
        })?;
        write_file(&self.paths.pid_file(), &child.id().to_string())?;

        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(status) = child.try_wait().map_err(io_err(&self.paths.log()))? {
                return Err(HarnessError::EarlyExit {
                    status: status.to_string(),
                    log_tail: log_tail(&self.paths.log()),
                });
            }
            let last_error = match cri_ready(&self.paths.socket()).await {
                Ok(()) => break,
                Err(e) => e,
            };
            if Instant::now() >= deadline {
                return Err(HarnessError::NotReady {
                    timeout: READY_TIMEOUT,
                    last_error,
                    log_tail: log_tail(&self.paths.log()),
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // The daemon lives in its own session and is reaped by whoever inherits it once we
        // stop it; the handle itself is not needed.
        drop(child);
        Ok(())
    }

    /// Imports an OCI image tarball (e.g. plegd's, from [`image::build_plegd_image`]) into
    /// `namespace` (CRI's is `k8s.io`) with `ctr images import`.
    pub fn import_image(&self, namespace: &str, tarball: &Path) -> Result<(), HarnessError> {
        run_command(
            Command::new(self.release.program("ctr"))
                .arg("--address")
                .arg(self.paths.socket())
                .args(["--namespace", namespace, "images", "import"])
                .arg(tarball),
        )
        .map(drop)
    }
}

impl Drop for PrivateContainerd {
    fn drop(&mut self) {
        if !self.detached {
            cleanup(&self.paths.dir);
            unregister_live(&self.paths.dir);
        }
    }
}

/// Stops and cleans up the named instance, if any. Returns whether there was one.
pub fn stop_instance(options: &ContainerdOptions) -> bool {
    let dir = options.base_dir.join(&options.name);
    if !dir.exists() {
        return false;
    }
    cleanup(&dir);
    true
}

/// Whether the named instance's daemon is running, and its socket.
pub fn instance_status(options: &ContainerdOptions) -> Option<(i32, PathBuf)> {
    let paths = InstancePaths::new(options.base_dir.join(&options.name));
    let pid = paths.daemon_pid().filter(|&pid| process::is_alive(pid))?;
    Some((pid, paths.socket()))
}

/// Waits until the CRI plugin at `socket` reports the runtime ready, for up to `timeout`: a
/// containerd restarted by its service manager serves its socket before its CRI plugin has
/// loaded its state, and calls made meanwhile fail.
pub async fn wait_cri_ready(socket: &Path, timeout: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        match cri_ready(socket).await {
            Ok(()) => return Ok(()),
            Err(e) if Instant::now() >= deadline => {
                anyhow::bail!("containerd's CRI was not ready within {timeout:?}: {e}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// Asks the CRI plugin whether the runtime is ready (`NetworkReady` is ignored: pods use the
/// host network, so no CNI is installed).
async fn cri_ready(socket: &Path) -> Result<(), String> {
    if !socket.exists() {
        return Err("socket not created yet".into());
    }
    let channel = unix_channel(socket).await.map_err(|e| e.to_string())?;
    let mut cri = RuntimeServiceClient::new(channel);
    cri.version(VersionRequest::default())
        .await
        .map_err(|e| format!("CRI Version: {e}"))?;
    let status = cri
        .status(StatusRequest { verbose: false })
        .await
        .map_err(|e| format!("CRI Status: {e}"))?
        .into_inner();
    let ready = status
        .status
        .iter()
        .flat_map(|s| &s.conditions)
        .any(|c| c.r#type == "RuntimeReady" && c.status);
    if ready {
        Ok(())
    } else {
        Err(format!("CRI runtime not ready: {:?}", status.status))
    }
}

/// The daemon's configuration for `version` (2.x wants `version = 3`, whose CRI plugins are
/// split and renamed): every path inside the instance directory, runc the given binary.
fn config_toml(paths: &InstancePaths, version: Version, runc: &Path) -> String {
    let dir = paths.dir.display();
    let common = format!(
        r#"root = "{dir}/root"
state = "{dir}/state"
disabled_plugins = [
  "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.internal.v1.tracing",
  # On by default in 2.x, with one node-wide socket (/var/run/nri/nri.sock) for every instance.
  "io.containerd.nri.v1.nri",
]

[grpc]
  address = "{dir}/containerd.sock"

[ttrpc]
  address = "{dir}/containerd.sock.ttrpc"

[debug]
  address = "{dir}/debug.sock"
  level = "info"

[plugins."io.containerd.internal.v1.opt"]
  path = "{dir}/opt"
"#
    );
    let cri = if version.wants_config_v3() {
        cri_config_v3(paths, runc)
    } else {
        cri_config_v2(paths, runc)
    };
    let config_version = if version.wants_config_v3() { 3 } else { 2 };
    format!("version = {config_version}\n{common}\n{cri}")
}

/// The CRI plugin of 1.6 and 1.7 (`version = 2`): one `io.containerd.grpc.v1.cri` plugin.
fn cri_config_v2(paths: &InstancePaths, runc: &Path) -> String {
    let dir = paths.dir.display();
    let runc = runc.display();
    format!(
        r#"[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause}"
  # Required here: without CAP_SYS_RESOURCE runc cannot lower oom_score_adj.
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false

[plugins."io.containerd.grpc.v1.cri".containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
  BinaryName = "{runc}"
  Root = "{dir}/runc"

[plugins."io.containerd.grpc.v1.cri".cni]
  bin_dir = "{dir}/cni/bin"
  conf_dir = "{dir}/cni/conf"
"#,
        pause = image::PAUSE_IMAGE,
    )
}

/// The CRI plugins of 2.x (`version = 3`): images (sandbox image pinned there), runtime, and
/// the gRPC service with only the streaming server left.
fn cri_config_v3(paths: &InstancePaths, runc: &Path) -> String {
    let dir = paths.dir.display();
    let runc = runc.display();
    format!(
        r#"[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"

[plugins."io.containerd.cri.v1.images".pinned_images]
  sandbox = "{pause}"

[plugins."io.containerd.cri.v1.runtime"]
  # Required here: without CAP_SYS_RESOURCE runc cannot lower oom_score_adj.
  restrict_oom_score_adj = true
  enable_selinux = false

[plugins."io.containerd.cri.v1.runtime".containerd]
  default_runtime_name = "runc"

[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
  BinaryName = "{runc}"
  Root = "{dir}/runc"

[plugins."io.containerd.cri.v1.runtime".cni]
  bin_dirs = ["{dir}/cni/bin"]
  conf_dir = "{dir}/cni/conf"

[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
"#,
        pause = image::PAUSE_IMAGE,
    )
}

/// Checks the harness can run `release` and finds its version and the runc to use (the
/// system's, from `PATH`).
fn preflight(release: &Release) -> Result<(Version, PathBuf), HarnessError> {
    if !nix::unistd::geteuid().is_root() {
        return Err(HarnessError::NotRoot);
    }
    if release.bin_dir.is_none() {
        for binary in ["containerd", "ctr", "containerd-shim-runc-v2"] {
            if !process::in_path(binary) {
                return Err(HarnessError::MissingBinary { binary });
            }
        }
    }
    let runc = process::which("runc").ok_or(HarnessError::MissingBinary { binary: "runc" })?;
    Ok((release.detect_version()?, runc))
}

/// Cleans up instances whose owner died without cleaning up (a killed test run), and detached
/// instances whose daemon died.
fn recover_stale(base_dir: &Path) {
    let Ok(entries) = fs::read_dir(base_dir) else {
        return;
    };
    for entry in entries.flatten() {
        let paths = InstancePaths::new(entry.path());
        let Ok(owner) = fs::read_to_string(paths.owner_file()) else {
            continue;
        };
        let stale = match owner.trim() {
            "detached" => !paths.daemon_pid().is_some_and(process::is_alive),
            pid => !pid.parse().is_ok_and(process::is_alive),
        };
        if stale {
            eprintln!(
                "harness: cleaning up stale containerd instance {}",
                paths.dir.display()
            );
            cleanup(&paths.dir);
        }
    }
}

/// What a runc container left in its state directory that cleanup needs.
#[derive(Debug, Default, PartialEq, Eq)]
struct RuncState {
    init_pid: Option<i32>,
    cgroup_paths: Vec<PathBuf>,
}

fn parse_runc_state(json: &str) -> RuncState {
    let Ok(value) = serde_json::from_str::<serde_json::Value>(json) else {
        return RuncState::default();
    };
    let init_pid = value["init_process_pid"]
        .as_i64()
        .and_then(|p| i32::try_from(p).ok());
    let mut cgroup_paths: Vec<PathBuf> = value["cgroup_paths"]
        .as_object()
        .into_iter()
        .flat_map(|m| m.values())
        .filter_map(|p| p.as_str().map(PathBuf::from))
        .collect();
    cgroup_paths.sort();
    cgroup_paths.dedup();
    RuncState {
        init_pid,
        cgroup_paths,
    }
}

/// Stops an instance and removes everything it left on the node. Never fails: every step is
/// best effort, and what could not be removed is reported on stderr.
pub fn cleanup(dir: &Path) {
    let paths = InstancePaths::new(dir.to_owned());
    if let Some(pid) = paths.daemon_pid() {
        process::terminate(pid, STOP_TIMEOUT);
    }

    // Containers: their processes (everything in their cgroups) and cgroups.
    let mut cgroups = Vec::new();
    let mut pids = Vec::new();
    for state_file in find_files(&paths.runc_root(), "state.json", 3) {
        let state = fs::read_to_string(&state_file)
            .map(|s| parse_runc_state(&s))
            .unwrap_or_default();
        pids.extend(state.init_pid);
        for cgroup in &state.cgroup_paths {
            pids.extend(process::cgroup_pids(cgroup));
        }
        cgroups.extend(state.cgroup_paths);
    }
    // Shims serving this daemon, found by the address they were started with.
    let socket = paths.socket();
    pids.extend(process::find_by_args(&[
        "-address",
        &socket.to_string_lossy(),
    ]));
    process::kill_all(&pids, Duration::from_secs(10));

    // Shim sockets live outside the instance directory (/run/containerd/s, not configurable);
    // each bundle records its shim's address: in `address` (1.6, 1.7) or `bootstrap.json` (2.x).
    let bundles = paths.state().join("io.containerd.runtime.v2.task");
    let addresses = find_files(&bundles, "address", 3)
        .into_iter()
        .filter_map(|file| fs::read_to_string(file).ok())
        .chain(
            find_files(&bundles, "bootstrap.json", 3)
                .into_iter()
                .filter_map(|file| fs::read_to_string(file).ok())
                .filter_map(|json| bootstrap_address(&json)),
        );
    for address in addresses {
        let socket = address.trim().trim_start_matches("unix://");
        if !socket.is_empty() {
            let _ = fs::remove_file(socket);
        }
    }

    for mount in process::mounts_under(dir) {
        if let Err(e) = nix::mount::umount2(&mount, nix::mount::MntFlags::MNT_DETACH) {
            eprintln!("harness: unmounting {}: {e}", mount.display());
        }
    }

    let cgroup_parents = fs::read_to_string(paths.cgroup_parents_file()).unwrap_or_default();
    for hierarchy in process::cgroup_mounts() {
        for parent in cgroup_parents.lines().filter(|l| l.starts_with('/')) {
            cgroups.push(hierarchy.join(parent.trim_start_matches('/')));
        }
    }
    // Deepest first. Only what this instance made: shared parents (`/kubepods/besteffort`,
    // `/plegd-native`) stay, since another instance may be creating a cgroup below them.
    cgroups.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    for cgroup in &cgroups {
        if let Err(e) = fs::remove_dir(cgroup)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            eprintln!("harness: removing cgroup {}: {e}", cgroup.display());
        }
    }

    if let Err(e) = fs::remove_dir_all(dir)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        eprintln!("harness: removing {}: {e}", dir.display());
    }
}

/// The shim address in a containerd 2.x bundle's `bootstrap.json`
/// (`{"version":2,"address":"unix:///run/containerd/s/...","protocol":"ttrpc"}`).
fn bootstrap_address(json: &str) -> Option<String> {
    let value: serde_json::Value = serde_json::from_str(json).ok()?;
    value["address"].as_str().map(str::to_owned)
}

/// Files named `name` at most `depth` levels below `root`.
fn find_files(root: &Path, name: &str, depth: usize) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let Ok(entries) = fs::read_dir(root) else {
        return found;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        if kind.is_dir() && depth > 0 {
            found.extend(find_files(&path, name, depth - 1));
        } else if entry.file_name() == name {
            found.push(path);
        }
    }
    found
}

fn read_pid(path: &Path) -> Option<i32> {
    fs::read_to_string(path).ok()?.trim().parse().ok()
}

fn log_tail(path: &Path) -> String {
    let log = fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> HarnessError {
    let path = path.to_owned();
    move |source| HarnessError::Io { path, source }
}

fn create_dir(path: &Path) -> Result<(), HarnessError> {
    fs::create_dir_all(path).map_err(io_err(path))
}

fn write_file(path: &Path, content: &str) -> Result<(), HarnessError> {
    fs::write(path, content).map_err(io_err(path))
}

/// Runs a command to completion; a failure carries its stderr.
pub(crate) fn run_command(command: &mut Command) -> Result<String, HarnessError> {
    let rendered = format!("{command:?}");
    let output = command.output().map_err(|source| HarnessError::Io {
        path: PathBuf::from(command.get_program()),
        source,
    })?;
    if !output.status.success() {
        return Err(HarnessError::Command {
            command: rendered,
            status: output.status.to_string(),
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// Instances owned by this process, cleaned up if it is interrupted.
static LIVE: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

fn register_live(dir: &Path) {
    LIVE.lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(dir.to_owned());
}

fn unregister_live(dir: &Path) {
    LIVE.lock()
        .unwrap_or_else(|e| e.into_inner())
        .retain(|d| d != dir);
}

/// On SIGINT/SIGTERM/SIGHUP, clean up every live instance, then exit as the signal would have.
fn install_signal_cleanup() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
        let Ok(mut signals) = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP]) else {
            eprintln!("harness: cannot install signal handlers; an interrupted run is cleaned up by the next start");
            return;
        };
        std::thread::spawn(move || {
            if let Some(signal) = signals.forever().next() {
                let dirs = std::mem::take(&mut *LIVE.lock().unwrap_or_else(|e| e.into_inner()));
                for dir in dirs {
                    eprintln!("harness: interrupted, cleaning up {}", dir.display());
                    cleanup(&dir);
                }
                std::process::exit(128 + signal);
            }
        });
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runc_state_yields_pid_and_unique_cgroups() {
        let json = r#"{"id":"c1","init_process_pid":4242,"cgroup_paths":{
            "":"/sys/fs/cgroup/unified/k8s.io/c1",
            "memory":"/sys/fs/cgroup/memory/k8s.io/c1",
            "cpu":"/sys/fs/cgroup/cpu/k8s.io/c1",
            "cpuacct":"/sys/fs/cgroup/cpu/k8s.io/c1"}}"#;
        let state = parse_runc_state(json);
        assert_eq!(state.init_pid, Some(4242));
        assert_eq!(
            state.cgroup_paths,
            vec![
                PathBuf::from("/sys/fs/cgroup/cpu/k8s.io/c1"),
                PathBuf::from("/sys/fs/cgroup/memory/k8s.io/c1"),
                PathBuf::from("/sys/fs/cgroup/unified/k8s.io/c1"),
            ]
        );
    }

    #[test]
    fn garbage_runc_state_yields_nothing() {
        assert_eq!(parse_runc_state("not json"), RuncState::default());
        assert_eq!(parse_runc_state("{}"), RuncState::default());
    }

    #[test]
    fn config_keeps_every_path_inside_the_instance() {
        let paths = InstancePaths::new(PathBuf::from("/tmp/plegd-harness/x"));
        for version in [Version::new(1, 6, 20), Version::new(2, 1, 9)] {
            let config = config_toml(&paths, version, Path::new("/usr/sbin/runc"));
            let parsed: toml::Value = toml::from_str(&config).expect("valid TOML");
            paths_inside_the_instance(&parsed);
        }
    }

    fn paths_inside_the_instance(parsed: &toml::Value) {
        for key in ["root", "state"] {
            assert!(
                parsed[key]
                    .as_str()
                    .unwrap()
                    .starts_with("/tmp/plegd-harness/x/")
            );
        }
        for section in ["grpc", "ttrpc", "debug"] {
            assert!(
                parsed[section]["address"]
                    .as_str()
                    .unwrap()
                    .starts_with("/tmp/plegd-harness/x/")
            );
        }
    }

    #[test]
    fn config_v2_for_1_x_has_one_cri_plugin() {
        let paths = InstancePaths::new(PathBuf::from("/tmp/plegd-harness/x"));
        let config = config_toml(&paths, Version::new(1, 7, 24), Path::new("/usr/sbin/runc"));
        let parsed: toml::Value = toml::from_str(&config).expect("valid TOML");
        assert_eq!(parsed["version"].as_integer(), Some(2));
        let cri = &parsed["plugins"]["io.containerd.grpc.v1.cri"];
        assert_eq!(cri["restrict_oom_score_adj"].as_bool(), Some(true));
        assert_eq!(cri["sandbox_image"].as_str(), Some(image::PAUSE_IMAGE));
        let runc = &cri["containerd"]["runtimes"]["runc"]["options"];
        assert_eq!(runc["BinaryName"].as_str(), Some("/usr/sbin/runc"));
        assert_eq!(runc["Root"].as_str(), Some("/tmp/plegd-harness/x/runc"));
    }

    #[test]
    fn config_v3_for_2_x_splits_the_cri_plugin() {
        let paths = InstancePaths::new(PathBuf::from("/tmp/plegd-harness/x"));
        let config = config_toml(&paths, Version::new(2, 1, 9), Path::new("/usr/sbin/runc"));
        let parsed: toml::Value = toml::from_str(&config).expect("valid TOML");
        assert_eq!(parsed["version"].as_integer(), Some(3));
        let plugins = &parsed["plugins"];
        assert_eq!(
            plugins["io.containerd.cri.v1.images"]["pinned_images"]["sandbox"].as_str(),
            Some(image::PAUSE_IMAGE)
        );
        let runtime = &plugins["io.containerd.cri.v1.runtime"];
        assert_eq!(runtime["restrict_oom_score_adj"].as_bool(), Some(true));
        let runc = &runtime["containerd"]["runtimes"]["runc"]["options"];
        assert_eq!(runc["BinaryName"].as_str(), Some("/usr/sbin/runc"));
        assert_eq!(runc["Root"].as_str(), Some("/tmp/plegd-harness/x/runc"));
        assert!(
            plugins["io.containerd.grpc.v1.cri"]
                .get("sandbox_image")
                .is_none()
        );
    }

    #[test]
    fn bootstrap_json_gives_the_shim_address() {
        assert_eq!(
            bootstrap_address(
                r#"{"version":2,"address":"unix:///run/containerd/s/abc","protocol":"ttrpc"}"#
            )
            .as_deref(),
            Some("unix:///run/containerd/s/abc")
        );
        assert_eq!(bootstrap_address("{}"), None);
        assert_eq!(bootstrap_address("garbage"), None);
    }

    #[test]
    fn find_files_respects_depth() {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir_all(dir.path().join("a/b/c")).unwrap();
        fs::write(dir.path().join("a/state.json"), "").unwrap();
        fs::write(dir.path().join("a/b/c/state.json"), "").unwrap();
        assert_eq!(find_files(dir.path(), "state.json", 1).len(), 1);
        assert_eq!(find_files(dir.path(), "state.json", 3).len(), 2);
    }
}
