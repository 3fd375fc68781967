//! plegd's heap on the node: what keeps it small under mimalloc (the binary's allocator) and
//! under glibc's malloc (the C libraries', and the allocator of a program embedding plegd).

/// Keeps transparent huge pages out of the process. mimalloc asks for them on the arena it
/// reserves (`madvise(MADV_HUGEPAGE)`), and the kernel's khugepaged then makes each 2 MiB of the
/// arena that holds any live block one huge page, resident whole: idle with 10 containers,
/// plegd's RSS grew from 22 to 35 MiB in the 40 s after its start (18 MiB of it huge pages),
/// where glibc's malloc held 14.7. A heap of a few MiB gains nothing from them. The flag is
/// the process's: it covers the mappings made before the call too. Best effort: a kernel
/// without it (before 3.15) keeps its default.
pub fn keep_huge_pages_out() {
    // SAFETY: PR_SET_THP_DISABLE takes integers only and changes no memory of the process.
    unsafe {
        libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0);
    }
}

/// Hands the heap freed by the probes' load back to the kernel. Parsing the kernel's BTF
/// (aya's loader and ours) allocates some 50 MiB that is freed once the programs are loaded,
/// and neither allocator returns it at once.
pub(crate) fn release_freed() {
    // SAFETY: mi_collect has no preconditions; it frees mimalloc's unused pages.
    unsafe {
        libmimalloc_sys::mi_collect(true);
    }
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim has no preconditions; it only returns free pages to the kernel.
    unsafe {
        libc::malloc_trim(0);
    }
}
