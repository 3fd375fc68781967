//! Which limit an OOM kill came from, from what the probe read at the kill. Pure: the kernel's
//! record and the victim's memory cgroup path in, the kill's account out; tested by tables.
//!
//! At `oom/mark_victim` the probe walks two memory cgroup chains up to the root: the victim's,
//! and the running task's. In a memory cgroup's OOM the running task is the one whose charge
//! failed (the kernel runs the OOM killer in its charge path), and the victim was chosen
//! inside the cgroup whose limit was hit; so that cgroup is an ancestor (or self) of both,
//! on their common part. For each level the probe reads its usage and limit (pages) and its
//! own OOM count, `memory_events_local[MEMCG_OOM]` (cgroup v2's `memory.events.local` `oom`,
//! kept on cgroup v1's memory hierarchy too): the kernel raises it in the cgroup whose limit
//! was hit, and there only, just before it chooses a victim.
//!
//! The cgroup whose limit was hit is the lowest common level whose count rose since plegd
//! last saw it, preferring one at its limit; a level plegd sees for the first time counts as
//! risen only when near or over its limit (its count may be from before plegd ran). Where no
//! common level rose, one of the victim's that did (a limit written below the usage: the
//! writer is no task of the subtree). Where none rose at all, no limit was hit: the node ran
//! out of memory (the global OOM killer raises no cgroup's count).

use std::collections::HashMap;

use plegd_common::{
    MemcgLevel, OOM_CHARGER_CHAIN, OOM_CHARGER_WHOLE, OOM_VICTIM_CHAIN, OOM_VICTIM_INIT,
    OOM_VICTIM_TASK, OOM_VICTIM_WHOLE, OomEvent,
};

use crate::{
    pleg::{OomKill, OomScope},
    sources::ebpf::{cgroup_path, text::text},
};

/// Pages a cgroup may be below its limit and still count as at it: a charge that failed left
/// it within one charge (8 pages at most for an order the OOM killer runs for), and other
/// tasks may have freed a little by the time the victim is chosen.
pub const LIMIT_SLACK_PAGES: u64 = 32;

/// Memory cgroups whose OOM count is remembered; past this many the oldest are forgotten
/// (each then counts as first seen).
pub const MAX_REMEMBERED: usize = 4096;

/// The OOM counts of the memory cgroups plegd saw at earlier kills, by cgroup id.
#[derive(Debug, Default)]
pub struct OomCounts {
    counts: HashMap<u64, u64>,
}

impl OomCounts {
    fn seen(&self, id: u64) -> Option<u64> {
        self.counts.get(&id).copied()
    }

    fn remember(&mut self, levels: &[MemcgLevel]) {
        if self.counts.len() + levels.len() > MAX_REMEMBERED {
            self.counts.clear();
        }
        for level in levels {
            self.counts.insert(level.id, level.oom_events);
        }
    }
}

/// One level of a chain, with its level in the hierarchy.
#[derive(Clone, Copy, Debug)]
struct Level {
    memcg: MemcgLevel,
    depth: u32,
}

/// A chain, lowest level first, and whether it reached the root.
struct Chain {
    levels: Vec<Level>,
    whole: bool,
}

impl Chain {
    fn of(
        levels: &[MemcgLevel],
        count: u32,
        lowest: u32,
        flags: u32,
        read: u32,
        whole: u32,
    ) -> Option<Self> {
        if flags & read == 0 {
            return None;
        }
        let count = (count as usize).min(levels.len());
        Some(Self {
            levels: levels[..count]
                .iter()
                .enumerate()
                .map(|(i, &memcg)| Level {
                    memcg,
                    depth: lowest.saturating_sub(i as u32),
                })
                .collect(),
            whole: flags & whole != 0,
        })
    }
}

/// Whether a level's limit is set and it is at it.
fn at_limit(level: &MemcgLevel, unlimited: u64) -> bool {
    level.max < unlimited && level.usage.saturating_add(LIMIT_SLACK_PAGES) >= level.max
}

/// Whether a level seen for the first time is near enough its limit for its OOM count to be
/// this kill's: within a sixteenth of it (the victim's own tasks may have freed some by the
/// time the probe reads it), or over it.
fn near_limit(level: &MemcgLevel, unlimited: u64) -> bool {
    level.max < unlimited
        && level
            .usage
            .saturating_add(LIMIT_SLACK_PAGES.max(level.max / 16))
            >= level.max
}

/// Whether its usage is above its limit (a limit written below the usage).
fn over_limit(level: &MemcgLevel, unlimited: u64) -> bool {
    level.max < unlimited && level.usage > level.max
}

/// The account of the kill `event` describes. `memory_paths`: what may be the victim's memory
/// cgroup path (cgroup2's, or the memory hierarchy's on cgroup v1), best first: the first as
/// deep as the record says its cgroup is is taken (a dying process's /proc says `/`); `comm`: the victim's
/// name when the record has none; `namespaces`: the containerd namespaces whose
/// `/<namespace>/<id>` cgroups are containers; `page_size` in bytes. `counts` remembers the
/// OOM counts seen, for the next kill.
pub fn account(
    event: &OomEvent,
    memory_paths: &[&str],
    comm: Option<&str>,
    namespaces: &[String],
    page_size: u64,
    counts: &mut OomCounts,
) -> OomKill {
    let victim_comm = if event.flags & OOM_VICTIM_TASK != 0 {
        text(&event.comm)
    } else {
        comm.unwrap_or_default().to_owned()
    };
    let mut kill = OomKill {
        scope: OomScope::Unknown,
        cgroup: None,
        limit_bytes: None,
        victim_pid: event.pid,
        victim_comm,
        victim_init: event.flags & OOM_VICTIM_INIT != 0,
    };
    let victim = Chain::of(
        &event.victim,
        event.victim_depth,
        event.victim_level,
        event.flags,
        OOM_VICTIM_CHAIN,
        OOM_VICTIM_WHOLE,
    );
    let charger = Chain::of(
        &event.charger,
        event.charger_depth,
        event.charger_level,
        event.flags,
        OOM_CHARGER_CHAIN,
        OOM_CHARGER_WHOLE,
    );
    let unlimited = (i64::MAX as u64) / page_size.max(1);
    // The chain the scope is told on: the victim's where read.
    let Some(chain) = victim.as_ref().or(charger.as_ref()) else {
        return kill;
    };
    let hit = limit_hit(chain, charger.as_ref(), counts, unlimited);
    for chain in [&victim, &charger].into_iter().flatten() {
        let levels: Vec<MemcgLevel> = chain.levels.iter().map(|l| l.memcg).collect();
        counts.remember(&levels);
    }
    let Some(hit) = hit else {
        // No limit's count rose: the global OOM killer (a chain cut short may hide one).
        if chain.whole {
            kill.scope = OomScope::Node;
        }
        return kill;
    };
    kill.limit_bytes = Some(hit.memcg.max.saturating_mul(page_size));
    let victim_level = victim.is_some().then_some(event.victim_level);
    locate(&mut kill, hit, victim_level, memory_paths, namespaces);
    kill
}

/// The level whose limit was hit, if any: the lowest level of `chain` common with the
/// charger's whose OOM count rose (one at its limit first), else one of `chain`'s that rose
/// (over or at its limit first).
fn limit_hit(
    chain: &Chain,
    charger: Option<&Chain>,
    counts: &OomCounts,
    unlimited: u64,
) -> Option<Level> {
    let rose = |level: &MemcgLevel| match counts.seen(level.id) {
        Some(seen) => level.oom_events > seen,
        None => level.oom_events > 0 && near_limit(level, unlimited),
    };
    let common = chain
        .levels
        .iter()
        .filter(|l| charger.is_none_or(|c| c.levels.iter().any(|m| m.memcg.id == l.memcg.id)));
    let risen: Vec<Level> = common.filter(|l| rose(&l.memcg)).copied().collect();
    risen
        .iter()
        .find(|l| at_limit(&l.memcg, unlimited))
        .or_else(|| risen.first())
        .copied()
        .or_else(|| {
            let risen: Vec<&Level> = chain.levels.iter().filter(|l| rose(&l.memcg)).collect();
            risen
                .iter()
                .find(|l| over_limit(&l.memcg, unlimited) || at_limit(&l.memcg, unlimited))
                .or_else(|| risen.first())
                .map(|l| **l)
        })
}

/// `kill`'s cgroup and scope, from `hit` and the victim's memory cgroup path (among
/// `memory_paths`). `victim_level`: the victim's level in the hierarchy, if its chain was read.
fn locate(
    kill: &mut OomKill,
    hit: Level,
    victim_level: Option<u32>,
    memory_paths: &[&str],
    namespaces: &[String],
) {
    // The victim's memory cgroup path, if it is the one the chain starts at.
    let components: Option<Vec<&str>> = memory_paths
        .iter()
        .map(|path| path.split('/').filter(|c| !c.is_empty()).collect())
        .find(|c: &Vec<&str>| match victim_level {
            Some(level) => c.len() == level as usize,
            None => c.len() >= hit.depth as usize && !c.is_empty(),
        });
    let Some(components) = components else {
        // Without the path, only the victim's own cgroup is surely its container's.
        if victim_level == Some(hit.depth) {
            kill.scope = OomScope::Container;
        }
        return;
    };
    let depth = hit.depth as usize;
    kill.cgroup = Some(format!("/{}", components[..depth].join("/")).into());
    // The container's cgroup: the shortest prefix that names a container, else the victim's.
    let container = (1..=components.len())
        .find(|&n| cgroup_path::parse(&components[..n].join("/"), namespaces).is_some())
        .unwrap_or(components.len());
    kill.scope = if depth >= container {
        OomScope::Container
    } else if depth + 1 == container && cgroup_path::is_pod_cgroup(components[depth - 1]) {
        OomScope::Pod
    } else {
        OomScope::Ancestor
    };
}

#[cfg(test)]
mod tests {
    use plegd_common::{KernelEventKind, OOM_LEVELS};

    use super::*;

    const PAGE: u64 = 4096;
    const UNLIMITED: u64 = (i64::MAX as u64) / PAGE;
    const ID: &str = "0c47cae53a77d0c47cae53a77d0c47cae53a77d0c47cae53a77d0c47cae53a77";
    const UID: &str = "3f9a2b1c-1111-4222-8333-944455556666";

    /// `(id, usage, max, oom_events)` per level, lowest first.
    type Levels<'a> = &'a [(u64, u64, u64, u64)];

    /// (name, victim chain, charger chain, wanted scope, wanted cgroup)
    type Case<'a> = (
        &'a str,
        Vec<(u64, u64, u64, u64)>,
        Vec<(u64, u64, u64, u64)>,
        OomScope,
        Option<&'a str>,
    );

    fn fill(levels: Levels<'_>) -> [MemcgLevel; OOM_LEVELS] {
        let mut chain = [MemcgLevel::default(); OOM_LEVELS];
        for (slot, &(id, usage, max, oom_events)) in chain.iter_mut().zip(levels) {
            *slot = MemcgLevel {
                id,
                usage,
                max,
                oom_events,
            };
        }
        chain
    }

    /// A kill whose victim (pid 42, `dd`, its container's init) sits at `victim_level`.
    fn event(victim_level: u32, victim: Levels<'_>, charger: Levels<'_>) -> OomEvent {
        OomEvent {
            kind: KernelEventKind::Oom as u32,
            pid: 42,
            cgroup_id: 7,
            ktime_ns: 0,
            flags: OOM_VICTIM_TASK
                | OOM_VICTIM_INIT
                | OOM_VICTIM_CHAIN
                | OOM_VICTIM_WHOLE
                | OOM_CHARGER_CHAIN
                | OOM_CHARGER_WHOLE,
            victim_depth: victim.len() as u32,
            charger_depth: charger.len() as u32,
            victim_level,
            charger_level: charger.len() as u32,
            _pad: 0,
            comm: *b"dd\0\0\0\0\0\0\0\0\0\0\0\0\0\0",
            victim: fill(victim),
            charger: fill(charger),
        }
    }

    fn namespaces() -> Vec<String> {
        vec!["k8s.io".into()]
    }

    fn scope_of(
        event: &OomEvent,
        path: &str,
        counts: &mut OomCounts,
    ) -> (OomScope, Option<String>) {
        let kill = account(event, &[path], None, &namespaces(), PAGE, counts);
        (kill.scope, kill.cgroup.map(|c| c.to_string()))
    }

    /// cgroupfs: `/kubepods/besteffort/pod<uid>/<id>`: ids 4 (container), 3 (pod), 2 (QoS),
    /// 1 (kubepods).
    fn cgroupfs() -> String {
        format!("/kubepods/besteffort/pod{UID}/{ID}")
    }

    const MIB: u64 = 256;

    #[test]
    fn the_lowest_common_level_whose_count_rose_at_its_limit_is_the_one_hit() {
        let path = cgroupfs();
        let pod = format!("/kubepods/besteffort/pod{UID}");
        let cases: Vec<Case<'_>> = vec![
            (
                "the container over its own 32 MiB",
                vec![
                    (4, 32 * MIB - 1, 32 * MIB, 1),
                    (3, 33 * MIB, UNLIMITED, 0),
                    (2, 40 * MIB, UNLIMITED, 0),
                    (1, 90 * MIB, UNLIMITED, 0),
                ],
                vec![
                    (4, 32 * MIB - 1, 32 * MIB, 1),
                    (3, 33 * MIB, UNLIMITED, 0),
                    (2, 40 * MIB, UNLIMITED, 0),
                    (1, 90 * MIB, UNLIMITED, 0),
                ],
                OomScope::Container,
                Some(path.as_str()),
            ),
            (
                // Its tasks freed a little between the failed charge and the probe's read.
                "the container first seen a little below its own limit",
                vec![
                    (4, 32 * MIB - 100, 32 * MIB, 1),
                    (3, 33 * MIB, UNLIMITED, 0),
                    (1, 90 * MIB, UNLIMITED, 0),
                ],
                vec![
                    (4, 32 * MIB - 100, 32 * MIB, 1),
                    (3, 33 * MIB, UNLIMITED, 0),
                    (1, 90 * MIB, UNLIMITED, 0),
                ],
                OomScope::Container,
                Some(path.as_str()),
            ),
            (
                "a container without a limit in a pod capped at 48 MiB",
                vec![
                    (4, 47 * MIB, UNLIMITED, 0),
                    (3, 48 * MIB, 48 * MIB, 1),
                    (2, 50 * MIB, UNLIMITED, 0),
                    (1, 90 * MIB, UNLIMITED, 0),
                ],
                vec![
                    (4, 47 * MIB, UNLIMITED, 0),
                    (3, 48 * MIB, 48 * MIB, 1),
                    (2, 50 * MIB, UNLIMITED, 0),
                    (1, 90 * MIB, UNLIMITED, 0),
                ],
                OomScope::Pod,
                Some(pod.as_str()),
            ),
            (
                // Equal limits: the pause's memory puts the pod at its limit first; the
                // container is within a few hundred KiB of its own, and its count did not rise.
                "a container and its pod with the same limit, the pod's hit",
                vec![
                    (4, 48 * MIB - 80, 48 * MIB, 0),
                    (3, 48 * MIB, 48 * MIB, 1),
                    (2, 50 * MIB, UNLIMITED, 0),
                    (1, 90 * MIB, UNLIMITED, 0),
                ],
                vec![
                    (4, 48 * MIB - 80, 48 * MIB, 0),
                    (3, 48 * MIB, 48 * MIB, 1),
                    (2, 50 * MIB, UNLIMITED, 0),
                    (1, 90 * MIB, UNLIMITED, 0),
                ],
                OomScope::Pod,
                Some(pod.as_str()),
            ),
            (
                // Another container of the pod ran out; the victim's own cgroup sits at its
                // limit too (it reclaims there), but is not on the charger's chain.
                "the pod's limit, hit by a sibling, the victim at its own",
                vec![
                    (4, 24 * MIB, 24 * MIB, 0),
                    (3, 48 * MIB, 48 * MIB, 1),
                    (2, 50 * MIB, UNLIMITED, 0),
                    (1, 90 * MIB, UNLIMITED, 0),
                ],
                vec![
                    (9, 24 * MIB, UNLIMITED, 0),
                    (3, 48 * MIB, 48 * MIB, 1),
                    (2, 50 * MIB, UNLIMITED, 0),
                    (1, 90 * MIB, UNLIMITED, 0),
                ],
                OomScope::Pod,
                Some(pod.as_str()),
            ),
            (
                "the QoS class's cgroup",
                vec![
                    (4, 10 * MIB, UNLIMITED, 0),
                    (3, 10 * MIB, UNLIMITED, 0),
                    (2, 64 * MIB, 64 * MIB, 1),
                    (1, 90 * MIB, UNLIMITED, 0),
                ],
                vec![
                    (8, 54 * MIB, UNLIMITED, 0),
                    (5, 54 * MIB, UNLIMITED, 0),
                    (2, 64 * MIB, 64 * MIB, 1),
                    (1, 90 * MIB, UNLIMITED, 0),
                ],
                OomScope::Ancestor,
                Some("/kubepods/besteffort"),
            ),
            (
                // The global OOM killer raises no count; the victim's container happens to
                // sit at its limit, which is no reason.
                "the node ran out",
                vec![
                    (4, 32 * MIB, 32 * MIB, 0),
                    (3, 33 * MIB, UNLIMITED, 0),
                    (2, 40 * MIB, UNLIMITED, 0),
                    (1, 90 * MIB, UNLIMITED, 0),
                ],
                vec![(20, 900 * MIB, UNLIMITED, 0)],
                OomScope::Node,
                None,
            ),
            (
                // memory.max written below the usage: the writer is outside the pod.
                "a pod limit lowered below its usage",
                vec![
                    (4, 47 * MIB, UNLIMITED, 0),
                    (3, 48 * MIB, 40 * MIB, 1),
                    (2, 50 * MIB, UNLIMITED, 0),
                    (1, 90 * MIB, UNLIMITED, 0),
                ],
                vec![(30, MIB, UNLIMITED, 0)],
                OomScope::Pod,
                Some(pod.as_str()),
            ),
        ];
        for (name, victim, charger, scope, cgroup) in cases {
            let mut counts = OomCounts::default();
            let event = event(4, &victim, &charger);
            assert_eq!(
                scope_of(&event, &path, &mut counts),
                (scope, cgroup.map(str::to_owned)),
                "{name}"
            );
        }
    }

    #[test]
    fn counts_seen_before_are_the_baseline_and_first_sights_need_a_limit() {
        let path = cgroupfs();
        let mut counts = OomCounts::default();
        // The pod cgroup had OOMs before plegd ran (count 5), and is far from its limit now;
        // the container hits its own.
        let levels = [
            (4, 32 * MIB, 32 * MIB, 1),
            (3, 33 * MIB, 64 * MIB, 5),
            (1, 90 * MIB, UNLIMITED, 0),
        ];
        let first = event(4, &levels, &levels);
        assert_eq!(scope_of(&first, &path, &mut counts).0, OomScope::Container);
        // Later the pod's limit: its count rose from the 5 remembered, the container's did not.
        let levels = [
            (4, 20 * MIB, 32 * MIB, 1),
            (3, 64 * MIB, 64 * MIB, 6),
            (1, 90 * MIB, UNLIMITED, 0),
        ];
        let second = event(4, &levels, &levels);
        assert_eq!(scope_of(&second, &path, &mut counts).0, OomScope::Pod);
        // Then the node: nothing rose since.
        let third = event(4, &levels, &[(20, 900 * MIB, UNLIMITED, 0)]);
        assert_eq!(scope_of(&third, &path, &mut counts).0, OomScope::Node);
        // A count first seen above zero, far from its limit: from before plegd, not this kill.
        let mut fresh = OomCounts::default();
        let levels = [(4, MIB, UNLIMITED, 3), (3, 2 * MIB, 64 * MIB, 2)];
        let node = event(2, &levels, &[(20, 900 * MIB, UNLIMITED, 0)]);
        assert_eq!(
            scope_of(&node, &format!("/pod{UID}/{ID}"), &mut fresh).0,
            OomScope::Node
        );
    }

    #[test]
    fn layouts_name_the_pod_cgroup_and_the_victim_and_limit_are_carried() {
        // The systemd driver.
        let uid = UID.replace('-', "_");
        let path = format!(
            "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{uid}.slice/cri-containerd-{ID}.scope"
        );
        let levels = [
            (4, 47 * MIB, UNLIMITED, 0),
            (3, 48 * MIB, 48 * MIB, 1),
            (2, 50 * MIB, UNLIMITED, 0),
            (1, 90 * MIB, UNLIMITED, 0),
        ];
        let kill = account(
            &event(4, &levels, &levels),
            &[&path],
            None,
            &namespaces(),
            PAGE,
            &mut OomCounts::default(),
        );
        assert_eq!(kill.scope, OomScope::Pod);
        assert_eq!(
            kill.cgroup.as_deref(),
            Some(
                format!(
                    "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{uid}.slice"
                )
                .as_str()
            )
        );
        assert_eq!(kill.limit_bytes, Some(48 << 20));
        assert_eq!(
            (kill.victim_pid, kill.victim_comm.as_str(), kill.victim_init),
            (42, "dd", true)
        );
        // containerd without a cgroup parent: the namespace's cgroup is above the container,
        // and no pod's.
        let levels = [(4, MIB, UNLIMITED, 0), (3, 64 * MIB, 64 * MIB, 1)];
        let kill = account(
            &event(2, &levels, &levels),
            &[&format!("/k8s.io/{ID}")],
            None,
            &namespaces(),
            PAGE,
            &mut OomCounts::default(),
        );
        assert_eq!(
            (kill.scope, kill.cgroup.as_deref()),
            (OomScope::Ancestor, Some("/k8s.io"))
        );
    }

    #[test]
    fn what_the_record_lacks_is_unknown_never_guessed() {
        let path = cgroupfs();
        // A chain cut short (deeper than the probe reads) and no count rose: maybe a limit
        // above it, maybe the node.
        let levels = [(4, MIB, UNLIMITED, 0)];
        let mut cut = event(4, &levels, &levels);
        cut.flags &= !(OOM_VICTIM_WHOLE | OOM_CHARGER_WHOLE);
        assert_eq!(
            scope_of(&cut, &path, &mut OomCounts::default()).0,
            OomScope::Unknown
        );
        // No path for the victim (a dying process's /proc says `/`): its own cgroup is its
        // container's; a level above is not told apart.
        let levels = [(4, 47 * MIB, UNLIMITED, 0), (3, 48 * MIB, 48 * MIB, 1)];
        let kill = account(
            &event(4, &levels, &levels),
            &["/"],
            None,
            &namespaces(),
            PAGE,
            &mut OomCounts::default(),
        );
        assert_eq!((kill.scope, kill.cgroup), (OomScope::Unknown, None));
        assert_eq!(kill.limit_bytes, Some(48 << 20));
        // No chain at all (a kernel without the memory cgroup offsets): only the victim; its
        // name from /proc where the record has none.
        let mut bare = event(4, &[], &[]);
        bare.flags = 0;
        let kill = account(
            &bare,
            &[&path],
            Some("hog"),
            &namespaces(),
            PAGE,
            &mut OomCounts::default(),
        );
        assert_eq!(
            (kill.scope, kill.victim_comm.as_str(), kill.victim_init),
            (OomScope::Unknown, "hog", false)
        );
    }

    #[test]
    fn only_the_chargers_chain_on_kernels_that_name_the_victim_by_pid() {
        // mark_victim(int pid): the running task's chain alone; the victim is in the subtree
        // of the cgroup hit, so it is on that chain.
        let path = cgroupfs();
        let levels = [
            (4, 47 * MIB, UNLIMITED, 0),
            (3, 48 * MIB, 48 * MIB, 1),
            (2, 50 * MIB, UNLIMITED, 0),
            (1, 90 * MIB, UNLIMITED, 0),
        ];
        let mut pid_only = event(4, &[], &levels);
        pid_only.flags = OOM_CHARGER_CHAIN | OOM_CHARGER_WHOLE;
        let kill = account(
            &pid_only,
            &[&path],
            Some("dd"),
            &namespaces(),
            PAGE,
            &mut OomCounts::default(),
        );
        assert_eq!(kill.scope, OomScope::Pod);
        assert_eq!(kill.victim_comm, "dd");
    }
}
