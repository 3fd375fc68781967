//! Bad input never panics: the real `plegd` binary, run as a process as a user would, with bad
//! flags, bad config files, contradicting settings and runtime endpoints that are no runtime.
//! What is fatal exits non-zero with a message naming the setting; an endpoint that may yet
//! become a runtime is retried (plegd may start before its runtime) with the reason in the log.

mod support;

use std::{
    collections::HashMap,
    io::{BufRead as _, BufReader, Read as _, Write as _},
    os::unix::net::UnixListener,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::{Arc, mpsc},
    time::{Duration, Instant},
};

use k8s_cri::v1 as cri;
use plegd::runtime::RuntimeKind;
use plegd_proto::v1 as pb;
use plegd_tests::{
    fake_cri::{self, FakeCri, Listing},
    process::{Terminating, plegd_binary},
};
use support::{RunningPlegd, config};
use tonic::Code;

const DEADLINE: Duration = Duration::from_secs(30);
const PERIOD: Duration = Duration::from_millis(100);

/// `plegd run` with `args`, its API socket, state and stdout out of the way.
fn plegd_run(dir: &Path, args: &[&str]) -> Command {
    let mut command = Command::new(plegd_binary().unwrap());
    command
        .arg("run")
        .arg("--socket")
        .arg(dir.join("plegd.sock"))
        .args(["--state-dir", "none"])
        .args(args)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    command
}

/// Runs `plegd run args` to its exit (within [`DEADLINE`]): its exit code and stderr.
fn exit_of(args: &[&str]) -> (i32, String) {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Terminating(plegd_run(dir.path(), args).spawn().unwrap());
    let mut stderr = child.0.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        stderr.read_to_string(&mut text).map(|_| text)
    });
    let deadline = Instant::now() + DEADLINE;
    let status = loop {
        if let Some(status) = child.0.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "plegd {args:?} did not exit");
        std::thread::sleep(Duration::from_millis(20));
    };
    let stderr = reader.join().unwrap().unwrap();
    assert!(
        !stderr.contains("panicked"),
        "plegd {args:?} panicked: {stderr}"
    );
    let code = status
        .code()
        .unwrap_or_else(|| panic!("plegd {args:?} killed by a signal: {status:?}; {stderr}"));
    (code, stderr)
}

/// Starts `plegd run args` and returns the first stderr line containing `wanted` (within
/// [`DEADLINE`]), then stops it; fails with what it wrote otherwise.
fn logged(args: &[&str], wanted: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Terminating(plegd_run(dir.path(), args).spawn().unwrap());
    let stderr = child.0.stderr.take().unwrap();
    let (lines, seen) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + DEADLINE;
    let mut read = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match seen.recv_timeout(left) {
            Ok(line) if line.contains(wanted) => {
                assert!(
                    child.0.try_wait().unwrap().is_none(),
                    "plegd {args:?} exited: it should retry"
                );
                drop(child);
                return line;
            }
            Ok(line) => read.push(line),
            Err(_) => panic!("plegd {args:?} never logged {wanted:?}; it logged {read:#?}"),
        }
    }
}

#[test]
fn bad_flag_values_exit_2_with_the_flag_and_the_value() {
    for (args, wanted) in [
        (
            &["--relist-period", "soon"][..],
            "invalid value 'soon' for '--relist-period <DURATION>'",
        ),
        (&["--watch-queue", "-1"], "unexpected argument '-1' found"),
        (
            &["--event-history", "lots"],
            "invalid value 'lots' for '--event-history <N>'",
        ),
        (
            &["--mode", "fast"],
            "invalid value 'fast' for '--mode <MODE>'",
        ),
        (
            &["--metrics-address", "localhost"],
            "invalid value 'localhost' for '--metrics-address <ADDR:PORT>'",
        ),
    ] {
        let (code, stderr) = exit_of(args);
        assert_eq!(code, 2, "{args:?}: {stderr}");
        assert!(stderr.contains(wanted), "{args:?}: {stderr}");
    }
}

#[test]
fn a_bad_config_file_exits_1_naming_the_file_line_and_column() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("plegd.toml");
    std::fs::File::create(&file)
        .unwrap()
        .write_all(b"relist-period = \"1s\"\nrelist-threshold = 3m\n")
        .unwrap();
    let (code, stderr) = exit_of(&["--config", file.to_str().unwrap()]);
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.starts_with(&format!("plegd: config file {}: ", file.display()))
            && stderr.contains("line 2, column 20"),
        "{stderr}"
    );

    let missing = dir.path().join("missing.toml");
    let (code, stderr) = exit_of(&["--config", missing.to_str().unwrap()]);
    assert_eq!(code, 1, "{stderr}");
    assert_eq!(
        stderr.trim_end(),
        format!(
            "plegd: reading config file {}: No such file or directory (os error 2)",
            missing.display()
        )
    );
}

#[test]
fn contradicting_or_absurd_settings_exit_1_naming_them() {
    for (args, wanted) in [
        (
            &["--relist-threshold", "6s"][..],
            "plegd: relist-threshold (6s) must be at least twice slow-relist-period (30s)",
        ),
        (
            &["--relist-period", "1m"],
            "plegd: slow-relist-period (30s) must not be shorter than relist-period (1m)",
        ),
        (
            &["--mode", "polling", "--relist-period", "2m"],
            "plegd: relist-threshold (3m) must be at least twice relist-period (2m)",
        ),
        (
            &["--inspect-concurrency", "0"],
            "plegd: inspect-concurrency must be greater than zero",
        ),
        (
            &["--watch-queue", "18446744073709551615"],
            "plegd: watch-queue must be at most 16777216",
        ),
        (
            &["--runtime-timeout", "1000years"],
            "plegd: runtime-timeout must be at most 1year",
        ),
    ] {
        let (code, stderr) = exit_of(args);
        assert_eq!(code, 1, "{args:?}: {stderr}");
        assert!(stderr.starts_with(wanted), "{args:?}: {stderr}");
    }
}

/// A unix socket at `dir`/`name` whose every connection gets `answer` (after reading what the
/// client sent first, if `answer` is not empty), then is closed.
fn fake_socket(dir: &Path, name: &str, answer: &'static [u8]) -> PathBuf {
    let path = dir.join(name);
    let listener = UnixListener::bind(&path).unwrap();
    std::thread::spawn(move || {
        for mut stream in listener.incoming().map_while(Result::ok) {
            if !answer.is_empty() {
                let _ = stream.read(&mut [0; 4096]);
                let _ = stream.write_all(answer);
            }
        }
    });
    path
}

#[test]
fn an_endpoint_that_is_no_runtime_is_retried_saying_why() {
    let dir = tempfile::tempdir().unwrap();
    let directory = dir.path().join("a-directory");
    std::fs::create_dir(&directory).unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, "not a socket").unwrap();
    let closes = fake_socket(dir.path(), "closes.sock", b"");
    let http1 = fake_socket(
        dir.path(),
        "http1.sock",
        b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
    );
    let missing = dir.path().join("missing.sock");
    for (endpoint, wanted) in [
        (
            missing.as_path(),
            &["connecting: transport error: No such file or directory"][..],
        ),
        (&directory, &["is a directory, not a unix socket"]),
        (&file, &["is a regular file, not a unix socket"]),
        // Closed while connecting ("connection error: Broken pipe"), or reset on the first
        // call, depending on which side is first.
        (
            &closes,
            &[
                "connecting: transport error",
                "accepted a connection but did not answer Version",
            ],
        ),
        (
            &http1,
            &["accepted a connection but did not answer Version"],
        ),
    ] {
        let line = logged(
            &[
                "--mode",
                "polling",
                "--runtime-endpoint",
                endpoint.to_str().unwrap(),
            ],
            "runtime",
        );
        assert!(
            line.contains(&format!("unix://{}", endpoint.display()))
                && wanted.iter().any(|w| line.contains(w)),
            "{}: {line}",
            endpoint.display()
        );
    }
}

/// Logs go to stderr; when whatever read them goes away, plegd keeps running (it panicked in
/// tracing-subscriber's report of the failed write, on the same broken stderr).
#[test]
fn a_stderr_nobody_reads_any_more_does_not_stop_plegd() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.sock");
    let mut child = Terminating(
        plegd_run(
            dir.path(),
            &[
                "--mode",
                "polling",
                "--runtime-endpoint",
                missing.to_str().unwrap(),
            ],
        )
        .spawn()
        .unwrap(),
    );
    let mut stderr = BufReader::new(child.0.stderr.take().unwrap());
    // The first lines may say other things (the capabilities it dropped).
    let mut line = String::new();
    for _ in 0..10 {
        line.clear();
        stderr.read_line(&mut line).unwrap();
        if line.contains("cannot reach the runtime") {
            break;
        }
    }
    assert!(line.contains("cannot reach the runtime"), "{line}");
    drop(stderr);
    // The next two retries (1 s, then 2 s later) each log a line into the broken pipe.
    let until = Instant::now() + Duration::from_secs(4);
    while Instant::now() < until {
        assert!(
            child.0.try_wait().unwrap().is_none(),
            "plegd exited when its stderr broke"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn an_endpoint_of_another_scheme_or_none_exits_1() {
    for (endpoint, wanted) in [
        (
            "tcp://127.0.0.1:1",
            "plegd: unsupported runtime endpoint \"tcp://127.0.0.1:1\": only unix sockets are \
             supported (unix:///path or /path)",
        ),
        ("unix://", "plegd: empty runtime endpoint"),
    ] {
        let (code, stderr) = exit_of(&["--mode", "polling", "--runtime-endpoint", endpoint]);
        assert_eq!(code, 1, "{stderr}");
        assert_eq!(stderr.lines().last(), Some(wanted), "{stderr}");
    }
}

fn sandbox(id: &str, uid: &str) -> cri::PodSandbox {
    cri::PodSandbox {
        id: id.into(),
        metadata: Some(cri::PodSandboxMetadata {
            name: format!("{uid}-name"),
            uid: uid.into(),
            namespace: "default".into(),
            attempt: 0,
        }),
        state: cri::PodSandboxState::SandboxReady as i32,
        created_at: 1_000_000_000,
        labels: HashMap::from([("io.kubernetes.pod.uid".to_owned(), uid.to_owned())]),
        ..Default::default()
    }
}

/// A container of `sandbox` in `state` (a raw number: the runtime may send any), without
/// labels or metadata.
fn container(id: &str, sandbox: &str, state: i32) -> cri::Container {
    cri::Container {
        id: id.into(),
        pod_sandbox_id: sandbox.into(),
        state,
        created_at: 2_000_000_000,
        ..Default::default()
    }
}

const RUNNING: i32 = cri::ContainerState::ContainerRunning as i32;
const EXITED: i32 = cri::ContainerState::ContainerExited as i32;

/// A runtime whose listing has no labels, no metadata, an unknown state number, a container
/// whose sandbox is gone and one with an empty id: plegd reads what it can and keeps going.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runtime_listing_odd_records_is_read_without_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Arc::new(FakeCri::listing(Listing {
        sandboxes: vec![sandbox("s1", "uid-1")],
        containers: vec![
            container("plain", "s1", RUNNING),
            container("orphan", "no-such-sandbox", EXITED),
            container("strange", "s1", 42),
            container("", "s1", RUNNING),
        ],
    }));
    let (socket, _server) = fake_cri::serve(dir.path(), Arc::clone(&fake)).unwrap();
    let mut plegd = RunningPlegd::start(config(RuntimeKind::Cri, &socket, PERIOD)).await;
    plegd
        .wait_container("s1", &["ContainerStarted"], DEADLINE)
        .await;
    plegd
        .wait_container("plain", &["ContainerStarted"], DEADLINE)
        .await;
    plegd
        .wait_container("orphan", &["ContainerDied"], DEADLINE)
        .await;
    // An unknown state is kubelet's "unknown": ContainerChanged, not sent by default.

    // Still reading: a change after the odd listing is an event as usual.
    fake.set_listing(Listing {
        sandboxes: vec![sandbox("s1", "uid-1")],
        containers: vec![container("plain", "s1", EXITED)],
    });
    plegd
        .wait_container("plain", &["ContainerStarted", "ContainerDied"], DEADLINE)
        .await;
    plegd.stop().await;
}

/// `count` containers of `s1` whose annotations add up to about `bytes`.
fn heavy_listing(count: usize, bytes: usize) -> Listing {
    let note = "x".repeat(bytes / count);
    Listing {
        sandboxes: vec![sandbox("s1", "uid-1")],
        containers: (0..count)
            .map(|i| cri::Container {
                annotations: HashMap::from([("note".to_owned(), note.clone())]),
                ..container(&format!("c{i}"), "s1", RUNNING)
            })
            .collect(),
    }
}

/// A listing over gRPC's default 4 MiB limit is read (plegd accepts 16 MiB, as kubelet does);
/// one over 16 MiB fails each relist with a message saying so, and plegd keeps retrying.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_over_4_mib_is_read_and_one_over_16_mib_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Arc::new(FakeCri::listing(heavy_listing(50, 6 << 20)));
    let (socket, _server) = fake_cri::serve(dir.path(), Arc::clone(&fake)).unwrap();
    let mut plegd = RunningPlegd::start(config(RuntimeKind::Cri, &socket, PERIOD)).await;
    plegd
        .wait_container("c49", &["ContainerStarted"], DEADLINE)
        .await;
    plegd.stop().await;

    fake.set_listing(heavy_listing(50, 20 << 20));
    let socket = socket.to_str().unwrap().to_owned();
    let line = tokio::task::spawn_blocking(move || {
        logged(
            &["--mode", "polling", "--runtime-endpoint", &socket],
            "relist failed",
        )
    })
    .await
    .unwrap();
    assert!(
        line.contains("ListContainers") && line.contains("the limit is: 16777216 bytes"),
        "{line}"
    );
}

/// Watch requests no client should send get a clear status, and the server keeps serving a
/// sensible watcher throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn absurd_watch_requests_get_a_status_and_the_server_keeps_serving() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Arc::new(FakeCri::listing(Listing {
        sandboxes: vec![sandbox("s1", "uid-1")],
        containers: vec![container("c1", "s1", RUNNING)],
    }));
    let (socket, _server) = fake_cri::serve(dir.path(), Arc::clone(&fake)).unwrap();
    let (mut plegd, api) =
        RunningPlegd::start_serving_api(config(RuntimeKind::Cri, &socket, PERIOD)).await;
    plegd
        .wait_container("c1", &["ContainerStarted"], DEADLINE)
        .await;
    let mut client = api.client().await;
    let mut sensible = client
        .watch(pb::WatchRequest::default())
        .await
        .unwrap()
        .into_inner();
    let run_id = client
        .list_pods(pb::ListPodsRequest {})
        .await
        .unwrap()
        .into_inner()
        .run_id;

    let huge = "n".repeat(5 << 20);
    let absurd = [
        (
            "from u64::MAX",
            pb::WatchRequest {
                from_sequence: u64::MAX,
                ..Default::default()
            },
            Some(Code::OutOfRange),
        ),
        (
            "another run",
            pb::WatchRequest {
                from_sequence: 1,
                run_id: run_id.wrapping_add(1),
                ..Default::default()
            },
            Some(Code::OutOfRange),
        ),
        (
            "run u64::MAX",
            pb::WatchRequest {
                run_id: u64::MAX,
                ..Default::default()
            },
            Some(Code::OutOfRange),
        ),
        (
            "unknown type",
            pb::WatchRequest {
                types: vec![i32::MAX],
                ..Default::default()
            },
            Some(Code::InvalidArgument),
        ),
        (
            "unspecified type",
            pb::WatchRequest {
                types: vec![0],
                ..Default::default()
            },
            Some(Code::InvalidArgument),
        ),
        (
            "negative type",
            pb::WatchRequest {
                types: vec![-1],
                ..Default::default()
            },
            Some(Code::InvalidArgument),
        ),
        // More entries than there are event types.
        (
            "8 types",
            pb::WatchRequest {
                types: vec![pb::EventType::ContainerDied as i32; 8],
                ..Default::default()
            },
            Some(Code::InvalidArgument),
        ),
        // Accepted: a type repeated (once per event type at most), Kubernetes' longest names.
        (
            "7 types",
            pb::WatchRequest {
                types: vec![pb::EventType::ContainerDied as i32; 7],
                ..Default::default()
            },
            None,
        ),
        (
            "the longest names",
            pb::WatchRequest {
                pod_namespace: "n".repeat(63),
                pod_name: "p".repeat(253),
                ..Default::default()
            },
            None,
        ),
        // Past plegd's 4 KiB, refused at the message's length prefix.
        (
            "1 MiB namespace",
            pb::WatchRequest {
                pod_namespace: "n".repeat(1 << 20),
                ..Default::default()
            },
            Some(Code::ResourceExhausted),
        ),
        (
            "over gRPC's 4 MiB",
            pb::WatchRequest {
                pod_namespace: huge,
                ..Default::default()
            },
            Some(Code::ResourceExhausted),
        ),
    ];
    for (what, request, wanted) in absurd {
        let answer = client.watch(request).await;
        match (answer, wanted) {
            (Ok(_), None) => {}
            (Err(status), Some(code)) => {
                assert_eq!(status.code(), code, "{what}: {status:?}");
                assert!(!status.message().is_empty(), "{what}: {status:?}");
            }
            (answer, _) => panic!("{what}: {answer:?}, wanted {wanted:?}"),
        }
    }

    fake.set_listing(Listing {
        sandboxes: vec![sandbox("s1", "uid-1")],
        containers: vec![container("c1", "s1", EXITED)],
    });
    let died = tokio::time::timeout(DEADLINE, async {
        loop {
            let event = sensible.message().await.unwrap().unwrap();
            if event.container_id == "c1" && event.r#type() == pb::EventType::ContainerDied {
                return event;
            }
        }
    })
    .await
    .expect("the sensible watcher still gets events");
    assert_eq!(died.pod_uid, "uid-1");
    plegd.stop().await;
    api.stopped();
}
