//! Project tasks, run as `cargo xtask <command>`.
//!
//! One module per subcommand; each exposes an `Options` struct (its clap arguments) and
//! `run(&Options) -> anyhow::Result<()>`, so one task can call another (for example `test` and
//! `demo` start with `setup::install`, naming the tools they use). What the commands share and
//! is no command itself (running programs, timing steps, the workspace's paths, the harness
//! binary, buf, a VM as a child process) lives under [`tools`].

mod audit;
mod bench;
mod containerd;
mod demo;
mod docs;
mod fresh;
mod fuzz;
mod image;
mod kernels;
mod node;
mod setup;
mod soak;
mod test;
mod tools;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "cargo xtask", about = "plegd project tasks", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Install and check everything the build and the tests need on this machine (run as root):
    /// apt packages, nightly rust-src, bpf-linker, tracefs, buf; with `--vm` also QEMU, Debian's
    /// 6.1 and 6.12 kernels and virtme-ng for `kernels`. Idempotent.
    Setup(setup::Options),
    /// Start, stop or query a private containerd (never the node's own), for trying plegd by
    /// hand: `cargo xtask containerd start`.
    Containerd(containerd::Options),
    /// Benchmarks written up as a report (target/bench/latest/report.md + PNGs): latency per
    /// mode, idle and churn cost, relist scale, in-kernel cost, and a busy node's cost per
    /// lifecycle, runtime throughput, overload share and cold start at density (`--sections`);
    /// summary table into docs/benchmarks.md.
    Bench(bench::Options),
    /// Every `cargo deny` check of deny.toml, RustSec advisories included (fetches their
    /// database from GitHub); `test` runs the offline ones (licenses, bans, sources).
    Audit(audit::Options),
    /// The churn audit: 1,000 container lifecycles per mode (eBPF only, containerd events only,
    /// default, polling), optionally under a fault, with K lifecycles in flight and each runtime
    /// backend (`--in-flight`, `--runtime`), each transition checked against ground truth;
    /// fails when one is lost, duplicated, reordered or wrong, or under 95 % were audited.
    Soak(soak::Options),
    /// Fuzz the parsers (cgroup paths, config files, kernel and containerd events) with
    /// libFuzzer for a while each (nightly, cargo-fuzz).
    Fuzz(fuzz::Options),
    /// Run plegd against a private containerd while real containers start, die and go.
    Demo(demo::Options),
    /// Regenerate the reference pages under docs/ (configuration, man pages, API, metrics)
    /// from the code; `cargo test` fails while they are out of date.
    Docs(docs::Options),
    /// Set up, check format, lints and the API's compatibility (buf), and run every test, unit
    /// and end-to-end (as root), then the quick eBPF check on Linux 6.1 in a VM.
    Test(test::Options),
    /// Build plegd's OCI image tarball (release binary and the shared libraries it loads) into
    /// the target directory and print its path; no registry or container engine needed.
    Image(image::Options),
    /// Boot Debian's 5.10, 6.1 and 6.12 kernels in VMs (QEMU TCG, virtme-ng) and run `plegd
    /// check` and the eBPF end-to-end tests inside each.
    Kernels(kernels::Options),
    /// A real node in a VM (QEMU TCG): systemd as PID 1, pure cgroup2, containerd as its
    /// service on the systemd cgroup driver, plegd installed as README says; runs the node
    /// check (readiness, lifecycles in every pid mode, eBPF-only, kill and restart, hardening)
    /// and prints each check's pass or FAIL.
    Node(node::Options),
    /// Prove README's `demo` and `test` work on a fresh machine: bootstrap a minimal Debian 12
    /// root, copy in only the Rust toolchain and a clone of HEAD, run both in a chroot (root;
    /// slow: a full build on top of the bootstrap).
    Fresh(fresh::Options),
}

fn main() -> ExitCode {
    let Cli { command } = Cli::parse();
    let result = match command {
        Command::Setup(opts) => setup::run(&opts),
        Command::Containerd(opts) => containerd::run(&opts),
        Command::Bench(opts) => bench::run(&opts),
        Command::Audit(opts) => audit::run(&opts),
        Command::Soak(opts) => soak::run(&opts),
        Command::Fuzz(opts) => fuzz::run(&opts),
        Command::Demo(opts) => demo::run(&opts),
        Command::Docs(opts) => docs::run(&opts),
        Command::Test(opts) => test::run(&opts),
        Command::Image(opts) => image::run(&opts),
        Command::Kernels(opts) => kernels::run(&opts),
        Command::Node(opts) => node::run(&opts),
        Command::Fresh(opts) => fresh::run(&opts),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{e:#}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory as _;

    use super::*;
    use crate::tools::harness;

    #[test]
    fn cli_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn setup_parses() {
        let cli = Cli::try_parse_from(["cargo xtask", "setup", "--check"]).unwrap();
        assert!(matches!(
            cli.command,
            Command::Setup(setup::Options {
                check: true,
                vm: false
            })
        ));
    }

    #[test]
    fn kernels_parses() {
        let cli =
            Cli::try_parse_from(["cargo xtask", "kernels", "--kernel", "6.12", "--quick"]).unwrap();
        let Command::Kernels(opts) = cli.command else {
            panic!("not kernels: {cli:?}");
        };
        assert_eq!(opts.kernel, kernels::Choice::V6_12);
        assert!(opts.quick);
        let cli = Cli::try_parse_from(["cargo xtask", "kernels"]).unwrap();
        let Command::Kernels(opts) = cli.command else {
            panic!("not kernels: {cli:?}");
        };
        assert_eq!(opts.kernel, kernels::Choice::All);
    }

    #[test]
    fn node_parses() {
        let cli = Cli::try_parse_from([
            "cargo xtask",
            "node",
            "--kernel",
            "5.10",
            "--containerd",
            "2.1",
            "--quick",
        ])
        .unwrap();
        let Command::Node(opts) = cli.command else {
            panic!("not node: {cli:?}");
        };
        assert_eq!(opts.kernel, kernels::Choice::V5_10);
        assert_eq!(opts.containerd, node::Containerd::V2_1);
        assert!(opts.quick && !opts.all);
        let cli = Cli::try_parse_from(["cargo xtask", "node"]).unwrap();
        let Command::Node(opts) = cli.command else {
            panic!("not node: {cli:?}");
        };
        assert_eq!(opts.kernel, kernels::Choice::V6_1);
        assert_eq!(opts.containerd, node::Containerd::V1_7);
        assert_eq!(opts.churn, 60);
    }

    #[test]
    fn containerd_release_is_chosen_per_run() {
        let cli =
            Cli::try_parse_from(["cargo xtask", "test", "--containerd", "2.1", "cri"]).unwrap();
        let Command::Test(opts) = cli.command else {
            panic!("not test: {cli:?}");
        };
        assert_eq!(opts.containerd.containerd.as_deref(), Some("2.1"));
        assert_eq!(opts.filter.as_deref(), Some("cri"));
        let mut cmd = std::process::Command::new("cargo");
        opts.containerd.apply(&mut cmd);
        assert!(
            cmd.get_envs()
                .any(|(k, v)| k == harness::RELEASE_ENV && v == Some("2.1".as_ref()))
        );
        let cli =
            Cli::try_parse_from(["cargo xtask", "containerd", "start", "--containerd", "1.7"])
                .unwrap();
        assert!(matches!(
            cli.command,
            Command::Containerd(containerd::Options { containerd: harness::Release { containerd: Some(ref v) }, .. }) if v == "1.7"
        ));
    }
}
