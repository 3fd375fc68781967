//! The hardened daemon, run as the `plegd` binary: the capabilities left once it is ready (in
//! every thread), eBPF still seeing containers start and die after the drop, and the API
//! socket's allow-list checked against clients run as other users.

use std::{
    collections::BTreeMap,
    os::unix::{fs::PermissionsExt as _, process::CommandExt as _},
    path::Path,
    process::{Command, Output, Stdio},
    time::Duration,
};

use plegd_tests::{Node, bench::Plegd, cri::ContainerSpec, process::plegd_binary};

/// CAP_BPF's bit in /proc's capability masks.
const CAP_BPF: u64 = 1 << 39;
/// Longer than any push source takes, far shorter than the relist period the eBPF case sets
/// (60 s, within the default 3 min health threshold).
const DEADLINE: Duration = Duration::from_secs(20);

/// The `Cap*` lines of /proc/<pid>/task/<tid>/status for every thread of `pid`, by name; each
/// must be the same in every thread (capabilities are per thread).
fn capabilities(pid: i32) -> BTreeMap<String, u64> {
    let mut seen: Option<BTreeMap<String, u64>> = None;
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).expect("plegd's threads");
    for task in tasks.flatten() {
        let status = std::fs::read_to_string(task.path().join("status")).expect("status");
        let caps: BTreeMap<String, u64> = status
            .lines()
            .filter_map(|line| {
                let (name, value) = line.split_once(':')?;
                let mask = u64::from_str_radix(value.trim(), 16).ok()?;
                name.starts_with("Cap").then(|| (name.to_owned(), mask))
            })
            .collect();
        assert_eq!(
            caps.len(),
            5,
            "CapInh, CapPrm, CapEff, CapBnd, CapAmb: {status}"
        );
        if let Some(first) = &seen {
            assert_eq!(first, &caps, "thread {:?} differs", task.file_name());
        }
        seen = Some(caps);
    }
    let caps = seen.expect("plegd has threads");
    println!("process {pid}: {caps:x?}");
    caps
}

fn expect_only(caps: &BTreeMap<String, u64>, mask: u64) {
    for (name, expected) in [
        ("CapEff", mask),
        ("CapPrm", mask),
        ("CapBnd", mask),
        ("CapInh", 0),
        ("CapAmb", 0),
    ] {
        assert_eq!(caps[name], expected, "{name}: {caps:x?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_cap_bpf_is_left_with_the_probes_and_nothing_without_them() {
    let binary = plegd_binary().expect("the plegd binary");
    let node = Node::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    // This test runs as root with CAP_BPF and much more: what is left is plegd's doing.
    let own = capabilities(std::process::id().try_into().unwrap());
    assert!(
        own["CapEff"] & CAP_BPF != 0 && own["CapEff"] != CAP_BPF,
        "{own:x?}"
    );

    // eBPF only, with relists too rare to see anything within the deadline: the events below
    // come from the probes, which keep working (map updates, ring reads) after the drop.
    let ebpf_args = ["--mode", "ebpf", "--sources", "ebpf"]
        .into_iter()
        .chain(["--relist-period", "60s", "--slow-relist-period", "60s"])
        .map(str::to_owned)
        .collect::<Vec<_>>();
    let plegd = Plegd::start(
        &binary,
        &node.containerd,
        &dir.path().join("ebpf"),
        &ebpf_args,
    )
    .unwrap();
    expect_only(&capabilities(plegd.pid()), CAP_BPF);
    let watch = plegd.watch().unwrap();
    let pod = node.cri.run_pod("caps").await.unwrap();
    let id = node
        .cri
        .run_container(&pod, &ContainerSpec::sleeper("sleeper"))
        .await
        .unwrap();
    assert!(
        watch
            .arrivals
            .wait(&id, "ContainerStarted", DEADLINE)
            .await
            .is_some(),
        "no ContainerStarted from the probes after the drop"
    );
    node.tasks.kill_init(&id).await.unwrap();
    assert!(
        watch
            .arrivals
            .wait(&id, "ContainerDied", DEADLINE)
            .await
            .is_some(),
        "no ContainerDied from the probes after the drop"
    );
    watch.stop();
    plegd.stop();

    let polling = ["--mode", "polling"].map(str::to_owned);
    let plegd = Plegd::start(
        &binary,
        &node.containerd,
        &dir.path().join("polling"),
        &polling,
    )
    .unwrap();
    expect_only(&capabilities(plegd.pid()), 0);
    plegd.stop();
}

/// A group that exists nowhere but in this test: the socket's group, a client's gid.
const API_GROUP: u32 = 4243;
/// The client's user, in no allow-list.
const CLIENT_UID: u32 = 4242;
/// A primary group that is not allowed.
const OTHER_GID: u32 = 4244;

/// `plegd health` on `socket` as `uid` with primary group `gid` and supplementary `groups`.
fn health_as(binary: &Path, socket: &Path, uid: u32, gid: u32, groups: &[u32]) -> Output {
    let groups: Vec<nix::unistd::Gid> = groups.iter().map(|&g| g.into()).collect();
    let mut command = Command::new(binary);
    command
        .arg("health")
        .arg("--socket")
        .arg(socket)
        .stdin(Stdio::null());
    // SAFETY: only async-signal-safe calls (setgroups, setgid, setuid) between fork and exec.
    // std's `uid`/`gid` would clear the supplementary groups, which this test sets.
    unsafe {
        command.pre_exec(move || {
            nix::unistd::setgroups(&groups)?;
            nix::unistd::setgid(gid.into())?;
            nix::unistd::setuid(uid.into())?;
            Ok(())
        });
    }
    command.output().expect("running plegd health")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_socket_admits_allowed_peers_and_refuses_one_its_file_mode_lets_in() {
    let binary = plegd_binary().expect("the plegd binary");
    let node = Node::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    // The client users must reach the socket's directory (plegd checks that it lets them).
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let run = dir.path().join("run");
    let args = ["--api-allow-gids", &API_GROUP.to_string()].map(str::to_owned);
    // Started and found healthy by root's `plegd health`: root is allowed by default.
    let plegd = Plegd::start(&binary, &node.containerd, &run, &args).unwrap();
    let meta = std::fs::metadata(&plegd.socket).unwrap();
    assert_eq!(
        (
            meta.permissions().mode() & 0o777,
            std::os::unix::fs::MetadataExt::gid(&meta)
        ),
        (0o660, API_GROUP),
        "one allowed gid: the socket is its group's"
    );

    // Allowed through its primary group.
    let accepted = health_as(&binary, &plegd.socket, CLIENT_UID, API_GROUP, &[]);
    assert!(accepted.status.success(), "{accepted:?}");

    // In the socket's group only as a supplementary group: the file mode lets it connect,
    // its credentials (uid, primary gid) are not allowed.
    let refused = health_as(&binary, &plegd.socket, CLIENT_UID, OTHER_GID, &[API_GROUP]);
    assert!(!refused.status.success(), "{refused:?}");
    let log = std::fs::read_to_string(run.join("plegd.log")).unwrap();
    // One line per uid and burst, however often the client connects again after the refusal.
    let refusals = log.matches("API client refused").count();
    assert_eq!(refusals, 1, "{log}");
    let refusal = log
        .lines()
        .find(|l| l.contains("API client refused"))
        .unwrap_or_else(|| panic!("no refusal logged:\n{log}"));
    assert!(
        refusal.contains(&format!("uid={CLIENT_UID}"))
            && refusal.contains(&format!("gid={OTHER_GID}"))
            && refusal.contains("pid=Some("),
        "{refusal}"
    );

    // Neither allowed nor in the group: the file mode stops it before plegd sees it.
    let stopped = health_as(&binary, &plegd.socket, CLIENT_UID, OTHER_GID, &[]);
    assert!(!stopped.status.success(), "{stopped:?}");
    let stderr = String::from_utf8_lossy(&stopped.stderr);
    assert!(stderr.contains("ermission denied"), "{stderr}");
    let log = std::fs::read_to_string(run.join("plegd.log")).unwrap();
    assert_eq!(
        log.matches("API client refused").count(),
        refusals,
        "the file mode stopped it: plegd saw no new peer\n{log}"
    );
    plegd.stop();
}
