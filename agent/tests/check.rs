//! `plegd check` on the real kernel (root, tracefs): every subject is reported, and on the
//! kernels this project runs on the probes load.

#[test]
fn the_report_names_every_subject_and_the_probes_load() {
    let (report, ebpf) = plegd::check::report();
    for subject in [
        "kernel",
        "probe cgroup_mkdir",
        "probe sched_process_exit",
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
