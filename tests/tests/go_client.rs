//! The Go client in proto/go: its stubs are what Debian 12's protoc-gen-go and
//! protoc-gen-go-grpc make of plegd.proto today, and its example (example/watch), built with
//! Debian's Go and grpc-go (GOPATH mode over /usr/share/gocode: no module proxy), follows a
//! real plegd over the unix socket with grpc-go's defaults: a `kill -9` reaches it, and after
//! plegd is killed and started again (a new run) it resyncs and sees the next one. All of it
//! is installed by `cargo xtask setup`.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

use nix::sys::signal::Signal;
use plegd_tests::{Node, bench::Plegd, cri::ContainerSpec, process::plegd_binary};
use tokio::io::{AsyncBufReadExt as _, BufReader, Lines};

const DEADLINE: Duration = Duration::from_secs(60);
/// The module's path (proto/go/go.mod) and the stubs' package below it.
const MODULE: &str = "plegd.local/proto";
const STUBS: &str = "plegdv1";
/// The Go packages Debian installs for GOPATH builds.
const DEBIAN_GOPATH: &str = "/usr/share/gocode";
/// Where google/protobuf/timestamp.proto comes from (python3-grpc-tools), as for the Python
/// client's stubs.
const WELL_KNOWN: &str = "/usr/lib/python3/dist-packages/grpc_tools/_proto";

fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// protoc with Go's plugins, writing the stubs of plegd.proto into `out`.
fn generate(out: &Path) {
    let mapping = format!("Mplegd/v1/plegd.proto={MODULE}/{STUBS}");
    let status = Command::new("protoc")
        .arg("-I")
        .arg(repository().join("proto/proto"))
        .arg("-I")
        .arg(WELL_KNOWN)
        .arg(format!("--go_out={}", out.display()))
        .arg(format!("--go-grpc_out={}", out.display()))
        .args([
            "--go_opt=paths=source_relative",
            "--go-grpc_opt=paths=source_relative",
        ])
        .arg(format!("--go_opt={mapping}"))
        .arg(format!("--go-grpc_opt={mapping}"))
        .arg("plegd/v1/plegd.proto")
        .status()
        .expect("running protoc (run `cargo xtask setup`)");
    assert!(status.success(), "protoc with protoc-gen-go failed");
}

#[test]
fn the_go_stubs_are_what_protoc_makes_of_the_proto_today() {
    let out = tempfile::tempdir().unwrap();
    generate(out.path());
    for file in ["plegd.pb.go", "plegd_grpc.pb.go"] {
        let fresh = std::fs::read_to_string(out.path().join("plegd/v1").join(file)).unwrap();
        let kept =
            std::fs::read_to_string(repository().join("proto/go").join(STUBS).join(file)).unwrap();
        assert!(
            fresh == kept,
            "proto/go/{STUBS}/{file} is stale: regenerate it (see tests/tests/go_client.rs's \
             generate) and commit it"
        );
    }
}

/// The example, built in a GOPATH of its own that holds the module beside Debian's packages.
fn build_example(gopath: &Path) -> PathBuf {
    let module = gopath.join("src").join(MODULE);
    std::fs::create_dir_all(module.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink(repository().join("proto/go"), &module).unwrap();
    let binary = gopath.join("watch");
    let output = Command::new("go")
        .args(["build", "-o"])
        .arg(&binary)
        .arg("./example/watch")
        .current_dir(&module)
        .env("GO111MODULE", "off")
        .env("GOPATH", format!("{}:{DEBIAN_GOPATH}", gopath.display()))
        .env("GOCACHE", concat!(env!("CARGO_TARGET_TMPDIR"), "/go-cache"))
        .env("GOPROXY", "off")
        .env("GOFLAGS", "")
        .output()
        .expect("running go (run `cargo xtask setup`)");
    assert!(
        output.status.success(),
        "go build ./example/watch failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    binary
}

/// Reads the client's lines until one satisfies `wanted`; all read.
async fn read_until(
    lines: &mut Lines<BufReader<tokio::process::ChildStdout>>,
    what: &str,
    wanted: impl Fn(&str) -> bool,
) -> Vec<String> {
    let mut read = Vec::new();
    let found = tokio::time::timeout(DEADLINE, async {
        while let Some(line) = lines.next_line().await.unwrap() {
            let done = wanted(&line);
            read.push(line);
            if done {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(
        found,
        Ok(true),
        "the Go client printed no {what}: {read:#?}"
    );
    read
}

fn died(container: &str) -> impl Fn(&str) -> bool + '_ {
    move |line| {
        line.contains(" CONTAINER_DIED ") && line.contains(container) && line.ends_with(" 137")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_go_example_follows_watch_through_a_kill_and_a_new_plegd_run() {
    let gopath = tempfile::tempdir().unwrap();
    let example = build_example(gopath.path());
    let Node {
        containerd,
        cri,
        tasks,
    } = Node::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut plegd = Plegd::start(&plegd_binary().unwrap(), &containerd, dir.path(), &[]).unwrap();
    let mut client = tokio::process::Command::new(&example)
        .arg(&plegd.socket)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("starting the Go client");
    let mut lines = BufReader::new(client.stdout.take().unwrap()).lines();
    read_until(&mut lines, "listing", |l| l.starts_with("listed ")).await;

    let pod = cri.run_pod("gopher").await.unwrap();
    let first = cri
        .run_container(&pod, &ContainerSpec::sleeper("first"))
        .await
        .unwrap();
    read_until(&mut lines, "start", |l| {
        l.contains(" CONTAINER_STARTED ") && l.contains(&first)
    })
    .await;
    tasks.kill_init(&first).await.unwrap();
    read_until(&mut lines, "ContainerDied 137", died(&first)).await;

    // A new run: the client's resume is refused (OUT_OF_RANGE), it lists again and follows.
    plegd.restart(Signal::SIGKILL).unwrap();
    read_until(&mut lines, "new listing", |l| l.starts_with("listed ")).await;
    let second = cri
        .run_container(&pod, &ContainerSpec::sleeper("second"))
        .await
        .unwrap();
    read_until(&mut lines, "start after the resync", |l| {
        l.contains(" CONTAINER_STARTED ") && l.contains(&second)
    })
    .await;
    tasks.kill_init(&second).await.unwrap();
    read_until(
        &mut lines,
        "ContainerDied 137 after the resync",
        died(&second),
    )
    .await;
    plegd.stop();
}
