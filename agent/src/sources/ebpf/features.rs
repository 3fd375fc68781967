//! What the running kernel offers the probes, one probe at a time, and how each attaches.
//!
//! Each probe has two programs. The raw tracepoint program reads the tracepoint's arguments
//! (the kernel's own structs, at offsets from BTF) and attaches through `bpf(2)`
//! (`BPF_RAW_TRACEPOINT_OPEN`): CAP_BPF and CAP_PERFMON suffice. The classic one reads the
//! tracefs record and attaches through `perf_event_open(2)`, which a kernel built with
//! `CONFIG_SECURITY_PERF_EVENTS_RESTRICT` and running with `kernel.perf_event_paranoid` 3
//! (Debian's 5.10, 6.1 and 6.12, as installed) grants only to CAP_SYS_ADMIN. The raw one is
//! preferred where the kernel's BTF has the tracepoint's prototype and every member it reads;
//! the classic one stays the fallback, where its tracefs fields are where it reads them. A
//! kernel that lacks both for an optional probe loses that probe only; the cgroup probes are
//! the one thing the source cannot do without (they tell which cgroups are containers' and
//! where their inits are tracked).
//!
//! Argument lists differ between kernels: `sched_process_exit` gained `group_dead` in ~6.16
//! (a program of its own: a raw program that reads past the arguments does not attach), and
//! `mark_victim` passes the victim's task rather than its pid since 6.9 (and in the stable
//! releases the change went back to). Signedness and sizes in the tracefs format files differ
//! too (6.1 says `signed:1` for `char comm[16]` and `__data_loc` fields, later kernels 0);
//! only offsets matter here.

use plegd_common::{
    PROBE_EXIT_CODE, PROBE_GROUP_DEAD, PROBE_OOM_MEMCG, PROBE_OOM_TASK, ProbeConfig,
    tracepoint_offsets as tp,
};

use crate::sources::ebpf::btf::{Arg, BtfError, KernelTypes, Types};

/// Fits a probe's raw program to the kernel's types: the program, with the offsets it reads
/// written into the config; or why it does not fit.
type RawFit = fn(&dyn Types, &mut ProbeConfig) -> Result<&'static str, String>;

/// One probe: its classic program's name (the probe's name), its tracepoint, the fields the
/// classic program reads at fixed offsets, how its raw program fits, and what is lost without
/// it.
#[derive(Debug)]
pub struct ProgramSpec {
    pub name: &'static str,
    pub category: &'static str,
    pub tracepoint: &'static str,
    fields: &'static [(&'static str, usize)],
    raw: RawFit,
    /// `None`: the source cannot run without it. `Some(loss)`: what users lose without it.
    pub without: Option<&'static str>,
}

const CGROUP_FIELDS: &[(&str, usize)] = &[
    ("root", tp::CGROUP_ROOT),
    ("level", tp::CGROUP_LEVEL),
    ("id", tp::CGROUP_ID),
    ("path", tp::CGROUP_PATH),
];

/// Every probe of the eBPF object.
pub const PROGRAMS: &[ProgramSpec] = &[
    ProgramSpec {
        name: "cgroup_mkdir",
        category: "cgroup",
        tracepoint: "cgroup_mkdir",
        fields: CGROUP_FIELDS,
        raw: |types, config| raw_cgroup(types, config, "cgroup_mkdir", "cgroup_mkdir_raw"),
        without: None,
    },
    ProgramSpec {
        name: "cgroup_rmdir",
        category: "cgroup",
        tracepoint: "cgroup_rmdir",
        fields: CGROUP_FIELDS,
        raw: |types, config| raw_cgroup(types, config, "cgroup_rmdir", "cgroup_rmdir_raw"),
        without: None,
    },
    ProgramSpec {
        name: "sched_process_exec",
        category: "sched",
        tracepoint: "sched_process_exec",
        fields: &[("filename", tp::EXEC_FILENAME)],
        raw: raw_exec,
        without: Some("no start hints: starts are found by the relist and the runtime streams"),
    },
    ProgramSpec {
        name: "sched_process_exit",
        category: "sched",
        tracepoint: "sched_process_exit",
        fields: &[],
        raw: raw_exit,
        without: Some("no exit hints: deaths are found by the relist and the runtime streams"),
    },
    ProgramSpec {
        name: "mark_victim",
        category: "oom",
        tracepoint: "mark_victim",
        fields: &[("pid", tp::OOM_PID)],
        raw: raw_oom,
        without: Some("no OOM-kill observations (the runtime's reason still says OOMKilled)"),
    },
];

/// Every program name of the object a probe may load, raw ones first: what the kernel's
/// program list can show of plegd.
pub const PROGRAM_NAMES: &[&str] = &[
    "cgroup_mkdir_raw",
    "cgroup_rmdir_raw",
    "sched_process_exec_raw",
    "sched_process_exit_raw_group",
    "sched_process_exit_raw",
    "mark_victim_raw",
    "cgroup_mkdir",
    "cgroup_rmdir",
    "sched_process_exec",
    "sched_process_exit",
    "mark_victim",
];

/// `cgroup_mkdir|rmdir(struct cgroup *cgrp, const char *path)`.
fn raw_cgroup(
    types: &dyn Types,
    config: &mut ProbeConfig,
    tracepoint: &'static str,
    program: &'static str,
) -> Result<&'static str, String> {
    expect_args(types, tracepoint, &[&[Arg::Pointer, Arg::Pointer]])?;
    config.cgroup_root = offset(types, "cgroup", "root")?;
    config.root_hierarchy_id = offset(types, "cgroup_root", "hierarchy_id")?;
    config.cgroup_level = offset(types, "cgroup", "level")?;
    config.cgroup_kn = offset(types, "cgroup", "kn")?;
    config.kn_id = offset(types, "kernfs_node", "id")?;
    Ok(program)
}

/// `sched_process_exec(struct task_struct *p, pid_t old_pid, struct linux_binprm *bprm)`.
fn raw_exec(types: &dyn Types, config: &mut ProbeConfig) -> Result<&'static str, String> {
    expect_args(
        types,
        "sched_process_exec",
        &[&[Arg::Pointer, Arg::Integer, Arg::Pointer]],
    )?;
    config.bprm_filename = offset(types, "linux_binprm", "filename")?;
    Ok("sched_process_exec_raw")
}

/// `sched_process_exit(struct task_struct *p)`, with `bool group_dead` after it since ~6.16.
fn raw_exit(types: &dyn Types, _: &mut ProbeConfig) -> Result<&'static str, String> {
    let args = expect_args(
        types,
        "sched_process_exit",
        &[&[Arg::Pointer], &[Arg::Pointer, Arg::Integer]],
    )?;
    Ok(if args.len() == 2 {
        "sched_process_exit_raw_group"
    } else {
        "sched_process_exit_raw"
    })
}

/// `mark_victim(int pid)`; since 6.9 `mark_victim(struct task_struct *task, uid_t uid)`.
/// The memory cgroup offsets ([`memcg_offsets`]) are the OOM scope's: without them the probe
/// still attaches, and its kills carry no scope.
fn raw_oom(types: &dyn Types, config: &mut ProbeConfig) -> Result<&'static str, String> {
    let args = expect_args(
        types,
        "mark_victim",
        &[&[Arg::Integer], &[Arg::Pointer, Arg::Integer]],
    )?;
    if args[0] == Arg::Pointer {
        config.task_pid = offset(types, "task_struct", "pid")?;
        config.flags |= PROBE_OOM_TASK;
    }
    let mut memcg = *config;
    if memcg_offsets(types, &mut memcg).is_ok() {
        *config = ProbeConfig {
            flags: config.flags | PROBE_OOM_MEMCG,
            ..memcg
        };
    }
    Ok("mark_victim_raw")
}

/// The offsets an OOM's memory cgroup chains are read at: a task's tgid, comm, cgroup2 cgroup
/// and memory cgroup; a memory cgroup's parent, cgroup, usage, limit and local OOM count.
pub fn memcg_offsets(types: &dyn Types, config: &mut ProbeConfig) -> Result<(), String> {
    let enum_value = |name, value| types.enum_value(name, value).map_err(|e| e.to_string());
    let memory = enum_value("cgroup_subsys_id", "memory_cgrp_id")?;
    let oom = enum_value("memcg_memory_event", "MEMCG_OOM")?;
    // The programs take a memory cgroup's css for the memory cgroup itself.
    let css = offset(types, "mem_cgroup", "css")?;
    if css != 0 {
        return Err(format!("mem_cgroup.css at {css}, not first"));
    }
    let path = |name, member, index| {
        types
            .path_offset(name, member, index)
            .map_err(|e| e.to_string())
    };
    config.task_tgid = offset(types, "task_struct", "tgid")?;
    config.task_comm = offset(types, "task_struct", "comm")?;
    config.task_cgroups = offset(types, "task_struct", "cgroups")?;
    config.css_set_dfl_cgrp = offset(types, "css_set", "dfl_cgrp")?;
    config.css_set_memcg = path("css_set", "subsys", Some(memory))?;
    config.css_parent = offset(types, "cgroup_subsys_state", "parent")?;
    config.css_cgroup = offset(types, "cgroup_subsys_state", "cgroup")?;
    config.memcg_usage = path("mem_cgroup", "memory.usage", None)?;
    config.memcg_max = path("mem_cgroup", "memory.max", None)?;
    config.memcg_oom_events = path("mem_cgroup", "memory_events_local", Some(oom))?;
    config.cgroup_level = offset(types, "cgroup", "level")?;
    config.cgroup_kn = offset(types, "cgroup", "kn")?;
    config.kn_id = offset(types, "kernfs_node", "id")?;
    Ok(())
}

/// The tracepoint's arguments, if they are one of `known`.
fn expect_args(
    types: &dyn Types,
    tracepoint: &'static str,
    known: &[&[Arg]],
) -> Result<Vec<Arg>, String> {
    let args = types
        .tracepoint_args(tracepoint)
        .map_err(|e| e.to_string())?;
    if known.contains(&args.as_slice()) {
        Ok(args)
    } else {
        Err(format!(
            "{tracepoint}'s arguments are {args:?}, a prototype the raw program does not know"
        ))
    }
}

fn offset(types: &dyn Types, name: &'static str, member: &'static str) -> Result<u32, String> {
    types.member_offset(name, member).map_err(|e| e.to_string())
}

/// Whether one way of attaching a probe fits here.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Support {
    Yes,
    No(String),
}

/// How a probe attaches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attach {
    /// Its raw tracepoint program, through `BPF_RAW_TRACEPOINT_OPEN`.
    Raw(&'static str),
    /// Its classic tracepoint program, through `perf_event_open`.
    Classic,
}

impl Attach {
    /// The program it loads.
    pub fn program(self, spec: &ProgramSpec) -> &'static str {
        match self {
            Self::Raw(program) => program,
            Self::Classic => spec.name,
        }
    }

    /// How it attaches, for people.
    pub fn describe(self, spec: &ProgramSpec) -> String {
        match self {
            Self::Raw(program) => format!(
                "raw tracepoint {} ({program}, BPF_RAW_TRACEPOINT_OPEN: no perf_event_open)",
                spec.tracepoint
            ),
            Self::Classic => format!(
                "tracepoint {}/{} (perf_event_open)",
                spec.category, spec.tracepoint
            ),
        }
    }
}

/// One probe on this kernel: its raw program, or why none fits; whether its classic one fits.
#[derive(Debug)]
pub struct Probe {
    pub spec: &'static ProgramSpec,
    pub raw: Result<&'static str, String>,
    pub classic: Support,
}

impl Probe {
    /// Its line of [`KernelFeatures::describe`]: which program serves it, and its fallback.
    fn describe(&self) -> (String, bool, String) {
        let subject = format!("probe {}", self.spec.name);
        let tracepoint = format!("{}/{}", self.spec.category, self.spec.tracepoint);
        let classic = match &self.classic {
            Support::Yes => format!("else tracepoint {tracepoint} (perf_event_open)"),
            Support::No(why) => format!("no tracepoint fallback: {why}"),
        };
        match (&self.raw, self.unavailable(), self.spec.without) {
            (Ok(program), _, _) => (
                subject,
                true,
                format!("raw tracepoint ({program}, BTF); {classic}"),
            ),
            (Err(raw), None, _) => (
                subject,
                true,
                format!(
                    "tracepoint {tracepoint} through perf_event_open (needs CAP_SYS_ADMIN \
                     where perf_event_paranoid is 3); no raw tracepoint: {raw}"
                ),
            ),
            (_, Some(why), Some(loss)) => (subject, false, format!("{why}: {loss}")),
            (_, Some(why), None) => (subject, false, format!("{why}: required, eBPF off")),
        }
    }

    /// The ways to attach it, in the order to try them.
    pub fn choices(&self) -> impl Iterator<Item = Attach> + '_ {
        let raw = self.raw.as_ref().ok().map(|&program| Attach::Raw(program));
        let classic = (self.classic == Support::Yes).then_some(Attach::Classic);
        raw.into_iter().chain(classic)
    }

    /// Why it cannot attach at all, if so.
    pub fn unavailable(&self) -> Option<String> {
        match (&self.raw, &self.classic) {
            (Err(raw), Support::No(classic)) => {
                Some(format!("raw tracepoint: {raw}; tracepoint: {classic}"))
            }
            _ => None,
        }
    }
}

/// What the running kernel offers, as read by [`KernelFeatures::probe`].
#[derive(Debug)]
pub struct KernelFeatures {
    /// One entry per [`PROGRAMS`] entry, in order.
    pub probes: Vec<Probe>,
    /// Offset of `group_dead` in the classic `sched_process_exit` record, where the kernel has
    /// it (about 6.16 on).
    pub group_dead: Option<usize>,
    /// Offset of `task_struct.exit_code`, or why it is unknown.
    pub exit_code: Result<u32, BtfError>,
    /// The offsets the raw programs read, and their flags.
    raw_config: ProbeConfig,
}

impl KernelFeatures {
    /// Reads tracefs under `tracefs` and the kernel's BTF.
    pub fn probe(tracefs: &str) -> Self {
        let mounted = std::path::Path::new(tracefs).join("events").is_dir();
        let types = KernelTypes::running().map_err(|e| e.to_string());
        Self::from_parts(
            |tracepoint| {
                if !mounted {
                    return Err(format!(
                        "tracefs is not mounted at {tracefs} (mount -t tracefs tracefs {tracefs})"
                    ));
                }
                std::fs::read_to_string(format!("{tracefs}/events/{tracepoint}/format"))
                    .map_err(|_| format!("no tracepoint {tracepoint}"))
            },
            types.as_ref().map(|t| t as &dyn Types),
        )
    }

    /// Decides each probe from the format files `format` returns (`Err`: why there is none)
    /// and the kernel's types (`Err`: why there are none).
    pub fn from_parts(
        format: impl Fn(&str) -> Result<String, String>,
        types: Result<&dyn Types, &String>,
    ) -> Self {
        let mut group_dead = None;
        let mut raw_config = ProbeConfig::default();
        let probes = PROGRAMS
            .iter()
            .map(|spec| {
                let raw = match types {
                    Ok(types) => (spec.raw)(types, &mut raw_config),
                    Err(e) => Err(e.to_string()),
                };
                let tracepoint = format!("{}/{}", spec.category, spec.tracepoint);
                let classic = match format(&tracepoint) {
                    Err(why) => Support::No(why),
                    Ok(text) => {
                        if spec.name == "sched_process_exit" {
                            group_dead = field_offset(&text, "group_dead");
                        }
                        classic_support(spec, &tracepoint, &text)
                    }
                };
                Probe { spec, raw, classic }
            })
            .collect();
        let exit_code = match types {
            Ok(types) => types.member_offset("task_struct", "exit_code"),
            Err(e) => Err(BtfError::Unreadable(e.clone())),
        };
        Self {
            probes,
            group_dead,
            exit_code,
            raw_config,
        }
    }

    /// Why the source cannot run at all here: a required probe can attach in no way.
    pub fn fatal(&self) -> Option<String> {
        self.probes.iter().find_map(|probe| {
            probe
                .spec
                .without
                .is_none()
                .then(|| probe.unavailable())
                .flatten()
                .map(|why| format!("probe {}: {why}", probe.spec.name))
        })
    }

    /// The programs' view of these features.
    pub fn probe_config(&self) -> ProbeConfig {
        let mut config = self.raw_config;
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
        let mut lines: Vec<(String, bool, String)> =
            self.probes.iter().map(Probe::describe).collect();
        lines.push(self.describe_group_dead());
        lines.push(self.describe_oom_scope());
        lines.push(self.describe_exit_status());
        lines
    }

    fn describe_group_dead(&self) -> (String, bool, String) {
        let exit = self
            .probes
            .iter()
            .find(|p| p.spec.name == "sched_process_exit");
        let raw_group = exit.is_some_and(|p| p.raw == Ok("sched_process_exit_raw_group"));
        match self.group_dead {
            _ if raw_group => (
                "exit group_dead".into(),
                true,
                "sched_process_exit's group_dead argument: exits are whole processes".into(),
            ),
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
        }
    }

    fn describe_oom_scope(&self) -> (String, bool, String) {
        let oom = self.probes.iter().find(|p| p.spec.name == "mark_victim");
        let oom_raw = oom.is_some_and(|p| p.raw.is_ok());
        match (oom_raw, self.raw_config.flags & PROBE_OOM_MEMCG != 0) {
            (true, true) => (
                "oom scope".into(),
                true,
                "memory cgroup chains read at each OOM kill (BTF): kills say which limit".into(),
            ),
            (true, false) => (
                "oom scope".into(),
                false,
                "the kernel's BTF lacks a memory cgroup member the OOM probe reads: kills carry \
                 no scope"
                    .into(),
            ),
            (false, _) => (
                "oom scope".into(),
                false,
                "no raw mark_victim program: kills carry no scope".into(),
            ),
        }
    }

    fn describe_exit_status(&self) -> (String, bool, String) {
        match &self.exit_code {
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
        }
    }
}

/// Whether the classic program of `spec` finds its fields where it reads them in `format`.
fn classic_support(spec: &ProgramSpec, tracepoint: &str, format: &str) -> Support {
    let misplaced: Vec<String> = spec
        .fields
        .iter()
        .filter_map(|&(field, expected)| match field_offset(format, field) {
            Some(found) if found == expected => None,
            Some(found) => Some(format!("{field} at {found}, expected {expected}")),
            None => Some(format!("{field} missing")),
        })
        .collect();
    if misplaced.is_empty() {
        Support::Yes
    } else {
        Support::No(format!("tracepoint {tracepoint}: {}", misplaced.join(", ")))
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
mod tests;
