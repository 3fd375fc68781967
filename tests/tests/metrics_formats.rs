//! `/metrics` in both exposition formats, chosen by the scraper's `Accept` header: OpenMetrics
//! (Prometheus 2.x, and without the header) and the classic Prometheus text
//! (`text/plain; version=0.0.4`); and `promtool check metrics` on both where promtool is
//! installed (Debian's `prometheus` package, not installed by setup: see TEST_PACKAGES).

mod support;

use std::{process::Stdio, time::Duration};

use plegd::runtime::RuntimeKind;
use plegd_tests::{ContainerdOptions, PrivateContainerd};
use support::{RunningPlegd, config};
use tokio::io::AsyncWriteExt as _;

/// What Prometheus 2.x sends.
const PROMETHEUS_ACCEPT: &str = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
const CLASSIC: &str = "text/plain; version=0.0.4; charset=utf-8";
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// GET /metrics with `accept`; returns (status, content type, body).
async fn get_metrics(address: std::net::SocketAddr, accept: Option<&str>) -> (u16, String, String) {
    let response = support::http_get(address, "/metrics", accept).await;
    (response.code, response.content_type, response.body)
}

/// Checks the classic text's structure: valid TYPE lines, each sample after its family's.
fn check_classic(text: &str) {
    assert!(!text.contains("# EOF"), "# EOF is OpenMetrics only");
    let mut family: Option<String> = None;
    let mut types = 0;
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("TYPE name kind");
            assert!(
                ["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind),
                "invalid classic type in {line:?}"
            );
            family = Some(name.to_owned());
            types += 1;
        } else if line.starts_with("# HELP ") || line.is_empty() {
        } else {
            assert!(!line.starts_with('#'), "unexpected comment {line:?}");
            let name = line.split(['{', ' ']).next().unwrap();
            let family = family.as_deref().expect("a sample before any TYPE");
            let suffixes = ["", "_bucket", "_sum", "_count"];
            assert!(
                suffixes.iter().any(|s| name == format!("{family}{s}")),
                "{name} is not in family {family}"
            );
            let value = line.rsplit(' ').next().unwrap();
            assert!(value.parse::<f64>().is_ok(), "bad value in {line:?}");
        }
    }
    assert!(types >= 10, "{text}");
    assert!(
        text.contains("# TYPE kubelet_pleg_discard_events untyped\n"),
        "{text}"
    );
}

/// `promtool check metrics` on `text`, if promtool is installed: (success, its output).
async fn promtool(text: &str) -> Option<(bool, String)> {
    let mut child = tokio::process::Command::new(plegd_tests::process::promtool()?)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .ok()?;
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(text.as_bytes()).await.unwrap();
    drop(stdin);
    let output = child.wait_with_output().await.unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    Some((output.status.success(), said))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_are_served_as_openmetrics_or_classic_text_as_the_scraper_asks() {
    let containerd = PrivateContainerd::start(&ContainerdOptions::unique())
        .await
        .unwrap();
    let settings = config(
        RuntimeKind::Cri,
        &containerd.socket(),
        Duration::from_millis(100),
    );
    let (plegd, api) = RunningPlegd::start_serving_api(settings).await;

    let (code, content_type, openmetrics) = get_metrics(api.metrics, Some(PROMETHEUS_ACCEPT)).await;
    assert_eq!((code, content_type.as_str()), (200, OPENMETRICS));
    assert!(openmetrics.ends_with("# EOF\n"));
    assert!(openmetrics.contains("# TYPE kubelet_pleg_discard_events unknown\n"));
    // Without the header, or with */* (curl): OpenMetrics, as before negotiation.
    for accept in [None, Some("*/*")] {
        let (_, content_type, _) = get_metrics(api.metrics, accept).await;
        assert_eq!(content_type, OPENMETRICS, "Accept {accept:?}");
    }

    let (code, content_type, classic) =
        get_metrics(api.metrics, Some("text/plain;version=0.0.4;q=1,*/*;q=0.1")).await;
    assert_eq!((code, content_type.as_str()), (200, CLASSIC));
    check_classic(&classic);
    let (_, content_type, _) = get_metrics(api.metrics, Some("text/plain")).await;
    assert_eq!(content_type, CLASSIC);

    match promtool(&classic).await {
        Some((passed, said)) => {
            eprintln!("promtool check metrics (classic text): passed: {passed}\n{said}");
            assert!(
                passed,
                "promtool rejects the classic text:\n{said}\n{classic}"
            );
            let (passed, said) = promtool(&openmetrics).await.unwrap();
            // promtool reads the classic format only: it rejects OpenMetrics' `unknown` type
            // and `# EOF`, which is why scrapers like it must ask for text/plain.
            eprintln!("promtool check metrics (OpenMetrics): passed: {passed}\n{said}");
        }
        None => eprintln!(
            "promtool not installed (Debian package `prometheus`, which `cargo xtask setup` \
             leaves out): skipping `promtool check metrics`"
        ),
    }
    plegd.stop().await;
    api.stopped();
}
