//! The reading of a relist: the runtime calls alone, with nothing of the relister but what it
//! planned ([`ReadJob`]), so reads of different targets run side by side while the relister
//! goes on deciding (the generator polls them; `Relister::finish` takes what they read).

use std::{
    collections::{BTreeMap, HashSet},
    sync::Arc,
    time::{Duration, SystemTime},
};

use futures::{StreamExt as _, stream};
use tokio::time::Instant;
use tracing::{debug, trace};

use crate::pleg::{
    decide::{
        hints::Hints,
        reconcile::{Covers, PodReading, Reading, TaskAsk, ToRead, tasks_to_read},
    },
    model::{
        record::{ContainerId, PodRecord, PodUid, TaskRecords},
        runtime::{ContainerRead, Runtime, RuntimeError},
        trigger::Scope,
    },
};

/// How long an exit a kernel hint saw is waited for from the task service: it answers as the
/// shim reaps the init (a few ms after the kernel saw the exit, tens under churn). A read runs
/// beside the others, so the wait holds up nothing but the container's next read.
pub const TASK_EXIT_WAIT: Duration = Duration::from_millis(250);

/// A read a relist planned, and what it carries to its end.
#[derive(Debug)]
pub struct ReadJob {
    /// The target the batch asked for.
    pub(super) scope: Scope,
    /// The hints the runtime's records left, which the reading answers.
    pub(super) hints: Hints,
    /// When the relist began (its records were tried).
    pub(super) started: Instant,
    /// When the runtime was first asked.
    pub(super) read_started: Instant,
    /// What the relist did before reading (events the records answered, settling).
    pub(super) outcome: super::RelistOutcome,
    pub(super) step: Step,
    /// How long a task status is waited for.
    pub(super) task_deadline: Duration,
    /// Pod inspections in flight at once.
    pub(super) concurrency: usize,
}

/// What a read asks the runtime.
#[derive(Debug)]
pub(super) enum Step {
    /// The node's listing (a full relist's first step).
    List,
    /// The pods the listing showed moved on, each inspected, and the task statuses the hints
    /// ask for: the node's reading.
    Inspect {
        pods: Vec<(PodUid, PodReading)>,
        /// Where in `pods` each pod to inspect is, with its committed record and its listing.
        to_inspect: Vec<(usize, Option<Arc<PodRecord>>, PodRecord)>,
        tasks: Vec<(ContainerId, TaskAsk)>,
        read_at: SystemTime,
    },
    /// A committed pod: what of it.
    Pod {
        uid: PodUid,
        committed: Option<Arc<PodRecord>>,
        what: ToRead,
        tasks: Vec<(ContainerId, TaskAsk)>,
    },
    /// A container not committed yet; the task statuses its state then asks for, but
    /// `busy`'s.
    Container {
        id: ContainerId,
        busy: HashSet<(ContainerId, TaskAsk)>,
    },
}

/// What a read found.
#[derive(Debug)]
pub enum Found {
    /// The node's listing.
    Listed(Vec<PodRecord>),
    /// A reading, and the containers whose task status missed its deadline.
    Read {
        reading: Reading,
        busy: Vec<(ContainerId, TaskAsk)>,
    },
}

/// A read done: the job back, with what it found.
#[derive(Debug)]
pub struct ReadDone {
    pub job: ReadJob,
    pub found: Result<Found, RuntimeError>,
}

impl ReadJob {
    /// When its relist began.
    pub fn started(&self) -> Instant {
        self.started
    }

    /// Reads the runtime as planned.
    pub async fn run<R: Runtime>(mut self, runtime: Arc<R>) -> ReadDone {
        let step = std::mem::replace(&mut self.step, Step::List);
        let found = self.read(&*runtime, step).await;
        ReadDone { job: self, found }
    }

    async fn read<R: Runtime>(&mut self, runtime: &R, step: Step) -> Result<Found, RuntimeError> {
        let deadline = self.task_deadline;
        match step {
            Step::List => Ok(Found::Listed(runtime.list_pods(&Scope::Node).await?)),
            Step::Inspect {
                mut pods,
                to_inspect,
                tasks,
                read_at,
            } => {
                let inspections = stream::iter(to_inspect)
                    .map(|(at, known, listed)| async move {
                        let read = runtime.inspect_listed(listed, known.as_deref()).await;
                        (at, inspection(read))
                    })
                    .buffer_unordered(self.concurrency.max(1))
                    .collect::<Vec<_>>();
                let (inspected, (tasks, busy)) =
                    futures::join!(inspections, read_tasks(runtime, tasks, deadline));
                for (at, reading) in inspected {
                    pods[at].1 = reading;
                }
                let reading = Reading {
                    covers: Covers::Node,
                    pods,
                    tasks,
                    read_at,
                };
                Ok(Found::Read { reading, busy })
            }
            Step::Pod {
                uid,
                committed,
                what,
                tasks,
            } => Ok(read_pod(runtime, uid, committed.as_deref(), what, tasks, deadline).await),
            Step::Container { id, busy } => {
                // Not committed: its pod is the one its record names.
                let reads = runtime
                    .read_containers(std::slice::from_ref(&id), None)
                    .await?;
                let pods = by_pod(reads, None);
                // Its kernel hints' task statuses are asked by what the reading shows (an
                // exec while CRI still says created).
                let state = |id: &ContainerId| {
                    pods.iter().find_map(|(_, pod)| match pod {
                        PodReading::Containers { pod, .. } => {
                            pod.containers.get(id).map(|c| c.state)
                        }
                        _ => None,
                    })
                };
                let mut to_read = tasks_to_read(&self.hints, state);
                to_read.retain(|ask| !busy.contains(ask));
                let (tasks, busy) = read_tasks(runtime, to_read, deadline).await;
                let reading = reading(Covers::Containers(vec![id]), pods, tasks);
                Ok(Found::Read { reading, busy })
            }
        }
    }
}

/// A committed pod's reading: `what` of it; a failure is the pod's, read again.
async fn read_pod<R: Runtime>(
    runtime: &R,
    uid: PodUid,
    committed: Option<&PodRecord>,
    what: ToRead,
    tasks: Vec<(ContainerId, TaskAsk)>,
    deadline: Duration,
) -> Found {
    let ((tasks, busy), covers, pods) = match what {
        ToRead::Pod => {
            let (tasks, read) = futures::join!(
                read_tasks(runtime, tasks, deadline),
                runtime.inspect_pod(&uid, committed)
            );
            (
                tasks,
                Covers::Pod(uid.clone()),
                vec![(uid, inspection(read))],
            )
        }
        ToRead::Containers(ids) if ids.is_empty() => (
            read_tasks(runtime, tasks, deadline).await,
            Covers::Containers(ids),
            Vec::new(),
        ),
        ToRead::Containers(ids) => {
            let (tasks, read) = futures::join!(
                read_tasks(runtime, tasks, deadline),
                runtime.read_containers(&ids, committed)
            );
            let pods = match read {
                Ok(reads) => by_pod(reads, committed),
                Err(error) => {
                    debug!(%error, "reading containers failed");
                    vec![(uid, PodReading::Failed)]
                }
            };
            (tasks, Covers::Containers(ids), pods)
        }
    };
    Found::Read {
        reading: reading(covers, pods, tasks),
        busy,
    }
}

fn reading(covers: Covers, pods: Vec<(PodUid, PodReading)>, tasks: TaskRecords) -> Reading {
    Reading {
        covers,
        pods,
        tasks,
        read_at: SystemTime::now(),
    }
}

/// What the task service says of `asks`' inits: a start's status within `deadline`, an exit
/// waited for up to [`TASK_EXIT_WAIT`]; and the asks whose answer missed its deadline. All
/// at once: under churn a read carries kernel hints of many containers, and one busy shim after
/// another would each cost the whole deadline.
async fn read_tasks<R: Runtime>(
    runtime: &R,
    asks: Vec<(ContainerId, TaskAsk)>,
    deadline: Duration,
) -> (TaskRecords, Vec<(ContainerId, TaskAsk)>) {
    let read = asks.into_iter().map(|(id, ask)| async move {
        let asked = Instant::now();
        let record = match ask {
            TaskAsk::Start => tokio::time::timeout(deadline, runtime.task_record(&id)).await,
            TaskAsk::Exit => tokio::time::timeout(TASK_EXIT_WAIT, runtime.task_exit(&id)).await,
        };
        trace!(container = %id, ?ask, answered_in = ?asked.elapsed(), "task asked");
        (id, ask, record)
    });
    let (mut tasks, mut busy) = (TaskRecords::new(), Vec::new());
    for (id, ask, record) in futures::future::join_all(read).await {
        match record {
            Ok(Ok(Some(record))) => {
                tasks.insert(id, record);
            }
            Ok(Ok(None)) => {}
            Ok(Err(error)) => debug!(container = %id, %error, "task status unavailable"),
            Err(_) => {
                debug!(container = %id, ?ask, "task status busy; the CRI store will tell");
                busy.push((id, ask));
            }
        }
    }
    (tasks, busy)
}

/// A pod's inspection as a reading.
fn inspection(result: Result<Option<PodRecord>, RuntimeError>) -> PodReading {
    match result {
        Ok(Some(record)) => PodReading::Inspected(record),
        // Removed between the trigger (or the list) and the inspection.
        Ok(None) => PodReading::Gone,
        Err(error) => {
            debug!(%error, "inspection failed");
            PodReading::Failed
        }
    }
}

/// Containers read by id as pod readings, ascending: each found one in its pod, those gone in
/// `home` (the pod they were committed in, if any).
fn by_pod(reads: Vec<ContainerRead>, home: Option<&PodRecord>) -> Vec<(PodUid, PodReading)> {
    let mut pods: BTreeMap<PodUid, (PodRecord, Vec<ContainerId>)> = BTreeMap::new();
    for read in reads {
        let Some(identity) = read.found.as_ref().or(home) else {
            continue;
        };
        let (pod, gone) = pods
            .entry(identity.uid.clone())
            .or_insert_with(|| (identity.identity(), Vec::new()));
        match read.found {
            Some(found) => {
                for (id, record) in found.containers.iter() {
                    pod.containers.insert(id.clone(), record.clone());
                }
            }
            None => gone.push(read.id),
        }
    }
    pods.into_iter()
        .map(|(uid, (pod, gone))| (uid, PodReading::Containers { pod, gone }))
        .collect()
}
