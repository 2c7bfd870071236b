fn main() -> std::process::ExitCode {
    history_service::cli::main()
}
