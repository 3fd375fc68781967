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

/// A kernel's types as the probes ask for them.
#[derive(Default)]
struct FakeTypes {
    members: HashMap<(&'static str, &'static str), u32>,
    prototypes: HashMap<&'static str, Vec<Arg>>,
    enums: HashMap<(&'static str, &'static str), u32>,
}

impl Types for FakeTypes {
    /// Arrays here hold 8-byte elements (pointers, `atomic_long_t`).
    fn path_offset(
        &self,
        name: &'static str,
        member: &'static str,
        index: Option<u32>,
    ) -> Result<u32, BtfError> {
        self.members
            .get(&(name, member))
            .map(|offset| offset + index.unwrap_or(0) * 8)
            .ok_or(BtfError::MissingMember { name, member })
    }

    fn enum_value(&self, name: &'static str, value: &'static str) -> Result<u32, BtfError> {
        self.enums
            .get(&(name, value))
            .copied()
            .ok_or(BtfError::MissingEnumValue { name, value })
    }

    fn tracepoint_args(&self, tracepoint: &'static str) -> Result<Vec<Arg>, BtfError> {
        self.prototypes
            .get(tracepoint)
            .cloned()
            .ok_or(BtfError::MissingPrototype { tracepoint })
    }
}

/// Types like 6.1's (Debian 12): mark_victim passes a pid (before the 6.1.x backport), exit
/// no group_dead; the offsets of this machine's 6.18.
fn types_6_1() -> FakeTypes {
    use Arg::{Integer, Pointer};
    FakeTypes {
        members: HashMap::from([
            (("task_struct", "exit_code"), 1164),
            (("task_struct", "pid"), 1264),
            (("cgroup", "root"), 696),
            (("cgroup_root", "hierarchy_id"), 12),
            (("cgroup", "level"), 216),
            (("cgroup", "kn"), 256),
            (("kernfs_node", "id"), 96),
            (("linux_binprm", "filename"), 96),
        ]),
        prototypes: HashMap::from([
            ("cgroup_mkdir", vec![Pointer, Pointer]),
            ("cgroup_rmdir", vec![Pointer, Pointer]),
            ("sched_process_exec", vec![Pointer, Integer, Pointer]),
            ("sched_process_exit", vec![Pointer]),
            ("mark_victim", vec![Integer]),
        ]),
        enums: HashMap::new(),
    }
}

/// [`types_6_1`] with the memory cgroup members and enums the OOM probe reads (this
/// machine's 6.18 offsets).
fn types_with_memcg() -> FakeTypes {
    let mut types = types_6_1();
    types.members.extend([
        (("task_struct", "tgid"), 1268),
        (("task_struct", "comm"), 1832),
        (("task_struct", "cgroups"), 2360),
        (("css_set", "dfl_cgrp"), 160),
        (("css_set", "subsys"), 0),
        (("cgroup_subsys_state", "parent"), 208),
        (("cgroup_subsys_state", "cgroup"), 0),
        (("mem_cgroup", "css"), 0),
        (("mem_cgroup", "memory.usage"), 256),
        (("mem_cgroup", "memory.max"), 344),
        (("mem_cgroup", "memory_events_local"), 888),
    ]);
    types.enums.extend([
        (("cgroup_subsys_id", "memory_cgrp_id"), 4),
        (("memcg_memory_event", "MEMCG_OOM"), 3),
    ]);
    types
}

fn features(
    formats: &HashMap<&'static str, &'static str>,
    types: Result<&dyn Types, &String>,
) -> KernelFeatures {
    KernelFeatures::from_parts(
        |tp| {
            formats
                .get(tp)
                .map(|s| (*s).to_owned())
                .ok_or(format!("no tracepoint {tp}"))
        },
        types,
    )
}

fn chosen(features: &KernelFeatures) -> Vec<Option<Attach>> {
    features.probes.iter().map(|p| p.choices().next()).collect()
}

#[test]
fn with_btf_every_probe_attaches_raw_with_its_tracepoint_as_fallback() {
    let types = types_6_1();
    let features = features(&formats_6_1(), Ok(&types));
    assert_eq!(features.fatal(), None);
    assert_eq!(
        chosen(&features),
        [
            Some(Attach::Raw("cgroup_mkdir_raw")),
            Some(Attach::Raw("cgroup_rmdir_raw")),
            Some(Attach::Raw("sched_process_exec_raw")),
            Some(Attach::Raw("sched_process_exit_raw")),
            Some(Attach::Raw("mark_victim_raw")),
        ]
    );
    assert!(
        features.probes.iter().all(|p| p.choices().count() == 2),
        "each with its classic tracepoint behind"
    );
    let config = features.probe_config();
    assert_eq!(
        config.flags, PROBE_EXIT_CODE,
        "a pid, no task, no group_dead"
    );
    assert_eq!(
        (
            config.task_exit_code,
            config.cgroup_root,
            config.root_hierarchy_id,
            config.cgroup_level,
            config.cgroup_kn,
            config.kn_id,
            config.bprm_filename
        ),
        (1164, 696, 12, 216, 256, 96, 96)
    );
}

#[test]
fn newer_prototypes_pick_their_programs() {
    let mut types = types_6_1();
    types
        .prototypes
        .insert("sched_process_exit", vec![Arg::Pointer, Arg::Integer]);
    types
        .prototypes
        .insert("mark_victim", vec![Arg::Pointer, Arg::Integer]);
    let features = features(&formats_6_1(), Ok(&types));
    assert_eq!(
        chosen(&features)[3..],
        [
            Some(Attach::Raw("sched_process_exit_raw_group")),
            Some(Attach::Raw("mark_victim_raw"))
        ]
    );
    let config = features.probe_config();
    assert_eq!(config.flags & PROBE_OOM_TASK, PROBE_OOM_TASK);
    assert_eq!(config.task_pid, 1264);
    let lines = features.describe();
    assert!(
        lines
            .iter()
            .any(|(s, ok, d)| s == "exit group_dead" && *ok && d.contains("argument")),
        "{lines:?}"
    );
}

#[test]
fn the_oom_probe_reads_memory_cgroups_where_btf_has_them_and_attaches_without() {
    let mut types = types_with_memcg();
    types
        .prototypes
        .insert("mark_victim", vec![Arg::Pointer, Arg::Integer]);
    let with = features(&formats_6_1(), Ok(&types));
    let config = with.probe_config();
    assert_eq!(
        config.flags & (PROBE_OOM_TASK | PROBE_OOM_MEMCG),
        PROBE_OOM_TASK | PROBE_OOM_MEMCG
    );
    assert_eq!(
        (
            config.task_tgid,
            config.task_cgroups,
            config.css_set_memcg,
            config.memcg_usage,
            config.memcg_max,
            config.memcg_oom_events,
        ),
        // subsys[4] and memory_events_local[3], 8-byte elements.
        (1268, 2360, 32, 256, 344, 888 + 24)
    );
    let scope = |features: &KernelFeatures| {
        features
            .describe()
            .into_iter()
            .find(|(s, ..)| s == "oom scope")
            .unwrap()
    };
    assert!(scope(&with).1);

    // A kernel whose mem_cgroup lacks one member: the probe attaches, kills carry no scope,
    // and none of the memory cgroup offsets is half set.
    types.members.remove(&("mem_cgroup", "memory_events_local"));
    let without = features(&formats_6_1(), Ok(&types));
    assert_eq!(chosen(&without)[4], Some(Attach::Raw("mark_victim_raw")));
    let config = without.probe_config();
    assert_eq!(config.flags & PROBE_OOM_MEMCG, 0);
    assert_eq!((config.task_cgroups, config.memcg_usage), (0, 0));
    let (_, ok, detail) = scope(&without);
    assert!(!ok && detail.contains("no scope"), "{detail}");
}

#[test]
fn without_btf_the_tracepoints_attach_and_say_what_they_need() {
    let no_btf = "reading /sys/kernel/btf/vmlinux: No such file or directory".to_owned();
    let features = features(&formats_6_1(), Err(&no_btf));
    assert_eq!(features.fatal(), None);
    assert!(
        chosen(&features)
            .iter()
            .all(|c| *c == Some(Attach::Classic))
    );
    assert!(features.exit_code.is_err());
    let (_, ok, detail) = features.describe().into_iter().next().unwrap();
    assert!(ok);
    assert!(detail.contains("perf_event_open"), "{detail}");
    assert!(detail.contains("No such file"), "{detail}");
}

#[test]
fn an_unknown_prototype_or_a_missing_member_falls_back_to_the_tracepoint() {
    let mut types = types_6_1();
    types.prototypes.insert(
        "mark_victim",
        vec![Arg::Pointer, Arg::Pointer, Arg::Integer],
    );
    types.members.remove(&("linux_binprm", "filename"));
    let features = features(&formats_6_1(), Ok(&types));
    assert_eq!(chosen(&features)[2], Some(Attach::Classic));
    assert_eq!(chosen(&features)[4], Some(Attach::Classic));
    let exec = &features.probes[2];
    assert!(
        exec.raw.as_ref().unwrap_err().contains("filename"),
        "{:?}",
        exec.raw
    );
}

#[test]
fn without_tracefs_raw_tracepoints_still_attach() {
    let types = types_6_1();
    let features = KernelFeatures::from_parts(
        |_| Err("tracefs is not mounted at /sys/kernel/tracing".to_owned()),
        Ok(&types),
    );
    assert_eq!(features.fatal(), None);
    assert!(
        features
            .probes
            .iter()
            .all(|p| p.choices().collect::<Vec<_>>().len() == 1)
    );
    assert_eq!(features.group_dead, None);
}

#[test]
fn a_missing_optional_tracepoint_costs_only_its_probe() {
    let no_btf = "no BTF".to_owned();
    let mut formats = formats_6_1();
    formats.remove("oom/mark_victim");
    let features = features(&formats, Err(&no_btf));
    assert_eq!(features.fatal(), None);
    assert_eq!(chosen(&features)[4], None);
    let (_, ok, detail) = features
        .describe()
        .into_iter()
        .find(|(s, _, _)| s == "probe mark_victim")
        .unwrap();
    assert!(!ok);
    assert!(detail.contains("no tracepoint oom/mark_victim"), "{detail}");
}

#[test]
fn a_required_probe_with_no_way_to_attach_is_fatal_and_says_why() {
    let no_btf = "no BTF".to_owned();
    let mut formats = formats_6_1();
    formats.insert(
        "cgroup/cgroup_mkdir",
        "format:\n\tfield:int root;\toffset:8;\tsize:4;\tsigned:1;\n\tfield:int level;\toffset:16;\tsize:4;\tsigned:1;\n",
    );
    let features = features(&formats, Err(&no_btf));
    let fatal = features.fatal().unwrap();
    assert!(fatal.contains("level at 16, expected 12"), "{fatal}");
    assert!(fatal.contains("id missing"), "{fatal}");
    assert!(fatal.contains("no BTF"), "{fatal}");
}

#[test]
fn group_dead_is_used_where_the_tracepoint_has_it() {
    let no_btf = "no BTF".to_owned();
    let mut formats = formats_6_1();
    formats.insert(
        "sched/sched_process_exit",
        "format:\n\tfield:char comm[16];\toffset:8;\tsize:16;\tsigned:0;\n\tfield:bool group_dead;\toffset:32;\tsize:1;\tsigned:0;\n",
    );
    let features = features(&formats, Err(&no_btf));
    assert_eq!(features.group_dead, Some(32));
    let config = features.probe_config();
    assert_eq!(config.flags, PROBE_GROUP_DEAD);
    assert_eq!(config.exit_group_dead, 32);
    let lines = features.describe();
    assert!(lines.iter().any(|(s, ok, _)| s == "exit status" && !ok));
}

#[test]
fn field_offsets_are_read_from_format_files() {
    let format = "name: cgroup_mkdir\nID: 1\nformat:\n\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\tfield:int root;\toffset:8;\tsize:4;\tsigned:1;\n\tfield:__data_loc char[] path;\toffset:24;\tsize:4;\tsigned:0;\n\tfield:char comm[16];\toffset:8;\tsize:16;\tsigned:0;\n";
    assert_eq!(field_offset(format, "root"), Some(8));
    assert_eq!(field_offset(format, "path"), Some(24));
    assert_eq!(field_offset(format, "comm"), Some(8));
    assert_eq!(field_offset(format, "level"), None);
}
