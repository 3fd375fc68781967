//! The lifecycle driver: container lifecycles as issue 52 measured them, N of them with K in
//! flight at once, in one shared pod (or spread over a few, in turn), through CRI as kubelet
//! drives containerd.
//!
//! One lifecycle: `CreateContainer` (`sleep 1000`), `StartContainer`, `ContainerStatus` every
//! [`POLL`] until RUNNING, kill -9 of its init, `ContainerStatus` every [`POLL`] until EXITED,
//! `RemoveContainer`. A new lifecycle starts whenever one ends, so K stay in flight until the
//! last N - K. Nothing here knows of plegd: the same run on a node without plegd is the
//! runtime's own throughput, the baseline a run beside plegd is held against.

use std::{
    future::Future,
    time::{Duration, Instant, SystemTime},
};

use anyhow::Context as _;
use k8s_cri::v1::{ContainerState, ContainerStatus};
use nix::sys::signal::Signal;

use crate::{
    cri::{ContainerSpec, Cri, Pod},
    native::Native,
};

/// How often a lifecycle asks CRI for its container's state, as kubelet's status polls would.
pub const POLL: Duration = Duration::from_millis(20);
/// Longest a lifecycle waits for one state (RUNNING, EXITED) before it counts as failed.
pub const STEP: Duration = Duration::from_secs(30);

/// What to run.
#[derive(Clone, Debug)]
pub struct Plan {
    /// Lifecycles in all (N).
    pub lifecycles: usize,
    /// Lifecycles in flight at once (K, at least 1).
    pub in_flight: usize,
    /// The containers' names are `<prefix><n>` (unique in the pod).
    pub prefix: String,
}

/// One lifecycle's container and the instants of its steps, on the wall clock (comparable with
/// containerd's timestamps and plegd's `emitted_at`).
#[derive(Clone, Debug)]
pub struct Lifecycle {
    /// Its place in the run (0..N).
    pub n: usize,
    /// The name of the pod it ran in.
    pub pod: String,
    pub container_id: String,
    /// `CreateContainer` sent.
    pub create: SystemTime,
    /// `StartContainer` returned.
    pub started: SystemTime,
    /// The first `ContainerStatus` that showed it RUNNING.
    pub running: SystemTime,
    /// SIGKILL sent to its init.
    pub killed: SystemTime,
    /// The first `ContainerStatus` that showed it EXITED.
    pub exited: SystemTime,
    /// The exit code that status showed (137 for the kill).
    pub exit_code: i32,
    /// `RemoveContainer` returned.
    pub removed: SystemTime,
}

/// A lifecycle that did not complete.
#[derive(Clone, Debug)]
pub struct Failure {
    pub n: usize,
    /// Its container, if it was created (it may still be in the pod).
    pub container_id: Option<String>,
    pub error: String,
}

/// What a run did.
#[derive(Clone, Debug)]
pub struct Run {
    /// The completed lifecycles, in the order they started.
    pub lifecycles: Vec<Lifecycle>,
    pub failed: Vec<Failure>,
    /// From the first `CreateContainer` sent to the last lifecycle's end.
    pub wall: Duration,
}

impl Run {
    /// Completed lifecycles per second of the run's wall time.
    pub fn per_second(&self) -> f64 {
        let wall = self.wall.as_secs_f64();
        if wall > 0.0 {
            self.lifecycles.len() as f64 / wall
        } else {
            0.0
        }
    }

    /// When the first `CreateContainer` was sent.
    pub fn first_create(&self) -> Option<SystemTime> {
        self.lifecycles.iter().map(|l| l.create).min()
    }

    /// When the last `RemoveContainer` returned.
    pub fn last_removal(&self) -> Option<SystemTime> {
        self.lifecycles.iter().map(|l| l.removed).max()
    }
}

/// Runs `plan`'s lifecycles in `pods` (at least one), lifecycle n in pod n mod their number;
/// `tasks` (containerd's task API in CRI's namespace) finds each container's init to kill. A
/// lifecycle that fails is reported, not fatal: the others go on.
pub async fn run(cri: &Cri, tasks: &Native, pods: &[Pod], plan: &Plan) -> Run {
    assert!(!pods.is_empty(), "lifecycles need a pod to run in");
    let began = Instant::now();
    let outcomes = in_flight(plan.lifecycles, plan.in_flight, |n| {
        let (cri, tasks, pod) = (cri.clone(), tasks.clone(), pods[n % pods.len()].clone());
        let name = format!("{}{n}", plan.prefix);
        async move { lifecycle(&cri, &tasks, &pod, n, &name).await }
    })
    .await;
    let wall = began.elapsed();
    let (mut lifecycles, mut failed) = (Vec::new(), Vec::new());
    for outcome in outcomes {
        match outcome {
            Ok(lifecycle) => lifecycles.push(lifecycle),
            Err(failure) => failed.push(failure),
        }
    }
    Run {
        lifecycles,
        failed,
        wall,
    }
}

/// Runs `each(0..n)` with at most `k` of them in flight, the next one started as soon as one
/// ends; their outputs in the order of their index. A panic in one is raised here.
pub async fn in_flight<T, F, Fut>(n: usize, k: usize, mut each: F) -> Vec<T>
where
    F: FnMut(usize) -> Fut,
    Fut: Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let k = k.max(1);
    let mut running = tokio::task::JoinSet::new();
    let mut done: Vec<(usize, T)> = Vec::with_capacity(n);
    let mut next = 0;
    while next < n || !running.is_empty() {
        while next < n && running.len() < k {
            let job = each(next);
            running.spawn(async move { (next, job.await) });
            next += 1;
        }
        match running.join_next().await {
            Some(Ok(output)) => done.push(output),
            Some(Err(e)) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Some(Err(e)) => panic!("a lifecycle was cancelled: {e}"),
            None => {}
        }
    }
    done.sort_by_key(|(i, _)| *i);
    done.into_iter().map(|(_, output)| output).collect()
}

/// One lifecycle of container `name` in `pod`.
async fn lifecycle(
    cri: &Cri,
    tasks: &Native,
    pod: &Pod,
    n: usize,
    name: &str,
) -> Result<Lifecycle, Failure> {
    let create = SystemTime::now();
    let spec = ContainerSpec {
        command: vec!["sleep".into(), "1000".into()],
        ..ContainerSpec::sleeper(name)
    };
    let id = cri
        .create_container(pod, &spec)
        .await
        .map_err(|e| Failure {
            n,
            container_id: None,
            error: format!("{e:#}"),
        })?;
    let steps = async {
        cri.start_container(&id).await?;
        let started = SystemTime::now();
        let (running, _) = poll_until(cri, &id, ContainerState::ContainerRunning).await?;
        let pid = tasks.init_pid(&id).await?;
        let killed = SystemTime::now();
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), Signal::SIGKILL)
            .with_context(|| format!("kill -9 {pid}, init of {id}"))?;
        let (exited, status) = poll_until(cri, &id, ContainerState::ContainerExited).await?;
        cri.remove_container(&id).await?;
        anyhow::Ok(Lifecycle {
            n,
            pod: pod.name.clone(),
            container_id: id.clone(),
            create,
            started,
            running,
            killed,
            exited,
            exit_code: status.exit_code,
            removed: SystemTime::now(),
        })
    };
    steps.await.map_err(|e| Failure {
        n,
        container_id: Some(id.clone()),
        error: format!("{e:#}"),
    })
}

/// Asks `ContainerStatus` every [`POLL`] until the container is in `state`, at most [`STEP`];
/// when the answer that showed it came, and that status.
async fn poll_until(
    cri: &Cri,
    id: &str,
    state: ContainerState,
) -> anyhow::Result<(SystemTime, ContainerStatus)> {
    let deadline = Instant::now() + STEP;
    loop {
        let status = cri.container_status(id).await?;
        if status.state == state as i32 {
            return Ok((SystemTime::now(), status));
        }
        if Instant::now() > deadline {
            anyhow::bail!(
                "container {id} not {state:?} within {STEP:?} (state {})",
                status.state
            );
        }
        tokio::time::sleep(POLL).await;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    };

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn at_most_k_run_at_once_and_each_runs_once() {
        let (now, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let outputs = in_flight(10, 3, |i| {
            let (now, most) = (now.clone(), most.clone());
            async move {
                let running = now.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(running, Ordering::SeqCst);
                // Later ones end first: outputs still come in index order.
                tokio::time::sleep(Duration::from_millis(100 - 10 * i as u64)).await;
                now.fetch_sub(1, Ordering::SeqCst);
                i * 2
            }
        })
        .await;
        assert_eq!(outputs, (0..10).map(|i| i * 2).collect::<Vec<_>>());
        assert_eq!(most.load(Ordering::SeqCst), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn a_new_one_starts_as_soon_as_one_ends() {
        // One long job and many short ones with K = 2: the short ones run one after another
        // beside the long one, not in rounds of two.
        let began = tokio::time::Instant::now();
        let ends = in_flight(5, 2, |i| async move {
            let length = if i == 0 { 1000 } else { 100 };
            tokio::time::sleep(Duration::from_millis(length)).await;
            began.elapsed().as_millis()
        })
        .await;
        assert_eq!(ends, [1000, 100, 200, 300, 400]);
    }

    #[tokio::test]
    async fn none_asked_none_run() {
        let outputs: Vec<()> = in_flight(0, 4, |_| async {}).await;
        assert!(outputs.is_empty());
    }

    #[test]
    fn throughput_is_completed_lifecycles_over_the_wall_time() {
        let at = |ms| SystemTime::UNIX_EPOCH + Duration::from_millis(ms);
        let lifecycle = |n, from, to| Lifecycle {
            n,
            pod: "p".into(),
            container_id: format!("c{n}"),
            create: at(from),
            started: at(from + 1),
            running: at(from + 2),
            killed: at(from + 3),
            exited: at(from + 4),
            exit_code: 137,
            removed: at(to),
        };
        let run = Run {
            lifecycles: vec![lifecycle(0, 10, 500), lifecycle(1, 20, 900)],
            failed: vec![Failure {
                n: 2,
                container_id: None,
                error: "boom".into(),
            }],
            wall: Duration::from_millis(1000),
        };
        assert_eq!(run.per_second(), 2.0);
        assert_eq!(run.first_create(), Some(at(10)));
        assert_eq!(run.last_removal(), Some(at(900)));
    }
}
