//! Embedding plegd with a sync handler of one's own: the PLEG (relist, pod cache, event bus,
//! sync loop) runs against the fake runtime through its face, `plegd::pleg::Pleg`, and
//! [`Printer`] prints each pod sync the sync loop hands it while a pod starts, exits and goes
//! away.
//!
//! `cargo run -p plegd --features testing --example sync_handler`. Against a node's runtime,
//! give `Pleg::start` the runtime `plegd::daemon::connect` finds instead.

use std::time::Duration;

use plegd::{
    base::metrics::Metrics,
    pleg::{ContainerState, Options, Pleg, PodSync, SyncHandler, SyncReason},
    runtime::testing::{FakeRuntime, container},
};
use tokio::sync::mpsc;

/// How long the example waits for each sync before it gives up.
const DEADLINE: Duration = Duration::from_secs(20);

/// Prints each sync as one line, and hands it on to whoever drives the example.
struct Printer {
    syncs: mpsc::UnboundedSender<PodSync>,
}

impl SyncHandler for Printer {
    async fn sync_pod(&self, sync: &PodSync) {
        println!("{}", line(sync));
        // The driver may be gone at shutdown; the handler has nothing more to do then.
        let _ = self.syncs.send(sync.clone());
    }
}

/// `reason namespace/name seq=N: container state [exit code], ...`.
fn line(sync: &PodSync) -> String {
    let containers: Vec<String> = sync
        .status
        .record
        .iter()
        .flat_map(|record| record.containers.values())
        .map(|c| match c.exit_code {
            Some(code) if c.state == ContainerState::Exited => {
                format!("{} {:?} {code}", c.name, c.state)
            }
            _ => format!("{} {:?}", c.name, c.state),
        })
        .collect();
    format!(
        "{} {}/{} seq={}: {}",
        sync.reason.name(),
        sync.namespace,
        sync.name,
        sync.sequence,
        containers.join(", ")
    )
}

/// Runs the core, walks one pod through its life, and returns the lines printed for it.
async fn run() -> anyhow::Result<Vec<String>> {
    let runtime = FakeRuntime::new();
    let (tx, mut syncs) = mpsc::unbounded_channel();
    let options = Options {
        relist_period: Duration::from_millis(100),
        ..Options::default()
    };
    let printer = Printer { syncs: tx };
    let (_pleg, running) = Pleg::start(runtime.clone(), printer, options, None, 1, &Metrics::new());

    let mut lines = Vec::new();
    let mut until = async |done: &dyn Fn(&PodSync) -> bool| -> anyhow::Result<()> {
        loop {
            let sync = tokio::time::timeout(DEADLINE, syncs.recv())
                .await?
                .ok_or_else(|| anyhow::anyhow!("the daemon stopped"))?;
            lines.push(line(&sync));
            if done(&sync) {
                return Ok(());
            }
        }
    };
    let state = |sync: &PodSync| {
        sync.status
            .record
            .as_ref()
            .and_then(|r| r.containers.values().next())
            .map(|c| (c.state, c.exit_code))
    };

    runtime.add_pod("web-uid", "default", "web");
    runtime.set_container("web-uid", container("c1", "app", ContainerState::Running));
    until(&|s| state(s) == Some((ContainerState::Running, None))).await?;
    runtime.set_state("web-uid", "c1", ContainerState::Exited, Some(3));
    until(&|s| state(s) == Some((ContainerState::Exited, Some(3)))).await?;
    runtime.remove_pod("web-uid");
    until(&|s| s.reason == SyncReason::Removed).await?;

    running.stop().await;
    Ok(lines)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    run().await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The example as the test suite runs it: the pod's life comes as syncs, the last one
    /// `removed`.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_example_prints_a_pods_life_as_syncs() {
        let lines = run().await.unwrap();
        assert!(lines[0].starts_with("event default/web seq="), "{lines:?}");
        assert!(
            lines.iter().any(|l| l.ends_with(": app Exited 3")),
            "{lines:?}"
        );
        let last = lines.last().unwrap();
        assert!(last.starts_with("removed default/web seq="), "{lines:?}");
        assert_eq!(
            lines.iter().filter(|l| l.starts_with("removed")).count(),
            1,
            "{lines:?}"
        );
    }
}
