//! `plegd check` on the real kernel (root, tracefs): every subject is reported, and on the
//! kernels this project runs on the probes load.

#[test]
fn the_report_names_every_subject_and_the_probes_load() {
    let settings = plegd::config::Config::load(&plegd::config::RunArgs::default()).unwrap();
    let (report, ebpf) = plegd::daemon::check::report(&settings);
    for subject in [
        "kernel",
        "probe cgroup_mkdir",
        "probe sched_process_exit",
        "probe cgroup_mkdir attached",
        "exit group_dead",
        "exit status",
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
    assert!(
        ebpf,
        "the probes load here (root, tracefs mounted):\n{report}"
    );
}

/// The running kernel's BTF gives `task_struct.exit_code`, wherever the struct puts it: exits
/// carry their status on the kernels this project runs on.
#[test]
fn the_running_kernel_gives_the_exit_code_offset() {
    use plegd::sources::ebpf::btf::{KernelTypes, Types as _};
    let offset = KernelTypes::running()
        .and_then(|types| types.member_offset("task_struct", "exit_code"))
        .expect("task_struct.exit_code in /sys/kernel/btf/vmlinux");
    // task_struct is a few KiB; an offset past that is a misread.
    assert!((8..16 * 1024).contains(&offset), "offset {offset}");
}
