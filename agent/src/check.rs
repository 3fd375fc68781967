//! `plegd check`: what this node offers plegd, and which mode `--mode auto` would run in.

use std::fmt::Write as _;

use crate::{
    runtime::choice::{WELL_KNOWN_SOCKETS, detect},
    sources::ebpf::{Probes, TRACEFS, features::KernelFeatures, index::CgroupMode},
};

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

/// Probes the node and renders the report; the second value is whether eBPF would be used.
pub fn report() -> (String, bool) {
    let mut lines = Vec::new();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|r| r.trim().to_owned())
        .unwrap_or_else(|e| format!("unknown ({e})"));
    lines.push(Line::new("kernel", true, kernel));
    if std::path::Path::new(TRACEFS).join("events").is_dir() {
        // What each probe needs, feature by feature.
        for (subject, ok, detail) in KernelFeatures::probe(TRACEFS).describe() {
            lines.push(Line::new(subject, ok, detail));
        }
    } else {
        lines.push(Line::new(
            "tracefs",
            false,
            format!("not mounted at {TRACEFS} (mount -t tracefs tracefs {TRACEFS})"),
        ));
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
    lines.push(match detect(&WELL_KNOWN_SOCKETS) {
        Ok(socket) => Line::new("runtime socket", true, socket.display().to_string()),
        Err(e) => Line::new("runtime socket", false, e.to_string()),
    });
    let (ebpf_ok, load) = match Probes::load(crate::sources::ebpf::DEFAULT_RING_BYTES) {
        Ok(probes) => (
            true,
            format!(
                "{} programs load and attach: {}",
                probes.program_names().len(),
                probes.program_names().join(", ")
            ),
        ),
        Err(e) => (false, e.to_string()),
    };
    lines.push(Line::new("eBPF probes", ebpf_ok, load));
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
}
