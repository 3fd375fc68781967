//! What plegd asks of the machine's kernel that no layer owns: its page size (the eBPF ring
//! buffer's unit, and the unit of a memory cgroup's limit as the kernel holds it).

/// This machine's page size; 4 KiB if it cannot be read (it always can on Linux).
pub fn page_size() -> u64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .and_then(|page| u64::try_from(page).ok())
        .unwrap_or(4096)
}
