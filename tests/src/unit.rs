//! deploy/systemd/plegd.service as the tests read it: the bounds they hold plegd to are the
//! unit's, never restated; and the memory cgroup a test holds plegd to them in.

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

/// The unit, as built into the harness.
const UNIT: &str = include_str!("../../deploy/systemd/plegd.service");

/// The unit's `MemoryMax=`, in bytes.
pub fn memory_max() -> anyhow::Result<u64> {
    let value = UNIT
        .lines()
        .find_map(|line| line.strip_prefix("MemoryMax="))
        .context("no MemoryMax= in deploy/systemd/plegd.service")?;
    parse_size(value)
}

/// A memory size as systemd writes it: digits with an optional K, M or G (powers of 1024).
pub fn parse_size(text: &str) -> anyhow::Result<u64> {
    let text = text.trim();
    let (digits, shift) = match text.char_indices().last() {
        Some((at, 'K')) => (&text[..at], 10),
        Some((at, 'M')) => (&text[..at], 20),
        Some((at, 'G')) => (&text[..at], 30),
        _ => (text, 0),
    };
    match digits.parse::<u64>() {
        Ok(number) => Ok(number << shift),
        Err(e) => bail!("memory size {text:?}: {e}"),
    }
}

/// Which memory controller holds the cgroup.
#[derive(Clone, Copy, Debug)]
pub enum Controller {
    V1,
    V2,
}

/// A memory cgroup of the test's, removed when dropped: a plegd born there
/// ([`crate::bench::Birth::cgroup`]) is held to its limit from its start on.
pub struct MemoryCgroup {
    pub dir: PathBuf,
    pub controller: Controller,
}

impl MemoryCgroup {
    /// Creates `name` with `limit` in cgroup2 if it has the memory controller, else in v1's
    /// memory hierarchy.
    pub fn create(name: &str, limit: u64) -> Self {
        let v2 = ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]
            .into_iter()
            .map(Path::new)
            .find(|root| {
                std::fs::read_to_string(root.join("cgroup.controllers"))
                    .is_ok_and(|c| c.split_whitespace().any(|c| c == "memory"))
            });
        let (root, controller) = match v2 {
            Some(root) => (root.to_owned(), Controller::V2),
            None => (PathBuf::from("/sys/fs/cgroup/memory"), Controller::V1),
        };
        assert!(
            root.join("cgroup.procs").exists(),
            "no memory controller: neither cgroup2 nor v1's /sys/fs/cgroup/memory"
        );
        if let Controller::V2 = controller {
            std::fs::write(root.join("cgroup.subtree_control"), "+memory").unwrap();
        }
        let dir = root.join(name);
        std::fs::create_dir(&dir).unwrap();
        let cgroup = Self { dir, controller };
        let (file, swap) = match controller {
            Controller::V2 => ("memory.max", Some("memory.swap.max")),
            Controller::V1 => ("memory.limit_in_bytes", None),
        };
        cgroup.write(file, &limit.to_string());
        // The limit is on memory, not memory and swap: no swapping around it.
        if let Some(swap) = swap.filter(|s| cgroup.dir.join(s).exists()) {
            cgroup.write(swap, "0");
        }
        assert_eq!(cgroup.read(file).trim(), limit.to_string(), "{file}");
        cgroup
    }

    fn write(&self, file: &str, value: &str) {
        std::fs::write(self.dir.join(file), value).unwrap_or_else(|e| {
            panic!("writing {value} to {}: {e}", self.dir.join(file).display())
        });
    }

    fn read(&self, file: &str) -> String {
        std::fs::read_to_string(self.dir.join(file))
            .unwrap_or_else(|e| panic!("reading {}: {e}", self.dir.join(file).display()))
    }

    /// A `key value` line of a flat-keyed file (memory.events, memory.oom_control).
    fn key(&self, file: &str, key: &str) -> u64 {
        self.read(file)
            .lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')?.trim().parse().ok())
            .unwrap_or_else(|| panic!("{file} has no {key}"))
    }

    /// Processes the cgroup's memory controller OOM-killed.
    pub fn oom_kills(&self) -> u64 {
        match self.controller {
            Controller::V2 => self.key("memory.events", "oom_kill"),
            Controller::V1 => self.key("memory.oom_control", "oom_kill"),
        }
    }

    /// The most memory charged to the cgroup at once.
    pub fn peak(&self) -> u64 {
        let file = match self.controller {
            Controller::V2 => "memory.peak",
            Controller::V1 => "memory.max_usage_in_bytes",
        };
        self.read(file).trim().parse().unwrap()
    }

    /// Times the usage reached the limit (and the kernel reclaimed, or failed to).
    pub fn at_limit(&self) -> u64 {
        match self.controller {
            Controller::V2 => self.key("memory.events", "max"),
            Controller::V1 => self.read("memory.failcnt").trim().parse().unwrap(),
        }
    }

    pub fn holds(&self, pid: i32) -> bool {
        self.read("cgroup.procs")
            .lines()
            .any(|l| l.trim() == pid.to_string())
    }
}

impl Drop for MemoryCgroup {
    fn drop(&mut self) {
        // The daemon it held may still be exiting: an empty cgroup can go.
        let deadline = Instant::now() + Duration::from_secs(10);
        while let Err(e) = std::fs::remove_dir(&self.dir) {
            if Instant::now() > deadline {
                eprintln!("removing {}: {e}", self.dir.display());
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_systemd_writes_them() {
        assert_eq!(parse_size("160M").unwrap(), 160 << 20);
        assert_eq!(parse_size(" 2G ").unwrap(), 2 << 30);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert!(parse_size("10T").is_err());
        assert!(memory_max().unwrap() > 0);
    }
}
