//! What the Kafka client holds in memory, measured: librdkafka allocates with glibc's malloc
//! (the service's own allocations go to jemalloc, `src/main.rs`), so glibc's heap in use is
//! librdkafka's prefetch — its queue and the fetch responses it decompresses — and its
//! bookkeeping. Exported as `history_kafka_client_heap_bytes`, beside the budget's share it is
//! sized for.
//!
//! And one setting of glibc for it: its fetch buffers are large and short-lived (a response, a
//! decompressed batch of up to a megabyte or so). glibc serves allocations above
//! `M_MMAP_THRESHOLD` with their own mappings, returned to the system when freed, but by default
//! it raises the threshold to the size of every such block freed, so that later ones come from
//! its arenas, where freed memory stays resident. Fixing the threshold at 128 KiB keeps the
//! process's resident memory at what librdkafka holds now rather than the most it ever held.

/// glibc's default mmap threshold, kept fixed.
const MMAP_THRESHOLD: i32 = 128 * 1024;

/// Fixes glibc's mmap threshold (see the module documentation). Call once, at start-up.
pub fn tune_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets a parameter of glibc's allocator; any value is accepted.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
    }
}

/// The bytes glibc's heap has in use (its arenas' and its mapped blocks'), where glibc reports
/// them.
pub fn heap_bytes() -> Option<u64> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallinfo2 reads glibc's allocator statistics; it takes and returns plain values.
        let info = unsafe { libc::mallinfo2() };
        Some((info.uordblks + info.hblkhd) as u64)
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glibcs_heap_counts_what_c_code_allocates() {
        let Some(before) = heap_bytes() else {
            panic!("glibc reports no heap on this target");
        };
        // SAFETY: a plain allocation through glibc, freed below.
        let block = unsafe { libc::malloc(256 << 20) };
        assert!(!block.is_null());
        let during = heap_bytes().unwrap();
        // SAFETY: allocated above, freed once.
        unsafe { libc::free(block) };
        // Far larger than what other tests may free meanwhile.
        assert!(during >= before + (200 << 20), "{before} then {during}");
    }
}
