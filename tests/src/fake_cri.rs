//! A scripted CRI runtime on a unix socket, for what the real one never does: event streams
//! that break on cue, listings with unlabelled containers, unknown states or a response larger
//! than gRPC's default 4 MiB limit. It implements `Version`, `GetContainerEvents` (one script
//! per call), the listings and the status calls (answered from the listing); every other call
//! is unimplemented.

use std::{
    collections::VecDeque,
    path::{Path, PathBuf},
    pin::Pin,
    sync::{Arc, Mutex},
};

use k8s_cri::v1::{
    Container, ContainerEventResponse, ContainerStatus, PodSandbox, PodSandboxStatus,
    runtime_service_server::{RuntimeService, RuntimeServiceServer},
};
use tokio::sync::{Semaphore, oneshot};
use tonic::{Request, Response, Status, codegen::tokio_stream};

/// What one `GetContainerEvents` call streams.
pub struct Script {
    pub events: Vec<ContainerEventResponse>,
    /// `Some`: the stream then breaks with this status; `None`: it stays open.
    pub then_break: Option<Status>,
}

/// What `ListPodSandbox` and `ListContainers` answer (unfiltered: plegd's full relist asks for
/// everything, and a targeted one finds its pod among everything).
#[derive(Clone, Debug, Default)]
pub struct Listing {
    pub sandboxes: Vec<PodSandbox>,
    pub containers: Vec<Container>,
}

/// The fake runtime's script and what it counted.
pub struct FakeCri {
    scripts: Mutex<VecDeque<Script>>,
    listing: Mutex<Listing>,
    versions: Mutex<u32>,
    streams: Mutex<u32>,
    /// Calls of `Version` or `GetContainerEvents` after their first wait for a permit, so a
    /// test can look at a source between two connections.
    gate: Arc<Semaphore>,
}

impl FakeCri {
    /// A runtime that streams `scripts` and lists nothing; calls after the first of each kind
    /// wait for `gate`.
    pub fn new(scripts: Vec<Script>, gate: Arc<Semaphore>) -> Self {
        Self {
            scripts: Mutex::new(scripts.into()),
            listing: Mutex::new(Listing::default()),
            versions: Mutex::new(0),
            streams: Mutex::new(0),
            gate,
        }
    }

    /// A runtime whose listings answer `listing`, with no event stream and no gate.
    pub fn listing(listing: Listing) -> Self {
        let fake = Self::new(Vec::new(), Arc::new(Semaphore::new(Semaphore::MAX_PERMITS)));
        fake.set_listing(listing);
        fake
    }

    /// What the listings answer from now on.
    pub fn set_listing(&self, listing: Listing) {
        *self.listing.lock().expect("listing lock") = listing;
    }

    fn listed(&self) -> Listing {
        self.listing.lock().expect("listing lock").clone()
    }

    /// Counts a call in `counter`; calls after the first wait for the gate.
    async fn pass_gate(&self, counter: &Mutex<u32>) {
        let call = {
            let mut calls = counter.lock().expect("counter lock");
            *calls += 1;
            *calls
        };
        if call > 1 {
            let _permit = self.gate.acquire().await;
        }
    }
}

/// Serves `fake` on `dir`/cri.sock until the returned sender is dropped or sent to.
pub fn serve(dir: &Path, fake: Arc<FakeCri>) -> std::io::Result<(PathBuf, oneshot::Sender<()>)> {
    let socket = dir.join("cri.sock");
    let listener = tokio::net::UnixListener::bind(&socket)?;
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(
                RuntimeServiceServer::from_arc(fake)
                    // Lets a test send more than what plegd accepts.
                    .max_encoding_message_size(usize::MAX),
            )
            .serve_with_incoming_shutdown(
                tokio_stream::wrappers::UnixListenerStream::new(listener),
                async {
                    let _ = stopped.await;
                },
            ),
    );
    Ok((socket, stop))
}

type EventStream =
    Pin<Box<dyn tokio_stream::Stream<Item = Result<ContainerEventResponse, Status>> + Send>>;

/// `impl RuntimeService for $ty` with the given items, and every other call unimplemented.
/// (`async_trait` must see the methods expanded, so the whole impl comes out of the macro.)
macro_rules! runtime_service {
    ($ty:ty { $($custom:item)* } unimplemented { $($name:ident: $req:ident -> $resp:ident),* $(,)? }) => {
        #[tonic::async_trait]
        impl RuntimeService for $ty {
            $($custom)*
            $(
                async fn $name(
                    &self,
                    _: Request<k8s_cri::v1::$req>,
                ) -> Result<Response<k8s_cri::v1::$resp>, Status> {
                    Err(Status::unimplemented(stringify!($name)))
                }
            )*
        }
    };
}

runtime_service! {
FakeCri {
    type GetContainerEventsStream = EventStream;

    async fn version(
        &self,
        _: Request<k8s_cri::v1::VersionRequest>,
    ) -> Result<Response<k8s_cri::v1::VersionResponse>, Status> {
        self.pass_gate(&self.versions).await;
        Ok(Response::new(k8s_cri::v1::VersionResponse {
            version: "0.1.0".into(),
            runtime_name: "scripted".into(),
            runtime_version: "1".into(),
            runtime_api_version: "v1".into(),
        }))
    }

    async fn get_container_events(
        &self,
        _: Request<k8s_cri::v1::GetEventsRequest>,
    ) -> Result<Response<EventStream>, Status> {
        self.pass_gate(&self.streams).await;
        let script = self
            .scripts
            .lock()
            .expect("scripts lock")
            .pop_front()
            .ok_or_else(|| Status::unavailable("no more scripts"))?;
        let items = script.events.into_iter().map(Ok);
        let stream: EventStream = match script.then_break {
            Some(status) => Box::pin(tokio_stream::iter(items.chain([Err(status)]))),
            None => Box::pin(tokio_stream::StreamExt::chain(
                tokio_stream::iter(items),
                tokio_stream::pending(),
            )),
        };
        Ok(Response::new(stream))
    }

    async fn list_pod_sandbox(
        &self,
        _: Request<k8s_cri::v1::ListPodSandboxRequest>,
    ) -> Result<Response<k8s_cri::v1::ListPodSandboxResponse>, Status> {
        Ok(Response::new(k8s_cri::v1::ListPodSandboxResponse {
            items: self.listed().sandboxes,
        }))
    }

    async fn list_containers(
        &self,
        _: Request<k8s_cri::v1::ListContainersRequest>,
    ) -> Result<Response<k8s_cri::v1::ListContainersResponse>, Status> {
        Ok(Response::new(k8s_cri::v1::ListContainersResponse {
            containers: self.listed().containers,
        }))
    }

    async fn pod_sandbox_status(
        &self,
        request: Request<k8s_cri::v1::PodSandboxStatusRequest>,
    ) -> Result<Response<k8s_cri::v1::PodSandboxStatusResponse>, Status> {
        let id = request.into_inner().pod_sandbox_id;
        let sandbox = self
            .listed()
            .sandboxes
            .into_iter()
            .find(|s| s.id == id)
            .ok_or_else(|| Status::not_found(format!("sandbox {id}")))?;
        Ok(Response::new(k8s_cri::v1::PodSandboxStatusResponse {
            status: Some(PodSandboxStatus {
                id: sandbox.id,
                metadata: sandbox.metadata,
                state: sandbox.state,
                created_at: sandbox.created_at,
                labels: sandbox.labels,
                annotations: sandbox.annotations,
                ..PodSandboxStatus::default()
            }),
            ..Default::default()
        }))
    }

    async fn container_status(
        &self,
        request: Request<k8s_cri::v1::ContainerStatusRequest>,
    ) -> Result<Response<k8s_cri::v1::ContainerStatusResponse>, Status> {
        let id = request.into_inner().container_id;
        let container = self
            .listed()
            .containers
            .into_iter()
            .find(|c| c.id == id)
            .ok_or_else(|| Status::not_found(format!("container {id}")))?;
        Ok(Response::new(k8s_cri::v1::ContainerStatusResponse {
            status: Some(ContainerStatus {
                id: container.id,
                metadata: container.metadata,
                state: container.state,
                created_at: container.created_at,
                labels: container.labels,
                annotations: container.annotations,
                ..ContainerStatus::default()
            }),
            ..Default::default()
        }))
    }
}
unimplemented {
        run_pod_sandbox: RunPodSandboxRequest -> RunPodSandboxResponse,
        stop_pod_sandbox: StopPodSandboxRequest -> StopPodSandboxResponse,
        remove_pod_sandbox: RemovePodSandboxRequest -> RemovePodSandboxResponse,
        create_container: CreateContainerRequest -> CreateContainerResponse,
        start_container: StartContainerRequest -> StartContainerResponse,
        stop_container: StopContainerRequest -> StopContainerResponse,
        remove_container: RemoveContainerRequest -> RemoveContainerResponse,
        update_container_resources: UpdateContainerResourcesRequest -> UpdateContainerResourcesResponse,
        reopen_container_log: ReopenContainerLogRequest -> ReopenContainerLogResponse,
        exec_sync: ExecSyncRequest -> ExecSyncResponse,
        exec: ExecRequest -> ExecResponse,
        attach: AttachRequest -> AttachResponse,
        port_forward: PortForwardRequest -> PortForwardResponse,
        container_stats: ContainerStatsRequest -> ContainerStatsResponse,
        list_container_stats: ListContainerStatsRequest -> ListContainerStatsResponse,
        pod_sandbox_stats: PodSandboxStatsRequest -> PodSandboxStatsResponse,
        list_pod_sandbox_stats: ListPodSandboxStatsRequest -> ListPodSandboxStatsResponse,
        update_runtime_config: UpdateRuntimeConfigRequest -> UpdateRuntimeConfigResponse,
        status: StatusRequest -> StatusResponse,
        checkpoint_container: CheckpointContainerRequest -> CheckpointContainerResponse,
        list_metric_descriptors: ListMetricDescriptorsRequest -> ListMetricDescriptorsResponse,
        list_pod_sandbox_metrics: ListPodSandboxMetricsRequest -> ListPodSandboxMetricsResponse,
        runtime_config: RuntimeConfigRequest -> RuntimeConfigResponse,
}
}
