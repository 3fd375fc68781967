//! OOM kills for the OOM-scope tests (this host's `tests/oom_scope.rs` and the node check):
//! a pod cgroup's memory limit, and the kernel's own word on each kill, its log's
//! `oom-kill:` line, which names the cgroup whose limit was hit (`oom_memcg=`), or none for a
//! node OOM (`constraint=CONSTRAINT_NONE`): the oracle plegd's scope is checked against.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail};

use crate::cri::{ContainerSpec, Pod};

/// cgroup v1's memory hierarchy here (this host mounts its controllers on v1).
const MEMORY_V1: &str = "/sys/fs/cgroup/memory";
/// The cgroup2 tree, on a pure cgroup v2 node.
const CGROUP2: &str = "/sys/fs/cgroup";

/// A container whose init takes 200 MiB, with a memory limit of its own or none. It waits a
/// second first: containerd's shim watches a container's cgroup for OOM kills only once the
/// container runs, and one it missed is an `Error` in CRI, not `OOMKilled`.
pub fn hog(name: &str, memory_limit: Option<i64>) -> ContainerSpec {
    ContainerSpec {
        memory_limit,
        ..ContainerSpec::shell(
            name,
            "sleep 1; exec dd if=/dev/zero of=/dev/null bs=200M count=1",
        )
    }
}

/// The path of a pod's cgroup below the hierarchy's root: `parent` is the sandbox's cgroup
/// parent (`/kubepods/besteffort/pod<uid>`, or the systemd driver's
/// `kubepods-besteffort-pod<uid>.slice`).
pub fn pod_cgroup_path(parent: &str) -> String {
    format!("/{}", relative(parent))
}

/// The path of a container's cgroup below the hierarchy's root, as containerd's runc or crun
/// makes it for either driver.
pub fn container_cgroup_path(parent: &str, id: &str) -> String {
    if parent.ends_with(".slice") {
        format!("{}/cri-containerd-{id}.scope", pod_cgroup_path(parent))
    } else {
        format!("{}/{id}", pod_cgroup_path(parent))
    }
}

fn relative(parent: &str) -> String {
    match parent.strip_suffix(".slice") {
        // systemd: each dash a level (`kubepods-besteffort-pod<uid>.slice` lives in
        // `kubepods.slice/kubepods-besteffort.slice/`).
        Some(slice) => {
            let parts: Vec<&str> = slice.split('-').collect();
            (1..=parts.len())
                .map(|n| format!("{}.slice", parts[..n].join("-")))
                .collect::<Vec<_>>()
                .join("/")
        }
        None => parent.trim_start_matches('/').to_owned(),
    }
}

/// The directory of a pod's cgroup in the memory controller's hierarchy (see
/// [`pod_cgroup_path`]).
pub fn pod_memory_cgroup(parent: &str) -> PathBuf {
    let relative = relative(parent);
    let v1 = Path::new(MEMORY_V1);
    if v1.join("memory.limit_in_bytes").exists() {
        v1.join(relative)
    } else {
        Path::new(CGROUP2).join(relative)
    }
}

/// Caps the pod cgroup of `pod` at `bytes`: a pod-level limit, as kubelet writes one for
/// pod-level resources (KEP-2837). Returns the cgroup's directory.
pub fn cap_pod_memory(pod: &Pod, bytes: u64) -> anyhow::Result<PathBuf> {
    let dir = pod_memory_cgroup(pod.cgroup_parent());
    let file = ["memory.max", "memory.limit_in_bytes"]
        .into_iter()
        .map(|name| dir.join(name))
        .find(|file| file.exists())
        .with_context(|| {
            format!(
                "pod {}: no memory limit file in {}",
                pod.name,
                dir.display()
            )
        })?;
    std::fs::write(&file, bytes.to_string())
        .with_context(|| format!("writing {}", file.display()))?;
    Ok(dir)
}

/// One `oom-kill:` line of the kernel's log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelOomKill {
    /// `CONSTRAINT_MEMCG` for a memory cgroup's limit, `CONSTRAINT_NONE` for the node's.
    pub constraint: String,
    /// The cgroup whose limit was hit (`oom_memcg=`), for a memory cgroup's.
    pub oom_memcg: Option<String>,
    /// The victim's memory cgroup, name and pid.
    pub task_memcg: String,
    pub task: String,
    pub pid: u32,
}

/// Parses the kernel's `oom-kill:constraint=...,oom_memcg=...,task_memcg=...,task=...,pid=...`.
pub fn parse_oom_kill(line: &str) -> Option<KernelOomKill> {
    let (_, fields) = line.split_once("oom-kill:")?;
    let field = |name: &str| {
        fields
            .split(',')
            .find_map(|f| f.strip_prefix(name)?.strip_prefix('='))
            .map(str::to_owned)
    };
    Some(KernelOomKill {
        constraint: field("constraint")?,
        oom_memcg: field("oom_memcg"),
        task_memcg: field("task_memcg").unwrap_or_default(),
        task: field("task").unwrap_or_default(),
        pid: field("pid")?.parse().ok()?,
    })
}

/// Every `oom-kill:` line in the kernel's log now (`dmesg`, as root).
pub fn kernel_oom_kills() -> anyhow::Result<Vec<KernelOomKill>> {
    let out = Command::new("dmesg")
        .output()
        .context("running dmesg (util-linux)")?;
    if !out.status.success() {
        bail!(
            "dmesg failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(parse_oom_kill)
        .collect())
}

/// The kernel's line for the kill of `pid`, waited for up to `deadline` (the log is written
/// as the victim is chosen, before plegd hears of it; a bounded wait all the same).
pub async fn kernel_oom_kill_of(
    pid: u32,
    deadline: std::time::Duration,
) -> anyhow::Result<KernelOomKill> {
    let found = crate::wait::until("the kernel's oom-kill line", deadline, || async {
        anyhow::Ok(kernel_oom_kills()?.into_iter().rev().find(|k| k.pid == pid))
    })
    .await?;
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernels_lines_name_the_cgroup_hit_or_none() {
        let memcg = "[ 3459.713248] oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,oom_memcg=/kubepods/besteffort/pod1,task_memcg=/kubepods/besteffort/pod1/abc,task=dd,pid=16876,uid=0";
        assert_eq!(
            parse_oom_kill(memcg),
            Some(KernelOomKill {
                constraint: "CONSTRAINT_MEMCG".into(),
                oom_memcg: Some("/kubepods/besteffort/pod1".into()),
                task_memcg: "/kubepods/besteffort/pod1/abc".into(),
                task: "dd".into(),
                pid: 16876,
            })
        );
        let node = "[ 99.1] oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0,global_oom,task_memcg=/kubepods.slice/x.scope,task=dd,pid=77,uid=0";
        let kill = parse_oom_kill(node).unwrap();
        assert_eq!(
            (kill.constraint.as_str(), kill.oom_memcg),
            ("CONSTRAINT_NONE", None)
        );
        assert_eq!(
            parse_oom_kill("Out of memory: Killed process 77 (dd)"),
            None
        );
    }

    #[test]
    fn systemd_slices_nest_by_their_dashes() {
        assert_eq!(
            container_cgroup_path("kubepods-besteffort-pod1a_2b.slice", "c0"),
            "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1a_2b.slice/cri-containerd-c0.scope"
        );
        assert_eq!(
            container_cgroup_path("/kubepods/besteffort/pod1", "c0"),
            "/kubepods/besteffort/pod1/c0"
        );
        let dir = pod_memory_cgroup("kubepods-besteffort-pod1a_2b.slice");
        assert!(
            dir.ends_with(
                "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1a_2b.slice"
            ),
            "{}",
            dir.display()
        );
        assert!(
            pod_memory_cgroup("/kubepods/besteffort/pod1").ends_with("kubepods/besteffort/pod1")
        );
    }
}
