//! The OTLP/gRPC receiver of the export test and the bench: OpenTelemetry's Python package of
//! the OTLP protos served by grpcio (tests/python/otlp_receiver.py, in the venv `cargo xtask
//! setup` makes), as a process that says where it listens and prints what it receives.

use std::{
    path::Path,
    process::Stdio,
    sync::{Arc, Mutex},
    time::Duration,
};

use anyhow::{Context as _, bail};
use nix::{
    sys::signal::{Signal, kill},
    unistd::Pid,
};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt as _, BufReader};

/// How long it may take to start or to stop.
const DEADLINE: Duration = Duration::from_secs(90);

/// The records a receiver printed, one JSON object each (attributes flattened).
pub type Records = Arc<Mutex<Vec<Value>>>;

/// A running receiver; killed if dropped.
pub struct Receiver {
    child: tokio::process::Child,
    pub port: u16,
    records: Records,
    reader: Option<tokio::task::JoinHandle<()>>,
}

impl Receiver {
    /// Starts a receiver on `port` (0: any free one) that adds each record it receives to
    /// `records`.
    pub async fn start(port: u16, records: Records) -> anyhow::Result<Self> {
        Self::spawn(port, records, "keep").await
    }

    /// Starts a receiver on any free port that acknowledges and keeps nothing (the bench's).
    pub async fn start_quiet() -> anyhow::Result<Self> {
        Self::spawn(0, Records::default(), "quiet").await
    }

    /// Starts a receiver on any free port that answers every Export INVALID_ARGUMENT, as a
    /// receiver does to a request it will never take; each call adds `{"rejected": RECORDS}`
    /// to its records.
    pub async fn start_rejecting() -> anyhow::Result<Self> {
        Self::spawn(0, Records::default(), "reject").await
    }

    async fn spawn(port: u16, records: Records, mode: &str) -> anyhow::Result<Self> {
        let quiet = mode == "quiet";
        let tests = Path::new(env!("CARGO_MANIFEST_DIR"));
        let python = tests.join("../.xtask/otlp-receiver/bin/python");
        if !python.exists() {
            bail!("{} missing: run `cargo xtask setup`", python.display());
        }
        let mut child = tokio::process::Command::new(python)
            .arg(tests.join("tests/python/otlp_receiver.py"))
            .arg(port.to_string())
            .arg(mode)
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .context("starting the OTLP receiver")?;
        let mut lines = BufReader::new(child.stdout.take().context("no stdout")?).lines();
        let first = tokio::time::timeout(DEADLINE, lines.next_line())
            .await
            .context("the receiver did not say where it listens in time")??
            .context("the receiver ended before saying where it listens")?;
        let port = first
            .strip_prefix("listening ")
            .and_then(|p| p.parse().ok())
            .with_context(|| format!("not a port: {first:?}"))?;
        let reader = (!quiet).then(|| {
            let records = Arc::clone(&records);
            tokio::spawn(async move {
                while let Ok(Some(line)) = lines.next_line().await {
                    let record = serde_json::from_str(&line)
                        .unwrap_or_else(|e| panic!("bad record line {line:?}: {e}"));
                    records.lock().unwrap().push(record);
                }
            })
        });
        Ok(Self {
            child,
            port,
            records,
            reader,
        })
    }

    /// Stops it gracefully (SIGTERM: calls in flight are answered) and waits for its output.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        let pid = self.child.id().context("the receiver is not running")?;
        kill(Pid::from_raw(i32::try_from(pid)?), Signal::SIGTERM)?;
        let status = tokio::time::timeout(DEADLINE, self.child.wait())
            .await
            .context("the receiver did not stop in time")??;
        if !status.success() {
            bail!("the receiver ended with {status}");
        }
        if let Some(reader) = self.reader.take() {
            reader.await?;
        }
        Ok(())
    }

    /// What it received so far.
    pub fn records(&self) -> Vec<Value> {
        self.records.lock().unwrap().clone()
    }

    /// Where its records go.
    pub fn shared_records(&self) -> &Records {
        &self.records
    }
}
