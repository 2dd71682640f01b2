//! The C allocator's settings for pelican's own processes.
//!
//! A worker reads each large body (4 KiB and more) into a buffer of its own and frees it
//! once the body is decoded or handled. glibc's malloc gives the free top of its heap back
//! to the kernel once it passes 128 KiB, so at 100 KB bodies the worker took most of each
//! body's pages fresh from the kernel again: 1.4-12 page faults per request, and about a
//! third of the worker's CPU (docs/benchmarks/2026-12-03-3f1306c-kept-memory.md). Here
//! freed memory is kept up to [`TRIM_THRESHOLD`] and blocks up to [`MMAP_THRESHOLD`] come
//! from the heap: the process stays at the high-water mark of what it held at once
//! (bounded by the bodies in flight) instead of faulting it in again on every read.
//!
//! A program of its own using the library decides this for itself (README, "Large
//! bodies"). An operator's `GLIBC_TUNABLES` with malloc settings wins over these.

/// Free memory at the top of the heap kept rather than given back.
pub const TRIM_THRESHOLD: usize = 64 << 20;
/// Blocks at least this large get a mapping of their own (and their pages are given back
/// when freed); smaller ones come from the heap.
pub const MMAP_THRESHOLD: usize = 32 << 20;

/// Applies [`TRIM_THRESHOLD`] and [`MMAP_THRESHOLD`] (glibc on Linux only; elsewhere, or
/// with malloc settings in `GLIBC_TUNABLES`, nothing).
pub fn keep_freed_memory() {
    let tuned = std::env::var("GLIBC_TUNABLES").is_ok_and(|t| t.contains("glibc.malloc."));
    if tuned {
        return;
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes the allocator's parameters; called before anything
    // else runs, with values in range.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD as libc::c_int);
        libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD as libc::c_int);
    }
}
