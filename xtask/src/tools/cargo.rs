//! The workspace's one test build: `cargo test --workspace --no-run`, and the executables it
//! made. `cargo xtask test` runs its test binaries, and `kernels` and `node` take plegd, the
//! harness and the eBPF tests from it: every step sees one feature set (plegd-tests turns on
//! plegd's `testing` through its dev-dependency), so no step builds plegd, its dependencies or
//! its eBPF programs again for a set of its own.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context as _, Result, bail};

use super::cmd::render;

/// An executable cargo built.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Artifact {
    /// The target's name (`plegd`, `ebpf_events`).
    pub name: String,
    /// Its first kind: `bin`, `test`, `lib` (the unit tests of a library)...
    pub kind: String,
    /// Built with the test harness (`cargo test` builds a bin twice: itself, for integration
    /// tests, and its unit tests).
    pub harness: bool,
    pub executable: PathBuf,
    /// The directory of its package's manifest: where `cargo test` runs it.
    pub package_dir: PathBuf,
}

/// The executables of `cargo test --workspace --no-run`.
#[derive(Debug, Clone)]
pub struct TestBuild {
    pub artifacts: Vec<Artifact>,
}

impl TestBuild {
    /// Builds every test of the workspace, and the binaries they run, without running any.
    pub fn build() -> Result<Self> {
        let mut cmd = Command::new(env!("CARGO"));
        cmd.args(["test", "--workspace", "--no-run"]);
        Ok(Self {
            artifacts: artifacts(&mut cmd)?,
        })
    }

    /// The binary `name` (built for the integration tests, not its unit tests).
    pub fn bin(&self, name: &str) -> Result<&Path> {
        self.find(name, "bin", false)
    }

    /// The integration test binary `name`.
    pub fn test(&self, name: &str) -> Result<&Path> {
        self.find(name, "test", true)
    }

    fn find(&self, name: &str, kind: &str, harness: bool) -> Result<&Path> {
        self.artifacts
            .iter()
            .find(|a| a.name == name && a.kind == kind && a.harness == harness)
            .map(|a| a.executable.as_path())
            .with_context(|| {
                format!("`cargo test --workspace --no-run` printed no {kind} executable {name}")
            })
    }

    /// The executables that run tests (libtest's harness), in cargo's order.
    pub fn harnesses(&self) -> impl Iterator<Item = &Artifact> {
        self.artifacts.iter().filter(|a| a.harness)
    }

    /// Cargo's target directory for the build's profile (`<target>/debug`).
    pub fn profile_dir(&self) -> Result<&Path> {
        // <target>/<profile>/plegd
        self.bin("plegd")?
            .parent()
            .context("plegd's path has no target directory")
    }
}

/// Runs a cargo build with `--message-format json` (diagnostics shown as usual on stderr) and
/// returns the executables it produced.
pub fn artifacts(cmd: &mut Command) -> Result<Vec<Artifact>> {
    cmd.arg("--message-format=json-render-diagnostics")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    let out = cmd
        .output()
        .with_context(|| format!("could not run `{}`", render(cmd)))?;
    if !out.status.success() {
        bail!(
            "`{}` failed ({}); its output is above",
            render(cmd),
            out.status
        );
    }
    Ok(executables(&String::from_utf8_lossy(&out.stdout)))
}

/// The `compiler-artifact` messages that have an executable.
fn executables(messages: &str) -> Vec<Artifact> {
    messages
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|message| message["reason"] == "compiler-artifact")
        .filter_map(|message| {
            Some(Artifact {
                name: message["target"]["name"].as_str()?.to_owned(),
                kind: message["target"]["kind"][0].as_str()?.to_owned(),
                harness: message["profile"]["test"] == true,
                executable: PathBuf::from(message["executable"].as_str()?),
                package_dir: Path::new(message["manifest_path"].as_str()?)
                    .parent()?
                    .to_owned(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn executables_come_from_compiler_artifacts() {
        let messages = r#"{"reason":"compiler-artifact","manifest_path":"/w/agent/Cargo.toml","target":{"name":"plegd","kind":["bin"]},"profile":{"test":false},"executable":"/t/debug/plegd"}
{"reason":"compiler-artifact","manifest_path":"/w/agent/Cargo.toml","target":{"name":"plegd","kind":["lib"]},"profile":{"test":false},"executable":null}
{"reason":"build-finished","success":true}
not json
{"reason":"compiler-artifact","manifest_path":"/w/tests/Cargo.toml","target":{"name":"ebpf_events","kind":["test"]},"profile":{"test":true},"executable":"/t/debug/deps/ebpf_events-0123"}"#;
        let build = TestBuild {
            artifacts: executables(messages),
        };
        assert_eq!(
            build.artifacts,
            [
                Artifact {
                    name: "plegd".into(),
                    kind: "bin".into(),
                    harness: false,
                    executable: PathBuf::from("/t/debug/plegd"),
                    package_dir: PathBuf::from("/w/agent"),
                },
                Artifact {
                    name: "ebpf_events".into(),
                    kind: "test".into(),
                    harness: true,
                    executable: PathBuf::from("/t/debug/deps/ebpf_events-0123"),
                    package_dir: PathBuf::from("/w/tests"),
                },
            ]
        );
        assert_eq!(build.bin("plegd").unwrap(), Path::new("/t/debug/plegd"));
        assert_eq!(build.profile_dir().unwrap(), Path::new("/t/debug"));
        assert!(build.test("plegd").is_err());
        assert_eq!(
            build.test("ebpf_events").unwrap(),
            Path::new("/t/debug/deps/ebpf_events-0123")
        );
        assert_eq!(
            build.harnesses().map(|a| &a.name[..]).collect::<Vec<_>>(),
            ["ebpf_events"]
        );
    }
}
