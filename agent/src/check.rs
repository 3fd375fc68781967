//! `plegd check`: what this node offers plegd, and which mode `--mode auto` would run in.

use std::{fmt::Write as _, path::Path};

use crate::{
    runtime::endpoint,
    sources::ebpf::{self, Probes, btf::KernelOffsets, index::CgroupMode},
};

/// One line of the report: a subject, whether it is fine, and what was found.
struct Line {
    subject: &'static str,
    ok: bool,
    detail: String,
}

/// Probes the node and renders the report; the second value is whether eBPF would be used.
pub fn report() -> (String, bool) {
    let mut lines = Vec::new();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|r| r.trim().to_owned())
        .unwrap_or_else(|e| format!("unknown ({e})"));
    lines.push(Line {
        subject: "kernel",
        ok: true,
        detail: kernel,
    });
    lines.push(match KernelOffsets::from_running_kernel() {
        Ok(_) => Line {
            subject: "BTF",
            ok: true,
            detail: "/sys/kernel/btf/vmlinux (task_struct offsets found: exits carry their status)"
                .into(),
        },
        Err(e) => Line {
            subject: "BTF",
            ok: false,
            detail: format!("unusable: {e} (exits would carry no status)"),
        },
    });
    let missing: Vec<String> = ebpf::TRACEPOINTS
        .iter()
        .filter(|(_, category, name)| {
            !Path::new(&format!("/sys/kernel/tracing/events/{category}/{name}")).exists()
        })
        .map(|(_, category, name)| format!("{category}/{name}"))
        .collect();
    lines.push(Line {
        subject: "tracepoints",
        ok: missing.is_empty(),
        detail: if missing.is_empty() {
            let names: Vec<String> = ebpf::TRACEPOINTS
                .iter()
                .map(|(_, c, n)| format!("{c}/{n}"))
                .collect();
            names.join(", ")
        } else {
            format!("missing (or tracefs not mounted): {}", missing.join(", "))
        },
    });
    lines.push(match CgroupMode::detect() {
        CgroupMode::V1 => Line {
            subject: "cgroups",
            ok: false,
            detail: "v1 only: no cgroup2 ids for the probes".into(),
        },
        CgroupMode::Hybrid { cgroup2 } => Line {
            subject: "cgroups",
            ok: true,
            detail: format!("hybrid (v1 controllers, cgroup2 at {})", cgroup2.display()),
        },
        CgroupMode::V2 { cgroup2 } => Line {
            subject: "cgroups",
            ok: true,
            detail: format!("cgroup2 at {}", cgroup2.display()),
        },
    });
    lines.push(match endpoint::detect(&endpoint::WELL_KNOWN_SOCKETS) {
        Ok(socket) => Line {
            subject: "runtime socket",
            ok: true,
            detail: socket.display().to_string(),
        },
        Err(e) => Line {
            subject: "runtime socket",
            ok: false,
            detail: e.to_string(),
        },
    });
    let (ebpf_ok, load) = match Probes::load() {
        Ok(probes) => (
            true,
            format!("{} programs load and attach", probes.program_names().len()),
        ),
        Err(e) => (false, e.to_string()),
    };
    lines.push(Line {
        subject: "eBPF probes",
        ok: ebpf_ok,
        detail: load,
    });
    lines.push(Line {
        subject: "--mode auto",
        ok: true,
        detail: if ebpf_ok {
            "ebpf (kernel probes trigger targeted relists; full relist slowed while healthy)".into()
        } else {
            "polling (full relist every period; stream sources still used if available)".into()
        },
    });
    (render(&lines), ebpf_ok)
}

fn render(lines: &[Line]) -> String {
    let mut out = String::new();
    for line in lines {
        let mark = if line.ok { "ok " } else { "NO " };
        let _ = writeln!(out, "{mark} {:<15} {}", line.subject, line.detail);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_report_names_every_subject() {
        let (report, _) = report();
        for subject in [
            "kernel",
            "BTF",
            "tracepoints",
            "cgroups",
            "runtime socket",
            "eBPF probes",
            "--mode auto",
        ] {
            assert!(
                report.contains(subject),
                "{subject} missing from:\n{report}"
            );
        }
    }

    #[test]
    fn lines_are_marked_and_aligned() {
        let text = render(&[
            Line {
                subject: "a",
                ok: true,
                detail: "fine".into(),
            },
            Line {
                subject: "b",
                ok: false,
                detail: "broken".into(),
            },
        ]);
        assert_eq!(
            text,
            format!("ok  {:<15} fine\nNO  {:<15} broken\n", "a", "b")
        );
    }
}
