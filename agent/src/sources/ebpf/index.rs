//! cgroup2 id -> container: the kernel reports cgroup ids (the inode number of the cgroup2
//! directory); this index, built by walking the cgroup2 tree and kept current from mkdir and
//! rmdir events, says which container each belongs to.

use std::{
    collections::HashMap,
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
    sync::Arc,
};

use crate::sources::ebpf::cgroup_path::{self, CgroupOwner};

/// How deep container cgroups sit at most below the cgroup2 root (systemd driver: 4).
const MAX_DEPTH: usize = 8;

/// How cgroups are mounted on this node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CgroupMode {
    /// Only cgroup v1 hierarchies: no cgroup2 ids for the probes.
    V1,
    /// v1 controllers plus a cgroup2 tree (e.g. /sys/fs/cgroup/unified).
    Hybrid { cgroup2: PathBuf },
    /// Pure cgroup2 (e.g. /sys/fs/cgroup).
    V2 { cgroup2: PathBuf },
}

impl CgroupMode {
    /// Reads /proc/self/mountinfo.
    pub fn detect() -> Self {
        Self::from_mountinfo(&std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default())
    }

    fn from_mountinfo(mountinfo: &str) -> Self {
        let mut cgroup2 = None;
        let mut v1 = false;
        for line in mountinfo.lines() {
            let Some((fields, tail)) = line.split_once(" - ") else {
                continue;
            };
            let Some(point) = fields.split(' ').nth(4) else {
                continue;
            };
            match tail.split(' ').next() {
                Some("cgroup2") if cgroup2.is_none() => cgroup2 = Some(PathBuf::from(point)),
                Some("cgroup") => v1 = true,
                _ => {}
            }
        }
        match (cgroup2, v1) {
            (Some(cgroup2), true) => Self::Hybrid { cgroup2 },
            (Some(cgroup2), false) => Self::V2 { cgroup2 },
            (None, _) => Self::V1,
        }
    }

    /// Where the cgroup2 tree is mounted, if it is.
    pub fn cgroup2(&self) -> Option<&Path> {
        match self {
            Self::V1 => None,
            Self::Hybrid { cgroup2 } | Self::V2 { cgroup2 } => Some(cgroup2),
        }
    }
}

/// Container cgroups by cgroup2 id, with their paths below the cgroup2 root.
#[derive(Debug, Default)]
pub struct CgroupIndex {
    root: PathBuf,
    /// Shared paths: each trigger about a container carries its cgroup's.
    owners: HashMap<u64, (CgroupOwner, Arc<str>)>,
    /// The changes made since a scan started, replayed on its result by [`Self::replace`]:
    /// the scan runs while events keep coming, and may have walked past a cgroup before its
    /// mkdir or rmdir.
    journal: Option<Vec<Change>>,
}

/// One change to the index made from an event.
#[derive(Debug)]
enum Change {
    Insert(u64, CgroupOwner, Arc<str>),
    Remove(u64),
}

impl CgroupIndex {
    /// Walks the cgroup2 tree under `root` and indexes every container cgroup.
    pub fn scan(root: &Path, namespaces: &[String]) -> Self {
        let mut index = Self {
            root: root.to_owned(),
            ..Self::default()
        };
        index.walk(root, namespaces, 0);
        index
    }

    fn walk(&mut self, dir: &Path, namespaces: &[String], depth: usize) {
        if depth > MAX_DEPTH {
            return;
        }
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let Ok(metadata) = entry.metadata() else {
                continue;
            };
            if !metadata.is_dir() {
                continue;
            }
            let path = entry.path();
            let relative = path
                .strip_prefix(&self.root)
                .unwrap_or(&path)
                .to_string_lossy()
                .into_owned();
            match cgroup_path::parse(&relative, namespaces) {
                Some(owner) => {
                    self.owners.insert(metadata.ino(), (owner, relative.into()));
                }
                // Containers do not nest: only descend into what is not one.
                None => self.walk(&path, namespaces, depth + 1),
            }
        }
    }

    pub fn get(&self, cgroup_id: u64) -> Option<&CgroupOwner> {
        self.owners.get(&cgroup_id).map(|(owner, _)| owner)
    }

    /// Indexes a cgroup seen being created (`path` below the cgroup2 root); returns its owner
    /// if it is a container's.
    pub fn insert(
        &mut self,
        cgroup_id: u64,
        path: &str,
        namespaces: &[String],
    ) -> Option<&CgroupOwner> {
        let owner = cgroup_path::parse(path, namespaces)?;
        let path: Arc<str> = path.into();
        if let Some(journal) = &mut self.journal {
            journal.push(Change::Insert(cgroup_id, owner.clone(), Arc::clone(&path)));
        }
        self.owners.insert(cgroup_id, (owner, path));
        self.get(cgroup_id)
    }

    /// The path of an indexed cgroup below the cgroup2 root.
    pub fn path(&self, cgroup_id: u64) -> Option<Arc<str>> {
        self.owners
            .get(&cgroup_id)
            .map(|(_, path)| Arc::clone(path))
    }

    /// Forgets a removed cgroup; returns its owner if it was a container's.
    pub fn remove(&mut self, cgroup_id: u64) -> Option<CgroupOwner> {
        if let Some(journal) = &mut self.journal {
            journal.push(Change::Remove(cgroup_id));
        }
        self.owners.remove(&cgroup_id).map(|(owner, _)| owner)
    }

    /// Starts recording changes for [`Self::replace`]: call it when a scan starts.
    pub fn start_journal(&mut self) {
        self.journal = Some(Vec::new());
    }

    /// Becomes `scanned`, with the changes made since [`Self::start_journal`] replayed on it in
    /// order: a cgroup created while the scan ran stays indexed, one removed stays forgotten.
    pub fn replace(&mut self, mut scanned: CgroupIndex) {
        for change in self.journal.take().unwrap_or_default() {
            match change {
                Change::Insert(id, owner, path) => {
                    scanned.owners.insert(id, (owner, path));
                }
                Change::Remove(id) => {
                    scanned.owners.remove(&id);
                }
            }
        }
        *self = scanned;
    }

    pub fn contains(&self, cgroup_id: u64) -> bool {
        self.owners.contains_key(&cgroup_id)
    }

    /// Every indexed cgroup id with its directory.
    pub fn dirs(&self) -> impl Iterator<Item = (u64, PathBuf)> + '_ {
        self.owners
            .iter()
            .map(|(&id, (_, path))| (id, self.root.join(path.trim_start_matches('/'))))
    }

    pub fn len(&self) -> usize {
        self.owners.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cgroup_modes_are_told_apart() {
        let hybrid = "\
26 25 0:23 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
27 25 0:24 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw";
        assert_eq!(
            CgroupMode::from_mountinfo(hybrid),
            CgroupMode::Hybrid {
                cgroup2: "/sys/fs/cgroup/unified".into()
            }
        );
        let v2 = "27 25 0:24 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw";
        assert_eq!(
            CgroupMode::from_mountinfo(v2),
            CgroupMode::V2 {
                cgroup2: "/sys/fs/cgroup".into()
            }
        );
        let v1 = "26 25 0:23 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory";
        assert_eq!(CgroupMode::from_mountinfo(v1), CgroupMode::V1);
    }

    #[test]
    fn a_scan_indexes_container_directories_by_inode() {
        let root = tempfile::tempdir().unwrap();
        let id = "a".repeat(64);
        let container = root
            .path()
            .join("kubepods/besteffort/pod12345678-aaaa")
            .join(&id);
        std::fs::create_dir_all(&container).unwrap();
        std::fs::create_dir_all(root.path().join("system.slice/other")).unwrap();
        std::fs::create_dir_all(root.path().join("plegd-native/solo")).unwrap();
        let index = CgroupIndex::scan(root.path(), &["plegd-native".to_owned()]);
        assert_eq!(index.len(), 2);
        let inode = std::fs::metadata(&container).unwrap().ino();
        let owner = index.get(inode).unwrap();
        assert_eq!(owner.container_id, id);
        assert_eq!(owner.pod_uid.as_deref(), Some("12345678-aaaa"));
        let dirs: HashMap<u64, PathBuf> = index.dirs().collect();
        assert_eq!(dirs[&inode], container);
    }

    #[test]
    fn changes_made_during_a_scan_are_replayed_on_its_result() {
        let namespaces = ["plegd-native".to_owned()];
        let mut index = CgroupIndex::default();
        index.insert(1, "plegd-native/gone", &namespaces);
        index.start_journal();
        // While the scan runs: one cgroup created after the scan walked past its parent, one
        // removed after the scan saw it.
        index.insert(2, "plegd-native/new", &namespaces);
        index.remove(1);
        let mut scanned = CgroupIndex::default();
        scanned.insert(1, "plegd-native/gone", &namespaces);
        scanned.insert(3, "plegd-native/old", &namespaces);
        index.replace(scanned);
        assert!(!index.contains(1));
        assert_eq!(index.get(2).unwrap().container_id, "new");
        assert_eq!(index.get(3).unwrap().container_id, "old");
        // The journal stops with the replacement.
        index.remove(3);
        index.replace(CgroupIndex::default());
        assert_eq!(index.len(), 0);
    }
}
