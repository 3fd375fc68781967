//! What the running kernel offers the probes, one feature at a time: each program's tracepoint
//! and the fields it reads (from tracefs `format` files), the optional `group_dead` field of
//! `sched_process_exit`, and `task_struct.exit_code` from BTF. A kernel that lacks an optional
//! feature loses that feature only; the cgroup tracepoints are the one thing the source cannot
//! do without (they tell which cgroups are containers' and where their inits are tracked).
//!
//! Signedness and sizes in the format files differ between kernels (6.1 says `signed:1` for
//! `char comm[16]` and `__data_loc` fields, later kernels 0); only offsets matter here.

use plegd_common::{PROBE_EXIT_CODE, PROBE_GROUP_DEAD, ProbeConfig, tracepoint_offsets as tp};

use crate::sources::ebpf::btf::{self, BtfError};

/// One program: its name in the object, its tracepoint, the fields it reads at fixed offsets,
/// and what is lost without it.
#[derive(Debug)]
pub struct ProgramSpec {
    pub name: &'static str,
    pub category: &'static str,
    pub tracepoint: &'static str,
    fields: &'static [(&'static str, usize)],
    /// `None`: the source cannot run without it. `Some(loss)`: what users lose without it.
    pub without: Option<&'static str>,
}

const CGROUP_FIELDS: &[(&str, usize)] = &[
    ("root", tp::CGROUP_ROOT),
    ("level", tp::CGROUP_LEVEL),
    ("id", tp::CGROUP_ID),
    ("path", tp::CGROUP_PATH),
];

/// Every program of the eBPF object.
pub const PROGRAMS: &[ProgramSpec] = &[
    ProgramSpec {
        name: "cgroup_mkdir",
        category: "cgroup",
        tracepoint: "cgroup_mkdir",
        fields: CGROUP_FIELDS,
        without: None,
    },
    ProgramSpec {
        name: "cgroup_rmdir",
        category: "cgroup",
        tracepoint: "cgroup_rmdir",
        fields: CGROUP_FIELDS,
        without: None,
    },
    ProgramSpec {
        name: "sched_process_exec",
        category: "sched",
        tracepoint: "sched_process_exec",
        fields: &[("filename", tp::EXEC_FILENAME)],
        without: Some("no start hints: starts are found by the relist and the runtime streams"),
    },
    ProgramSpec {
        name: "sched_process_exit",
        category: "sched",
        tracepoint: "sched_process_exit",
        fields: &[],
        without: Some("no exit hints: deaths are found by the relist and the runtime streams"),
    },
    ProgramSpec {
        name: "mark_victim",
        category: "oom",
        tracepoint: "mark_victim",
        fields: &[("pid", tp::OOM_PID)],
        without: Some("no OOM-kill observations (the runtime's reason still says OOMKilled)"),
    },
];

/// Whether one program can attach here.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Support {
    Yes,
    No(String),
}

/// What the running kernel offers, as read by [`KernelFeatures::probe`].
#[derive(Debug)]
pub struct KernelFeatures {
    /// One entry per [`PROGRAMS`] entry, in order.
    pub programs: Vec<(&'static ProgramSpec, Support)>,
    /// Offset of `group_dead` in `sched_process_exit`, where the kernel has it (about 6.16 on).
    pub group_dead: Option<usize>,
    /// Offset of `task_struct.exit_code`, or why it is unknown.
    pub exit_code: Result<u32, BtfError>,
}

impl KernelFeatures {
    /// Reads tracefs under `tracefs` and the kernel's BTF.
    pub fn probe(tracefs: &str) -> Self {
        Self::from_formats(
            |tracepoint| {
                std::fs::read_to_string(format!("{tracefs}/events/{tracepoint}/format")).ok()
            },
            btf::running_kernel_exit_code_offset(),
        )
    }

    /// Decides each feature from the format files `format` returns (`None`: no such
    /// tracepoint) and the BTF lookup's result.
    pub fn from_formats(
        format: impl Fn(&str) -> Option<String>,
        exit_code: Result<u32, BtfError>,
    ) -> Self {
        let mut group_dead = None;
        let programs = PROGRAMS
            .iter()
            .map(|spec| {
                let tracepoint = format!("{}/{}", spec.category, spec.tracepoint);
                let Some(text) = format(&tracepoint) else {
                    return (spec, Support::No(format!("no tracepoint {tracepoint}")));
                };
                if spec.name == "sched_process_exit" {
                    group_dead = field_offset(&text, "group_dead");
                }
                let misplaced: Vec<String> = spec
                    .fields
                    .iter()
                    .filter_map(|&(field, expected)| match field_offset(&text, field) {
                        Some(found) if found == expected => None,
                        Some(found) => Some(format!("{field} at {found}, expected {expected}")),
                        None => Some(format!("{field} missing")),
                    })
                    .collect();
                if misplaced.is_empty() {
                    (spec, Support::Yes)
                } else {
                    let why = format!("tracepoint {tracepoint}: {}", misplaced.join(", "));
                    (spec, Support::No(why))
                }
            })
            .collect();
        Self {
            programs,
            group_dead,
            exit_code,
        }
    }

    /// Why the source cannot run at all here: a required program cannot attach.
    pub fn fatal(&self) -> Option<&str> {
        self.programs
            .iter()
            .find_map(|(spec, support)| match support {
                Support::No(why) if spec.without.is_none() => Some(why.as_str()),
                _ => None,
            })
    }

    /// The programs to load and attach.
    pub fn attachable(&self) -> impl Iterator<Item = &'static ProgramSpec> + '_ {
        self.programs
            .iter()
            .filter(|(_, support)| *support == Support::Yes)
            .map(|(spec, _)| *spec)
    }

    /// The programs' view of these features.
    pub fn probe_config(&self) -> ProbeConfig {
        let mut config = ProbeConfig::default();
        if let Ok(offset) = self.exit_code {
            config.task_exit_code = offset;
            config.flags |= PROBE_EXIT_CODE;
        }
        if let Some(offset) = self.group_dead {
            // A tracepoint record is far smaller than 4 GiB.
            config.exit_group_dead = offset as u32;
            config.flags |= PROBE_GROUP_DEAD;
        }
        config
    }

    /// One line per feature: (subject, available, detail), for `plegd check` and the logs.
    pub fn describe(&self) -> Vec<(String, bool, String)> {
        let mut lines: Vec<(String, bool, String)> = self
            .programs
            .iter()
            .map(|(spec, support)| {
                let subject = format!("probe {}", spec.name);
                let tracepoint = format!("{}/{}", spec.category, spec.tracepoint);
                match (support, spec.without) {
                    (Support::Yes, _) => (subject, true, tracepoint),
                    (Support::No(why), Some(loss)) => (subject, false, format!("{why}: {loss}")),
                    (Support::No(why), None) => {
                        (subject, false, format!("{why}: required, eBPF off"))
                    }
                }
            })
            .collect();
        lines.push(match self.group_dead {
            Some(offset) => (
                "exit group_dead".into(),
                true,
                format!("sched_process_exit.group_dead at {offset}: exits are whole processes"),
            ),
            None => (
                "exit group_dead".into(),
                false,
                "sched_process_exit has no group_dead (kernels before ~6.16): a process's main \
                 thread exit stands for the process's"
                    .into(),
            ),
        });
        lines.push(match &self.exit_code {
            Ok(offset) => (
                "exit status".into(),
                true,
                format!("task_struct.exit_code at {offset} (BTF): exits carry their status"),
            ),
            Err(e) => (
                "exit status".into(),
                false,
                format!("{e}: exits carry no status (the runtime's exit code still does)"),
            ),
        });
        lines
    }
}

/// The offset of `field` in a tracefs `format` file.
fn field_offset(format: &str, field: &str) -> Option<usize> {
    format.lines().find_map(|line| {
        let declaration = line.trim().strip_prefix("field:")?;
        let (declaration, rest) = declaration.split_once(';')?;
        let name = declaration.rsplit(' ').next()?.split('[').next()?;
        if name != field {
            return None;
        }
        rest.trim()
            .strip_prefix("offset:")?
            .split(';')
            .next()?
            .parse()
            .ok()
    })
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    /// The formats of Debian 12's 6.1 kernel: no group_dead, `signed:1` on strings.
    fn formats_6_1() -> HashMap<&'static str, &'static str> {
        let cgroup = "format:\n\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\tfield:int root;\toffset:8;\tsize:4;\tsigned:1;\n\tfield:int level;\toffset:12;\tsize:4;\tsigned:1;\n\tfield:u64 id;\toffset:16;\tsize:8;\tsigned:0;\n\tfield:__data_loc char[] path;\toffset:24;\tsize:4;\tsigned:1;\n";
        HashMap::from([
            ("cgroup/cgroup_mkdir", cgroup),
            ("cgroup/cgroup_rmdir", cgroup),
            (
                "sched/sched_process_exec",
                "format:\n\tfield:__data_loc char[] filename;\toffset:8;\tsize:4;\tsigned:1;\n\tfield:pid_t pid;\toffset:12;\tsize:4;\tsigned:1;\n",
            ),
            (
                "sched/sched_process_exit",
                "format:\n\tfield:char comm[16];\toffset:8;\tsize:16;\tsigned:1;\n\tfield:pid_t pid;\toffset:24;\tsize:4;\tsigned:1;\n\tfield:int prio;\toffset:28;\tsize:4;\tsigned:1;\n",
            ),
            (
                "oom/mark_victim",
                "format:\n\tfield:int pid;\toffset:8;\tsize:4;\tsigned:1;\n",
            ),
        ])
    }

    fn features(
        formats: &HashMap<&'static str, &'static str>,
        exit_code: Result<u32, BtfError>,
    ) -> KernelFeatures {
        KernelFeatures::from_formats(|tp| formats.get(tp).map(|s| (*s).to_owned()), exit_code)
    }

    #[test]
    fn a_6_1_kernel_attaches_every_program_and_lacks_only_group_dead() {
        let features = features(&formats_6_1(), Ok(2404));
        assert_eq!(features.fatal(), None);
        assert_eq!(features.attachable().count(), PROGRAMS.len());
        assert_eq!(features.group_dead, None);
        let config = features.probe_config();
        assert_eq!(config.flags, PROBE_EXIT_CODE);
        assert_eq!(config.task_exit_code, 2404);
    }

    #[test]
    fn group_dead_is_used_where_the_kernel_has_it() {
        let mut formats = formats_6_1();
        formats.insert(
            "sched/sched_process_exit",
            "format:\n\tfield:char comm[16];\toffset:8;\tsize:16;\tsigned:0;\n\tfield:bool group_dead;\toffset:32;\tsize:1;\tsigned:0;\n",
        );
        let features = features(
            &formats,
            Err(BtfError::MissingStruct {
                name: "task_struct",
            }),
        );
        assert_eq!(features.group_dead, Some(32));
        let config = features.probe_config();
        assert_eq!(config.flags, PROBE_GROUP_DEAD);
        assert_eq!(config.exit_group_dead, 32);
        let lines = features.describe();
        assert!(lines.iter().any(|(s, ok, _)| s == "exit status" && !ok));
    }

    #[test]
    fn a_missing_optional_tracepoint_costs_only_its_program() {
        let mut formats = formats_6_1();
        formats.remove("oom/mark_victim");
        let features = features(&formats, Ok(8));
        assert_eq!(features.fatal(), None);
        let names: Vec<&str> = features.attachable().map(|p| p.name).collect();
        assert!(!names.contains(&"mark_victim"));
        assert_eq!(names.len(), PROGRAMS.len() - 1);
        let (_, ok, detail) = features
            .describe()
            .into_iter()
            .find(|(s, _, _)| s == "probe mark_victim")
            .unwrap();
        assert!(!ok);
        assert!(detail.contains("no tracepoint oom/mark_victim"), "{detail}");
    }

    #[test]
    fn a_moved_required_field_is_fatal_and_says_where() {
        let mut formats = formats_6_1();
        formats.insert(
            "cgroup/cgroup_mkdir",
            "format:\n\tfield:int root;\toffset:8;\tsize:4;\tsigned:1;\n\tfield:int level;\toffset:16;\tsize:4;\tsigned:1;\n",
        );
        let features = features(&formats, Ok(8));
        let fatal = features.fatal().unwrap();
        assert!(fatal.contains("level at 16, expected 12"), "{fatal}");
        assert!(fatal.contains("id missing"), "{fatal}");
    }

    #[test]
    fn field_offsets_are_read_from_format_files() {
        let format = "name: cgroup_mkdir\nID: 1\nformat:\n\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\tfield:int root;\toffset:8;\tsize:4;\tsigned:1;\n\tfield:__data_loc char[] path;\toffset:24;\tsize:4;\tsigned:0;\n\tfield:char comm[16];\toffset:8;\tsize:16;\tsigned:0;\n";
        assert_eq!(field_offset(format, "root"), Some(8));
        assert_eq!(field_offset(format, "path"), Some(24));
        assert_eq!(field_offset(format, "comm"), Some(8));
        assert_eq!(field_offset(format, "level"), None);
    }
}
