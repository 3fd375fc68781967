//! The `plegd.v1.Pleg` service: thin tonic handlers over plain functions, each error variant
//! mapped to its own status code.

use std::{pin::Pin, sync::Arc, task::Poll, time::Duration};

use futures::{Stream, StreamExt as _};
use plegd_proto::v1::{self as pb, pleg_server::Pleg};
use tokio::sync::broadcast;
use tokio_stream::wrappers::BroadcastStream;
use tonic::{Request, Response, Status};

use crate::{
    api::{
        Shared,
        admission::{Refusal, connection_of},
        convert,
    },
    base::bus::{Ended, SubscribeError, Subscription},
    pleg::{Notice, PodLifecycleEvent, PodSync, PodUid, SyncReason, SyncSubscription},
};

/// A `Watch` that cannot start.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum WatchError {
    #[error("unknown event type {0}")]
    UnknownType(i32),
    #[error("types has {given} entries; there are {} event types", EVENT_TYPES.len())]
    TooManyTypes { given: usize },
    #[error(
        "run {requested} is over (plegd restarted; current run: {current}); list the pods and watch anew"
    )]
    OtherRun { requested: u64, current: u64 },
    #[error(transparent)]
    Subscribe(#[from] SubscribeError),
}

/// A `GetPodStatus` without an answer.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum PodStatusError {
    #[error("pod_uid is empty")]
    EmptyUid,
    #[error("no pod with uid {0} in the cache")]
    NotFound(String),
}

/// Which pods a watcher wants: the filters `Watch` and `SyncPods` share (empty: any).
#[derive(Clone, Debug, Default)]
pub struct PodSelector {
    namespace: String,
    name: String,
    uid: String,
}

impl PodSelector {
    pub fn matches(&self, namespace: &str, name: &str, uid: &str) -> bool {
        (self.namespace.is_empty() || self.namespace == namespace)
            && (self.name.is_empty() || self.name == name)
            && (self.uid.is_empty() || self.uid == uid)
    }
}

/// Every event type a watcher may ask for: `WatchRequest.types` has at most one entry each.
pub const EVENT_TYPES: [pb::EventType; 7] = [
    pb::EventType::ContainerStarted,
    pb::EventType::ContainerDied,
    pb::EventType::ContainerRemoved,
    pb::EventType::ContainerChanged,
    pb::EventType::PodSync,
    pb::EventType::KernelObservation,
    pb::EventType::ObservationUnconfirmed,
];

/// Which events a watcher wants.
#[derive(Clone, Debug, Default)]
pub struct Filter {
    pods: PodSelector,
    /// Sorted, each once.
    types: Vec<i32>,
    observations: bool,
}

impl Filter {
    pub fn from_request(request: &pb::WatchRequest) -> Result<Self, WatchError> {
        if request.types.len() > EVENT_TYPES.len() {
            return Err(WatchError::TooManyTypes {
                given: request.types.len(),
            });
        }
        if let Some(bad) = request.types.iter().find(|t| {
            matches!(
                pb::EventType::try_from(**t),
                Err(_) | Ok(pb::EventType::Unspecified)
            )
        }) {
            return Err(WatchError::UnknownType(*bad));
        }
        let mut types = request.types.clone();
        types.sort_unstable();
        types.dedup();
        Ok(Self {
            pods: PodSelector {
                namespace: request.pod_namespace.clone(),
                name: request.pod_name.clone(),
                uid: request.pod_uid.clone(),
            },
            types,
            observations: request.include_observations,
        })
    }

    /// The event as this watcher gets it (of run `run_id`), or `None` when filtered out.
    pub fn event(&self, event: &PodLifecycleEvent, run_id: u64) -> Option<pb::Event> {
        let kind = convert::event_type(event.event_type);
        self.wants(&event.pod_namespace, &event.pod_name, &event.pod, kind)
            .then(|| self.served(convert::event(event, run_id)))
    }

    /// The notice as this watcher gets it, or `None` when filtered out.
    pub fn notice(&self, notice: &Notice, run_id: u64) -> Option<pb::Event> {
        let message = convert::notice(notice, run_id);
        self.wants(
            &notice.pod_namespace,
            &notice.pod_name,
            &notice.pod,
            message.r#type(),
        )
        .then(|| self.served(message))
    }

    fn wants(&self, namespace: &str, name: &str, uid: &PodUid, kind: pb::EventType) -> bool {
        self.pods.matches(namespace, name, &uid.0)
            && (self.types.is_empty() || self.types.contains(&(kind as i32)))
    }

    fn served(&self, mut event: pb::Event) -> pb::Event {
        if !self.observations {
            event.observations.clear();
        }
        event
    }
}

/// Starts a watch: checks the run and the filters, then subscribes.
pub fn watch(
    shared: &Shared,
    request: &pb::WatchRequest,
) -> Result<(Subscription<PodLifecycleEvent>, Filter), WatchError> {
    let filter = Filter::from_request(request)?;
    let current = shared.pleg.events().run_id();
    if request.run_id != 0 && request.run_id != current {
        return Err(WatchError::OtherRun {
            requested: request.run_id,
            current,
        });
    }
    Ok((
        shared.pleg.events().subscribe(request.from_sequence)?,
        filter,
    ))
}

/// Starts a sync stream: subscribes to the sync loop's feed with the request's filters,
/// then, with `initial`, queues a sync of every cached pod they keep (subscribed first: a
/// sync the loop sends meanwhile coalesces with it, none is missed).
pub fn sync_pods(shared: &Shared, request: &pb::SyncPodsRequest) -> SyncSubscription {
    let pods = PodSelector {
        namespace: request.pod_namespace.clone(),
        name: request.pod_name.clone(),
        uid: request.pod_uid.clone(),
    };
    let subscription = shared.pleg.syncs().subscribe(Box::new(move |sync| {
        pods.matches(&sync.namespace, &sync.name, &sync.pod.0)
    }));
    if request.initial {
        // The pods with the stream position they reflect, as ListPods reads them.
        let _listing = shared.pleg.cache().listing();
        let sequence = shared.pleg.events().last_sequence();
        for (pod, status) in shared.pleg.cache().pods() {
            let Some(record) = &status.record else {
                continue;
            };
            subscription.offer(PodSync {
                pod,
                namespace: record.namespace.clone(),
                name: record.name.clone(),
                reason: SyncReason::Resync,
                status,
                sequence,
            });
        }
    }
    subscription
}

/// The syncs of a subscription as a response stream, ending with UNAVAILABLE at shutdown.
fn sync_stream(
    subscription: SyncSubscription,
    run_id: u64,
) -> impl Stream<Item = Result<pb::PodSync, Status>> + Send + 'static {
    futures::stream::unfold(Some(subscription), move |state| async move {
        let mut subscription = state?;
        Some(match subscription.next().await {
            Some(sync) => (Ok(convert::pod_sync(&sync, run_id)), Some(subscription)),
            None => (
                Err(Status::unavailable(
                    "plegd is shutting down; call SyncPods again",
                )),
                None,
            ),
        })
    })
}

/// One pod's cached status.
pub fn pod_status(shared: &Shared, uid: &str) -> Result<pb::PodStatus, PodStatusError> {
    if uid.is_empty() {
        return Err(PodStatusError::EmptyUid);
    }
    convert::pod_status(&shared.pleg.cache().get(&PodUid(uid.to_owned())))
        .ok_or_else(|| PodStatusError::NotFound(uid.to_owned()))
}

/// How long `ListPods` waits for a run's first full relist before it answers UNAVAILABLE.
const FIRST_RELIST_WAIT: Duration = Duration::from_secs(10);

/// A `ListPods` without an answer yet.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum ListPodsError {
    #[error("no full relist has finished yet in this run (waited {0:?}); retry")]
    NotReadYet(Duration),
}

/// Every cached pod, with the stream position they go with, once a full relist has read them
/// all: before it (a start, a restart), a watcher that resyncs on the listing would take every
/// pod not read yet for gone, and the first relist's events (a `ContainerDied` with no
/// `ContainerStarted` for a container that died meanwhile) would not add up with it.
pub async fn list_pods(shared: &Shared) -> Result<pb::ListPodsResponse, ListPodsError> {
    tokio::time::timeout(
        FIRST_RELIST_WAIT,
        shared.pleg.cache().await_first_full_relist(),
    )
    .await
    .map_err(|_| ListPodsError::NotReadYet(FIRST_RELIST_WAIT))?;
    // No relist step between the position and the pods: the events after the position are
    // exactly what the listing does not show yet.
    let _listing = shared.pleg.cache().listing();
    Ok(pb::ListPodsResponse {
        sequence: shared.pleg.events().last_sequence(),
        pods: convert::pods(shared.pleg.cache()),
        run_id: shared.pleg.events().run_id(),
    })
}

/// Health and sources.
pub fn health(shared: &Shared) -> pb::Health {
    convert::health(
        shared.pleg.healthy(),
        &shared.sources.snapshot(),
        shared.pleg.events().run_id(),
        shared.pleg.events().last_sequence(),
    )
}

fn watch_status(error: WatchError) -> Status {
    match error {
        WatchError::UnknownType(_) | WatchError::TooManyTypes { .. } => {
            Status::invalid_argument(error.to_string())
        }
        WatchError::OtherRun { .. } | WatchError::Subscribe(_) => {
            Status::out_of_range(error.to_string())
        }
    }
}

fn pod_status_status(error: PodStatusError) -> Status {
    match error {
        PodStatusError::EmptyUid => Status::invalid_argument(error.to_string()),
        PodStatusError::NotFound(_) => Status::not_found(error.to_string()),
    }
}

/// How a stream that ends reports it; `resume` is the sequence to resume from.
fn ended_status(ended: &Ended, resume: u64) -> Status {
    match ended {
        Ended::Lagged { .. } => {
            Status::resource_exhausted(format!("{ended}; resume with from_sequence={resume}"))
        }
        Ended::Closed => Status::unavailable(format!(
            "plegd is shutting down; resume with from_sequence={resume}"
        )),
    }
}

/// The events of a subscription (of run `run_id`) as a response stream, ending with a status;
/// with `notices`, the kernel's notices too, as they come, until the events end.
fn event_stream(
    subscription: Subscription<PodLifecycleEvent>,
    filter: Filter,
    run_id: u64,
    notices: Option<broadcast::Receiver<Arc<Notice>>>,
) -> Pin<Box<dyn Stream<Item = Result<pb::Event, Status>> + Send + 'static>> {
    let events = pleg_events(subscription, filter.clone(), run_id);
    let Some(notices) = notices else {
        return Box::pin(events);
    };
    // A watcher that fell behind skips the notices it missed: a preview only, unlike the
    // events that confirm them.
    let noticed = BroadcastStream::new(notices).filter_map(move |notice| {
        std::future::ready(
            notice
                .ok()
                .and_then(|notice| filter.notice(&notice, run_id))
                .map(|event| Some(Ok(event))),
        )
    });
    // `None` marks the end of the events, which ends the whole stream.
    let events = events
        .map(Some)
        .chain(futures::stream::once(async { None }));
    Box::pin(
        earliest_first(noticed, events)
            .take_while(|item| std::future::ready(item.is_some()))
            .filter_map(std::future::ready),
    )
}

/// An item of a watch stream before its end is taken out: `None` marks the end of the events.
type Streamed = Option<Result<pb::Event, Status>>;

/// Merges two streams of a watch, each item as soon as it is ready, but of two ready at once
/// the one emitted first (an error or the end before either). A kernel's notice is told before
/// the trigger it rides on reaches the relist, so it is ready before the event that confirms
/// it: a watcher that reads both late still gets the notice first, ahead of confirmation as
/// promised (an alternation sent the event first about half the time).
fn earliest_first(
    a: impl Stream<Item = Streamed> + Send + 'static,
    b: impl Stream<Item = Streamed> + Send + 'static,
) -> impl Stream<Item = Streamed> + Send + 'static {
    fn emitted(item: &Streamed) -> Option<(i64, i32)> {
        match item {
            Some(Ok(event)) => event.emitted_at.as_ref().map(|t| (t.seconds, t.nanos)),
            _ => None,
        }
    }
    let (mut a, mut b) = (Box::pin(a.peekable()), Box::pin(b.peekable()));
    futures::stream::poll_fn(move |cx| {
        let take_a = match (a.as_mut().poll_peek(cx), b.as_mut().poll_peek(cx)) {
            (Poll::Ready(Some(x)), Poll::Ready(Some(y))) => emitted(x) <= emitted(y),
            (Poll::Ready(Some(_)), _) => true,
            (_, Poll::Ready(Some(_))) => false,
            (Poll::Ready(None), Poll::Ready(None)) => return Poll::Ready(None),
            _ => return Poll::Pending,
        };
        if take_a {
            a.as_mut().poll_next(cx)
        } else {
            b.as_mut().poll_next(cx)
        }
    })
}

/// The PLEG events of a subscription, ending with a status that says where to resume.
fn pleg_events(
    subscription: Subscription<PodLifecycleEvent>,
    filter: Filter,
    run_id: u64,
) -> impl Stream<Item = Result<pb::Event, Status>> + Send + 'static {
    // Taken with the subscription, under the bus's lock: no event can slip in between.
    let resume = subscription.start();
    futures::stream::unfold(
        Some((subscription, filter, resume)),
        move |state| async move {
            let (mut subscription, filter, mut resume) = state?;
            loop {
                match subscription.next().await {
                    Ok(event) => {
                        resume = event.sequence + 1;
                        if let Some(event) = filter.event(&event, run_id) {
                            return Some((Ok(event), Some((subscription, filter, resume))));
                        }
                    }
                    Err(ended) => return Some((Err(ended_status(&ended, resume)), None)),
                }
            }
        },
    )
}

/// The tonic service.
#[derive(Clone, Debug)]
pub struct PlegService {
    shared: Arc<Shared>,
}

impl PlegService {
    pub fn new(shared: Shared) -> Self {
        Self {
            shared: Arc::new(shared),
        }
    }
}

type EventStream = Pin<Box<dyn Stream<Item = Result<pb::Event, Status>> + Send + 'static>>;
type SyncStream = Pin<Box<dyn Stream<Item = Result<pb::PodSync, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl Pleg for PlegService {
    type WatchStream = EventStream;
    type SyncPodsStream = SyncStream;

    async fn watch(
        &self,
        request: Request<pb::WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let connection = connection_of(request.extensions());
        let request = request.into_inner();
        let (subscription, filter) = watch(&self.shared, &request).map_err(|error| {
            if let (WatchError::TooManyTypes { .. }, Some(connection)) = (&error, &connection) {
                connection.refuse("request", Refusal::TooMany);
            }
            watch_status(error)
        })?;
        let notices = request
            .include_kernel_observations
            .then(|| self.shared.pleg.notices());
        let run_id = self.shared.pleg.events().run_id();
        Ok(Response::new(event_stream(
            subscription,
            filter,
            run_id,
            notices,
        )))
    }

    async fn list_pods(
        &self,
        _request: Request<pb::ListPodsRequest>,
    ) -> Result<Response<pb::ListPodsResponse>, Status> {
        list_pods(&self.shared)
            .await
            .map(Response::new)
            .map_err(|e| Status::unavailable(e.to_string()))
    }

    async fn get_pod_status(
        &self,
        request: Request<pb::GetPodStatusRequest>,
    ) -> Result<Response<pb::PodStatus>, Status> {
        pod_status(&self.shared, &request.get_ref().pod_uid)
            .map(Response::new)
            .map_err(pod_status_status)
    }

    async fn get_health(
        &self,
        _request: Request<pb::GetHealthRequest>,
    ) -> Result<Response<pb::Health>, Status> {
        Ok(Response::new(health(&self.shared)))
    }

    async fn sync_pods(
        &self,
        request: Request<pb::SyncPodsRequest>,
    ) -> Result<Response<Self::SyncPodsStream>, Status> {
        let subscription = sync_pods(&self.shared, request.get_ref());
        Ok(Response::new(Box::pin(sync_stream(
            subscription,
            self.shared.pleg.events().run_id(),
        ))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        base::bus::EventBus,
        pleg::{
            ContainerId, NoticeKind, Observation, ObservationKind, PodLifecycleEventType, PodUid,
            Source,
        },
    };

    fn event(sequence: u64, namespace: &str, t: PodLifecycleEventType) -> PodLifecycleEvent {
        PodLifecycleEvent {
            pod_namespace: namespace.into(),
            event_type: t,
            ..crate::runtime::testing::event(sequence, "p")
        }
    }

    fn notice(namespace: &str) -> Notice {
        Notice {
            kind: NoticeKind::Ahead,
            pod: PodUid("u".into()),
            pod_namespace: namespace.into(),
            pod_name: "p".into(),
            container_id: ContainerId("c".into()),
            container_name: "app".into(),
            observations: vec![Observation {
                source: Source::Ebpf,
                kind: ObservationKind::OomKilled,
            }],
            observed_at: std::time::SystemTime::UNIX_EPOCH,
            emitted_at: std::time::SystemTime::UNIX_EPOCH,
        }
    }

    #[test]
    fn filters_select_and_strip_observations() {
        let filter = Filter::from_request(&pb::WatchRequest {
            pod_namespace: "a".into(),
            types: vec![pb::EventType::ContainerDied as i32],
            ..pb::WatchRequest::default()
        })
        .unwrap();
        assert!(
            filter
                .event(&event(1, "b", PodLifecycleEventType::ContainerDied), 1)
                .is_none()
        );
        assert!(
            filter
                .event(&event(1, "a", PodLifecycleEventType::ContainerStarted), 1)
                .is_none()
        );
        let kept = filter
            .event(&event(1, "a", PodLifecycleEventType::ContainerDied), 7)
            .unwrap();
        assert!(kept.observations.is_empty());
        assert_eq!((kept.run_id, kept.pod_namespace.as_str()), (7, "a"));
        assert_eq!(
            Filter::from_request(&pb::WatchRequest {
                types: vec![42],
                ..pb::WatchRequest::default()
            })
            .unwrap_err(),
            WatchError::UnknownType(42)
        );
    }

    #[test]
    fn types_are_deduplicated_and_at_most_one_per_event_type() {
        let died = pb::EventType::ContainerDied as i32;
        let filter = Filter::from_request(&pb::WatchRequest {
            types: vec![died; EVENT_TYPES.len()],
            ..pb::WatchRequest::default()
        })
        .unwrap();
        assert_eq!(filter.types, [died]);
        let every: Vec<i32> = EVENT_TYPES.iter().rev().map(|t| *t as i32).collect();
        let filter = Filter::from_request(&pb::WatchRequest {
            types: every.clone(),
            ..pb::WatchRequest::default()
        })
        .unwrap();
        assert_eq!(filter.types, (1..=7).collect::<Vec<_>>());
        assert_eq!(
            Filter::from_request(&pb::WatchRequest {
                types: [every, vec![died]].concat(),
                ..pb::WatchRequest::default()
            })
            .unwrap_err(),
            WatchError::TooManyTypes { given: 8 }
        );
        // Every type the API names is here.
        let named = (1..16)
            .filter(|t| pb::EventType::try_from(*t).is_ok())
            .count();
        assert_eq!(named, EVENT_TYPES.len());
    }

    /// The largest request a watcher can mean, with every filter at the longest Kubernetes
    /// allows (a namespace is a DNS label, 63; a pod name a DNS subdomain, 253; a uid 36, or
    /// `namespace/container id` outside Kubernetes) and every event type, encodes far below
    /// the decoding limit.
    #[test]
    fn the_largest_legitimate_request_fits() {
        use prost::Message as _;
        let largest = pb::WatchRequest {
            from_sequence: u64::MAX,
            pod_namespace: "n".repeat(63),
            pod_name: "p".repeat(253),
            pod_uid: "u".repeat(253),
            types: EVENT_TYPES.iter().map(|t| *t as i32).collect(),
            include_observations: true,
            run_id: u64::MAX,
            include_kernel_observations: true,
        };
        let length = largest.encoded_len();
        assert!(length < 700, "{length}");
        assert!(length * 4 < crate::api::admission::MAX_REQUEST, "{length}");
        let sync = pb::SyncPodsRequest {
            pod_namespace: largest.pod_namespace,
            pod_name: largest.pod_name,
            pod_uid: largest.pod_uid,
            initial: true,
        };
        assert!(sync.encoded_len() < length);
    }

    #[test]
    fn errors_map_to_distinct_codes() {
        assert_eq!(
            watch_status(WatchError::UnknownType(9)).code(),
            tonic::Code::InvalidArgument
        );
        assert_eq!(
            watch_status(WatchError::TooManyTypes { given: 8 }).code(),
            tonic::Code::InvalidArgument
        );
        assert_eq!(
            watch_status(WatchError::OtherRun {
                requested: 1,
                current: 2
            })
            .code(),
            tonic::Code::OutOfRange
        );
        assert_eq!(
            watch_status(SubscribeError::TooOld { from: 1, oldest: 5 }.into()).code(),
            tonic::Code::OutOfRange
        );
        let lagged = ended_status(&Ended::Lagged { queue: 4 }, 17);
        assert_eq!(lagged.code(), tonic::Code::ResourceExhausted);
        assert!(
            lagged.message().starts_with("lagged: "),
            "{}",
            lagged.message()
        );
        assert!(lagged.message().ends_with("from_sequence=17"));
        assert_eq!(
            ended_status(&Ended::Closed, 1).code(),
            tonic::Code::Unavailable
        );
        assert_eq!(
            pod_status_status(PodStatusError::NotFound("u".into())).code(),
            tonic::Code::NotFound
        );
        assert_eq!(
            pod_status_status(PodStatusError::EmptyUid).code(),
            tonic::Code::InvalidArgument
        );
    }

    #[tokio::test]
    async fn the_stream_filters_and_ends_with_the_resume_point() {
        use futures::StreamExt as _;
        let bus = EventBus::new(1, 100, 2);
        let subscription = bus.subscribe(1).unwrap();
        let filter = Filter::from_request(&pb::WatchRequest {
            pod_namespace: "a".into(),
            ..pb::WatchRequest::default()
        })
        .unwrap();
        let mut stream = event_stream(subscription, filter, 1, None);
        bus.publish(Arc::new(event(
            1,
            "a",
            PodLifecycleEventType::ContainerStarted,
        )));
        bus.publish(Arc::new(event(
            2,
            "b",
            PodLifecycleEventType::ContainerStarted,
        )));
        assert_eq!(stream.next().await.unwrap().unwrap().sequence, 1);
        bus.close();
        let status = stream.next().await.unwrap().unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unavailable);
        assert!(
            status.message().ends_with("from_sequence=3"),
            "{}",
            status.message()
        );
        assert!(stream.next().await.is_none());
    }

    /// Kernel observations come as they are seen, filtered like events, and never move the
    /// resume point.
    #[tokio::test]
    async fn kernel_observations_join_the_stream_without_moving_the_resume_point() {
        use futures::StreamExt as _;
        let bus = EventBus::new(1, 100, 8);
        let (noticed, notices) = broadcast::channel(8);
        let filter = Filter::from_request(&pb::WatchRequest {
            pod_namespace: "a".into(),
            ..pb::WatchRequest::default()
        })
        .unwrap();
        let subscription = bus.subscribe(1).unwrap();
        let mut stream = event_stream(subscription, filter, 1, Some(notices));
        for namespace in ["b", "a"] {
            noticed.send(Arc::new(notice(namespace))).unwrap();
        }
        let first = stream.next().await.unwrap().unwrap();
        assert_eq!(
            (first.r#type, first.sequence),
            (pb::EventType::KernelObservation as i32, 0)
        );
        bus.publish(Arc::new(event(
            1,
            "a",
            PodLifecycleEventType::ContainerDied,
        )));
        assert_eq!(stream.next().await.unwrap().unwrap().sequence, 1);
        bus.close();
        let status = stream.next().await.unwrap().unwrap_err();
        assert!(
            status.message().ends_with("from_sequence=2"),
            "{}",
            status.message()
        );
    }

    /// A notice told before an event goes out before it, however late the watcher reads
    /// both, and whichever the stream gave last.
    #[tokio::test]
    async fn a_notice_told_before_an_event_is_streamed_before_it() {
        use std::time::{Duration, SystemTime};

        use futures::StreamExt as _;
        let bus = EventBus::new(1, 100, 8);
        let (noticed, notices) = broadcast::channel(8);
        let subscription = bus.subscribe(1).unwrap();
        let mut stream = event_stream(subscription, Filter::default(), 1, Some(notices));
        let at = |ms| SystemTime::UNIX_EPOCH + Duration::from_millis(ms);
        let told = |ms| Notice {
            emitted_at: at(ms),
            ..notice("a")
        };
        noticed.send(Arc::new(told(1))).unwrap();
        assert_eq!(
            stream.next().await.unwrap().unwrap().r#type,
            pb::EventType::KernelObservation as i32
        );
        // Both ready when the watcher reads again: the event published first, but told after.
        bus.publish(Arc::new(PodLifecycleEvent {
            emitted_at: at(3),
            ..event(1, "a", PodLifecycleEventType::ContainerDied)
        }));
        noticed.send(Arc::new(told(2))).unwrap();
        let order: Vec<i32> = [stream.next().await, stream.next().await]
            .into_iter()
            .map(|item| item.unwrap().unwrap().r#type)
            .collect();
        assert_eq!(
            order,
            [
                pb::EventType::KernelObservation as i32,
                pb::EventType::ContainerDied as i32
            ]
        );
    }
}
