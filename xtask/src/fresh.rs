//! `cargo xtask fresh`: prove that README's two commands work on a machine state that owes
//! nothing to this one. Builds a minimal Debian 12 root with mmdebstrap, copies in only the
//! Rust toolchain and a clone of HEAD, and runs `cargo xtask demo` then `cargo xtask test` in
//! it, in a chroot, exactly as README says (as root).
//!
//! Layout under `--dir` (default `$TMPDIR/plegd-fresh`):
//! - `base/`: Debian 12 `minbase` + the Rust toolchain's own prerequisites ([`PREREQUISITES`]) +
//!   the copied toolchain. Built once, reused by later runs (`--rebuild` builds it again).
//! - `run/upper`, `run/work`: an overlay on `base`, so every run starts from the pristine base
//!   and leaves it untouched (`--keep` continues the previous run's changes instead: a warm
//!   re-run for chasing a failure, not a fresh one). What the run installed and built stays
//!   there for inspection until the next run.
//! - `run/root`: the merged root the chroot runs in; `run/tmp`: its own `/tmp` (a plain
//!   directory, because containerd's overlayfs snapshots cannot live on an overlayfs).
//!
//! mmdebstrap rather than debootstrap: it resolves with apt itself, so the root gets every suite
//! of the host's sources (bookworm, bookworm-updates and bookworm-security, where LLVM 22 comes
//! from) in one pass, and it is faster (parallel downloads, no second stage).
//!
//! Mounts (the overlay, `/tmp`, `/run`, `/proc`, `/sys` with its cgroup and tracefs submounts,
//! `/dev` with `/dev/pts`) are made in a private mount namespace, so the host's mount table never
//! sees them and a killed run cannot leak them; a guard also unmounts everything under the root
//! when the run ends, fails or is interrupted (SIGINT/SIGTERM/SIGHUP wait for the chroot's
//! processes to clean up first).

use std::{
    env,
    ffi::CString,
    fmt::Write as _,
    fs::{self, File},
    os::unix::{ffi::OsStrExt as _, fs::PermissionsExt as _, io::AsRawFd as _},
    path::{Path, PathBuf},
    process::Command,
    sync::atomic::{AtomicI32, Ordering},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use clap::Args;

use crate::{
    setup,
    tools::{
        cmd::{capture, render, stream},
        steps::Steps,
        workspace,
    },
};

/// The Debian release of the fresh root: the one README promises.
const SUITE: &str = "bookworm";

/// What "with the Rust toolchain installed" brings besides rustup's files: a C linker (`cc`,
/// which rustc links with, and libc's startup files) and the CA certificates cargo needs to
/// reach crates.io. `cargo xtask setup` cannot install them: xtask itself must build first.
const PREREQUISITES: &[&str] = &["ca-certificates", "gcc", "libc6-dev"];

/// The README's commands, in order, run in the root's clone.
const COMMANDS: [Readme; 2] = [Readme::Demo, Readme::Test];

/// One of README's two commands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Readme {
    /// `cargo xtask demo`.
    Demo,
    /// `cargo xtask test`.
    Test,
}

impl Readme {
    fn name(self) -> &'static str {
        match self {
            Self::Demo => "demo",
            Self::Test => "test",
        }
    }
}

/// Where the clone goes inside the root.
const REPO_IN_ROOT: &str = "root/plegd";

/// Where Debian keeps a site's own CA certificates (`update-ca-certificates` adds them).
const LOCAL_CAS: &str = "/usr/local/share/ca-certificates";

/// The marker written once `base/` is complete.
const BASE_OK: &str = "base.ok";

#[derive(Debug, Clone, Args)]
pub struct Options {
    /// Where the roots live [default: $TMPDIR/plegd-fresh].
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Build the base root again (mmdebstrap and the toolchain copy) even if one is there.
    #[arg(long)]
    pub rebuild: bool,
    /// Continue the previous run's root (its installed packages and build) instead of starting
    /// from the pristine base: a warm re-run to chase a failure, not a fresh one.
    #[arg(long)]
    pub keep: bool,
    /// Open a shell in the root, mounted as for a run, instead of running demo and test (with
    /// `--keep`: in the previous run's root, to look at a failure).
    #[arg(long)]
    pub shell: bool,
    /// Run only this one of README's commands (to time it on a fresh root; both run in order
    /// otherwise).
    #[arg(long, value_enum)]
    pub only: Option<Readme>,
}

pub fn run(opts: &Options) -> Result<()> {
    workspace::require_root(
        "cargo xtask fresh",
        "it bootstraps a root, mounts and chroots",
    )?;
    let dir = opts
        .dir
        .clone()
        .unwrap_or_else(|| env::temp_dir().join("plegd-fresh"));
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let _lock = lock(&dir)?;
    catch_signals();
    private_mount_namespace()?;

    let mut timings = Steps::new("fresh");
    let result = run_steps(opts, &dir, &mut timings);
    timings.print();
    if let Some(signal) = interrupted() {
        bail!("cargo xtask fresh: interrupted by signal {signal}");
    }
    result
}

fn run_steps(opts: &Options, dir: &Path, timings: &mut Steps) -> Result<()> {
    let base = dir.join("base");
    let base_ok = dir.join(BASE_OK);
    let run = dir.join("run");
    let rebuilt = opts.rebuild || !base_ok.exists();
    if rebuilt {
        if base.exists() || run.exists() {
            // The run's overlay is on the old base: it goes too.
            timings.time("remove old roots", || {
                remove_tree(&base_ok)?;
                remove_tree(&run)?;
                remove_tree(&base)
            })?;
        }
        let sources = host_sources()?;
        timings.time("mmdebstrap", || bootstrap(&base, &sources))?;
        timings.time("toolchain copy", || copy_toolchain(&base))?;
        fs::write(&base_ok, describe(&sources))
            .with_context(|| format!("writing {}", base_ok.display()))?;
    } else {
        eprintln!(
            "fresh: reusing the base root {} (--rebuild builds it again)",
            base.display()
        );
    }

    if opts.keep && !rebuilt && run.join("upper").is_dir() {
        eprintln!(
            "fresh: --keep: continuing the previous run's changes in {}",
            run.display()
        );
    } else if run.exists() {
        timings.time("remove previous run", || remove_tree(&run))?;
    }
    for sub in ["upper", "work", "root", "tmp"] {
        fs::create_dir_all(run.join(sub))
            .with_context(|| format!("creating {}", run.join(sub).display()))?;
    }
    fs::set_permissions(run.join("tmp"), fs::Permissions::from_mode(0o1777))
        .context("making the root's /tmp world-writable")?;

    let root = run.join("root");
    let mounts = MountGuard::new(&root);
    mount_root(&base, &run, &root)?;
    write_host_files(&root)?;
    timings.time("clone", || clone_head(&root))?;

    if opts.shell {
        return shell(&root);
    }
    let mut failed = Vec::new();
    for command in COMMANDS
        .into_iter()
        .filter(|c| opts.only.is_none_or(|only| only == *c))
        .map(Readme::name)
    {
        if interrupted().is_some() {
            break;
        }
        if let Err(e) = timings.time(&format!("cargo xtask {command}"), || {
            in_chroot(&root, command)
        }) {
            eprintln!("fresh: {e:#}");
            failed.push(command);
        }
    }
    drop(mounts);
    if !failed.is_empty() {
        bail!(
            "in the fresh root, `cargo xtask {}` failed; what the run changed stays in {} \
             (`cargo xtask fresh --keep --shell` for a look, `--keep` to re-run warm)",
            failed.join("`, `cargo xtask "),
            run.join("upper").display(),
        );
    }
    Ok(())
}

/// Holds `DIR/lock` so two runs never share a root.
fn lock(dir: &Path) -> Result<File> {
    let path = dir.join("lock");
    let file = File::create(&path).with_context(|| format!("creating {}", path.display()))?;
    // SAFETY: a valid open descriptor; flock has no other precondition.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        bail!(
            "another `cargo xtask fresh` holds {}: wait for it to finish",
            path.display()
        );
    }
    Ok(file)
}

// ---------------------------------------------------------------------------------------------
// Signals and the mount namespace

/// The signal that asked us to stop (0: none).
static SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn record_signal(signal: libc::c_int) {
    SIGNAL.store(signal, Ordering::SeqCst);
}

/// Lets SIGINT/SIGTERM/SIGHUP reach the children (a handler, unlike SIG_IGN, is reset by exec)
/// while xtask only records them: it waits for the chroot's processes to clean up, skips the
/// remaining steps and unmounts.
fn catch_signals() {
    for signal in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe {
            libc::signal(
                signal,
                record_signal as extern "C" fn(libc::c_int) as libc::sighandler_t,
            );
        }
    }
}

fn interrupted() -> Option<i32> {
    match SIGNAL.load(Ordering::SeqCst) {
        0 => None,
        signal => Some(signal),
    }
}

/// Moves xtask (single-threaded, so the whole process) into a mount namespace of its own, with
/// no propagation to or from the host: every mount made from here on, by xtask or a child, is
/// invisible outside and goes away with the last process in the namespace.
fn private_mount_namespace() -> Result<()> {
    // SAFETY: unshare and mount with constant arguments; no memory is handed over.
    unsafe {
        if libc::unshare(libc::CLONE_NEWNS) != 0 {
            return Err(std::io::Error::last_os_error()).context("unshare(CLONE_NEWNS)");
        }
        if libc::mount(
            c"none".as_ptr(),
            c"/".as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_PRIVATE,
            std::ptr::null(),
        ) != 0
        {
            return Err(std::io::Error::last_os_error()).context("making / rprivate");
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The base root

/// One `deb` line of the host's apt sources.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Source {
    uri: String,
    suite: String,
    components: Vec<String>,
}

impl Source {
    pub(crate) fn line(&self) -> String {
        format!(
            "deb {} {} {}",
            self.uri,
            self.suite,
            self.components.join(" ")
        )
    }
}

/// The host's `deb` sources for [`SUITE`] and its updates/security suites, from
/// /etc/apt/sources.list and the `.list`/`.sources` files of sources.list.d (the ones apt reads).
pub(crate) fn host_sources() -> Result<Vec<Source>> {
    let mut sources = Vec::new();
    let list = Path::new("/etc/apt/sources.list");
    if let Ok(text) = fs::read_to_string(list) {
        sources.extend(parse_one_line(&text));
    }
    let dir = Path::new("/etc/apt/sources.list.d");
    let mut files: Vec<PathBuf> = fs::read_dir(dir)
        .map(|entries| entries.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    files.sort();
    for file in files {
        let parse = match file.extension().and_then(|e| e.to_str()) {
            Some("list") => parse_one_line,
            Some("sources") => parse_deb822,
            _ => continue,
        };
        let text =
            fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
        sources.extend(parse(&text));
    }
    sources.retain(|s| s.suite == SUITE || s.suite.starts_with(&format!("{SUITE}-")));
    sources.dedup();
    if !sources.iter().any(|s| s.suite == SUITE) {
        bail!(
            "no `deb` source for {SUITE} in /etc/apt/sources.list or /etc/apt/sources.list.d: \
             the fresh root uses the host's Debian archive"
        );
    }
    Ok(sources)
}

/// `deb [options] URI SUITE COMPONENT...` lines.
fn parse_one_line(text: &str) -> Vec<Source> {
    let mut sources = Vec::new();
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or_default().trim();
        let Some(rest) = line.strip_prefix("deb ") else {
            continue;
        };
        let rest = rest.trim_start();
        let rest = match rest.strip_prefix('[') {
            Some(options) => options.split_once(']').map_or("", |(_, r)| r),
            None => rest,
        };
        let mut words = rest.split_whitespace();
        if let (Some(uri), Some(suite)) = (words.next(), words.next()) {
            sources.push(Source {
                uri: uri.to_owned(),
                suite: suite.to_owned(),
                components: words.map(str::to_owned).collect(),
            });
        }
    }
    sources
}

/// deb822 stanzas (`Types: deb`, `URIs`, `Suites`, `Components`, `Enabled`).
fn parse_deb822(text: &str) -> Vec<Source> {
    let mut sources = Vec::new();
    for stanza in text.split("\n\n") {
        let mut fields: Vec<(String, String)> = Vec::new();
        for line in stanza.lines() {
            if line.starts_with('#') {
                continue;
            }
            if line.starts_with([' ', '\t']) {
                if let Some((_, value)) = fields.last_mut() {
                    value.push(' ');
                    value.push_str(line.trim());
                }
            } else if let Some((key, value)) = line.split_once(':') {
                fields.push((key.trim().to_ascii_lowercase(), value.trim().to_owned()));
            }
        }
        let field = |name: &str| {
            fields
                .iter()
                .find(|(key, _)| key == name)
                .map(|(_, value)| value.split_whitespace().collect::<Vec<_>>())
                .unwrap_or_default()
        };
        if !field("types").contains(&"deb") || field("enabled") == ["no"] {
            continue;
        }
        for uri in field("uris") {
            for suite in field("suites") {
                sources.push(Source {
                    uri: uri.to_owned(),
                    suite: suite.to_owned(),
                    components: field("components").iter().map(|c| c.to_string()).collect(),
                });
            }
        }
    }
    sources
}

fn describe(sources: &[Source]) -> String {
    let mut text = format!(
        "Debian {SUITE} minbase + {} + the Rust toolchain, built by cargo xtask fresh from:\n",
        PREREQUISITES.join(" ")
    );
    for source in sources {
        let _ = writeln!(text, "{}", source.line());
    }
    text
}

/// `mmdebstrap --variant=minbase` of [`SUITE`] with [`PREREQUISITES`] into `base`.
fn bootstrap(base: &Path, sources: &[Source]) -> Result<()> {
    debian_root(base, sources, PREREQUISITES, "fresh")
}

/// `mmdebstrap --variant=minbase` of [`SUITE`] with `include` into `base` (also for `cargo xtask
/// node`'s VM root), installing mmdebstrap first if it is missing; `who` prefixes what it says.
pub(crate) fn debian_root(
    base: &Path,
    sources: &[Source],
    include: &[&str],
    who: &str,
) -> Result<()> {
    if !setup::missing_packages(&["mmdebstrap"])?.is_empty() {
        eprintln!("{who}: installing mmdebstrap");
        setup::install_packages(&["mmdebstrap"])?;
    }
    eprintln!(
        "{who}: mmdebstrap {SUITE} into {} from {}",
        base.display(),
        sources
            .iter()
            .map(|s| format!("{} {}", s.uri, s.suite))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let mut cmd = Command::new("mmdebstrap");
    cmd.args(["--variant=minbase", "--mode=root"])
        .arg(format!("--include={}", include.join(",")))
        .arg(SUITE)
        .arg(base)
        .args(sources.iter().map(Source::line));
    stream(&mut cmd).with_context(|| format!("{who}: bootstrapping a Debian root failed"))
}

/// Copies rustup, its proxies and the stable and nightly toolchains into the base root's
/// /root; not bpf-linker or anything else `cargo install`ed (setup must install those), and not
/// cargo's registry cache (crates.io is reachable: the fresh root downloads what it needs).
fn copy_toolchain(base: &Path) -> Result<()> {
    let home = env::var_os("HOME").map_or_else(|| PathBuf::from("/root"), PathBuf::from);
    let rustup_home =
        env::var_os("RUSTUP_HOME").map_or_else(|| home.join(".rustup"), PathBuf::from);
    let cargo_home = env::var_os("CARGO_HOME").map_or_else(|| home.join(".cargo"), PathBuf::from);
    let to_rustup = base.join("root/.rustup");
    let to_bin = base.join("root/.cargo/bin");
    for dir in [
        to_rustup.join("toolchains"),
        to_rustup.join("update-hashes"),
        to_rustup.join("downloads"),
        to_rustup.join("tmp"),
        to_bin.clone(),
    ] {
        fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    }

    let mut copied = Vec::new();
    let toolchains = rustup_home.join("toolchains");
    for entry in
        fs::read_dir(&toolchains).with_context(|| format!("reading {}", toolchains.display()))?
    {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let wanted = name.starts_with("stable-")
            || name
                .strip_prefix("nightly-")
                .is_some_and(|rest| !rest.starts_with(|c: char| c.is_ascii_digit()))
            // Aliases such as 1.95.0-<triple> -> stable-<triple> cost nothing.
            || entry.file_type()?.is_symlink();
        if wanted {
            cp(&entry.path(), &to_rustup.join("toolchains"))?;
            let hash = rustup_home.join("update-hashes").join(&name);
            if hash.exists() {
                cp(&hash, &to_rustup.join("update-hashes"))?;
            }
            copied.push(name);
        } else {
            eprintln!("fresh: not copying toolchain {name}");
        }
    }
    if !copied.iter().any(|n| n.starts_with("stable-")) {
        bail!("no stable toolchain in {}", toolchains.display());
    }
    cp(&rustup_home.join("settings.toml"), &to_rustup)?;

    let bin = cargo_home.join("bin");
    let mut proxies = Vec::new();
    for entry in fs::read_dir(&bin).with_context(|| format!("reading {}", bin.display()))? {
        let entry = entry?;
        let name = entry.file_name();
        let is_proxy = name == "rustup"
            || fs::read_link(entry.path()).is_ok_and(|target| target.ends_with("rustup"));
        if is_proxy {
            cp(&entry.path(), &to_bin)?;
            proxies.push(name.to_string_lossy().into_owned());
        } else {
            eprintln!(
                "fresh: not copying {} (not part of rustup: setup must install it)",
                entry.path().display()
            );
        }
    }
    eprintln!(
        "fresh: copied toolchains {} and {} from {}",
        copied.join(" "),
        proxies.join(" "),
        bin.display()
    );
    Ok(())
}

fn cp(from: &Path, into_dir: &Path) -> Result<()> {
    capture(Command::new("cp").arg("-a").arg(from).arg(into_dir)).map(drop)
}

/// `rm -rf --one-file-system PATH`: never descends into a mount (say a bound /sys).
fn remove_tree(path: &Path) -> Result<()> {
    if path.symlink_metadata().is_err() {
        return Ok(());
    }
    let mounted = mounts_under(&read_mountinfo()?, path);
    if !mounted.is_empty() {
        bail!(
            "refusing to remove {}: {} mounted under it",
            path.display(),
            mounted
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    capture(
        Command::new("rm")
            .args(["-rf", "--one-file-system"])
            .arg(path),
    )
    .map(drop)
}

// ---------------------------------------------------------------------------------------------
// The run's root

/// The overlay, then what a booted Debian has mounted: /run (tmpfs), /proc, /sys with the
/// cgroup hierarchies (v1 controllers and the cgroup2 tree at /sys/fs/cgroup/unified on this
/// hybrid machine: runc needs them) and tracefs, /dev with /dev/pts; /tmp is the run's own.
fn mount_root(base: &Path, run: &Path, root: &Path) -> Result<()> {
    let overlay = format!(
        "lowerdir={},upperdir={},workdir={}",
        base.display(),
        run.join("upper").display(),
        run.join("work").display()
    );
    mount(&["-t", "overlay", "overlay", "-o", &overlay], root)?;
    mount_from(&["--bind"], &run.join("tmp"), &root.join("tmp"))?;
    mount(
        &["-t", "tmpfs", "-o", "mode=0755", "tmpfs"],
        &root.join("run"),
    )?;
    mount(&["-t", "proc", "proc"], &root.join("proc"))?;
    mount_from(&["--rbind"], Path::new("/sys"), &root.join("sys"))?;
    mount_from(&["--rbind"], Path::new("/dev"), &root.join("dev"))?;

    let mounted = mounts_under(&read_mountinfo()?, root);
    let wanted = [
        "sys/fs/cgroup",
        "sys/fs/cgroup/unified",
        "sys/kernel/tracing",
        "dev/pts",
    ];
    for sub in wanted {
        let path = root.join(sub);
        if Path::new("/").join(sub).exists() && !mounted.contains(&path) {
            eprintln!("fresh: warning: /{sub} is not a mount in the root (is it one on the host?)");
        }
    }
    eprintln!(
        "fresh: {} mounts under {} (private to this run)",
        mounted.len(),
        root.display()
    );
    Ok(())
}

fn mount(args: &[&str], target: &Path) -> Result<()> {
    fs::create_dir_all(target).with_context(|| format!("creating {}", target.display()))?;
    capture(Command::new("mount").args(args).arg(target)).map(drop)
}

fn mount_from(args: &[&str], source: &Path, target: &Path) -> Result<()> {
    fs::create_dir_all(target).with_context(|| format!("creating {}", target.display()))?;
    capture(Command::new("mount").args(args).arg(source).arg(target)).map(drop)
}

/// This site's network settings, which a fresh machine here would need too: the host's
/// resolver, and the local CA certificates it trusts (`/usr/local/share/ca-certificates`: here
/// egress to crates.io goes through a TLS-inspecting proxy); and the /etc/hosts any installed
/// Debian has (mmdebstrap writes none).
fn write_host_files(root: &Path) -> Result<()> {
    let resolv = fs::read("/etc/resolv.conf").context("reading the host's /etc/resolv.conf")?;
    let target = root.join("etc/resolv.conf");
    if target.symlink_metadata().is_ok() {
        fs::remove_file(&target).with_context(|| format!("removing {}", target.display()))?;
    }
    fs::write(&target, resolv).with_context(|| format!("writing {}", target.display()))?;
    let hosts = root.join("etc/hosts");
    if !hosts.exists() {
        fs::write(
            &hosts,
            "127.0.0.1\tlocalhost\n::1\t\tlocalhost ip6-localhost ip6-loopback\n",
        )
        .with_context(|| format!("writing {}", hosts.display()))?;
    }
    let local_cas = Path::new(LOCAL_CAS);
    let cas: Vec<PathBuf> = fs::read_dir(local_cas)
        .map(|entries| entries.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    if !cas.is_empty() {
        let into = root.join(LOCAL_CAS.trim_start_matches('/'));
        fs::create_dir_all(&into).with_context(|| format!("creating {}", into.display()))?;
        for ca in &cas {
            cp(ca, &into)?;
        }
        capture(
            Command::new("chroot")
                .arg(root)
                .args(["/usr/sbin/update-ca-certificates", "--fresh"])
                .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
        )?;
        eprintln!(
            "fresh: trusting the host's local CA certificates ({})",
            cas.iter()
                .filter_map(|p| p.file_name())
                .map(|n| n.to_string_lossy())
                .collect::<Vec<_>>()
                .join(" ")
        );
    }
    Ok(())
}

/// Fetches this worktree's HEAD into the root's clone and checks it out (uncommitted changes
/// are not in it); with `--keep`, the previous clone (and its target dir) is updated.
fn clone_head(root: &Path) -> Result<()> {
    let workspace = workspace::root();
    let head = capture(
        Command::new("git")
            .arg("-C")
            .arg(&workspace)
            .args(["rev-parse", "HEAD"]),
    )?;
    let dirty = capture(Command::new("git").arg("-C").arg(&workspace).args([
        "status",
        "--porcelain",
        "--untracked-files=no",
    ]))?;
    if !dirty.trim().is_empty() {
        eprintln!(
            "fresh: warning: uncommitted changes in {} are not in the fresh root",
            workspace.display()
        );
    }
    let repo = root.join(REPO_IN_ROOT);
    if !repo.join(".git").exists() {
        fs::create_dir_all(&repo)?;
        capture(
            Command::new("git")
                .arg("-C")
                .arg(&repo)
                .args(["init", "-q"]),
        )?;
    }
    capture(
        Command::new("git")
            .arg("-C")
            .arg(&repo)
            .args(["fetch", "-q"])
            .arg(workspace)
            .arg(head.trim()),
    )?;
    capture(Command::new("git").arg("-C").arg(&repo).args([
        "checkout",
        "-q",
        "--force",
        "--detach",
        head.trim(),
    ]))?;
    eprintln!("fresh: /{REPO_IN_ROOT} is at {}", head.trim());
    Ok(())
}

/// `cargo xtask COMMAND` in the root's clone, with a root login's environment and nothing of
/// ours (no CARGO_TARGET_DIR, no RUSTUP_TOOLCHAIN).
fn in_chroot(root: &Path, command: &str) -> Result<()> {
    let mut cmd = chroot(root);
    cmd.args(["cargo", "xtask", command]);
    eprintln!("fresh: chroot {}: cargo xtask {command}", root.display());
    stream(&mut cmd)
}

/// An interactive shell in the root's clone (stdin is the terminal's, unlike [`stream`]'s).
fn shell(root: &Path) -> Result<()> {
    let mut cmd = chroot(root);
    cmd.args(["/bin/bash", "-i"]);
    eprintln!(
        "fresh: shell in {} (mounted until it exits)",
        root.display()
    );
    let status = cmd
        .status()
        .with_context(|| format!("could not run `{}`", render(&cmd)))?;
    eprintln!("fresh: shell exited ({status})");
    // A Ctrl-C typed at the shell was the shell's, not a request to stop.
    SIGNAL.store(0, Ordering::SeqCst);
    Ok(())
}

/// `chroot ROOT env -C /root/plegd` with a root login's environment; the program comes next.
fn chroot(root: &Path) -> Command {
    let mut cmd = Command::new("chroot");
    cmd.arg(root)
        .args(["/usr/bin/env", "-C", &format!("/{REPO_IN_ROOT}")])
        .env_clear()
        .env("HOME", "/root")
        .env("USER", "root")
        .env("LOGNAME", "root")
        .env("SHELL", "/bin/bash")
        .env("LANG", "C.UTF-8")
        .env(
            "PATH",
            "/root/.cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        );
    if let Some(term) = env::var_os("TERM") {
        cmd.env("TERM", term);
    }
    cmd
}

// ---------------------------------------------------------------------------------------------
// Mounts

/// When dropped: kills what the run left running in the root (a process whose root directory
/// is the chroot's can only be one the run started), then unmounts every mount under the root
/// (ours, and any a failed run left), deepest first.
struct MountGuard {
    root: PathBuf,
}

impl MountGuard {
    fn new(root: &Path) -> Self {
        Self {
            root: root.to_owned(),
        }
    }
}

impl Drop for MountGuard {
    fn drop(&mut self) {
        kill_strays(&self.root);
        let mounts = match read_mountinfo() {
            Ok(info) => mounts_under(&info, &self.root),
            Err(e) => {
                eprintln!("fresh: warning: cannot read the mount table to unmount: {e:#}");
                return;
            }
        };
        for path in mounts.iter().rev() {
            let Ok(c_path) = CString::new(path.as_os_str().as_bytes()) else {
                continue;
            };
            // SAFETY: a valid NUL-terminated path.
            if unsafe { libc::umount2(c_path.as_ptr(), 0) } != 0 {
                let error = std::io::Error::last_os_error();
                // SAFETY: as above; a lazy unmount detaches it even while busy.
                if unsafe { libc::umount2(c_path.as_ptr(), libc::MNT_DETACH) } != 0 {
                    eprintln!("fresh: warning: cannot unmount {}: {error}", path.display());
                } else {
                    eprintln!("fresh: {} was busy ({error}): detached it", path.display());
                }
            }
        }
        let left = read_mountinfo()
            .map(|info| mounts_under(&info, &self.root))
            .unwrap_or_default();
        if left.is_empty() {
            eprintln!(
                "fresh: unmounted {} mounts under {}",
                mounts.len(),
                self.root.display()
            );
        } else {
            eprintln!(
                "fresh: warning: still mounted (in this run's private namespace only): {left:?}"
            );
        }
    }
}

/// SIGKILLs every process chrooted into `root` (by pid, after naming it) and waits a moment
/// for them to go, so the unmounts that follow are not busy.
fn kill_strays(root: &Path) {
    let strays = processes_in(root);
    if strays.is_empty() {
        return;
    }
    for (pid, cmdline) in &strays {
        eprintln!(
            "fresh: warning: the run left pid {pid} running in the root, killing it: {cmdline}"
        );
        // SAFETY: kill has no memory preconditions; the pid was chrooted into our root a moment
        // ago (a reused pid would have another root).
        unsafe { libc::kill(*pid, libc::SIGKILL) };
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while !processes_in(root).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Processes whose root directory is `root`, with their command lines.
fn processes_in(root: &Path) -> Vec<(libc::pid_t, String)> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<libc::pid_t>().ok())
        .filter(|pid| fs::read_link(format!("/proc/{pid}/root")).is_ok_and(|r| r == root))
        .map(|pid| {
            let cmdline = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            (pid, cmdline.trim().to_owned())
        })
        .collect()
}

fn read_mountinfo() -> Result<String> {
    fs::read_to_string("/proc/self/mountinfo").context("reading /proc/self/mountinfo")
}

/// Mount points at or under `dir`, in the table's order (parents before children).
fn mounts_under(mountinfo: &str, dir: &Path) -> Vec<PathBuf> {
    mountinfo
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(|field| PathBuf::from(unescape_mountinfo(field)))
        .filter(|point| point.starts_with(dir))
        .collect()
}

/// Mount points in mountinfo have space, tab, newline and backslash as octal escapes.
fn unescape_mountinfo(field: &str) -> String {
    let mut out = String::with_capacity(field.len());
    let mut rest = field;
    while let Some(at) = rest.find('\\') {
        out.push_str(&rest[..at]);
        let code = rest.get(at + 1..at + 4);
        match code.and_then(|c| u8::from_str_radix(c, 8).ok()) {
            Some(byte) => {
                out.push(char::from(byte));
                rest = &rest[at + 4..];
            }
            None => {
                out.push('\\');
                rest = &rest[at + 1..];
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_sources_keep_deb_lines_without_options_or_comments() {
        let text = "# comment\n\
                    deb http://deb.debian.org/debian bookworm main contrib # trailing\n\
                    deb-src http://deb.debian.org/debian bookworm main\n\
                    deb [signed-by=/k.gpg arch=amd64] http://security.debian.org/debian-security bookworm-security main\n";
        assert_eq!(
            parse_one_line(text),
            [
                Source {
                    uri: "http://deb.debian.org/debian".into(),
                    suite: "bookworm".into(),
                    components: vec!["main".into(), "contrib".into()],
                },
                Source {
                    uri: "http://security.debian.org/debian-security".into(),
                    suite: "bookworm-security".into(),
                    components: vec!["main".into()],
                },
            ]
        );
    }

    #[test]
    fn deb822_stanzas_expand_uris_times_suites_and_skip_disabled() {
        let text = "Types: deb\n\
                    # http://snapshot.debian.org/archive/debian/20250520T000000Z\n\
                    URIs: http://deb.debian.org/debian\n\
                    Suites: bookworm bookworm-updates\n\
                    Components: main\n\
                    Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\
                    \n\
                    Types: deb-src\n\
                    URIs: http://deb.debian.org/debian\n\
                    Suites: bookworm\n\
                    Components: main\n\
                    \n\
                    Types: deb\n\
                    Enabled: no\n\
                    URIs: http://example.org/debian\n\
                    Suites: bookworm\n\
                    Components: main\n";
        let lines: Vec<String> = parse_deb822(text).iter().map(Source::line).collect();
        assert_eq!(
            lines,
            [
                "deb http://deb.debian.org/debian bookworm main",
                "deb http://deb.debian.org/debian bookworm-updates main",
            ]
        );
    }

    #[test]
    fn mounts_under_matches_whole_components_and_unescapes() {
        let info = "22 27 0:21 / /proc rw - proc proc rw\n\
                    90 27 0:50 / /tmp/plegd-fresh/run/root rw - overlay overlay rw\n\
                    91 90 0:22 / /tmp/plegd-fresh/run/root/sys rw - sysfs sysfs rw\n\
                    92 27 0:51 / /tmp/plegd-fresh/run/rootless rw - tmpfs tmpfs rw\n\
                    93 90 0:52 / /tmp/plegd-fresh/run/root/a\\040b rw - tmpfs tmpfs rw\n";
        let root = Path::new("/tmp/plegd-fresh/run/root");
        assert_eq!(
            mounts_under(info, root),
            [root.to_owned(), root.join("sys"), root.join("a b"),]
        );
        assert_eq!(unescape_mountinfo(r"a\134b\011c\0"), "a\\b\tc\\0");
    }
}
