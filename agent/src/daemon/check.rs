//! `plegd check`: what this node offers plegd, which mode `--mode auto` would run in, and
//! which push sources `plegd run` would choose for the runtime it finds, and why.

use std::{fmt::Write as _, path::Path, time::Duration};

use crate::{
    config::{
        Config,
        fit::{self, RuntimeInfo},
    },
    pleg::Source,
    runtime::{
        AnyRuntime, RuntimeOptions,
        choice::{WELL_KNOWN_SOCKETS, detect, parse_endpoint},
    },
    sources::ebpf::{Probes, TRACEFS, features::KernelFeatures, index::CgroupMode},
};

/// How long `plegd check` waits for the runtime's Version.
const RUNTIME_TIMEOUT: Duration = Duration::from_secs(3);

/// One line of the report: a subject, whether it is fine, and what was found.
struct Line {
    subject: String,
    ok: bool,
    detail: String,
}

impl Line {
    fn new(subject: impl Into<String>, ok: bool, detail: impl Into<String>) -> Self {
        Self {
            subject: subject.into(),
            ok,
            detail: detail.into(),
        }
    }
}

/// Probes the node and renders the report for `plegd run` with `settings` (its runtime
/// endpoint and kind, `--sources`, `--allow-shared-cri-events`); the second value is whether
/// eBPF would be used.
pub fn report(settings: &Config) -> (String, bool) {
    let mut lines = Vec::new();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|r| r.trim().to_owned())
        .unwrap_or_else(|e| format!("unknown ({e})"));
    lines.push(Line::new("kernel", true, kernel));
    // What each probe needs, feature by feature, and how it would attach.
    for (subject, ok, detail) in KernelFeatures::probe(TRACEFS).describe() {
        lines.push(Line::new(subject, ok, detail));
    }
    lines.push(match CgroupMode::detect() {
        CgroupMode::V1 => Line::new("cgroups", false, "v1 only: no cgroup2 ids for the probes"),
        CgroupMode::Hybrid { cgroup2 } => Line::new(
            "cgroups",
            true,
            format!("hybrid (v1 controllers, cgroup2 at {})", cgroup2.display()),
        ),
        CgroupMode::V2 { cgroup2 } => {
            Line::new("cgroups", true, format!("cgroup2 at {}", cgroup2.display()))
        }
    });
    let socket = match &settings.runtime_endpoint {
        Some(given) => parse_endpoint(given),
        None => detect(&WELL_KNOWN_SOCKETS),
    };
    match socket {
        Ok(socket) => {
            lines.push(Line::new(
                "runtime socket",
                true,
                socket.display().to_string(),
            ));
            lines.extend(runtime_lines(settings, &socket));
        }
        Err(e) => {
            lines.push(Line::new("runtime socket", false, e.to_string()));
            lines.push(Line::new(
                "sources",
                false,
                "no runtime to fit them to: the runtime's name and version decide them",
            ));
        }
    }
    let (ebpf_ok, load) = match Probes::load(crate::sources::ebpf::DEFAULT_RING_BYTES) {
        Ok(probes) => {
            // How each probe attached under this process's capabilities.
            for (subject, ok, detail) in probes.describe_attachment() {
                lines.push(Line::new(subject, ok, detail));
            }
            (
                true,
                format!(
                    "{} programs load and attach: {}",
                    probes.program_names().len(),
                    probes.program_names().join(", ")
                ),
            )
        }
        Err(e) => (false, e.to_string()),
    };
    lines.push(Line::new("eBPF probes", ebpf_ok, load));
    for (subject, ok, detail) in crate::api::listen::exposure(settings) {
        lines.push(Line::new(subject, ok, detail));
    }
    lines.push(Line::new(
        "--mode auto",
        true,
        if ebpf_ok {
            "ebpf (kernel probes trigger targeted relists; full relist slowed while healthy)"
        } else {
            "polling (full relist every period; stream sources still used if available)"
        },
    ));
    (render(&lines), ebpf_ok)
}

/// What the runtime at `socket` says it is, and the push sources `plegd run` would choose
/// there, one line each with why.
fn runtime_lines(settings: &Config, socket: &Path) -> Vec<Line> {
    let asked = async {
        let options = RuntimeOptions {
            call_timeout: RUNTIME_TIMEOUT,
            ..RuntimeOptions::default()
        };
        let runtime = AnyRuntime::connect(settings.runtime, socket, options)
            .await
            .map_err(|e| e.to_string())?;
        runtime.version().await.map_err(|e| e.to_string())
    };
    let version = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime.block_on(asked),
        Err(e) => Err(format!("starting the async runtime: {e}")),
    };
    let mut lines = Vec::new();
    let info = match version {
        Ok(version) => {
            lines.push(Line::new("runtime", true, version.to_string()));
            RuntimeInfo::from_version(&version.name, &version.version)
        }
        Err(why) => {
            lines.push(Line::new(
                "runtime",
                false,
                format!("Version failed: {why}"),
            ));
            RuntimeInfo::Unknown {
                why: format!("Version failed: {why}"),
            }
        }
    };
    lines.extend(source_lines(&fit::choose(
        &info,
        &settings.source_request(),
    )));
    lines
}

/// One line per push source, or the refusal `plegd run` would stop with.
fn source_lines(plan: &Result<fit::Plan, fit::Refused>) -> Vec<Line> {
    match plan {
        Ok(plan) => Source::PUSH
            .iter()
            .map(|source| {
                let on = if plan.runs(*source) { "on" } else { "off" };
                let why = plan.why.get(source).map_or("", String::as_str);
                Line::new(
                    format!("source {}", source.name()),
                    true,
                    format!("{on} ({why})"),
                )
            })
            .collect(),
        Err(refused) => vec![Line::new(
            "sources",
            false,
            format!("plegd run would stop: {refused}"),
        )],
    }
}

fn render(lines: &[Line]) -> String {
    let mut out = String::new();
    for line in lines {
        let mark = if line.ok { "ok " } else { "NO " };
        let _ = writeln!(out, "{mark} {:<24} {}", line.subject, line.detail);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_marked_and_aligned() {
        let text = render(&[
            Line::new("a", true, "fine"),
            Line::new("b", false, "broken"),
        ]);
        assert_eq!(
            text,
            format!("ok  {:<24} fine\nNO  {:<24} broken\n", "a", "b")
        );
    }

    #[test]
    fn each_source_is_a_line_and_a_refusal_is_one_line_marked_no() {
        let settings = Config::load(&crate::config::RunArgs::default()).unwrap();
        let info = RuntimeInfo::from_version("containerd", "v1.7.24");
        let text = render(&source_lines(&fit::choose(
            &info,
            &settings.source_request(),
        )));
        assert!(
            text.contains("source cri-events        off (off by default on containerd v1.7.24"),
            "{text}"
        );
        assert!(
            text.contains("source containerd        on (on by default"),
            "{text}"
        );
        let mut asked = settings.source_request();
        asked.given = true;
        let text = render(&source_lines(&fit::choose(&info, &asked)));
        assert!(text.starts_with("NO  sources"), "{text}");
        assert!(text.contains("#7318"), "{text}");
    }
}
