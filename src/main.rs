/// jemalloc instead of glibc's malloc: the pipeline allocates and frees several small buffers per
/// record on half a dozen threads. Measured against glibc (with its arenas capped at two, which
/// kept its resident memory down): the same peak RSS, and about a tenth less of the service's CPU
/// per event (docs/benchmarks.md). librdkafka's own allocations stay with glibc.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> std::process::ExitCode {
    history_service::kafka::client_memory::tune_allocator();
    history_service::cli::main()
}
