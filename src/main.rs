fn main() -> std::process::ExitCode {
    limit_malloc_arenas();
    history_service::cli::main()
}

/// glibc gives each busy thread its own malloc arena; the pipeline's threads each allocate and
/// free many small buffers, and a dozen arenas fragment into far more resident memory than the
/// data needs. Two arenas keep the peak RSS down at no measurable cost on a small machine.
fn limit_malloc_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator parameters; it is called before any thread starts.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}
