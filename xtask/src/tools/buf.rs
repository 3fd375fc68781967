//! The plegd.v1 API stays compatible: `buf lint` on the proto module and `buf breaking` against
//! the proto at [`BASELINE`], run by `cargo xtask test`; `cargo xtask setup` installs buf
//! ([`BUF_VERSION`], from npm's `@bufbuild/buf`) under [`BUF_PREFIX`] in the workspace.
//!
//! The rules are in the module's `buf.yaml` (proto/proto/buf.yaml): which lint rules the API,
//! older than buf, is excepted from, and the breaking category (FILE).

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};

use super::{
    cmd::{capture, output, render},
    workspace,
};

/// The buf release setup installs (pinned: lint and breaking rules change between releases).
pub const BUF_VERSION: &str = "1.75.0";

/// The npm prefix holding buf, relative to the workspace root (ignored by git).
pub const BUF_PREFIX: &str = ".xtask/buf";

/// The proto module (holds buf.yaml and plegd/v1/plegd.proto), relative to the workspace root.
pub const MODULE: &str = "proto/proto";

/// The revision whose proto `buf breaking` compares against: the API as it was before issue 25
/// added SyncPods (ce3d1a2, the last change to proto/ before c3a0a0d). The repository has no
/// release tags and no remote to take a merge-base with, and comparing with the previous commit
/// (`HEAD~`) would accept a break once it is committed (the next commit compares against the
/// broken proto). A fixed baseline keeps every change since it checked, however many commits
/// it took. Move it forward only to a revision whose API was released, and only forward.
pub const BASELINE: &str = "ce3d1a2e7952a9f01c359cd8373fa13b0871e0f2";

/// `.xtask/buf/node_modules/.bin/buf` in the workspace (a node script that runs the platform's
/// binary, `@bufbuild/buf-linux-x64`).
pub fn program() -> PathBuf {
    workspace::root()
        .join(BUF_PREFIX)
        .join("node_modules/.bin/buf")
}

/// `buf --version` of `buf`.
pub fn version(buf: &Path) -> Result<String> {
    Ok(capture(Command::new(buf).arg("--version"))?
        .trim()
        .to_owned())
}

/// `buf lint` and `buf breaking` against [`BASELINE`], for `cargo xtask test`.
pub fn check() -> Result<()> {
    let buf = program();
    if !buf.exists() {
        bail!(
            "{} is missing: run `cargo xtask setup` (installs buf {BUF_VERSION} from npm)",
            buf.display()
        );
    }
    let root = workspace::root();
    let module = root.join(MODULE);
    lint(&buf, &module)?;
    // A clone without the baseline (shallow, or not a git checkout) cannot compare: lint still
    // ran, and the skip is said rather than failed, since nothing about the proto is wrong.
    if !has_commit(&root, BASELINE) {
        eprintln!(
            "buf: breaking check skipped: this checkout lacks the baseline commit {} (a shallow \
             clone? `git fetch --unshallow` brings it)",
            &BASELINE[..7]
        );
        return Ok(());
    }
    let baseline = tempfile::tempdir().context("creating a directory for the baseline proto")?;
    let against = export(&root, BASELINE, baseline.path())?;
    breaking(&buf, &module, &against).with_context(|| {
        format!(
            "plegd.v1 is no longer compatible with the API at {} (the baseline in \
             xtask/src/tools/buf.rs): add new fields, messages and RPCs instead of changing or \
             removing published ones",
            &BASELINE[..7]
        )
    })
}

/// `buf lint` of the module at `module` (its own buf.yaml); fails with buf's findings.
pub fn lint(buf: &Path, module: &Path) -> Result<()> {
    run(
        Command::new(buf).arg("lint").arg(module),
        "buf lint found problems in the plegd.v1 proto (rules: proto/proto/buf.yaml)",
    )
}

/// `buf breaking` of `module` against the module at `against`, with `module`'s buf.yaml rules;
/// fails with the changes buf calls breaking.
pub fn breaking(buf: &Path, module: &Path, against: &Path) -> Result<()> {
    run(
        Command::new(buf)
            .arg("breaking")
            .arg(module)
            .arg("--against")
            .arg(against),
        "buf breaking found incompatible changes",
    )
}

fn run(cmd: &mut Command, what: &str) -> Result<()> {
    let out = output(cmd)?;
    if out.status.success() {
        return Ok(());
    }
    let findings = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    bail!(
        "{what} (`{}`, {}):\n{}",
        render(cmd),
        out.status,
        findings.trim_end()
    )
}

/// Whether the git checkout at `root` holds the commit `rev`.
fn has_commit(root: &Path, rev: &str) -> bool {
    Command::new("git")
        .arg("-C")
        .arg(root)
        .args(["cat-file", "-e", &format!("{rev}^{{commit}}")])
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

/// Writes the proto module as it was at `rev` under `dir` (`git archive`, which works the same
/// in a worktree, where `.git` is a file) and returns the module's directory there.
fn export(root: &Path, rev: &str, dir: &Path) -> Result<PathBuf> {
    let archive = dir.join("baseline.tar");
    let mut git = Command::new("git");
    git.arg("-C")
        .arg(root)
        .args(["archive", "--format=tar", "-o"])
        .arg(&archive)
        .arg(rev)
        .arg(MODULE);
    capture(&mut git).with_context(|| {
        format!(
            "exporting the baseline proto at {rev} (a shallow clone may lack it: `git fetch \
             --unshallow`)"
        )
    })?;
    capture(
        Command::new("tar")
            .arg("-xf")
            .arg(&archive)
            .arg("-C")
            .arg(dir),
    )
    .context("unpacking the baseline proto")?;
    let module = dir.join(MODULE);
    // Its own buf.yaml, so buf does not look above it for one (the baseline predates buf.yaml;
    // one in a parent of the temporary directory would make buf misread the input).
    fs::write(module.join("buf.yaml"), "version: v2\n")
        .context("writing the baseline's buf.yaml")?;
    Ok(module)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_commit_the_checkout_lacks_is_told_apart() {
        let root = workspace::root();
        assert!(has_commit(&root, "HEAD"));
        assert!(!has_commit(
            &root,
            "0123456789abcdef0123456789abcdef01234567"
        ));
        assert!(!has_commit(Path::new("/nonexistent"), "HEAD"));
    }

    /// buf when setup installed it; `None` (the test then says why it does nothing) otherwise.
    fn installed_buf() -> Option<PathBuf> {
        let buf = program();
        if buf.exists() {
            Some(buf)
        } else {
            eprintln!(
                "skipped: {} is not installed (`cargo xtask setup` installs it)",
                buf.display()
            );
            None
        }
    }

    /// A copy of the workspace's proto module under `dir`.
    fn copy_module(dir: &Path) -> PathBuf {
        let module = workspace::root().join(MODULE);
        let copy = dir.join("module");
        fs::create_dir_all(copy.join("plegd/v1")).unwrap();
        fs::copy(module.join("buf.yaml"), copy.join("buf.yaml")).unwrap();
        fs::copy(
            module.join("plegd/v1/plegd.proto"),
            copy.join("plegd/v1/plegd.proto"),
        )
        .unwrap();
        copy
    }

    #[test]
    fn the_pinned_buf_is_installed_or_not_at_all() {
        let Some(buf) = installed_buf() else { return };
        assert_eq!(version(&buf).unwrap(), BUF_VERSION);
    }

    #[test]
    fn the_api_passes_lint_and_is_compatible_with_the_baseline() {
        if installed_buf().is_none() {
            return;
        }
        check().unwrap();
    }

    #[test]
    fn a_removed_field_is_reported_as_breaking() {
        let Some(buf) = installed_buf() else { return };
        let dir = tempfile::tempdir().unwrap();
        let against = copy_module(dir.path());
        let changed = dir.path().join("changed");
        fs::create_dir_all(&changed).unwrap();
        let changed = copy_module(&changed);
        breaking(&buf, &changed, &against).expect("an unchanged copy is compatible");

        let proto = changed.join("plegd/v1/plegd.proto");
        let text = fs::read_to_string(&proto).unwrap();
        // WatchRequest's pod_name, taken out as a careless edit would.
        let field = "  string pod_name = 3;\n";
        assert!(text.contains(field), "plegd.proto no longer has {field:?}");
        fs::write(&proto, text.replacen(field, "", 1)).unwrap();
        let err = format!("{:#}", breaking(&buf, &changed, &against).unwrap_err());
        assert!(
            err.contains("buf breaking found incompatible changes"),
            "{err}"
        );
        assert!(
            err.contains(r#"Previously present field "3" with name "pod_name""#),
            "{err}"
        );
    }

    #[test]
    fn a_lint_finding_fails_lint() {
        let Some(buf) = installed_buf() else { return };
        let dir = tempfile::tempdir().unwrap();
        let module = copy_module(dir.path());
        lint(&buf, &module).unwrap();
        let proto = module.join("plegd/v1/plegd.proto");
        let text = fs::read_to_string(&proto).unwrap();
        // A message in lower case breaks STANDARD's MESSAGE_PASCAL_CASE.
        fs::write(&proto, format!("{text}\nmessage lower_case {{}}\n")).unwrap();
        let err = format!("{:#}", lint(&buf, &module).unwrap_err());
        assert!(err.contains("lower_case"), "{err}");
    }
}
