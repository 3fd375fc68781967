//! The node check: what `cargo xtask node` runs inside its VM, a node as most Kubernetes nodes
//! are (systemd as PID 1, a pure cgroup2 tree, containerd as its systemd service on the systemd
//! cgroup driver, plegd installed from deploy/ as README says), against that node's own
//! containerd and plegd, never the harness's private ones.
//!
//! [`prepare`] writes containerd's config before the guest restarts it; [`check`] runs the checks
//! and prints one `@@xtask check <name> pass|FAIL <detail>` line per check, which xtask reads
//! from the VM's serial port.

use std::{
    collections::HashMap,
    io::{BufRead as _, BufReader, Write as _},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant, SystemTime},
};

use anyhow::{Context as _, bail, ensure};
use k8s_cri::v1::ContainerState;
use serde_json::Value;
use tokio::sync::Notify;

use crate::{
    Version,
    audit::{self, Folding, Record},
    bench::{Jitter, sources_connected},
    containerd::{self, CRI_NAMESPACE},
    cri::{CgroupDriver, ContainerSpec, Cri, PidMode, Pod},
    image,
    native::Native,
    oom,
    process::Terminating,
    soak,
};

/// What the guest's output lines start with.
pub const MARK: &str = "@@xtask";
pub const CONTAINERD_SOCKET: &str = "/run/containerd/containerd.sock";
const CONTAINERD_CONFIG: &str = "/etc/containerd/config.toml";
/// Where README's Install section puts plegd, its unit and its config.
pub const PLEGD: &str = "/usr/local/bin/plegd";
const UNIT: &str = "plegd.service";
const UNIT_FILE: &str = "/etc/systemd/system/plegd.service";
const CONFIG: &str = "/etc/plegd/plegd.toml";
/// The unit's default API socket (RuntimeDirectory=plegd).
const API_SOCKET: &str = "/run/plegd/plegd.sock";
/// What plegd's READY=1 comes with (agent/src/daemon/notify.rs).
const READY_STATUS: &str = "first full relist done";

/// Debian's kernels set it to 3 (CONFIG_SECURITY_PERF_EVENTS_RESTRICT): perf_event_open then
/// needs CAP_SYS_ADMIN, whatever CAP_PERFMON says.
const PERF_EVENT_PARANOID: &str = "/proc/sys/kernel/perf_event_paranoid";

/// Longest wait for one event or one state of a unit.
const STEP: Duration = Duration::from_secs(30);
/// The full relist period of the eBPF-only run: removals are found by it alone.
const EBPF_ONLY_RELIST: &str = "10s";

/// The capabilities the unit hands plegd and the one it keeps (README, "Install").
const CAP_SETPCAP: u32 = 8;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

/// `[Service]` settings of the unit that make up its sandbox: `plegd check` runs under them.
const SANDBOX_KEYS: &[&str] = &[
    "User",
    "CapabilityBoundingSet",
    "AmbientCapabilities",
    "LimitMEMLOCK",
    "NoNewPrivileges",
    "ProtectSystem",
    "ProtectHome",
    "PrivateTmp",
    "PrivateDevices",
    "ProtectHostname",
    "ProtectClock",
    "ProtectKernelModules",
    "ProtectKernelLogs",
    "ProtectControlGroups",
    "ProtectKernelTunables",
    "RestrictNamespaces",
    "RestrictRealtime",
    "RestrictSUIDSGID",
    "LockPersonality",
    "MemoryDenyWriteExecute",
    "RestrictAddressFamilies",
    "SystemCallArchitectures",
    "SystemCallFilter",
    "SystemCallErrorNumber",
];

/// The OCI runtime containerd's runc shim runs containers with (`--oci-runtime`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum OciRuntime {
    /// Debian's runc (the shim's own default).
    #[default]
    Runc,
    /// Debian's crun, as the shim's `BinaryName`: it runs only on a pure cgroup v2 node.
    Crun,
}

impl OciRuntime {
    pub fn name(self) -> &'static str {
        match self {
            Self::Runc => "runc",
            Self::Crun => "crun",
        }
    }

    /// The `BinaryName` line of the shim's options, if any.
    fn binary_name(self) -> &'static str {
        match self {
            Self::Runc => "",
            Self::Crun => "  BinaryName = \"/usr/local/sbin/crun-oci-1.1\"\n",
        }
    }
}

/// Where `prepare` puts [`CRUN_WRAPPER`], the shim's `BinaryName` with crun.
const CRUN_WRAPPER_PATH: &str = "/usr/local/sbin/crun-oci-1.1";

/// Debian 12's crun (1.8.1) predates OCI runtime-spec 1.2 and refuses the `ociVersion` 1.2.x
/// that containerd 1.7 and 2.x write ("unknown version specified": a prefix check, not a
/// comparison). The bundles plegd's checks make use nothing of 1.2, so the shim's crun is this
/// wrapper: it says 1.1.0 in the bundle's config.json, then runs crun as asked.
const CRUN_WRAPPER: &str = r#"#!/bin/sh
# Written by plegd-harness node prepare --oci-runtime crun (tests/src/node.rs).
prev=
for arg in "$@"; do
    case "$prev" in --bundle|-b) bundle=$arg ;; esac
    prev=$arg
done
if [ -n "$bundle" ] && [ -f "$bundle/config.json" ]; then
    sed -i 's/"ociVersion": *"1\.[2-9][.0-9a-z-]*"/"ociVersion":"1.1.0"/' "$bundle/config.json"
fi
exec /usr/bin/crun "$@"
"#;

/// containerd's config on the node: the CRI plugin's runc shim on the systemd cgroup driver
/// (running `runtime` as its OCI runtime), the sandbox image the harness imports (no registry
/// here); everything else containerd's default.
pub fn containerd_config(version: Version, runtime: OciRuntime) -> String {
    let pause = image::PAUSE_IMAGE;
    let binary = runtime.binary_name();
    if version.wants_config_v3() {
        format!(
            "version = 3\n\n\
             [plugins.\"io.containerd.cri.v1.images\".pinned_images]\n  sandbox = \"{pause}\"\n\n\
             [plugins.\"io.containerd.cri.v1.runtime\".containerd.runtimes.runc]\n  runtime_type = \"io.containerd.runc.v2\"\n\n\
             [plugins.\"io.containerd.cri.v1.runtime\".containerd.runtimes.runc.options]\n  SystemdCgroup = true\n{binary}"
        )
    } else {
        format!(
            "version = 2\n\n\
             [plugins.\"io.containerd.grpc.v1.cri\"]\n  sandbox_image = \"{pause}\"\n\n\
             [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc]\n  runtime_type = \"io.containerd.runc.v2\"\n\n\
             [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc.options]\n  SystemdCgroup = true\n{binary}"
        )
    }
}

/// Writes [`containerd_config`] for the `containerd` first in `PATH` (the guest restarts
/// containerd afterwards); returns its version.
pub fn prepare(runtime: OciRuntime) -> anyhow::Result<Version> {
    let out = run("containerd", &["--version"])?;
    let version = Version::parse_version_output(&out)
        .with_context(|| format!("containerd --version said {out:?}"))?;
    if let Some(dir) = Path::new(CONTAINERD_CONFIG).parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(CONTAINERD_CONFIG, containerd_config(version, runtime))
        .with_context(|| format!("writing {CONTAINERD_CONFIG}"))?;
    if runtime == OciRuntime::Crun {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::write(CRUN_WRAPPER_PATH, CRUN_WRAPPER)
            .with_context(|| format!("writing {CRUN_WRAPPER_PATH}"))?;
        std::fs::set_permissions(CRUN_WRAPPER_PATH, std::fs::Permissions::from_mode(0o755))?;
    }
    Ok(version)
}

/// Which checks to run.
#[derive(Clone, Copy, Debug, Default)]
pub struct Plan {
    /// Skip the eBPF-only round (the quick check).
    pub quick: bool,
    /// Lifecycles of the churn audit (0: none).
    pub churn: usize,
    pub seed: u64,
    /// The OCI runtime containerd runs containers with (`prepare` wrote it in its config).
    pub oci_runtime: OciRuntime,
}

/// Runs every check on the node, printing each result as it comes; fails if one failed.
pub async fn check(plan: Plan) -> anyhow::Result<()> {
    let mut report = Reporter::default();
    report.result("init", init());
    report.result("containerd", containerd());
    let images = std::env::temp_dir().join("plegd-node-images");
    let imported = import_images(&images);
    let imported_ok = imported.is_ok();
    report.result("images", imported);
    report.result("plegd-ready", plegd_ready());
    // The kernel's own setting, left as it is (Debian's is 3).
    let paranoid = perf_event_paranoid()?;
    let since = unix_now();
    report.result("ebpf-attached", ebpf_attached(paranoid));
    report.result("plegd-check", plegd_check_sandboxed());
    report.result("daemonset-capabilities", daemonset_capabilities());
    report.result("hardening", hardening());
    let cri = Cri::connect_socket(Path::new(CONTAINERD_SOCKET), CgroupDriver::Systemd).await;
    match (cri, imported_ok) {
        (Ok(cri), true) => {
            report.result("oci-runtime", oci_runtime(&cri, plan.oci_runtime).await);
            for pid_mode in PidMode::ALL {
                let name = format!("lifecycle-default-{}", pid_key(pid_mode));
                report.result(&name, lifecycles(&cri, pid_mode, Round::Default).await);
            }
            report.result("oom-scope", oom_scope(&cri).await);
            if !plan.quick {
                report.result("oom-node", oom_node(&cri).await);
                let result = ebpf_only(&cri, &mut report).await;
                report.result("ebpf-only", result);
            }
            if plan.churn > 0 {
                report.result("churn", churn(&cri, plan.churn, plan.seed).await);
            }
            report.result("kill-restart", kill_restart(&cri).await);
            report.result("journal", journal(since));
        }
        (Err(e), _) => report.result("cri", Err(e)),
        (_, false) => report.result("cri", Err(anyhow::anyhow!("no images: no pods"))),
    }
    if report.failed.is_empty() {
        Ok(())
    } else {
        bail!(
            "{} checks failed: {}",
            report.failed.len(),
            report.failed.join(", ")
        )
    }
}

/// Prints one line per check.
#[derive(Default)]
struct Reporter {
    failed: Vec<String>,
}

impl Reporter {
    fn result(&mut self, name: &str, result: anyhow::Result<String>) {
        let (verdict, detail) = match result {
            Ok(detail) => ("pass", detail),
            Err(e) => {
                self.failed.push(name.to_owned());
                ("FAIL", format!("{e:#}"))
            }
        };
        // One line each: the host reads them line by line.
        let detail = detail.replace('\n', " | ");
        println!("{MARK} check {name} {verdict} {detail}");
        let _ = std::io::stdout().flush();
    }
}

// ---------------------------------------------------------------------------------------------
// The node itself

/// systemd is PID 1 and cgroup2 at /sys/fs/cgroup is the only cgroup mount.
fn init() -> anyhow::Result<String> {
    let comm = std::fs::read_to_string("/proc/1/comm")?;
    ensure!(
        comm.trim() == "systemd",
        "PID 1 is {:?}, not systemd",
        comm.trim()
    );
    let version = run("systemctl", &["--version"])?;
    let version = version.lines().next().unwrap_or_default().to_owned();
    let mounts = std::fs::read_to_string("/proc/self/mounts")?;
    let cgroups: Vec<(&str, &str)> = mounts
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let (_, at, kind) = (fields.next()?, fields.next()?, fields.next()?);
            kind.starts_with("cgroup").then_some((at, kind))
        })
        .collect();
    ensure!(
        cgroups == [("/sys/fs/cgroup", "cgroup2")],
        "cgroup mounts are {cgroups:?}, not cgroup2 at /sys/fs/cgroup alone"
    );
    Ok(format!("PID 1 {version}; cgroup2 alone at /sys/fs/cgroup"))
}

/// containerd runs as its unit, its CRI runc on the systemd cgroup driver.
fn containerd() -> anyhow::Result<String> {
    let unit = show(
        "containerd.service",
        &["ActiveState", "SubState", "ExecStart"],
    )?;
    ensure!(
        unit["ActiveState"] == "active" && unit["SubState"] == "running",
        "containerd.service is {}/{}",
        unit["ActiveState"],
        unit["SubState"]
    );
    let config = std::fs::read_to_string(CONTAINERD_CONFIG)?;
    ensure!(
        config.contains("SystemdCgroup = true"),
        "{CONTAINERD_CONFIG} does not set SystemdCgroup"
    );
    let version = run("containerd", &["--version"])?;
    Ok(format!(
        "containerd.service active/running: {}; SystemdCgroup = true",
        version.trim()
    ))
}

/// The harness's busybox and pause images, imported into CRI's namespace.
fn import_images(dir: &Path) -> anyhow::Result<String> {
    let images = image::build_images(dir)?;
    for tarball in [&images.busybox, &images.pause] {
        let tarball = tarball.to_str().context("image path")?;
        run(
            "ctr",
            &[
                "--address",
                CONTAINERD_SOCKET,
                "--namespace",
                crate::containerd::CRI_NAMESPACE,
                "images",
                "import",
                tarball,
            ],
        )?;
    }
    Ok(format!(
        "{} and {}",
        image::BUSYBOX_IMAGE,
        image::PAUSE_IMAGE
    ))
}

// ---------------------------------------------------------------------------------------------
// plegd's unit

/// systemd shows plegd active only once READY=1 came (its status text is READY's), and plegd's
/// health shows the full relist READY waited for.
fn plegd_ready() -> anyhow::Result<String> {
    let unit = show(
        UNIT,
        &[
            "Type",
            "ActiveState",
            "SubState",
            "StatusText",
            "ExecMainStartTimestampMonotonic",
            "ActiveEnterTimestampMonotonic",
        ],
    )?;
    ensure!(
        unit["Type"] == "notify",
        "the unit's Type is {}",
        unit["Type"]
    );
    ensure!(
        unit["ActiveState"] == "active" && unit["SubState"] == "running",
        "plegd is {}/{}",
        unit["ActiveState"],
        unit["SubState"]
    );
    ensure!(
        unit["StatusText"].starts_with(READY_STATUS),
        "active with status {:?}: not READY's",
        unit["StatusText"]
    );
    let micros = |key: &str| unit[key].parse::<u64>().unwrap_or(0);
    let (started, active) = (
        micros("ExecMainStartTimestampMonotonic"),
        micros("ActiveEnterTimestampMonotonic"),
    );
    ensure!(
        active > started,
        "active at {active} µs, not after the start at {started} µs"
    );
    let health = health()?;
    ensure!(
        health["healthy"] == true,
        "plegd health says unhealthy: {}",
        health["message"]
    );
    Ok(format!(
        "active/running {:.2} s after exec (READY=1: \"{}\"); health: {}",
        (active - started) as f64 / 1e6,
        unit["StatusText"],
        health["message"].as_str().unwrap_or_default()
    ))
}

/// What `plegd check` printed under the unit's own sandbox (its capabilities, filters,
/// protections read from the installed unit file): its `ok`/`NO` lines, its stderr.
fn sandboxed_check() -> anyhow::Result<(Vec<String>, String)> {
    let unit = std::fs::read_to_string(UNIT_FILE)?;
    let mut cmd = Command::new("systemd-run");
    cmd.args(["--wait", "--pipe", "--quiet", "--collect"]);
    for (key, value) in sandbox_settings(&unit) {
        cmd.arg("-p").arg(format!("{key}={value}"));
    }
    cmd.args([PLEGD, "check"]);
    let out = cmd.output().context("systemd-run plegd check")?;
    Ok(check_lines_of(&out))
}

/// The `ok`/`NO` lines of a `plegd check`'s output, spaces squeezed, and its stderr.
fn check_lines_of(out: &std::process::Output) -> (Vec<String>, String) {
    let lines = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with("ok ") || l.starts_with("NO "))
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect();
    (
        lines,
        String::from_utf8_lossy(&out.stderr).trim().to_owned(),
    )
}

/// The `plegd check` line about `subject` ("eBPF probes", "probe ").
fn check_lines<'a>(lines: &'a [String], subject: &str) -> Vec<&'a String> {
    lines
        .iter()
        .filter(|l| l[3..].starts_with(subject))
        .collect()
}

/// `plegd check` under the unit's sandbox loads and attaches every probe.
fn plegd_check_sandboxed() -> anyhow::Result<String> {
    let (lines, stderr) = sandboxed_check()?;
    every_probe_attached(&lines, &stderr, "the unit's sandbox")
}

/// The capabilities deploy/kubernetes/daemonset.yaml gives plegd's container (`add`, after
/// `drop: [ALL]`).
fn daemonset_added_capabilities() -> anyhow::Result<Vec<String>> {
    use serde::Deserialize as _;
    let text = include_str!("../../deploy/kubernetes/daemonset.yaml");
    for document in serde_yaml::Deserializer::from_str(text) {
        let manifest = serde_yaml::Value::deserialize(document)?;
        if manifest["kind"] != "DaemonSet" {
            continue;
        }
        let containers = manifest["spec"]["template"]["spec"]["containers"]
            .as_sequence()
            .context("the DaemonSet's containers")?;
        let plegd = containers
            .iter()
            .find(|c| c["name"] == "plegd")
            .context("no container plegd in the DaemonSet")?;
        let add = plegd["securityContext"]["capabilities"]["add"]
            .as_sequence()
            .context("the plegd container adds no capability")?;
        return Ok(add
            .iter()
            .filter_map(|c| c.as_str().map(str::to_lowercase))
            .collect());
    }
    bail!("no DaemonSet in deploy/kubernetes/daemonset.yaml")
}

/// `plegd check` as root with the DaemonSet's capabilities and no other (its bounding set:
/// what root's exec gets) loads and attaches every probe. Kernels before 5.11 charge BPF maps
/// to RLIMIT_MEMLOCK, which the manifest says needs SYS_RESOURCE there.
fn daemonset_capabilities() -> anyhow::Result<String> {
    let mut caps = daemonset_added_capabilities()?;
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease")?;
    if kernel_before(&release, (5, 11)) {
        caps.push("sys_resource".to_owned());
    }
    let bounding = format!(
        "-all,{}",
        caps.iter()
            .map(|c| format!("+{c}"))
            .collect::<Vec<_>>()
            .join(",")
    );
    let out = Command::new("setpriv")
        .args([
            "--inh-caps",
            "-all",
            "--bounding-set",
            &bounding,
            PLEGD,
            "check",
        ])
        .output()
        .context("setpriv plegd check")?;
    let (lines, stderr) = check_lines_of(&out);
    every_probe_attached(
        &lines,
        &stderr,
        &format!("the DaemonSet's capabilities ({bounding})"),
    )
}

/// Whether a kernel `release` ("5.10.0-32-amd64") is older than `(major, minor)`.
fn kernel_before(release: &str, (major, minor): (u32, u32)) -> bool {
    let mut parts = release
        .trim()
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|p| p.parse::<u32>().ok());
    let found = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    found < (major, minor)
}

/// `plegd check`'s lines: every probe attached, the eBPF summary ok; the summary and the
/// optional features it lacks.
fn every_probe_attached(lines: &[String], stderr: &str, under: &str) -> anyhow::Result<String> {
    let probes = check_lines(lines, "probe ");
    let summary = check_lines(lines, "eBPF probes");
    let all_ok = !probes.is_empty()
        && probes.iter().all(|l| l.starts_with("ok "))
        && summary.first().is_some_and(|l| l.starts_with("ok "));
    ensure!(
        all_ok,
        "under {under}: {} (stderr: {stderr})",
        lines.join("; ")
    );
    let attached: Vec<&str> = check_lines(lines, "probe ")
        .into_iter()
        .filter(|l| l.contains(" attached "))
        .map(|l| {
            if l.contains("raw tracepoint") {
                "raw"
            } else {
                "perf_event_open"
            }
        })
        .collect();
    let optional: Vec<&str> = lines
        .iter()
        .filter(|l| l.starts_with("NO "))
        .map(String::as_str)
        .collect();
    Ok(format!(
        "under {under}: {}; {} probe lines ok, attached as {}; not ok (optional): {}",
        summary[0],
        probes.len(),
        attached.join(", "),
        if optional.is_empty() {
            "none".to_owned()
        } else {
            optional.join("; ")
        }
    ))
}

/// At the kernel's own `perf_event_paranoid` (Debian's 3, where `perf_event_open` needs
/// CAP_SYS_ADMIN), the unit as installed runs with its probes: its eBPF source is up, and
/// every probe attached without perf_event_open where the kernel is that strict.
fn ebpf_attached(paranoid: u32) -> anyhow::Result<String> {
    let health = Command::new(PLEGD)
        .args(["health", "--output", "json", "--socket", API_SOCKET])
        .output()
        .context("plegd health")?;
    let health: Value = serde_json::from_slice(&health.stdout)
        .with_context(|| format!("plegd health: {}", String::from_utf8_lossy(&health.stdout)))?;
    let ebpf = health["sources"]
        .as_array()
        .and_then(|sources| sources.iter().find(|s| s["source"] == "ebpf"))
        .with_context(|| format!("no eBPF source in {health}"))?;
    ensure!(
        ebpf["state"] == "connected",
        "perf_event_paranoid {paranoid}: plegd's eBPF source is {}",
        ebpf
    );
    let (lines, stderr) = sandboxed_check()?;
    let classic: Vec<&String> = check_lines(&lines, "probe ")
        .into_iter()
        .filter(|l| l.contains(" attached ") && !l.contains("raw tracepoint"))
        .collect();
    ensure!(
        paranoid <= 2 || classic.is_empty(),
        "perf_event_paranoid {paranoid}, yet attached through perf_event_open: {classic:?} \
         (stderr: {stderr})"
    );
    Ok(format!(
        "perf_event_paranoid {paranoid} (untouched): the unit's eBPF source is {}",
        ebpf["state"]
    ))
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn perf_event_paranoid() -> anyhow::Result<u32> {
    let text = std::fs::read_to_string(PERF_EVENT_PARANOID)
        .with_context(|| format!("reading {PERF_EVENT_PARANOID}"))?;
    Ok(text.trim().parse()?)
}

/// The `[Service]` lines of `unit` that are part of its sandbox ([`SANDBOX_KEYS`]).
fn sandbox_settings(unit: &str) -> Vec<(&str, &str)> {
    let mut in_service = false;
    let mut settings = Vec::new();
    for line in unit.lines().map(str::trim) {
        if line.starts_with('[') {
            in_service = line == "[Service]";
        } else if in_service
            && !line.starts_with('#')
            && let Some((key, value)) = line.split_once('=')
            && SANDBOX_KEYS.contains(&key.trim())
        {
            settings.push((key.trim(), value.trim()));
        }
    }
    settings
}

/// The running plegd holds only CAP_BPF (README: three at start, one kept), its bounding and
/// ambient sets hold nothing else, no new privileges, a seccomp filter.
fn hardening() -> anyhow::Result<String> {
    let pid = main_pid()?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .map(str::trim)
            .with_context(|| format!("/proc/{pid}/status has no {name}"))
    };
    let caps = |name: &str| -> anyhow::Result<u64> { Ok(u64::from_str_radix(field(name)?, 16)?) };
    let bpf = 1u64 << CAP_BPF;
    let unit_set = bpf | 1 << CAP_PERFMON | 1 << CAP_SETPCAP;
    let (eff, prm, inh, bnd, amb) = (
        caps("CapEff")?,
        caps("CapPrm")?,
        caps("CapInh")?,
        caps("CapBnd")?,
        caps("CapAmb")?,
    );
    ensure!(
        eff == bpf && prm == bpf,
        "CapEff {eff:016x} CapPrm {prm:016x}: not CAP_BPF alone"
    );
    ensure!(
        inh & !bpf == 0 && bnd & !bpf == 0 && amb & !bpf == 0,
        "CapInh {inh:016x} CapBnd {bnd:016x} CapAmb {amb:016x} hold more than CAP_BPF"
    );
    ensure!(bnd & !unit_set == 0, "bounding set beyond the unit's");
    ensure!(field("NoNewPrivs")? == "1", "NoNewPrivs is not set");
    ensure!(
        field("Seccomp")? == "2",
        "no seccomp filter (Seccomp: {})",
        field("Seccomp")?
    );
    Ok(format!(
        "pid {pid}: CapEff {eff:016x} CapPrm {prm:016x} CapInh {inh:016x} CapBnd {bnd:016x} \
         CapAmb {amb:016x} (CAP_BPF only), NoNewPrivs 1, Seccomp 2 (filter)"
    ))
}

/// No system call was refused: the kernel logged no seccomp action and plegd's journal has no
/// refused call (the unit's filter answers EPERM: a refused call shows as an error there) and
/// no SIGSYS.
fn journal(since: u64) -> anyhow::Result<String> {
    let since = format!("@{since}");
    let kernel = run("journalctl", &["-k", "-b", "--no-pager", "-o", "cat"])?;
    let seccomp: Vec<&str> = kernel
        .lines()
        .filter(|l| l.contains("seccomp") || l.contains("type=1326"))
        .collect();
    ensure!(seccomp.is_empty(), "kernel log: {}", seccomp.join(" | "));
    let plegd = run(
        "journalctl",
        &["-u", UNIT, "--since", &since, "--no-pager", "-o", "cat"],
    )?;
    let refused: Vec<&str> = plegd
        .lines()
        .filter(|l| {
            l.contains("Operation not permitted") || l.contains("SIGSYS") || l.contains("EPERM")
        })
        .collect();
    ensure!(
        refused.is_empty(),
        "plegd's journal: {}",
        refused.join(" | ")
    );
    Ok(format!(
        "no seccomp action in the kernel log; {} lines of plegd's journal, none refused",
        plegd.lines().count()
    ))
}

/// `systemctl kill -s KILL plegd`: the unit starts it again (a new main pid, READY again) and
/// a watcher that was connected is told to resync.
async fn kill_restart(cri: &Cri) -> anyhow::Result<String> {
    let watcher = Watcher::start()?;
    let pod = cri
        .run_pod_in("node-kill-restart", PidMode::Container)
        .await?;
    let result = kill_restart_with(cri, &pod, &watcher).await;
    let _ = cri.remove_pod(&pod).await;
    watcher.stop();
    result
}

async fn kill_restart_with(cri: &Cri, pod: &Pod, watcher: &Watcher) -> anyhow::Result<String> {
    // The watcher follows the daemon once it has the sleeper's start.
    let sleeper = cri
        .run_container(pod, &ContainerSpec::sleeper("sleeper"))
        .await?;
    let started = watcher.event(&sleeper, "ContainerStarted", STEP).await?;
    let before = show(UNIT, &["MainPID", "NRestarts"])?;
    let killed_at = Instant::now();
    run("systemctl", &["kill", "-s", "KILL", UNIT])?;
    // The restart takes what a start takes: under QEMU's TCG beside the suite's tests, its
    // probes' load (the kernel's BTF parsed by an emulated CPU) once took 54 s.
    let after = wait_for(
        "plegd restarted by its unit",
        Duration::from_secs(180),
        || {
            let now = show(UNIT, &["MainPID", "NRestarts", "ActiveState", "SubState"])?;
            let restarted = now["MainPID"] != before["MainPID"]
                && now["MainPID"] != "0"
                && now["ActiveState"] == "active"
                && now["SubState"] == "running";
            Ok(restarted.then_some(now))
        },
    )?;
    let restarted_in = killed_at.elapsed();
    let old_run = started["run_id"].clone();
    let resync = watcher
        .wait("a resync to the new run", STEP, |v| {
            v.get("resync").is_some() && v["resync"]["run_id"] != old_run
        })
        .await?;
    let listed = resync["resync"]["pods"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|p| p["containers"].as_array().into_iter().flatten())
        .find(|c| c["id"] == sleeper.as_str())
        .map(|c| c["state"].clone());
    ensure!(
        listed.as_ref().is_some_and(|s| s == "running"),
        "the resync lists the running sleeper as {listed:?}"
    );
    Ok(format!(
        "main pid {} -> {} (NRestarts {} -> {}) in {:.1} s; the watcher resynced from run {} to {}, \
         the sleeper listed running",
        before["MainPID"],
        after["MainPID"],
        before["NRestarts"],
        after["NRestarts"],
        restarted_in.as_secs_f64(),
        old_run.as_str().unwrap_or("?"),
        resync["resync"]["run_id"].as_str().unwrap_or("?")
    ))
}

/// Why lifecycles were abandoned: each distinct error once, with how many it ended (ids
/// masked, so that errors alike but for their container count as one).
fn abandoned_why(why: &[String]) -> String {
    let mut counted: Vec<(String, usize)> = Vec::new();
    for w in why {
        let masked = mask_ids(w);
        match counted.iter_mut().find(|(seen, _)| *seen == masked) {
            Some((_, n)) => *n += 1,
            None => counted.push((masked, 1)),
        }
    }
    counted
        .iter()
        .map(|(error, n)| format!("; {n}x {error}"))
        .collect()
}

/// `text` with each run of 32 or more hex digits (a container or sandbox id) as `<id>`.
fn mask_ids(text: &str) -> String {
    let mut masked = String::with_capacity(text.len());
    let mut run = String::new();
    for c in text.chars().chain(std::iter::once(' ')) {
        if c.is_ascii_hexdigit() {
            run.push(c);
            continue;
        }
        masked.push_str(if run.len() >= 32 { "<id>" } else { &run });
        run.clear();
        masked.push(c);
    }
    masked.pop();
    masked
}

// ---------------------------------------------------------------------------------------------
// Lifecycles

/// Lifecycles of the churn in flight at most (TCG is slow).
const CHURN_IN_FLIGHT: usize = 8;

/// The soak's churn, short, against the node's plegd: `lifecycles` lifecycles drawn from
/// `seed` (kill -9, exit codes, OOM, brief runs, CRI stops, whole pods stopped) in pods of
/// every pid mode, with `systemctl restart containerd` and `systemctl restart plegd` halfway;
/// the soak's checker ([`audit::check`]) on what a watcher received: nothing lost, duplicated,
/// reordered or with a wrong exit. What changed during the two restarts folds as the soak's
/// restart faults allow (the outage, then full relists alone until plegd's push sources are
/// connected again).
async fn churn(cri: &Cri, lifecycles: usize, seed: u64) -> anyhow::Result<String> {
    let began = Instant::now();
    let watcher = Watcher::start()?;
    let socket = Path::new(CONTAINERD_SOCKET);
    let prefix = format!("churn-{seed:x}");
    let mut pods = Vec::new();
    for (i, pid_mode) in PidMode::ALL
        .iter()
        .cycle()
        .take(PidMode::ALL.len() * soak::PODS_PER_MODE)
        .enumerate()
    {
        pods.push(cri.run_pod_in(&format!("{prefix}-{i}"), *pid_mode).await?);
    }
    let mut clients = (
        cri.clone(),
        Native::connect_socket(socket, CRI_NAMESPACE).await?,
    );
    let mut jitter = Jitter::new(seed);
    let mut running = tokio::task::JoinSet::new();
    let mut results = Vec::new();
    // When the restarts began, plegd was back, and its push sources were connected again.
    let mut restarted = None;
    for n in 0..lifecycles {
        while running.len() >= CHURN_IN_FLIGHT {
            results.extend(running.join_next().await);
        }
        let draw = soak::Draw::new(n, &mut jitter);
        let pod: Pod = pods[draw.pod % pods.len()].clone();
        let (cri, tasks, prefix) = (clients.0.clone(), clients.1.clone(), prefix.clone());
        running.spawn(async move { soak::lifecycle(&cri, &tasks, &pod, &prefix, draw).await });
        if n + 1 == lifecycles / 2 {
            let down = SystemTime::now();
            run("systemctl", &["restart", "containerd"])?;
            // Lifecycles started before its CRI is back would fail, not test plegd.
            containerd::wait_cri_ready(socket, STEP).await?;
            clients = (
                Cri::connect_socket(socket, CgroupDriver::Systemd).await?,
                Native::connect_socket(socket, CRI_NAMESPACE).await?,
            );
            run("systemctl", &["restart", UNIT])?;
            let up = SystemTime::now();
            wait_for("plegd's push sources connected", STEP, || match health() {
                Ok(health) => Ok(sources_connected(&health)?.then_some(())),
                Err(_) => Ok(None),
            })?;
            restarted = Some((down, up, SystemTime::now()));
            println!(
                "{MARK} note churn: {} lifecycles in, containerd and plegd restarted",
                n + 1
            );
        }
        tokio::time::sleep(jitter.below(Duration::from_millis(300))).await;
    }
    while let Some(result) = running.join_next().await {
        results.push(result);
    }
    let mut truths = Vec::new();
    let mut why = Vec::new();
    for result in results {
        match result {
            Ok(Ok(truth)) => truths.push(truth),
            Ok(Err(e)) => why.push(format!("{e:#}")),
            Err(e) => why.push(e.to_string()),
        }
    }
    let abandoned = why.len();
    // Every removal reached the watcher, within one bound for all: what is still missing
    // then is the audit's to report.
    let deadline = Instant::now() + STEP;
    for truth in truths.iter().filter(|t| t.removed) {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        let _ = watcher
            .event(&truth.container_id, "ContainerRemoved", left)
            .await;
    }
    let folding = Folding {
        outage: restarted.map(|(down, up, _)| (down, up)),
        polled: restarted
            .map(|(down, _, connected)| soak::polled_across_a_restart(down, connected)),
        ..soak::Mode::Default.folding()
    };
    let report = audit::check(&truths, &watcher.records(), folding);
    watcher.stop();
    for pod in &pods {
        let _ = clients.0.remove_pod(pod).await;
    }
    let summary = report.to_string();
    // plegd is judged, not the harness: a lifecycle whose own runtime calls broke across the
    // restarts (a broken pipe, a sandbox the restart took) has no ground truth and is left out,
    // however many; what plegd reported of every other one must hold.
    let reasons = abandoned_why(&why);
    ensure!(
        report.expected > 0 && report.is_clean(),
        "seed {seed}, {abandoned} abandoned{reasons}: {summary}"
    );
    Ok(format!(
        "seed {seed}, {:.0} s, {abandoned} lifecycles abandoned (in flight during the restarts{reasons}): {}",
        began.elapsed().as_secs_f64(),
        summary.lines().next().unwrap_or_default()
    ))
}

/// How plegd runs for a round of lifecycles.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Round {
    /// deploy/plegd.toml as installed.
    Default,
    /// eBPF hints alone (`mode = "ebpf"`, `sources = ["ebpf"]`), full relists slowed: starts
    /// and deaths must come through eBPF, removals through a slow full relist.
    EbpfOnly,
}

/// eBPF-only: plegd's config switched, the unit restarted, a round of lifecycles per pid mode,
/// and the installed config back.
async fn ebpf_only(cri: &Cri, report: &mut Reporter) -> anyhow::Result<String> {
    let installed = std::fs::read_to_string(CONFIG)?;
    let ebpf = format!(
        "{installed}\n# cargo xtask node: the eBPF-only round.\nmode = \"ebpf\"\nsources = [\"ebpf\"]\n\
         relist-period = \"{EBPF_ONLY_RELIST}\"\nslow-relist-period = \"{EBPF_ONLY_RELIST}\"\n"
    );
    std::fs::write(CONFIG, ebpf)?;
    let restarted = run("systemctl", &["restart", UNIT]);
    let mut passed = 0;
    if restarted.is_ok() {
        for pid_mode in PidMode::ALL {
            let name = format!("lifecycle-ebpf-only-{}", pid_key(pid_mode));
            let result = lifecycles(cri, pid_mode, Round::EbpfOnly).await;
            passed += usize::from(result.is_ok());
            report.result(&name, result);
        }
    }
    std::fs::write(CONFIG, installed)?;
    run("systemctl", &["restart", UNIT])?;
    restarted.context("restarting plegd in eBPF-only mode")?;
    ensure!(
        passed == PidMode::ALL.len(),
        "{passed} of {} pid modes passed",
        PidMode::ALL.len()
    );
    Ok(format!(
        "all {passed} pid modes; installed config restored, plegd restarted"
    ))
}

/// In a pod of `pid_mode` made as kubelet's systemd driver makes it: a container killed with
/// kill -9, one exiting 3, one OOM-killed, each removed; each transition seen by a watcher of
/// the node's plegd, for the right pod, in the container's systemd scope.
async fn lifecycles(cri: &Cri, pid_mode: PidMode, round: Round) -> anyhow::Result<String> {
    let watcher = Watcher::start()?;
    let pod = cri
        .run_pod_in(
            &format!("node-{}-{}", round_key(round), pid_key(pid_mode)),
            pid_mode,
        )
        .await?;
    let result = lifecycles_in(cri, &pod, &watcher, round).await;
    let _ = cri.remove_pod(&pod).await;
    watcher.stop();
    result
}

async fn lifecycles_in(
    cri: &Cri,
    pod: &Pod,
    watcher: &Watcher,
    round: Round,
) -> anyhow::Result<String> {
    let mut notes = Vec::new();
    // kill -9 of a sleeper, from outside the runtime.
    let sleeper = cri
        .run_container(pod, &ContainerSpec::sleeper("sleeper"))
        .await?;
    let started = watcher.event(&sleeper, "ContainerStarted", STEP).await?;
    check_event(&started, pod, round)?;
    let scope = scope_of(pod, &sleeper)?;
    let pids = procs(&scope)?;
    ensure!(!pids.is_empty(), "{} holds no process", scope.display());
    for pid in &pids {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(*pid),
            nix::sys::signal::Signal::SIGKILL,
        )?;
    }
    let died = watcher.event(&sleeper, "ContainerDied", STEP).await?;
    check_event(&died, pod, round)?;
    ensure!(
        died["exit_code"] == 137,
        "kill -9: exit {}",
        died["exit_code"]
    );
    let observations = died["observations"].to_string();
    ensure!(
        round == Round::Default || observations.contains("signal=9"),
        "kill -9: no signal 9 observed ({observations})"
    );
    notes.push(format!(
        "kill -9 -> exit 137 {} via {} ({} ms)",
        observations, died["sources"], died["latency_ms"]
    ));

    // An exit with a code.
    let exiting = cri
        .run_container(pod, &ContainerSpec::exiting("exiting", 3))
        .await?;
    let died = watcher.event(&exiting, "ContainerDied", STEP).await?;
    check_event(&died, pod, round)?;
    ensure!(died["exit_code"] == 3, "exit 3: exit {}", died["exit_code"]);
    notes.push(format!("exit 3 via {}", died["sources"]));

    // The kernel's OOM killer, under a 32 MiB limit. CRI's own record must say OOMKilled,
    // and plegd must have told it.
    let oom = cri.run_container(pod, &ContainerSpec::oom("oom")).await?;
    let died = watcher.event(&oom, "ContainerDied", STEP).await?;
    check_event(&died, pod, round)?;
    let observations = died["observations"].to_string();
    let observed = observations.contains("ebpf:oom_killed");
    ensure!(
        died["exit_code"] == 137 && (round == Round::Default || observed),
        "OOM: exit {} reason {} confirmed by {} observations {observations}",
        died["exit_code"],
        died["reason"],
        died["confirmed_by"]
    );
    let status = cri
        .wait_state(&oom, ContainerState::ContainerExited, STEP)
        .await?;
    ensure!(
        status.reason == "OOMKilled",
        "OOM: CRI says reason {:?}",
        status.reason
    );
    let told = told_as_shown(watcher, &died, &status.reason).await?;
    notes.push(format!(
        "OOM -> {} {} {observations} (confirmed by {}; CRI: OOMKilled, {told}) via {}",
        died["exit_code"], died["reason"], died["confirmed_by"], died["sources"]
    ));

    // Removal: the kernel sees nothing of it, so eBPF-only finds it in a slow full relist.
    let removal = match round {
        Round::Default => STEP,
        Round::EbpfOnly => STEP + Duration::from_secs(10),
    };
    for id in [&sleeper, &exiting, &oom] {
        cri.wait_state(id, ContainerState::ContainerExited, STEP)
            .await?;
        cri.remove_container(id).await?;
    }
    for id in [&sleeper, &exiting, &oom] {
        let removed = watcher.event(id, "ContainerRemoved", removal).await?;
        ensure!(
            removed["pod_uid"] == pod.uid.as_str(),
            "removal for pod {}",
            removed["pod_uid"]
        );
    }
    notes.push("3 removals".into());
    Ok(format!(
        "pod {} in {} (scope {}): {}",
        pod.name,
        CgroupDriver::Systemd.pod_parent(&pod.uid),
        scope.file_name().unwrap_or_default().to_string_lossy(),
        notes.join("; ")
    ))
}

/// Where the unit serves /metrics on the node: node.sh's drop-in sets
/// `PLEGD_METRICS_ADDRESS` (the installed config leaves it off).
const METRICS: &str = "127.0.0.1:9809";

/// The OCI runtime containerd runs containers with is the one asked for: its state
/// directory under the shim's root holds crun's `status` or runc's `state.json`.
async fn oci_runtime(cri: &Cri, runtime: OciRuntime) -> anyhow::Result<String> {
    let pod = cri.run_pod("node-oci-runtime").await?;
    let result = async {
        let id = cri
            .run_container(&pod, &ContainerSpec::sleeper("sleeper"))
            .await?;
        let state = Path::new("/run/containerd/runc")
            .join(CRI_NAMESPACE)
            .join(&id);
        let file = match runtime {
            OciRuntime::Runc => "state.json",
            OciRuntime::Crun => "status",
        };
        ensure!(
            state.join(file).exists(),
            "{} has no {file}: the container is not {}'s",
            state.display(),
            runtime.name()
        );
        let version = run(
            match runtime {
                OciRuntime::Runc => "runc",
                OciRuntime::Crun => "crun",
            },
            &["--version"],
        )?;
        Ok(format!(
            "{} runs the containers ({}{})",
            runtime.name(),
            version.lines().next().unwrap_or_default(),
            match runtime {
                OciRuntime::Runc => "",
                OciRuntime::Crun => ", through crun-oci-1.1: ociVersion 1.1.0",
            }
        ))
    }
    .await;
    let _ = cri.remove_pod(&pod).await;
    result
}

/// A counter's series on the unit's /metrics (0 for one not made yet).
fn counter(name: &str, labels: &str) -> anyhow::Result<f64> {
    let address = METRICS.parse().context("metrics address")?;
    let series = crate::bench::metric_series_at(address, name)
        .with_context(|| format!("reading {name} at {METRICS}"))?;
    Ok(series.get(labels).copied().unwrap_or(0.0))
}

/// How plegd told the death `died` with the reason CRI shows, `shown`: on the death itself,
/// or on the ContainerChanged that corrects it. containerd's shim sends `/tasks/oom` apart from
/// `/tasks/exit`, on cgroup2 after a wait on `memory.events`, so on a slow node it can follow
/// the exit; the death then goes out with the reason containerd had (`Error`), and the
/// reason it takes later is told (docs/design.md, "From hints to reads": a reason corrected).
async fn told_as_shown(watcher: &Watcher, died: &Value, shown: &str) -> anyhow::Result<String> {
    if died["reason"] == shown {
        return Ok("told on the death".to_owned());
    }
    let id = died["container_id"].as_str().unwrap_or_default();
    let sequence = died["sequence"].as_u64().unwrap_or(u64::MAX);
    let changed = watcher
        .wait(
            &format!("ContainerChanged of {id:.12} to reason {shown}, after {died}"),
            STEP,
            |v| {
                v["type"] == "ContainerChanged"
                    && v["container_id"] == id
                    && v["reason"] == shown
                    && v["sequence"].as_u64().is_some_and(|s| s > sequence)
            },
        )
        .await?;
    Ok(format!(
        "told {} on the death, then {shown} on a ContainerChanged {}",
        died["reason"], changed["observations"]
    ))
}

/// An OOM kill of `spec` in `pod`: its ContainerDied says `scope` and the cgroup the kernel's
/// log names (none for the node's), the victim is the init (`dd`), and the node's and the
/// pod's counters move by exactly one; the kernel killed nothing else meanwhile.
async fn oom_kill_checked(
    cri: &Cri,
    watcher: &Watcher,
    pod: &Pod,
    spec: &ContainerSpec,
    customize: impl FnOnce(&mut k8s_cri::v1::ContainerConfig),
    scope: &str,
) -> anyhow::Result<String> {
    let node_labels = format!("{{scope=\"{scope}\"}}");
    let pod_labels = format!(
        "{{namespace=\"{}\",pod=\"{}\",scope=\"{scope}\"}}",
        pod.namespace, pod.name
    );
    let before = (
        counter("plegd_oom_kills_total", &node_labels)?,
        counter("plegd_pod_oom_kills_total", &pod_labels)?,
    );
    let kills_before = oom::kernel_oom_kills()?;
    let id = cri.create_container_with(pod, spec, customize).await?;
    cri.start_container(&id).await?;
    let died = watcher.event(&id, "ContainerDied", STEP * 2).await?;
    check_event(&died, pod, Round::Default)?;
    let account = &died["oom"];
    let limited = match scope {
        "container" => Some(oom::container_cgroup_path(pod.cgroup_parent(), &id)),
        "pod" => Some(oom::pod_cgroup_path(pod.cgroup_parent())),
        _ => None,
    };
    // crun limits its `container` cgroup inside the scope: the container's own too.
    let limited = match (scope, account["cgroup"].as_str(), limited) {
        ("container", Some(told), Some(scope_path))
            if told == format!("{scope_path}/container") =>
        {
            Some(told.to_owned())
        }
        (_, _, limited) => limited,
    };
    // The reason is containerd's record: its shim may miss an OOM kill (under crun it missed
    // these), and then CRI says `Error` too; the kill's account is the kernel's.
    let shown = cri
        .wait_state(&id, ContainerState::ContainerExited, STEP)
        .await?
        .reason;
    let told = told_as_shown(watcher, &died, &shown).await?;
    ensure!(
        died["exit_code"] == 137
            && (shown == "OOMKilled" || shown == "Error")
            && account["scope"] == scope
            && account["cgroup"] == limited.as_deref().map_or(Value::Null, Value::from)
            && account["victim_init"] == true
            && account["victim_comm"] == "dd",
        "OOM ({scope}): {died}"
    );
    let pid = account["victim_pid"]
        .as_u64()
        .and_then(|p| u32::try_from(p).ok())
        .context("no victim pid")?;
    let kernel = oom::kernel_oom_kill_of(pid, STEP).await?;
    match &limited {
        Some(limited) => ensure!(
            kernel.constraint == "CONSTRAINT_MEMCG"
                && kernel.oom_memcg.as_deref() == Some(limited.as_str()),
            "the kernel says {kernel:?}, plegd {account}"
        ),
        None => ensure!(
            kernel.constraint == "CONSTRAINT_NONE" && kernel.oom_memcg.is_none(),
            "the kernel says {kernel:?}, plegd {account}"
        ),
    }
    let others: Vec<_> = oom::kernel_oom_kills()?
        .into_iter()
        .filter(|k| k.pid != pid && !kills_before.contains(k))
        .collect();
    ensure!(
        others.is_empty(),
        "the kernel killed others too: {others:?}"
    );
    let after = (
        counter("plegd_oom_kills_total", &node_labels)?,
        counter("plegd_pod_oom_kills_total", &pod_labels)?,
    );
    ensure!(
        after.0 - before.0 == 1.0 && after.1 - before.1 == 1.0,
        "OOM ({scope}): counters {before:?} -> {after:?}"
    );
    println!("{MARK} note oom-{scope}: {died}");
    Ok(format!(
        "{scope} {} victim {pid} reason {shown} ({told}; kernel: {}), plegd_oom_kills_total{node_labels} {} -> {}, plegd_pod_oom_kills_total{{..}} {} -> {}",
        account["cgroup"], kernel.constraint, before.0, after.0, before.1, after.1
    ))
}

/// A container over its own 32 MiB, then one without a limit in a pod capped at 48 MiB (a
/// pod-level limit, written into the pod's slice as kubelet would).
async fn oom_scope(cri: &Cri) -> anyhow::Result<String> {
    let watcher = Watcher::start()?;
    let mut notes = Vec::new();
    let result = async {
        let own = cri.run_pod("node-oom-own").await?;
        let hog = oom::hog("hog", Some(32 << 20));
        notes.push(oom_kill_checked(cri, &watcher, &own, &hog, |_| {}, "container").await);
        let _ = cri.remove_pod(&own).await;
        let shared = cri.run_pod("node-oom-pod").await?;
        oom::cap_pod_memory(&shared, 48 << 20)?;
        let hog = oom::hog("hog", None);
        notes.push(oom_kill_checked(cri, &watcher, &shared, &hog, |_| {}, "pod").await);
        let _ = cri.remove_pod(&shared).await;
        notes.into_iter().collect::<anyhow::Result<Vec<_>>>()
    }
    .await;
    watcher.stop();
    Ok(result?.join("; "))
}

/// The node out of memory: a container without a limit, `oom_score_adj` 1000, takes nearly
/// all of it in one allocation. The kernel's global OOM killer must take it, and nothing else.
async fn oom_node(cri: &Cri) -> anyhow::Result<String> {
    let meminfo = std::fs::read_to_string("/proc/meminfo")?;
    let total_kib: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .context("no MemTotal in /proc/meminfo")?;
    // Below the overcommit heuristic's refusal (the RAM), above what is free.
    let mib = total_kib * 95 / 100 / 1024;
    let hog = ContainerSpec::shell(
        "hog",
        &format!("sleep 1; exec dd if=/dev/zero of=/dev/null bs={mib}M count=1"),
    );
    let watcher = Watcher::start()?;
    let pod = cri.run_pod("node-oom-node").await?;
    let result = oom_kill_checked(
        cri,
        &watcher,
        &pod,
        &hog,
        |config| {
            if let Some(linux) = config.linux.as_mut() {
                linux
                    .resources
                    .get_or_insert_with(Default::default)
                    .oom_score_adj = 1000;
            }
        },
        "node",
    )
    .await;
    let _ = cri.remove_pod(&pod).await;
    watcher.stop();
    Ok(format!(
        "{} ({mib} MiB of {} MiB)",
        result?,
        total_kib / 1024
    ))
}

/// The event belongs to `pod`; in eBPF-only rounds it came through eBPF.
fn check_event(event: &Value, pod: &Pod, round: Round) -> anyhow::Result<()> {
    ensure!(
        event["pod_uid"] == pod.uid.as_str() && event["pod_name"] == pod.name.as_str(),
        "{} for pod {}/{}, not {}/{}",
        event["type"],
        event["pod_name"],
        event["pod_uid"],
        pod.name,
        pod.uid
    );
    let sources = event["sources"].as_array().cloned().unwrap_or_default();
    ensure!(
        round == Round::Default || sources.iter().any(|s| s == "ebpf"),
        "{} via {:?}, not eBPF",
        event["type"],
        sources
    );
    Ok(())
}

/// The systemd scope a container of `pod` runs in:
/// `kubepods.slice/kubepods-besteffort.slice/<pod slice>/cri-containerd-<id>.scope`.
fn scope_of(pod: &Pod, id: &str) -> anyhow::Result<PathBuf> {
    let slice = CgroupDriver::Systemd.pod_parent(&pod.uid);
    let scope = Path::new("/sys/fs/cgroup/kubepods.slice/kubepods-besteffort.slice")
        .join(slice)
        .join(format!("cri-containerd-{id}.scope"));
    ensure!(
        scope.is_dir(),
        "no systemd scope {} for container {id}",
        scope.display()
    );
    Ok(scope)
}

/// The processes of `cgroup` and of crun's `container` cgroup inside it (crun's systemd
/// manager runs a container's processes there, not in its scope).
fn procs(cgroup: &Path) -> anyhow::Result<Vec<i32>> {
    let mut pids = Vec::new();
    for dir in [cgroup.to_owned(), cgroup.join("container")] {
        if let Ok(text) = std::fs::read_to_string(dir.join("cgroup.procs")) {
            pids.extend(text.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
        }
    }
    Ok(pids)
}

fn pid_key(mode: PidMode) -> &'static str {
    match mode {
        PidMode::Container => "container",
        PidMode::Pod => "pod",
        PidMode::Node => "node",
    }
}

fn round_key(round: Round) -> &'static str {
    match round {
        Round::Default => "default",
        Round::EbpfOnly => "ebpf",
    }
}

// ---------------------------------------------------------------------------------------------
// A watcher of the node's plegd

/// `plegd watch --output json --from 1` on the unit's socket: the run's events from its first
/// (none missed before it connects), a resync line when the run changes, each line kept as
/// JSON.
struct Watcher {
    process: Terminating,
    lines: Arc<(Mutex<Vec<Value>>, Notify)>,
    /// The same lines as the churn audit reads them.
    records: Arc<Mutex<Vec<Record>>>,
}

impl Watcher {
    fn start() -> anyhow::Result<Self> {
        let mut child = Command::new(PLEGD)
            .args([
                "watch", "--socket", API_SOCKET, "--output", "json", "--from", "1",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .context("starting plegd watch")?;
        let stdout = child.stdout.take().context("watch stdout")?;
        let lines = Arc::new((Mutex::new(Vec::new()), Notify::new()));
        let records = Arc::new(Mutex::new(Vec::new()));
        let (kept, recorded) = (lines.clone(), records.clone());
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Some(record) = Record::from_watch_line(&line, SystemTime::now()) {
                    recorded.lock().expect("watch records lock").push(record);
                }
                if let Ok(value) = serde_json::from_str::<Value>(&line) {
                    kept.0.lock().expect("watch lines lock").push(value);
                    kept.1.notify_waiters();
                }
            }
        });
        Ok(Self {
            process: Terminating(child),
            lines,
            records,
        })
    }

    /// The first line `matches` accepts, waiting up to `timeout` for it.
    async fn wait(
        &self,
        what: &str,
        timeout: Duration,
        matches: impl Fn(&Value) -> bool,
    ) -> anyhow::Result<Value> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let changed = self.lines.1.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if let Some(found) = self
                .lines
                .0
                .lock()
                .expect("watch lines lock")
                .iter()
                .find(|v| matches(v))
            {
                return Ok(found.clone());
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                bail!("the watcher got no {what} within {} s", timeout.as_secs());
            }
        }
    }

    async fn event(&self, id: &str, event_type: &str, timeout: Duration) -> anyhow::Result<Value> {
        self.wait(&format!("{event_type} of {id:.12}"), timeout, |v| {
            v["type"] == event_type && v["container_id"] == id
        })
        .await
    }

    fn records(&self) -> Vec<Record> {
        self.records.lock().expect("watch records lock").clone()
    }

    fn stop(self) {
        let _ = self.process.stop(Duration::from_secs(5));
    }
}

// ---------------------------------------------------------------------------------------------
// Helpers

/// `plegd health --output json` on the unit's socket.
fn health() -> anyhow::Result<Value> {
    let out = run(
        PLEGD,
        &["health", "--socket", API_SOCKET, "--output", "json"],
    )?;
    Ok(serde_json::from_str(&out)?)
}

fn main_pid() -> anyhow::Result<i32> {
    let pid: i32 = show(UNIT, &["MainPID"])?["MainPID"].parse()?;
    ensure!(pid > 0, "plegd has no main pid");
    Ok(pid)
}

/// `systemctl show UNIT -p ...` as a map (every asked property present, maybe empty).
fn show(unit: &str, properties: &[&str]) -> anyhow::Result<HashMap<String, String>> {
    let mut args = vec!["show", unit];
    for p in properties {
        args.extend(["-p", p]);
    }
    let out = run("systemctl", &args)?;
    let mut map: HashMap<String, String> = properties
        .iter()
        .map(|p| ((*p).to_owned(), String::new()))
        .collect();
    for line in out.lines() {
        if let Some((key, value)) = line.split_once('=') {
            map.insert(key.to_owned(), value.to_owned());
        }
    }
    Ok(map)
}

/// Polls `probe` (a systemd property, which has no event to await here) until it gives a value
/// or `timeout` passes.
fn wait_for<T>(
    what: &str,
    timeout: Duration,
    mut probe: impl FnMut() -> anyhow::Result<Option<T>>,
) -> anyhow::Result<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = probe()? {
            return Ok(value);
        }
        if Instant::now() > deadline {
            bail!("timed out after {} s waiting for {what}", timeout.as_secs());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Runs `program args`; its stdout, or an error with its stderr.
fn run(program: &str, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {program}"))?;
    ensure!(
        out.status.success(),
        "`{program} {}` failed ({}): {}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_releases_compare_by_major_and_minor() {
        assert!(kernel_before("5.10.0-32-amd64", (5, 11)));
        assert!(!kernel_before("6.1.0-57-amd64", (5, 11)));
        assert!(!kernel_before("5.11.0", (5, 11)));
        assert!(kernel_before("4.19.0-27-amd64", (5, 11)));
    }

    #[test]
    fn the_daemonset_adds_the_units_capabilities() {
        assert_eq!(
            daemonset_added_capabilities().unwrap(),
            ["bpf", "perfmon", "setpcap"]
        );
    }

    #[test]
    fn abandoned_lifecycles_are_told_by_error_with_ids_masked() {
        let id = |c: char| c.to_string().repeat(64);
        let why = [
            format!("StartContainer {}: broken pipe", id('a')),
            format!("StartContainer {}: broken pipe", id('b')),
            "CreateContainer c5 in pod-5: broken pipe".to_owned(),
        ];
        assert_eq!(
            abandoned_why(&why),
            "; 2x StartContainer <id>: broken pipe; 1x CreateContainer c5 in pod-5: broken pipe"
        );
        // Short hex words (a name, a code) stay.
        assert_eq!(mask_ids("exit 137 in c0 at dead"), "exit 137 in c0 at dead");
    }

    #[test]
    fn the_sandbox_is_read_from_the_service_section() {
        let unit = "[Unit]\nUser=nobody\n[Service]\n# CapabilityBoundingSet=x\nType=notify\n\
                    CapabilityBoundingSet=CAP_BPF CAP_PERFMON\nSystemCallFilter=@system-service bpf\n\
                    [Install]\nUser=other\n";
        assert_eq!(
            sandbox_settings(unit),
            [
                ("CapabilityBoundingSet", "CAP_BPF CAP_PERFMON"),
                ("SystemCallFilter", "@system-service bpf")
            ]
        );
    }

    #[test]
    fn the_deployed_unit_gives_its_whole_sandbox() {
        let unit = include_str!("../../deploy/systemd/plegd.service");
        let keys: Vec<&str> = sandbox_settings(unit).iter().map(|(k, _)| *k).collect();
        for key in [
            "CapabilityBoundingSet",
            "AmbientCapabilities",
            "SystemCallFilter",
        ] {
            assert!(keys.contains(&key), "{key} missing from {keys:?}");
        }
    }

    #[test]
    fn containerd_config_sets_the_systemd_driver_in_each_layout() {
        for (version, plugin) in [
            (Version::new(1, 7, 24), "io.containerd.grpc.v1.cri"),
            (Version::new(2, 1, 9), "io.containerd.cri.v1.runtime"),
        ] {
            let config: toml::Value =
                toml::from_str(&containerd_config(version, OciRuntime::Runc)).unwrap();
            let runc = &config["plugins"][plugin]["containerd"]["runtimes"]["runc"];
            assert_eq!(runc["options"]["SystemdCgroup"].as_bool(), Some(true));
            assert_eq!(runc["options"].get("BinaryName"), None);
            let config: toml::Value =
                toml::from_str(&containerd_config(version, OciRuntime::Crun)).unwrap();
            let options = &config["plugins"][plugin]["containerd"]["runtimes"]["runc"]["options"];
            assert_eq!(options["BinaryName"].as_str(), Some(CRUN_WRAPPER_PATH));
            assert_eq!(options["SystemdCgroup"].as_bool(), Some(true));
        }
    }

    #[test]
    fn kubelet_systemd_pod_slices() {
        assert_eq!(
            CgroupDriver::Systemd.pod_parent("1a2b-3c"),
            "kubepods-besteffort-pod1a2b_3c.slice"
        );
        assert_eq!(
            CgroupDriver::Cgroupfs.pod_parent("1a2b-3c"),
            "/kubepods/besteffort/pod1a2b-3c"
        );
    }
}
