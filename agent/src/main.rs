use std::process::ExitCode;

/// mimalloc rather than glibc's malloc: every relist frees the listing the runtime handed
/// over, thousands of small records, and glibc's free reads the chunks around each one, which
/// at 10,000 pods are no longer in the CPU's caches (measured: docs/benchmarks.md, "Why some
/// constants are what they are").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Run by the loader before Rust's runtime starts, so before mimalloc's first allocation:
/// called from `main`, the first 2 MiB of mimalloc's arena were already one huge page.
#[used]
#[unsafe(link_section = ".init_array")]
static KEEP_HUGE_PAGES_OUT: extern "C" fn() = keep_huge_pages_out;

extern "C" fn keep_huge_pages_out() {
    plegd::base::heap::keep_huge_pages_out();
}

fn main() -> ExitCode {
    plegd::cli::main()
}
