//! `cargo xtask bench`: does a watcher that stops reading cost the others anything?
//!
//! plegd runs on the in-memory runtime (200 pods whose containers flip between running and
//! exited before every 20 ms relist: some 10,000 events a second) and serves its API on a unix
//! socket. Four watchers read everything and time each event from its emission to its arrival.
//! Side by side in one run: the four alone, then beside 50 watchers that never read (256-byte
//! HTTP/2 windows). Also reported: how many of those were ended as lagged and how much the
//! process's resident memory grew meanwhile.

use std::{
    path::Path,
    time::{Duration, Instant, SystemTime},
};

use plegd::{
    api::Listeners,
    config::{Config, RunArgs},
    daemon::{Daemon, PushSources},
    pleg::{ContainerState, Source},
    runtime::testing::{FakeRuntime, container},
};
use plegd_proto::v1::{self as pb, pleg_client::PlegClient};
use tokio_util::sync::CancellationToken;
use tonic::transport::{Channel, Endpoint};

const PODS: usize = 200;
const PERIOD: Duration = Duration::from_millis(20);
const READERS: usize = 4;
const STALLED: usize = 50;
/// Events each reader times, per scenario.
const EVENTS: usize = 20_000;

struct Report {
    delays: Vec<Duration>,
    elapsed: Duration,
    lagged: usize,
    rss_growth_kib: i64,
}

fn rss_kib() -> i64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

async fn client(socket: &Path, window: Option<u32>) -> PlegClient<Channel> {
    let endpoint = Endpoint::from_static("http://plegd.local").initial_stream_window_size(window);
    PlegClient::new(
        plegd_tests::unix_channel_with(socket, endpoint)
            .await
            .expect("API socket"),
    )
}

async fn watch(client: &mut PlegClient<Channel>) -> tonic::Streaming<pb::Event> {
    client
        .watch(pb::WatchRequest::default())
        .await
        .expect("watch")
        .into_inner()
}

async fn scenario(stalled: usize) -> Report {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut config = Config::load(&RunArgs {
        runtime_endpoint: Some("unused".into()),
        sources: Some(vec![Source::Relist]),
        relist_period: Some(PERIOD),
        state_dir: Some("none".into()),
        socket: Some(dir.path().join("plegd.sock")),
        ..RunArgs::default()
    })
    .expect("bench config");
    config.event_channel_capacity = 10_000;
    let runtime = FakeRuntime::new();
    for pod in 0..PODS {
        runtime.add_pod(&format!("p{pod}"), "bench", &format!("pod-{pod}"));
        runtime.set_container(
            &format!("p{pod}"),
            container(&format!("c{pod}"), "app", ContainerState::Running),
        );
    }
    let listeners = Listeners::bind(&config).expect("API bound");
    let shutdown = CancellationToken::new();
    let daemon = Daemon::start(
        runtime.clone(),
        PushSources::none(),
        Some(listeners),
        &config,
        tokio::io::sink(),
        (),
    )
    .expect("daemon started");
    let shared = daemon.shared();
    let daemon = tokio::spawn(daemon.run(shutdown.clone()));

    let mut held = Vec::new();
    for _ in 0..stalled {
        let mut c = client(&config.socket, Some(256)).await;
        let stream = watch(&mut c).await;
        held.push((c, stream));
    }
    let mut readers = Vec::new();
    for _ in 0..READERS {
        let mut c = client(&config.socket, None).await;
        let mut stream = watch(&mut c).await;
        readers.push(tokio::spawn(async move {
            let mut delays = Vec::with_capacity(EVENTS);
            while delays.len() < EVENTS {
                let event = stream.message().await.expect("stream alive").expect("open");
                let emitted: SystemTime = event.emitted_at.expect("emitted_at").try_into().unwrap();
                delays.push(
                    SystemTime::now()
                        .duration_since(emitted)
                        .unwrap_or_default(),
                );
            }
            // Still subscribed: the count below is of stalled watchers alone.
            (c, stream, delays)
        }));
    }
    assert_eq!(shared.pleg.events().subscriber_count(), READERS + stalled);

    let rss_before = rss_kib();
    let started = Instant::now();
    let driver = tokio::spawn({
        let runtime = runtime.clone();
        async move {
            let mut state = ContainerState::Exited;
            loop {
                for pod in 0..PODS {
                    runtime.set_state(&format!("p{pod}"), &format!("c{pod}"), state, Some(0));
                }
                state = match state {
                    ContainerState::Exited => ContainerState::Running,
                    _ => ContainerState::Exited,
                };
                tokio::time::sleep(PERIOD).await;
            }
        }
    });
    let mut delays = Vec::new();
    let mut done = Vec::new();
    for reader in readers {
        let (c, stream, d) = reader.await.expect("reader");
        delays.extend(d);
        done.push((c, stream));
    }
    let elapsed = started.elapsed();
    let rss_growth_kib = rss_kib() - rss_before;
    let lagged = READERS + stalled - shared.pleg.events().subscriber_count();
    drop(done);
    driver.abort();
    shutdown.cancel();
    drop(held);
    daemon.await.expect("daemon task").expect("daemon");
    delays.sort();
    Report {
        delays,
        elapsed,
        lagged,
        rss_growth_kib,
    }
}

fn print(name: &str, r: &Report) {
    let at = |q: f64| r.delays[((r.delays.len() - 1) as f64 * q) as usize];
    eprintln!(
        "  {name:<34} emitted->received p50 {:>8.2?} p99 {:>8.2?} max {:>8.2?}; \
         {:.0} events/s per reader; lagged {}; process RSS {:+} KiB",
        at(0.5),
        at(0.99),
        r.delays[r.delays.len() - 1],
        EVENTS as f64 / r.elapsed.as_secs_f64(),
        r.lagged,
        r.rss_growth_kib,
    );
}

#[tokio::main]
async fn main() {
    eprintln!(
        "watchers: {READERS} readers x {EVENTS} events ({PODS} pods flipping every {PERIOD:?})"
    );
    let alone = scenario(0).await;
    print("alone", &alone);
    let beside = scenario(STALLED).await;
    print(&format!("beside {STALLED} stalled watchers"), &beside);
    let p99 = |r: &Report| r.delays[(r.delays.len() - 1) * 99 / 100];
    eprintln!(
        "  p99 ratio (beside / alone): {:.2}; stalled watchers ended as lagged: {}/{STALLED}",
        p99(&beside).as_secs_f64() / p99(&alone).as_secs_f64(),
        beside.lagged,
    );
}
