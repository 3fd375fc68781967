//! The churn audit, short: container lifecycles in every mode, and under each fault, against a
//! `plegd run` process, checked by `plegd_tests::audit` from what a `plegd watch` process
//! received (see plegd_tests::soak). `cargo xtask soak` runs the long version
//! (`soak_as_configured`, ignored here) with its settings in `PLEGD_SOAK_*`.

mod support;

use std::time::Duration;

use plegd_tests::{
    Node,
    soak::{self, Fault, Mode, Plan, Runtime},
};

/// Lifecycles per short run: enough for every action in every pid-namespace mode, bursts
/// included, in well under a minute on a small node.
const SHORT: usize = 60;
/// Lifecycles in flight of the suite's busy runs: where the containerd backend lost whole
/// lifecycles (issue 52).
const BUSY: usize = 16;

/// The least the hostile soak lasts: past plegd's deadlines on a connection that never
/// finishes its TLS handshake (5 s) or never makes its first call (10 s).
const HOSTILE: Duration = Duration::from_secs(15);

/// One soak at a time: two at once on a small node measure the node's overload.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn soak_once(mode: Mode, fault: Option<Fault>, lifecycles: usize, duration: Duration) {
    soak_plan(Plan {
        mode,
        fault,
        lifecycles,
        duration,
        seed: soak::seed_from_env().unwrap(),
        abuse: false,
        in_flight: None,
        runtime: Runtime::Cri,
    })
    .await;
}

/// [`SHORT`] lifecycles in default mode, [`BUSY`] in flight from the start, plegd on `runtime`.
async fn soak_busy(runtime: Runtime) {
    soak_plan(Plan {
        mode: Mode::Default,
        fault: None,
        lifecycles: SHORT,
        duration: Duration::ZERO,
        seed: soak::seed_from_env().unwrap(),
        abuse: false,
        in_flight: Some(BUSY),
        runtime,
    })
    .await;
}

async fn soak_plan(plan: Plan) {
    let _serial = SERIAL.lock().await;
    println!("soak: {plan:?}");
    let node = Node::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let outcome = soak::run(
        &node,
        &plegd_tests::process::plegd_binary().expect("the plegd binary"),
        &soak::run_dir(dir.path(), &plan),
        &plan,
    )
    .await
    .unwrap();
    if let Err(e) = soak::conclude(&plan, &outcome) {
        panic!(
            "{e:#}; plegd's log and the audit's input are in {}",
            dir.keep().display()
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn soak_ebpf_only() {
    soak_once(Mode::Ebpf, None, SHORT, Duration::ZERO).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn soak_containerd_events_only() {
    soak_once(Mode::Events, None, SHORT, Duration::ZERO).await;
}

/// Default mode with the CRI backend, 16 lifecycles in flight all through: nothing lost.
#[tokio::test(flavor = "multi_thread")]
async fn soak_default_16_in_flight_cri() {
    soak_busy(Runtime::Cri).await;
}

/// Default mode with containerd's own API as the backend, 16 lifecycles in flight all through:
/// nothing lost (issue 52: it lost whole lifecycles, no event at all).
#[tokio::test(flavor = "multi_thread")]
async fn soak_default_16_in_flight_containerd() {
    soak_busy(Runtime::Containerd).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn soak_polling() {
    soak_once(Mode::Polling, None, SHORT, Duration::ZERO).await;
}

/// containerd SIGKILLed mid-churn and started again: the stream's reconnect and its full
/// relist leave nothing lost (events only: no eBPF hint nor short relist to make up for it).
#[tokio::test(flavor = "multi_thread")]
async fn soak_through_a_containerd_crash() {
    soak_once(
        Mode::Events,
        Some(Fault::ContainerdRestart),
        SHORT,
        Duration::ZERO,
    )
    .await;
}

/// plegd SIGKILLed mid-churn: the watcher is told to resync, and its fresh listing plus what
/// follows account for every transition.
#[tokio::test(flavor = "multi_thread")]
async fn soak_through_a_plegd_crash() {
    soak_once(Mode::Default, Some(Fault::PlegdKill), SHORT, Duration::ZERO).await;
}

/// plegd SIGTERMed mid-churn and started on its saved state: the run continues, the watcher
/// resumes from its sequence, nothing is missed.
#[tokio::test(flavor = "multi_thread")]
async fn soak_through_a_plegd_clean_restart() {
    soak_once(Mode::Default, Some(Fault::PlegdTerm), SHORT, Duration::ZERO).await;
}

/// A one-page eBPF ring buffer and an exec storm mid-churn, the kernel as the only push
/// source: the losses are counted, full relists follow, and nothing is lost.
#[tokio::test(flavor = "multi_thread")]
async fn soak_through_a_ring_buffer_overflow() {
    soak_once(Mode::Ebpf, Some(Fault::RingOverflow), SHORT, Duration::ZERO).await;
}

/// containerd frozen (SIGSTOP) mid-churn while containers exit, then thawed: nothing is lost.
/// (Health turning off past the threshold, and back on, is api.rs's.)
#[tokio::test(flavor = "multi_thread")]
async fn soak_through_a_containerd_hang() {
    soak_once(
        Mode::Default,
        Some(Fault::ContainerdHang),
        SHORT,
        Duration::ZERO,
    )
    .await;
}

/// containerd's event stream silent while connected, mid-churn, with no other push source:
/// the heartbeat finds it, full relists go fast until it is back, nothing is lost.
#[tokio::test(flavor = "multi_thread")]
async fn soak_through_a_silent_event_stream() {
    soak_once(
        Mode::Events,
        Some(Fault::SilentStream),
        SHORT,
        Duration::ZERO,
    )
    .await;
}

/// Hostile and careless clients on the API all through a churn, containerd restarted in the
/// middle, plegd with a unit's 1,024 descriptors: the watcher misses nothing, plegd reaches
/// containerd again, a new watcher gets in, health holds, RSS stays under the unit's
/// MemoryMax, and the descriptors come back (plegd_tests::abuse). The short form: long enough
/// for plegd's handshake (5 s) and first-call (10 s) deadlines to close the flooders'
/// connections once; `cargo xtask soak --abuse` is the long one.
#[tokio::test(flavor = "multi_thread")]
async fn soak_under_hostile_clients() {
    soak_plan(Plan {
        mode: Mode::Default,
        fault: Some(Fault::ContainerdRestart),
        lifecycles: SHORT,
        duration: HOSTILE,
        seed: soak::seed_from_env().unwrap(),
        abuse: true,
        in_flight: None,
        runtime: Runtime::Cri,
    })
    .await;
}

/// `cargo xtask soak`: every mode and fault in `PLEGD_SOAK_MODES` / `PLEGD_SOAK_FAULTS`
/// (comma separated; `none` for no fault; a fault meaningless in a mode is skipped in it), with
/// each backend of `PLEGD_SOAK_RUNTIMES` (default `cri`) and each K of `PLEGD_SOAK_IN_FLIGHT`
/// (`bursts`, the default, for bursts after random pauses), `PLEGD_SOAK_LIFECYCLES` lifecycles
/// (default 1000) or `PLEGD_SOAK_MINUTES`, whichever lasts longer; every report printed before
/// it fails.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "long: run by cargo xtask soak"]
async fn soak_as_configured() {
    let list = |name: &str, default: &str| -> Vec<String> {
        std::env::var(name)
            .unwrap_or_else(|_| default.to_owned())
            .split(',')
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect()
    };
    let modes: Vec<Mode> = list("PLEGD_SOAK_MODES", "ebpf,events,default,polling")
        .iter()
        .map(|m| m.parse().unwrap())
        .collect();
    let faults: Vec<Option<Fault>> = list("PLEGD_SOAK_FAULTS", "none")
        .iter()
        .map(|f| (f != "none").then(|| f.parse().unwrap()))
        .collect();
    let runtimes: Vec<Runtime> = list("PLEGD_SOAK_RUNTIMES", "cri")
        .iter()
        .map(|r| r.parse().unwrap())
        .collect();
    let in_flight: Vec<Option<usize>> = list("PLEGD_SOAK_IN_FLIGHT", "bursts")
        .iter()
        .map(|k| (k != "bursts").then(|| k.parse().expect("PLEGD_SOAK_IN_FLIGHT")))
        .collect();
    let number = |name: &str, default: u64| -> u64 {
        std::env::var(name).map_or(default, |v| v.parse().expect(name))
    };
    let lifecycles = number("PLEGD_SOAK_LIFECYCLES", 1000) as usize;
    let duration = Duration::from_secs(60 * number("PLEGD_SOAK_MINUTES", 0));
    let seed = soak::seed_from_env().unwrap();
    let node = Node::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let binary = plegd_tests::process::plegd_binary().expect("the plegd binary");
    let mut failed = Vec::new();
    for &fault in &faults {
        for &mode in &modes {
            if let Some(fault) = fault.filter(|f| !f.applies_to(mode)) {
                println!(
                    "soak: fault {} does not apply to mode {}, skipped",
                    fault.key(),
                    mode.key()
                );
                continue;
            }
            for &runtime in &runtimes {
                for &in_flight in &in_flight {
                    let plan = Plan {
                        mode,
                        fault,
                        lifecycles,
                        duration,
                        seed,
                        abuse: std::env::var_os("PLEGD_SOAK_ABUSE").is_some(),
                        in_flight,
                        runtime,
                    };
                    println!("soak: {plan:?}");
                    let outcome =
                        soak::run(&node, &binary, &soak::run_dir(dir.path(), &plan), &plan)
                            .await
                            .unwrap();
                    if let Err(e) = soak::conclude(&plan, &outcome) {
                        failed.push(format!(
                            "{}/{}/{}/{}: {e}",
                            mode.key(),
                            fault.map_or("none", Fault::key),
                            runtime.key(),
                            in_flight.map_or("bursts".to_owned(), |k| format!("K={k}")),
                        ));
                    }
                }
            }
        }
    }
    if !failed.is_empty() {
        panic!(
            "{failed:#?}\nplegd's logs and the audits' inputs are in {}",
            dir.keep().display()
        );
    }
}
