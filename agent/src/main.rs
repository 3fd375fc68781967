use std::process::ExitCode;

/// mimalloc rather than glibc's malloc: every relist frees the listing the runtime handed
/// over, thousands of small records, and glibc's free reads the chunks around each one, which
/// at 10,000 pods are no longer in the CPU's caches. With mimalloc the pure core's full relist
/// took 316 ns per pod at 10,000 pods instead of 810, and freeing the listing grew 1.6x per pod
/// from 100 to 10,000 pods instead of 4.6x (`cargo xtask bench`, relist_core).
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
