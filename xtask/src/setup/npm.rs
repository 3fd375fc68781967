//! Programs from npm, each in a prefix of its own under `.xtask/` in the workspace: buf for the
//! API checks, @grpc/grpc-js for the Node client test; Debian's npm first when none runs.

use std::{
    env, fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};

use super::{
    Options,
    apt::install_packages,
    programs::find_program,
    summary::{State, Summary, say},
};
use crate::tools::{buf, cmd::stream, workspace};

/// The Node gRPC client the tests run, and its .proto loader.
pub const GRPC_JS_VERSION: &str = "1.14.7";

const PROTO_LOADER_VERSION: &str = "0.8.1";

/// Their npm prefix, relative to the workspace root (the tests find `node_modules` there).
pub const GRPC_JS_PREFIX: &str = ".xtask/grpc-js";

/// The Debian package holding npm, installed only when no `npm` runs: NodeSource's `nodejs`
/// carries its own npm and conflicts with Debian's, so it is not in [`BUILD_PACKAGES`].
const NPM_PACKAGE: &str = "npm";

/// buf in its npm prefix, installed with npm when missing or another version.
pub(super) fn buf_cli(opts: &Options, summary: &mut Summary) -> Result<()> {
    const STEP: &str = "buf";
    let prefix = workspace::root().join(buf::BUF_PREFIX);
    let program = buf::program();
    let wanted = buf::BUF_VERSION;
    let found = if program.exists() {
        buf::version(&program).ok()
    } else {
        None
    };
    let detail = format!("buf {wanted} ({})", program.display());
    if found.as_deref() == Some(wanted) {
        say(STEP, format!("already installed: {detail}"));
        summary.add(STEP, State::Present, detail);
        return Ok(());
    }
    let why = match &found {
        Some(other) => format!("{} is buf {other}", program.display()),
        None => format!("no {}", program.display()),
    };
    if opts.check {
        let npm = if find_program("npm", &[]).is_some() {
            ""
        } else {
            " (and no npm)"
        };
        say(STEP, format!("missing: {why}{npm}"));
        summary.add(STEP, State::Missing, format!("{why}{npm}"));
        return Ok(());
    }
    say(
        STEP,
        format!(
            "{why}: installing @bufbuild/buf@{wanted} from npm into {}",
            prefix.display()
        ),
    );
    // Its postinstall only swaps the node launcher for the binary; buf runs the same without
    // it.
    npm_install(STEP, &prefix, &[format!("@bufbuild/buf@{wanted}")])?;
    let version = buf::version(&program).context("the freshly installed buf does not run")?;
    if version != wanted {
        bail!(
            "npm installed {}, which says {version:?}, not {wanted:?}",
            program.display()
        );
    }
    summary.add(STEP, State::Installed, detail);
    Ok(())
}

/// npm, installed from apt first when none runs.
fn npm(step: &str) -> Result<PathBuf> {
    if let Some(npm) = find_program("npm", &[]) {
        return Ok(npm);
    }
    say(
        step,
        format!("no npm: installing apt package {NPM_PACKAGE}"),
    );
    install_packages(&[NPM_PACKAGE])?;
    find_program("npm", &[])
        .with_context(|| format!("apt package {NPM_PACKAGE} is installed but npm is not found"))
}

/// `npm install` of `packages` (`name@version`) into `prefix`, at those exact versions and
/// without their install scripts (newer npm skips them unless approved).
fn npm_install(step: &str, prefix: &Path, packages: &[String]) -> Result<()> {
    stream(
        Command::new(npm(step)?)
            .arg("install")
            .arg("--prefix")
            .arg(prefix)
            .args([
                "--no-audit",
                "--no-fund",
                "--save-exact",
                "--ignore-scripts",
            ])
            .args(packages)
            // Out of the workspace: npm must not take its root for a package.
            .current_dir(env::temp_dir()),
    )
    .with_context(|| format!("npm install {} failed", packages.join(" ")))
}

/// @grpc/grpc-js and @grpc/proto-loader, for the Node client test, in an npm prefix of their
/// own under `.xtask/`.
pub(super) fn grpc_js(opts: &Options, summary: &mut Summary) -> Result<()> {
    const STEP: &str = "grpc-js";
    let prefix = workspace::root().join(GRPC_JS_PREFIX);
    let wanted = [
        ("@grpc/grpc-js", GRPC_JS_VERSION),
        ("@grpc/proto-loader", PROTO_LOADER_VERSION),
    ];
    let installed = |name: &str| -> Option<String> {
        let manifest =
            fs::read_to_string(prefix.join("node_modules").join(name).join("package.json")).ok()?;
        let manifest: serde_json::Value = serde_json::from_str(&manifest).ok()?;
        manifest["version"].as_str().map(str::to_owned)
    };
    let detail = wanted
        .iter()
        .map(|(name, version)| format!("{name}@{version}"))
        .collect::<Vec<_>>();
    let missing: Vec<&String> = wanted
        .iter()
        .zip(&detail)
        .filter(|((name, version), _)| installed(name).as_deref() != Some(version))
        .map(|(_, package)| package)
        .collect();
    let where_ = format!("{} ({})", detail.join(" "), prefix.display());
    if missing.is_empty() {
        say(STEP, format!("already installed: {where_}"));
        summary.add(STEP, State::Present, where_);
        return Ok(());
    }
    if opts.check {
        say(STEP, format!("missing: {}", detail.join(" ")));
        summary.add(STEP, State::Missing, detail.join(" "));
        return Ok(());
    }
    say(
        STEP,
        format!(
            "installing {} from npm into {}",
            detail.join(" "),
            prefix.display()
        ),
    );
    npm_install(STEP, &prefix, &detail)?;
    if let Some((name, version)) = wanted
        .iter()
        .find(|(name, version)| installed(name).as_deref() != Some(version))
    {
        bail!(
            "npm install reported success but {name}@{version} is not in {}",
            prefix.display()
        );
    }
    summary.add(STEP, State::Installed, where_);
    Ok(())
}
