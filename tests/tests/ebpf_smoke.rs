//! The smallest proof that plegd's kernel probes work on a kernel: they load and attach, and a
//! container's start and its kill -9 reach plegd through eBPF alone (no stream source, full
//! relists minutes apart). `cargo xtask kernels --quick` runs this on other kernels in a VM,
//! where everything is slow (QEMU without KVM), hence the generous deadlines; ebpf_events has
//! the whole lifecycle in every pid namespace mode.

mod support;

use std::time::Duration;

use plegd::{config::Mode, pleg::Source};
use plegd_tests::Node;
use support::{RunningPlegd, observations, push_config, start_then_kill};

/// Bounds each wait; far below the relist period, so an event within it came from eBPF.
const DEADLINE: Duration = Duration::from_secs(60);
const SLOW: Duration = Duration::from_secs(600);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_and_a_kill_9_reach_plegd_through_ebpf() {
    // `cargo xtask kernels` streams the output as it comes: a run that stalls shows where.
    RunningPlegd::log_to_test_output_or("info");
    let Node {
        containerd,
        cri,
        tasks,
    } = Node::start().await.unwrap();
    let config = push_config(&containerd, &[Source::Ebpf], Mode::Ebpf, SLOW);
    // --mode ebpf fails here if the probes do not load and attach.
    let mut plegd = RunningPlegd::start(config).await;
    plegd.wait_sources_connected(1, DEADLINE).await;

    let pod = cri.run_pod("smoke").await.unwrap();
    // eBPF is the only push source and the first full relist ran before the pod existed, so
    // the start can only be found through a kernel hint. Not necessarily this container's: in
    // a slow VM the targeted relist of the pod that the sandbox's hint triggered (and retries)
    // may see the container running first, and then names the relist as its source.
    let killed = start_then_kill(&mut plegd, &cri, &tasks, &pod, "killed", DEADLINE).await;
    let died = plegd.last_of(&killed);
    assert_eq!(died["sources"], serde_json::json!(["ebpf"]), "{died}");
    assert!(
        observations(died).contains(&"ebpf:signal=9".to_owned()),
        "{died}"
    );
    assert_eq!(died["exit_code"], 137, "{died}");
    plegd.stop().await;
}
