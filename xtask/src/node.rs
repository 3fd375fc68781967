//! `cargo xtask node`: a real node in a VM. systemd as PID 1, a pure cgroup2 tree, containerd as
//! its systemd service on the systemd cgroup driver, plegd installed exactly as README's Install
//! section says; then the node check (`plegd-harness node check`, tests/src/node.rs) against
//! that node's containerd and plegd, each check's pass or FAIL printed back here.
//!
//! The VM is QEMU (TCG only: KVM here is a nested hypervisor under which stock kernels hang)
//! booting a Debian kernel with three virtio disks, all made with `mke2fs -d` (no loop device,
//! no mount on the host):
//! - the root: Debian 12 minbase + systemd, dbus, udev, containerd, runc, busybox-static
//!   (mmdebstrap, built once under [`IMAGES`], rebuilt when [`ROOT_PACKAGES`] or the hook
//!   unit change), opened as a QEMU snapshot so every run starts from the same root;
//! - the kernel's modules (`/lib/modules/<release>`, once per kernel);
//! - the payload of this run: plegd and plegd-harness as built here, deploy/'s unit and
//!   config, the containerd release asked for, and `node.sh`, which the root's
//!   `node-check.service` runs once the system is up.
//!
//! A tiny initramfs (busybox, the virtio and ext4 modules of that kernel) mounts the three and
//! hands over to systemd. The console goes to `console.log` beside the payload; the check's
//! output comes on the second serial port, read here line by line (`@@xtask` markers).

use std::{
    collections::{BTreeMap, HashSet},
    fmt::Write as _,
    fs,
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use clap::Args;

use crate::{
    fresh,
    kernels::Choice,
    setup::{self, Kernel, VmTools},
    tools::{
        cargo::TestBuild,
        cmd::{capture, render},
        vm,
        workspace::{self, format_duration},
    },
};

/// Where the root's and the kernels' modules' disk images are kept: outside the workspace, as
/// setup's containerd releases are, so that a fresh clone (CI's) reuses them.
const IMAGES: &str = "/opt/plegd/node";

/// What the VM's root holds besides minbase.
const ROOT_PACKAGES: &[&str] = &[
    "systemd",
    "systemd-sysv",
    "dbus",
    "udev",
    "kmod",
    "containerd",
    "runc",
    // Debian's crun (1.8.1): the node check's second OCI runtime (`--oci-runtime crun`).
    "crun",
    "busybox-static",
    "procps",
];

/// The unit in the root that runs the payload's `node.sh` once the system is up, its output
/// on the second serial port.
const HOOK_UNIT: &str = "\
[Unit]
Description=cargo xtask node: the node check
After=multi-user.target containerd.service
ConditionPathExists=/opt/node/node.sh

[Service]
Type=oneshot
ExecStart=/bin/sh /opt/node/node.sh
StandardOutput=tty
StandardError=tty
TTYPath=/dev/ttyS1

[Install]
WantedBy=multi-user.target
";

/// /etc/hosts of the root (minbase has none; containerd copies it into every host-network
/// sandbox).
const HOSTS: &str =
    "127.0.0.1\tlocalhost\n127.0.1.1\tnode\n::1\tlocalhost ip6-localhost ip6-loopback\n";

/// Modules the initramfs loads (with what they need) to mount ext4 on virtio disks.
const INITRAMFS_MODULES: &[&str] = &["virtio_pci", "virtio_blk", "crc32c_generic", "ext4"];

/// The initramfs's init: modules, the three disks, then systemd.
const INIT: &str = r#"#!/bin/busybox sh
# Written by cargo xtask node.
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
for m in $(cat /modules/order); do insmod "/modules/$m" || echo "initramfs: insmod $m failed"; done
# The disks appear as the virtio driver probes them: a bounded wait.
i=0
while [ ! -b /dev/vdc ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done
mount -o rw /dev/vda /root || { echo "initramfs: cannot mount the root"; poweroff -f; }
mkdir -p "/root/lib/modules/$(uname -r)" /root/opt/node
mount -o ro /dev/vdb "/root/lib/modules/$(uname -r)" || echo "initramfs: no modules disk"
mount -o ro /dev/vdc /root/opt/node || echo "initramfs: no payload disk"
umount /proc /sys
mount --move /dev /root/dev
exec switch_root /root /sbin/init
"#;

const MEMORY: &str = "2G";
const CPUS: &str = "2";
/// Bounds on one VM, boot included.
const QUICK_TIMEOUT: Duration = Duration::from_secs(20 * 60);
const FULL_TIMEOUT: Duration = Duration::from_secs(30 * 60);
/// How long the guest may take to power off once its script is done.
const POWEROFF: Duration = Duration::from_secs(60);
const MARK: &str = "@@xtask";

/// Checks every run must report, besides the eBPF-only ones (not with `--quick`).
const REQUIRED_CHECKS: &[&str] = &[
    "init",
    "containerd",
    "images",
    "plegd-ready",
    "plegd-check",
    "hardening",
    "lifecycle-default-container",
    "lifecycle-default-pod",
    "lifecycle-default-node",
    "oci-runtime",
    "oom-scope",
    "kill-restart",
    "journal",
];
/// Checks of the full run only (not with `--quick`): the eBPF-only round and the node-level
/// OOM.
const FULL_CHECKS: &[&str] = &[
    "lifecycle-ebpf-only-container",
    "lifecycle-ebpf-only-pod",
    "lifecycle-ebpf-only-node",
    "ebpf-only",
    "oom-node",
];

/// Options of `cargo xtask node`.
#[derive(Debug, Clone, Args)]
pub struct Options {
    /// Which kernel to boot.
    #[arg(long, value_enum, default_value_t = Choice::V6_1)]
    pub kernel: Choice,
    /// The containerd the node runs as its service: 1.6 (Debian 12's, in the root), 1.7 or 2.1
    /// (unpacked by `cargo xtask setup`).
    #[arg(long, value_enum, default_value_t = Containerd::V1_7)]
    pub containerd: Containerd,
    /// Every kernel with containerd 1.7 and 2.1 (overrides --kernel and --containerd).
    #[arg(long)]
    pub all: bool,
    /// Skip the eBPF-only round and the node-level OOM.
    #[arg(long)]
    pub quick: bool,
    /// The OCI runtime containerd's runc shim runs containers with: Debian's runc, or its
    /// crun as the shim's `BinaryName` (crun needs the VM's pure cgroup v2).
    #[arg(long, value_enum, default_value_t = OciRuntime::Runc)]
    pub oci_runtime: OciRuntime,
    /// Lifecycles of the churn audit (0: none).
    #[arg(long, default_value_t = 60)]
    pub churn: usize,
}

/// `--oci-runtime`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OciRuntime {
    Runc,
    Crun,
}

impl OciRuntime {
    fn name(self) -> &'static str {
        match self {
            Self::Runc => "runc",
            Self::Crun => "crun",
        }
    }
}

/// `--containerd`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Containerd {
    #[value(name = "1.6")]
    V1_6,
    #[value(name = "1.7")]
    V1_7,
    #[value(name = "2.1")]
    V2_1,
}

impl Containerd {
    fn label(self) -> &'static str {
        match self {
            Self::V1_6 => "1.6",
            Self::V1_7 => "1.7",
            Self::V2_1 => "2.1",
        }
    }

    /// Where setup unpacked its binaries (`None`: the root's own, Debian 12's 1.6).
    fn bin_dir(self) -> Option<PathBuf> {
        match self {
            Self::V1_6 => None,
            Self::V1_7 | Self::V2_1 => Some(
                Path::new(setup::CONTAINERD_ROOT)
                    .join(self.label())
                    .join("usr/bin"),
            ),
        }
    }
}

pub fn run(opts: &Options) -> Result<()> {
    workspace::require_root(
        "cargo xtask node",
        "it bootstraps a Debian root and installs packages",
    )?;
    let kernel = if opts.all { Choice::All } else { opts.kernel };
    let tools = setup::install_for_kernels(
        setup::Extras {
            releases: true,
            ..setup::Extras::NONE
        },
        kernel.series(),
    )?;
    eprintln!("node: building plegd and plegd-harness (`cargo test --workspace --no-run`)");
    run_with(opts, &tools, &TestBuild::build()?)
}

/// The node check on each kernel of `tools` (setup installed them, and the containerd
/// releases), with the binaries of the workspace's test `build`.
pub fn run_with(opts: &Options, tools: &VmTools, build: &TestBuild) -> Result<()> {
    let runtimes = if opts.all {
        vec![Containerd::V1_7, Containerd::V2_1]
    } else {
        vec![opts.containerd]
    };
    let start = Instant::now();
    let dir = Path::new(IMAGES);
    let root = root_image(dir)?;
    let built = built(build)?;
    let timeout = if opts.quick {
        QUICK_TIMEOUT
    } else {
        FULL_TIMEOUT
    };
    let mut results = Vec::new();
    for kernel in &tools.kernels {
        let modules = modules_image(dir, kernel)?;
        for &containerd in &runtimes {
            let mut name = format!("{}+containerd-{}", kernel.series.name(), containerd.label());
            if opts.oci_runtime != OciRuntime::Runc {
                name.push_str(&format!("+{}", opts.oci_runtime.name()));
            }
            let run_dir = workspace::target_dir().join("xtask/node").join(&name);
            let initramfs = initramfs(&run_dir, kernel)?;
            let payload = payload(&run_dir, &built, containerd, opts)?;
            let vm = Vm {
                name: &name,
                kernel,
                initramfs: &initramfs,
                disks: [&root, &modules, &payload],
                console: run_dir.join("console.log"),
            };
            let report = vm.boot(timeout)?;
            let console = vm.console;
            results.push((name, console, report));
        }
    }

    eprintln!("node: summary ({})", format_duration(start.elapsed()));
    let mut failed = Vec::new();
    for (name, console, report) in &results {
        let verdict = report.verdict(opts.quick, opts.churn > 0);
        eprintln!(
            "  {name:<22} {:<6} {}",
            if verdict.is_empty() { "ok" } else { "FAILED" },
            report.one_line()
        );
        for line in &report.checks {
            eprintln!("      {line}");
        }
        if !verdict.is_empty() {
            eprintln!(
                "      failed: {} (console: {})",
                verdict.join("; "),
                console.display()
            );
            failed.push(name.as_str());
        }
    }
    if !failed.is_empty() {
        bail!("node: failed on {}", failed.join(", "));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Disks

/// The root's disk image, bootstrapped when missing or built from another package list or
/// hook unit.
fn root_image(dir: &Path) -> Result<PathBuf> {
    let image = dir.join("root.ext4");
    let marker = dir.join("root.ok");
    let sources = fresh::host_sources()?;
    let mut wanted = format!(
        "Debian bookworm minbase + {}\n{HOOK_UNIT}{HOSTS}",
        ROOT_PACKAGES.join(" ")
    );
    for source in &sources {
        let _ = writeln!(wanted, "{}", source.line());
    }
    if image.exists() && fs::read_to_string(&marker).is_ok_and(|m| m == wanted) {
        eprintln!("node: reusing the root {}", image.display());
        return Ok(image);
    }
    let base = dir.join("root");
    for stale in [&marker, &image] {
        let _ = fs::remove_file(stale);
    }
    if base.exists() {
        fs::remove_dir_all(&base).with_context(|| format!("removing {}", base.display()))?;
    }
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    fresh::debian_root(&base, &sources, ROOT_PACKAGES, "node")?;
    let units = base.join("etc/systemd/system");
    fs::write(units.join("node-check.service"), HOOK_UNIT)?;
    let wants = units.join("multi-user.target.wants");
    fs::create_dir_all(&wants)?;
    std::os::unix::fs::symlink(
        "/etc/systemd/system/node-check.service",
        wants.join("node-check.service"),
    )
    .context("enabling node-check.service")?;
    fs::write(base.join("etc/hostname"), "node\n")?;
    fs::write(base.join("etc/hosts"), HOSTS)?;
    make_ext4(&base, &image, "2G")?;
    fs::remove_dir_all(&base).with_context(|| format!("removing {}", base.display()))?;
    fs::write(&marker, wanted)?;
    Ok(image)
}

/// `/lib/modules/<release>` of `kernel` as a disk image, made once.
fn modules_image(dir: &Path, kernel: &Kernel) -> Result<PathBuf> {
    let image = dir.join(format!("modules-{}.ext4", kernel.release));
    if image.exists() {
        return Ok(image);
    }
    let modules = Path::new("/lib/modules").join(&kernel.release);
    let size = tree_bytes(&modules)? * 5 / 4 + (64 << 20);
    let partial = image.with_extension("partial");
    make_ext4(&modules, &partial, &format!("{}k", size >> 10))?;
    fs::rename(&partial, &image)?;
    Ok(image)
}

/// `mke2fs -t ext4 -d from to size`.
fn make_ext4(from: &Path, to: &Path, size: &str) -> Result<()> {
    eprintln!("node: writing {} from {}", to.display(), from.display());
    let _ = fs::remove_file(to);
    capture(
        Command::new("mke2fs")
            .args(["-q", "-F", "-t", "ext4", "-d"])
            .arg(from)
            .arg(to)
            .arg(size),
    )
    .map(drop)
}

fn tree_bytes(dir: &Path) -> Result<u64> {
    let mut total = 0;
    for entry in fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let entry = entry?;
        let meta = entry.path().symlink_metadata()?;
        total += if meta.is_dir() {
            tree_bytes(&entry.path())? + 4096
        } else {
            meta.len().max(4096)
        };
    }
    Ok(total)
}

/// The initramfs for `kernel`: busybox, [`INITRAMFS_MODULES`] and what they depend on (in load
/// order), [`INIT`].
fn initramfs(run_dir: &Path, kernel: &Kernel) -> Result<PathBuf> {
    let tree = run_dir.join("initramfs");
    if tree.exists() {
        fs::remove_dir_all(&tree)?;
    }
    let modules = Path::new("/lib/modules").join(&kernel.release);
    let dep = fs::read_to_string(modules.join("modules.dep"))
        .with_context(|| format!("reading {}/modules.dep", modules.display()))?;
    let builtin = fs::read_to_string(modules.join("modules.builtin")).unwrap_or_default();
    let order = load_order(&dep, &builtin, INITRAMFS_MODULES)?;
    for sub in ["bin", "modules", "proc", "sys", "dev", "root"] {
        fs::create_dir_all(tree.join(sub))?;
    }
    fs::copy("/bin/busybox", tree.join("bin/busybox")).context("copying /bin/busybox")?;
    let mut names = String::new();
    for path in &order {
        let name = uncompressed_name(path);
        let to = tree.join("modules").join(&name);
        copy_module(&modules.join(path), &to)?;
        let _ = writeln!(names, "{name}");
    }
    fs::write(tree.join("modules/order"), names)?;
    let init = tree.join("init");
    fs::write(&init, INIT)?;
    fs::set_permissions(&init, fs::Permissions::from_mode(0o755))?;
    let image = run_dir.join("initramfs.cpio");
    capture(
        Command::new("sh")
            .arg("-c")
            .arg("find . -print | cpio -o -H newc --quiet > \"$0\"")
            .arg(&image)
            .current_dir(&tree),
    )?;
    Ok(image)
}

/// The modules to load for `wanted`, dependencies first, as paths of `modules.dep`; built-in
/// ones (in `modules.builtin`) need nothing.
fn load_order(dep: &str, builtin: &str, wanted: &[&str]) -> Result<Vec<String>> {
    let deps: BTreeMap<&str, Vec<&str>> = dep
        .lines()
        .filter_map(|line| {
            let (module, needs) = line.split_once(':')?;
            Some((module.trim(), needs.split_whitespace().collect()))
        })
        .collect();
    let by_name = |name: &str| {
        deps.keys()
            .find(|path| module_name(path) == name)
            .map(|path| (*path).to_owned())
    };
    let builtin: HashSet<String> = builtin.lines().map(module_name).collect();
    let mut order = Vec::new();
    fn visit(
        path: &str,
        deps: &BTreeMap<&str, Vec<&str>>,
        order: &mut Vec<String>,
        depth: usize,
    ) -> Result<()> {
        if depth > 32 {
            bail!("modules.dep: a dependency cycle at {path}");
        }
        if order.iter().any(|p| p == path) {
            return Ok(());
        }
        // modules.dep lists what a module needs with the last to load first: load from the end.
        for need in deps.get(path).into_iter().flatten().rev() {
            visit(need, deps, order, depth + 1)?;
        }
        order.push(path.to_owned());
        Ok(())
    }
    for name in wanted {
        match by_name(name) {
            Some(path) => visit(&path, &deps, &mut order, 0)?,
            None if builtin.contains(*name) => {}
            None => bail!("the kernel has no module {name}, built in or not"),
        }
    }
    Ok(order)
}

/// `kernel/fs/ext4/ext4.ko.xz` -> `ext4` (modules.dep may say `-` where the name has `_`).
fn module_name(path: &str) -> String {
    let file = path.rsplit('/').next().unwrap_or(path);
    let stem = file.split(".ko").next().unwrap_or(file);
    stem.replace('-', "_")
}

fn uncompressed_name(path: &str) -> String {
    let file = path.rsplit('/').next().unwrap_or(path);
    format!("{}.ko", file.split(".ko").next().unwrap_or(file))
}

/// Copies a module, decompressing `.ko.xz`/`.ko.zst` (busybox's insmod loads plain ones).
fn copy_module(from: &Path, to: &Path) -> Result<()> {
    let name = from.to_string_lossy();
    let tool = if name.ends_with(".xz") {
        Some("xz")
    } else if name.ends_with(".zst") {
        Some("zstd")
    } else {
        None
    };
    match tool {
        None => fs::copy(from, to)
            .map(drop)
            .with_context(|| format!("copying {}", from.display())),
        Some(tool) => {
            let out = Command::new(tool)
                .arg("-dc")
                .arg(from)
                .output()
                .with_context(|| format!("running {tool}"))?;
            if !out.status.success() {
                bail!("{tool} -dc {} failed", from.display());
            }
            fs::write(to, out.stdout).with_context(|| format!("writing {}", to.display()))
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Payload

/// What the guest runs, built here.
struct Built {
    plegd: PathBuf,
    harness: PathBuf,
}

/// plegd and plegd-harness from the workspace's test build (debug, as the tests run them).
fn built(build: &TestBuild) -> Result<Built> {
    Ok(Built {
        plegd: build.bin("plegd")?.to_owned(),
        harness: build.bin("plegd-harness")?.to_owned(),
    })
}

/// The payload disk of one run.
fn payload(
    run_dir: &Path,
    built: &Built,
    containerd: Containerd,
    opts: &Options,
) -> Result<PathBuf> {
    let tree = run_dir.join("payload");
    if tree.exists() {
        fs::remove_dir_all(&tree)?;
    }
    for sub in ["bin", "deploy/systemd"] {
        fs::create_dir_all(tree.join(sub))?;
    }
    fs::copy(&built.plegd, tree.join("bin/plegd"))?;
    fs::copy(&built.harness, tree.join("bin/plegd-harness"))?;
    let deploy = workspace::root().join("deploy");
    fs::copy(
        deploy.join("systemd/plegd.service"),
        tree.join("deploy/systemd/plegd.service"),
    )?;
    fs::copy(deploy.join("plegd.toml"), tree.join("deploy/plegd.toml"))?;
    if let Some(bin) = containerd.bin_dir() {
        let to = tree.join("containerd");
        fs::create_dir_all(&to)?;
        for entry in fs::read_dir(&bin).with_context(|| {
            format!(
                "reading {} (cargo xtask setup unpacks containerd {} there)",
                bin.display(),
                containerd.label()
            )
        })? {
            let entry = entry?;
            fs::copy(entry.path(), to.join(entry.file_name()))?;
        }
    }
    fs::write(
        tree.join("node.sh"),
        guest_script(opts.quick, opts.churn, opts.oci_runtime),
    )?;
    let image = run_dir.join("payload.ext4");
    let size = tree_bytes(&tree)? * 5 / 4 + (32 << 20);
    make_ext4(&tree, &image, &format!("{}k", size >> 10))?;
    Ok(image)
}

/// `node.sh`: the containerd release as the service's binary, its config (with the OCI
/// runtime asked for), README's Install lines verbatim (and a drop-in that serves /metrics,
/// for the OOM counters), the node check; then power off.
fn guest_script(quick: bool, churn: usize, runtime: OciRuntime) -> String {
    let quick = if quick { " --quick" } else { "" };
    let runtime = runtime.name();
    format!(
        r#"# Written by cargo xtask node; run by node-check.service in the VM.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
N=/opt/node
mark() {{ echo "{MARK} $*"; }}
finish() {{ mark done; systemctl --no-block poweroff; exit 0; }}
mark boot "$(uname -r)"
if [ -d $N/containerd ]; then
    install -m 0755 $N/containerd/* /usr/local/bin/
    mkdir -p /etc/systemd/system/containerd.service.d
    printf '[Service]\nExecStart=\nExecStart=/usr/local/bin/containerd\n' \
        > /etc/systemd/system/containerd.service.d/release.conf
fi
$N/bin/plegd-harness node prepare --oci-runtime {runtime} || {{ mark fatal "writing containerd's config failed"; finish; }}
if ! {{ systemctl daemon-reload && systemctl restart containerd; }}; then
    mark fatal "containerd did not restart"
    journalctl -u containerd -b --no-pager | tail -n 30
    finish
fi
# README, "Install", line by line.
cd $N
install -m 0755 bin/plegd /usr/local/bin/plegd
install -m 0644 deploy/systemd/plegd.service /etc/systemd/system/
install -D -m 0644 deploy/plegd.toml /etc/plegd/plegd.toml
# Not README's: /metrics for the check's OOM counters, in a drop-in (the unit file stays as
# deploy/ has it).
mkdir -p /etc/systemd/system/plegd.service.d
printf '[Service]\nEnvironment=PLEGD_METRICS_ADDRESS=127.0.0.1:9809\n' \
    > /etc/systemd/system/plegd.service.d/metrics.conf
if ! {{ systemctl daemon-reload && systemctl enable --now plegd; }}; then
    mark fatal "systemctl enable --now plegd failed"
    systemctl status plegd --no-pager
    journalctl -u plegd -b --no-pager | tail -n 40
    finish
fi
cd /
$N/bin/plegd-harness node check{quick} --churn {churn} --oci-runtime {runtime}
status=$?
if [ $status -ne 0 ]; then
    journalctl -u plegd -b --no-pager | tail -n 40
fi
mark status $status
finish
"#
    )
}

// ---------------------------------------------------------------------------------------------
// The VM

struct Vm<'a> {
    name: &'a str,
    kernel: &'a Kernel,
    initramfs: &'a Path,
    /// The root (a snapshot: never written), the modules, the payload.
    disks: [&'a Path; 3],
    console: PathBuf,
}

impl Vm<'_> {
    fn command(&self) -> Command {
        let mut cmd = Command::new("qemu-system-x86_64");
        cmd.args([
            "-machine",
            "q35,accel=tcg",
            "-cpu",
            "max",
            "-smp",
            CPUS,
            "-m",
            MEMORY,
        ])
        .args([
            "-no-reboot",
            "-monitor",
            "none",
            "-display",
            "none",
            "-nic",
            "none",
        ])
        .arg("-kernel")
        .arg(&self.kernel.vmlinuz)
        .arg("-initrd")
        .arg(self.initramfs)
        .args([
            "-append",
            "console=ttyS0 panic=-1 rw systemd.unified_cgroup_hierarchy=1",
        ]);
        for (i, disk) in self.disks.iter().enumerate() {
            let mode = if i == 0 { "snapshot=on" } else { "readonly=on" };
            cmd.arg("-drive").arg(format!(
                "file={},format=raw,if=virtio,{mode}",
                disk.display()
            ));
        }
        cmd.arg("-serial")
            .arg(format!("file:{}", self.console.display()))
            .args(["-serial", "stdio"]);
        cmd
    }

    /// Boots the VM and reads the check's lines as they come. Fails only when QEMU cannot be
    /// started; what happened inside is in the report.
    fn boot(&self, timeout: Duration) -> Result<Report> {
        let mut cmd = self.command();
        eprintln!(
            "node: [{}] booting {} under QEMU TCG (timeout {}; console {}): {}",
            self.name,
            self.kernel.release,
            format_duration(timeout),
            self.console.display(),
            render(&cmd)
        );
        let mut report = Report::default();
        let run = vm::Run {
            tool: "node",
            name: self.name,
            timeout,
            poweroff: POWEROFF,
        };
        let ended = run.watch(&mut cmd, |line, at| {
            report.line(line, at);
            report.done
        })?;
        report.total = ended.total;
        // A guest done with its script may be killed powering off: that is no problem.
        if !report.done {
            report.problem = ended.problem("QEMU");
        }
        Ok(report)
    }
}

// ---------------------------------------------------------------------------------------------
// Reading the guest's output

/// What one VM run showed.
#[derive(Debug, Default)]
struct Report {
    /// From QEMU's start to the script's first line (boot to systemd's multi-user target).
    boot: Option<Duration>,
    total: Duration,
    /// `<name> pass|FAIL <detail>` of each check, in order.
    checks: Vec<String>,
    passed: Vec<String>,
    failed: Vec<String>,
    /// What stopped the script before the checks.
    fatal: Option<String>,
    done: bool,
    problem: Option<String>,
}

impl Report {
    fn line(&mut self, line: &str, at: Duration) {
        let Some(mark) = line.strip_prefix(MARK) else {
            return;
        };
        let mark = mark.trim_start();
        let (word, rest) = mark.split_once(' ').unwrap_or((mark, ""));
        match word {
            "boot" => self.boot = Some(at),
            "check" => {
                let mut fields = rest.splitn(3, ' ');
                let (Some(name), Some(verdict)) = (fields.next(), fields.next()) else {
                    return;
                };
                self.checks.push(rest.to_owned());
                if verdict == "pass" {
                    self.passed.push(name.to_owned());
                } else {
                    self.failed.push(name.to_owned());
                }
            }
            "fatal" => self.fatal = Some(rest.to_owned()),
            "done" => self.done = true,
            _ => {}
        }
    }

    /// Why this run failed (empty when it did not).
    fn verdict(&self, quick: bool, churn: bool) -> Vec<String> {
        let mut why = Vec::new();
        if let Some(problem) = &self.problem {
            why.push(problem.clone());
        }
        if self.boot.is_none() {
            why.push("the guest never ran node.sh".into());
        }
        if let Some(fatal) = &self.fatal {
            why.push(fatal.clone());
        }
        if !self.failed.is_empty() {
            why.push(format!("failed: {}", self.failed.join(", ")));
        }
        let required = REQUIRED_CHECKS
            .iter()
            .chain(if quick { &[][..] } else { FULL_CHECKS })
            .chain(if churn { &["churn"][..] } else { &[] });
        let missing: Vec<&str> = required
            .filter(|c| !self.passed.iter().chain(&self.failed).any(|n| n == *c))
            .copied()
            .collect();
        if !missing.is_empty() && self.boot.is_some() {
            why.push(format!("never reported: {}", missing.join(", ")));
        }
        why
    }

    fn one_line(&self) -> String {
        let mut parts = Vec::new();
        if let Some(boot) = self.boot {
            parts.push(format!("boot {}", format_duration(boot)));
        }
        parts.push(format!(
            "{} passed, {} failed",
            self.passed.len(),
            self.failed.len()
        ));
        parts.push(format!("total {}", format_duration(self.total)));
        parts.join("; ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modules_load_after_what_they_need() {
        let dep = "kernel/fs/ext4/ext4.ko: kernel/lib/crc16.ko kernel/fs/mbcache.ko kernel/fs/jbd2/jbd2.ko\n\
                   kernel/fs/jbd2/jbd2.ko:\nkernel/fs/mbcache.ko:\nkernel/lib/crc16.ko:\n\
                   kernel/drivers/virtio/virtio_pci.ko: kernel/drivers/virtio/virtio_pci_legacy_dev.ko kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko\n\
                   kernel/drivers/virtio/virtio.ko: kernel/drivers/virtio/virtio_ring.ko\n\
                   kernel/drivers/virtio/virtio_ring.ko:\nkernel/drivers/virtio/virtio_pci_legacy_dev.ko:\n\
                   kernel/drivers/block/virtio_blk.ko.xz: kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko\n";
        let builtin = "kernel/crypto/crc32c_generic.ko\n";
        let order = load_order(dep, builtin, INITRAMFS_MODULES).unwrap();
        let names: Vec<String> = order.iter().map(|p| module_name(p)).collect();
        assert_eq!(
            names,
            [
                "virtio_ring",
                "virtio",
                "virtio_pci_legacy_dev",
                "virtio_pci",
                "virtio_blk",
                "jbd2",
                "mbcache",
                "crc16",
                "ext4"
            ]
        );
        assert_eq!(
            uncompressed_name("kernel/drivers/block/virtio_blk.ko.xz"),
            "virtio_blk.ko"
        );
        let err = load_order(dep, "", &["nope"]).unwrap_err().to_string();
        assert!(err.contains("no module nope"), "{err}");
    }

    #[test]
    fn checks_and_markers_make_the_verdict() {
        let mut report = Report::default();
        let at = Duration::from_secs(30);
        report.line("[   1.0] kernel noise", at);
        report.line("@@xtask boot 6.1.0-57-amd64", at);
        for name in REQUIRED_CHECKS {
            report.line(&format!("@@xtask check {name} pass fine"), at);
        }
        report.line("@@xtask done", at);
        assert!(
            report.verdict(true, false).is_empty(),
            "{:?}",
            report.verdict(true, false)
        );
        assert_eq!(
            report.verdict(false, false),
            [format!("never reported: {}", FULL_CHECKS.join(", "))]
        );
        report.line("@@xtask check journal FAIL plegd's journal: EPERM", at);
        assert!(report.verdict(true, false)[0].contains("failed: journal"));
        assert_eq!(report.checks.len(), REQUIRED_CHECKS.len() + 1);
    }

    #[test]
    fn a_guest_that_never_booted_says_so() {
        let report = Report {
            problem: Some("timed out after 20m00s (killed the VM)".into()),
            ..Report::default()
        };
        assert_eq!(
            report.verdict(true, false),
            [
                "timed out after 20m00s (killed the VM)",
                "the guest never ran node.sh"
            ]
        );
    }

    #[test]
    fn the_guest_script_installs_as_readme_says() {
        let script = guest_script(true, 30, OciRuntime::Runc);
        let readme = fs::read_to_string(workspace::root().join("README.md")).unwrap();
        // README's lines for deploy/'s files, verbatim (the binary is the debug one built here).
        for line in [
            "install -m 0644 deploy/systemd/plegd.service /etc/systemd/system/",
            "install -D -m 0644 deploy/plegd.toml /etc/plegd/plegd.toml",
            "systemctl daemon-reload && systemctl enable --now plegd",
        ] {
            assert!(readme.contains(line), "README lacks {line:?}");
            assert!(script.contains(line), "node.sh lacks {line:?}");
        }
        assert!(script.contains("install -m 0755 bin/plegd /usr/local/bin/plegd\n"));
        assert!(script.contains("node check --quick --churn 30 --oci-runtime runc\n"));
        let crun = guest_script(false, 0, OciRuntime::Crun);
        assert!(crun.contains("node prepare --oci-runtime crun "));
    }
}
