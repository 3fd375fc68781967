//! The OTLP export against a real OTLP/gRPC receiver ([`plegd_tests::otlp::Receiver`]:
//! OpenTelemetry's Python package of the OTLP protos served by grpcio), and the real plegd
//! binary on a real containerd.
//!
//! - Every event of a churn reaches the receiver exactly once, in one run, across a restart
//!   of the receiver (events published while it is down wait in the history) and a clean
//!   restart of plegd while it is down (SIGTERM: the next start resumes after the last
//!   acknowledged event), each record carrying the semantic-convention attributes of its
//!   container.
//! - A receiver down for longer than the history holds costs the oldest events, counted:
//!   what never arrives is exactly `plegd_otlp_dropped_total`, and the rest arrives once.
//! - A receiver that refuses every batch for good (INVALID_ARGUMENT) is sent each event once:
//!   each refused batch is dropped and counted (`plegd_otlp_refused_total`), never retried,
//!   and the export goes on with the newer events.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
    sync::{Arc, Mutex},
    time::Duration,
};

use k8s_cri::v1::ContainerState;
use nix::sys::signal::Signal;
use plegd_tests::{
    Node, bench::Plegd, cri::Cri, native::Native, otlp::Receiver, process::plegd_binary, wait,
};
use serde_json::Value;

const DEADLINE: Duration = Duration::from_secs(90);

fn sequence(record: &Value) -> u64 {
    record["attributes"]["plegd.sequence"]
        .as_u64()
        .unwrap_or_else(|| panic!("no plegd.sequence in {record}"))
}

/// The event types each container's records carry, in the order received.
fn types_by_container(records: &[Value]) -> BTreeMap<String, Vec<String>> {
    let mut types: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for record in records {
        let attributes = &record["attributes"];
        if let Some(id) = attributes["container.id"].as_str() {
            types
                .entry(id.to_owned())
                .or_default()
                .push(attributes["plegd.event.type"].as_str().unwrap().to_owned());
        }
    }
    types
}

/// A pod of `count` sleepers, each killed, then everything removed; returns the containers'
/// ids.
async fn churn(cri: &Cri, tasks: &Native, name: &str, count: usize) -> Vec<String> {
    let pod = cri.run_pod(name).await.unwrap();
    let mut ids = Vec::new();
    for i in 0..count {
        let spec = plegd_tests::cri::ContainerSpec::sleeper(&format!("{name}-{i}"));
        ids.push(cri.run_container(&pod, &spec).await.unwrap());
    }
    for id in &ids {
        wait_state(cri, id, ContainerState::ContainerRunning).await;
        tasks.kill_init(id).await.unwrap();
    }
    // Stopping a pod whose container's shim is still going away fails ("ttrpc: closed").
    for id in &ids {
        wait_state(cri, id, ContainerState::ContainerExited).await;
    }
    cri.stop_pod(&pod).await.unwrap();
    cri.remove_pod(&pod).await.unwrap();
    ids
}

async fn wait_state(cri: &Cri, id: &str, state: ContainerState) {
    cri.wait_state(id, state, DEADLINE).await.unwrap();
}

/// Waits until `receiver` holds Started, Died, Removed of each of `ids`.
async fn wait_lifecycles(receiver: &Receiver, ids: &[String]) {
    let records = Arc::clone(receiver.shared_records());
    let ids = ids.to_vec();
    wait::until("every lifecycle at the receiver", DEADLINE, || {
        let types = types_by_container(&records.lock().unwrap());
        let done = ids
            .iter()
            .all(|id| types.get(id).is_some_and(|t| t.len() >= 3));
        async move { anyhow::Ok(done.then_some(())) }
    })
    .await
    .unwrap_or_else(|e| {
        panic!(
            "{e}; received: {:#?}",
            types_by_container(&receiver.records())
        )
    });
}

async fn wait_metric(plegd: &Plegd, name: &str, at_least: f64) {
    wait::until(&format!("{name} >= {at_least}"), DEADLINE, || {
        let value = plegd.metric(name);
        async move { anyhow::Ok(value.ok().filter(|v| *v >= at_least).map(drop)) }
    })
    .await
    .unwrap();
}

fn otlp_args(port: u16, state: &Path, extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = [
        "--otlp-endpoint",
        &format!("http://127.0.0.1:{port}"),
        "--state-dir",
        &state.display().to_string(),
    ]
    .map(str::to_owned)
    .to_vec();
    args.extend(extra.iter().map(|a| (*a).to_owned()));
    args
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_event_reaches_the_receiver_once_across_its_restart_and_plegds() {
    let Node {
        containerd,
        cri,
        tasks,
    } = Node::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let records = Arc::new(Mutex::new(Vec::new()));
    let receiver = Receiver::start(0, Arc::clone(&records)).await.unwrap();
    let port = receiver.port;
    let binary = plegd_binary().unwrap();
    let args = otlp_args(port, &dir.path().join("state"), &[]);
    let mut plegd = Plegd::start(&binary, &containerd, dir.path(), &args).unwrap();

    let mut ids = churn(&cri, &tasks, "up", 3).await;
    wait_lifecycles(&receiver, &ids).await;

    // Down: what happens meanwhile waits in plegd's history, and a clean restart of plegd
    // then saves where the receiver stopped acknowledging; the next start sends the rest.
    receiver.stop().await.unwrap();
    let while_down = churn(&cri, &tasks, "down", 3).await;
    wait_metric(&plegd, "plegd_otlp_export_failures_total", 1.0).await;
    let failures = plegd.metric("plegd_otlp_export_failures_total").unwrap();
    plegd.restart(Signal::SIGTERM).unwrap();
    let receiver = Receiver::start(port, Arc::clone(&records)).await.unwrap();
    wait_lifecycles(&receiver, &while_down).await;
    ids.extend(while_down);
    ids.extend(churn(&cri, &tasks, "after", 3).await);
    wait_lifecycles(&receiver, &ids).await;

    let last = plegd.last_sequence().unwrap();
    wait::until("the receiver holds the last event", DEADLINE, || {
        let got = records.lock().unwrap().iter().any(|r| sequence(r) == last);
        async move { anyhow::Ok(got.then_some(())) }
    })
    .await
    .unwrap();
    let received = receiver.records();
    let sequences: Vec<u64> = received.iter().map(sequence).collect();
    let distinct: BTreeSet<u64> = sequences.iter().copied().collect();
    let runs: BTreeSet<&str> = received
        .iter()
        .map(|r| r["attributes"]["plegd.run_id"].as_str().unwrap())
        .collect();
    println!(
        "OTLP export across a receiver restart and, meanwhile, a plegd SIGTERM restart: {} events published \
         (sequences 1..={last}), {} records received, {} duplicated, {} dropped (metric), \
         {failures} export calls failed while the receiver was down, {} run(s)",
        last,
        sequences.len(),
        sequences.len() - distinct.len(),
        plegd.metric("plegd_otlp_dropped_total").unwrap(),
        runs.len(),
    );
    assert_eq!(
        sequences.len(),
        distinct.len(),
        "an event received twice: {sequences:?}"
    );
    assert_eq!(
        distinct,
        (1..=last).collect::<BTreeSet<_>>(),
        "not every event of the run, once"
    );
    assert_eq!(
        runs.len(),
        1,
        "the clean restart continues the run: {runs:?}"
    );
    assert_eq!(plegd.metric("plegd_otlp_dropped_total").unwrap(), 0.0);
    let types = types_by_container(&received);
    for id in &ids {
        assert_eq!(
            types[id],
            ["ContainerStarted", "ContainerDied", "ContainerRemoved"],
            "{id}"
        );
    }
    let died = received
        .iter()
        .find(|r| {
            r["attributes"]["plegd.event.type"] == "ContainerDied"
                && r["attributes"]["container.id"] == ids[0].as_str()
        })
        .unwrap();
    let attributes = &died["attributes"];
    assert_eq!(attributes["k8s.namespace.name"], "plegd-test", "{died}");
    assert_eq!(attributes["k8s.pod.name"], "up", "{died}");
    assert_eq!(attributes["k8s.container.name"], "up-0", "{died}");
    assert!(
        attributes["k8s.pod.uid"]
            .as_str()
            .is_some_and(|u| !u.is_empty()),
        "{died}"
    );
    assert!(attributes["container.image.name"].is_string(), "{died}");
    assert_eq!(attributes["plegd.exit_code"], 137, "{died}");
    assert_eq!(attributes["plegd.signal"], 9, "{died}");
    assert!(attributes["plegd.sources"].is_array(), "{died}");
    assert_eq!(died["resource"]["service.name"], "plegd", "{died}");
    assert_eq!(died["severity"], "WARN", "{died}");
    assert!(
        died["body"]
            .as_str()
            .unwrap()
            .starts_with("ContainerDied plegd-test/up up-0"),
        "{died}"
    );
    plegd.stop();
    receiver.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_down_longer_than_the_history_costs_the_oldest_events_counted() {
    // With a read-ahead of 4: the exporter holds at most 4 + 10 events for the receiver.
    const HISTORY: u64 = 10;
    const READ_AHEAD: u64 = 4;
    let Node {
        containerd,
        cri,
        tasks,
    } = Node::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let records = Arc::new(Mutex::new(Vec::new()));
    // Where it will listen, taken then given back: plegd starts with the receiver down.
    let receiver = Receiver::start(0, Arc::clone(&records)).await.unwrap();
    let port = receiver.port;
    receiver.stop().await.unwrap();
    let binary = plegd_binary().unwrap();
    let args = otlp_args(
        port,
        &dir.path().join("state"),
        &[
            "--event-history",
            &HISTORY.to_string(),
            "--event-channel-capacity",
            &READ_AHEAD.to_string(),
        ],
    );
    let plegd = Plegd::start(&binary, &containerd, dir.path(), &args).unwrap();

    // Nearly three times the history in events while the receiver is down: each container's
    // and the sandbox's start, death and removal.
    const CONTAINERS: u64 = 8;
    churn(&cri, &tasks, "lost", CONTAINERS as usize).await;
    let published = 3 * (CONTAINERS + 1);
    wait::until("the churn's every event", DEADLINE, || {
        let last = plegd.last_sequence();
        async move { anyhow::Ok(last.ok().filter(|l| *l >= published).map(drop)) }
    })
    .await
    .unwrap();
    wait_metric(&plegd, "plegd_otlp_export_failures_total", 1.0).await;
    let last = plegd.last_sequence().unwrap();
    let receiver = Receiver::start(port, Arc::clone(&records)).await.unwrap();
    wait::until("the receiver holds the last event", DEADLINE, || {
        let got = records.lock().unwrap().iter().any(|r| sequence(r) == last);
        async move { anyhow::Ok(got.then_some(())) }
    })
    .await
    .unwrap();

    let received = receiver.records();
    let sequences: Vec<u64> = received.iter().map(sequence).collect();
    let distinct: BTreeSet<u64> = sequences.iter().copied().collect();
    let missing = (1..=last).filter(|s| !distinct.contains(s)).count() as f64;
    let dropped = plegd.metric("plegd_otlp_dropped_total").unwrap();
    println!(
        "OTLP export with the receiver down for {last} events, history {HISTORY}, read-ahead \
         {READ_AHEAD}: {} received, \
         {} duplicated, {missing} never arrived, {dropped} dropped (metric)",
        sequences.len(),
        sequences.len() - distinct.len(),
    );
    assert_eq!(sequences.len(), distinct.len(), "duplicates: {sequences:?}");
    assert!(
        dropped > 0.0,
        "nothing dropped of {last} events with a history of {HISTORY}"
    );
    assert_eq!(
        missing, dropped,
        "what never arrived is what was counted: {sequences:?}"
    );
    // Only the oldest go: what the history held when the receiver came back arrives whole.
    let newest: Vec<u64> = (last - HISTORY + 1..=last).collect();
    assert!(
        newest.iter().all(|s| distinct.contains(s)),
        "the last {HISTORY} events did not all arrive: {sequences:?}"
    );
    assert_eq!(
        plegd.last_sequence().unwrap(),
        last,
        "events after the churn's"
    );
    plegd.stop();
    receiver.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_that_refuses_every_batch_is_sent_each_event_once_and_never_stalls_the_export() {
    let Node {
        containerd,
        cri,
        tasks,
    } = Node::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start_rejecting().await.unwrap();
    let binary = plegd_binary().unwrap();
    let args = otlp_args(receiver.port, &dir.path().join("state"), &[]);
    let plegd = Plegd::start(&binary, &containerd, dir.path(), &args).unwrap();

    // Two churns apart: what comes after the first refusals is sent too.
    churn(&cri, &tasks, "refused", 3).await;
    let first = plegd.last_sequence().unwrap();
    wait_metric(&plegd, "plegd_otlp_refused_total", first as f64).await;
    churn(&cri, &tasks, "newer", 3).await;
    // Every event refused, the last one included: a late event (a removal told after the
    // churn returned) moves the last sequence on, so both are read together.
    let last = wait::until("every event refused", DEADLINE, || {
        let last = plegd.last_sequence();
        let refused = plegd.metric("plegd_otlp_refused_total");
        async move {
            let last = last?;
            anyhow::Ok((last >= first && refused? == last as f64).then_some(last))
        }
    })
    .await
    .unwrap();

    let calls = receiver.records();
    let sent: u64 = calls.iter().filter_map(|c| c["rejected"].as_u64()).sum();
    let refused = plegd.metric("plegd_otlp_refused_total").unwrap();
    let failures = plegd.metric("plegd_otlp_export_failures_total").unwrap();
    println!(
        "OTLP export to a receiver refusing every batch: {last} events, {} export calls \
         carrying {sent} records, {refused} refused (metric), {failures} failed calls retried",
        calls.len(),
    );
    assert_eq!(sent, last, "each event sent once, none retried: {calls:?}");
    assert_eq!(refused, last as f64);
    assert_eq!(failures, 0.0, "a refusal is no failure to retry");
    assert_eq!(plegd.metric("plegd_otlp_exported_total").unwrap(), 0.0);
    plegd.stop();
    receiver.stop().await.unwrap();
}
