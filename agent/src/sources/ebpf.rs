//! Loading and attaching plegd's eBPF programs.

use aya::{Ebpf, programs::TracePoint};

/// The eBPF object built by build.rs from the `plegd-ebpf` crate.
static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/plegd"));

/// The tracepoints plegd attaches to, as `(program name, category, tracepoint name)`.
const TRACEPOINTS: &[(&str, &str, &str)] = &[("sched_process_exec", "sched", "sched_process_exec")];

/// Why the kernel probes could not be loaded; polling mode still works.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("loading the eBPF object: {0}")]
    Load(#[from] aya::EbpfError),
    #[error("eBPF program {name} missing from the object")]
    MissingProgram { name: &'static str },
    #[error("eBPF program {name}: {source}")]
    Program {
        name: &'static str,
        #[source]
        source: aya::programs::ProgramError,
    },
}

/// Loaded and attached probes; detached when dropped.
pub struct Probes {
    ebpf: Ebpf,
}

impl Probes {
    /// Loads the embedded object and attaches every program to its tracepoint.
    pub fn load() -> Result<Self, LoadError> {
        bump_memlock_rlimit();
        let mut ebpf = Ebpf::load(EBPF_OBJECT)?;
        for &(name, category, tracepoint) in TRACEPOINTS {
            let program: &mut TracePoint = ebpf
                .program_mut(name)
                .ok_or(LoadError::MissingProgram { name })?
                .try_into()
                .map_err(|source| LoadError::Program { name, source })?;
            program
                .load()
                .map_err(|source| LoadError::Program { name, source })?;
            program
                .attach(category, tracepoint)
                .map_err(|source| LoadError::Program { name, source })?;
        }
        Ok(Self { ebpf })
    }

    /// Names of the attached programs.
    pub fn program_names(&self) -> Vec<String> {
        self.ebpf
            .programs()
            .map(|(name, _)| name.to_owned())
            .collect()
    }
}

/// Kernels before 5.11 charge BPF maps to RLIMIT_MEMLOCK. Newer ones account to the memory
/// cgroup, and raising the limit needs CAP_SYS_RESOURCE, so failure is not an error.
fn bump_memlock_rlimit() {
    let rlim = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: setrlimit reads a valid, initialised rlimit struct.
    let ret = unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &rlim) };
    if ret != 0 {
        tracing::debug!(
            error = %std::io::Error::last_os_error(),
            "could not raise RLIMIT_MEMLOCK (not needed on kernels >= 5.11)"
        );
    }
}
