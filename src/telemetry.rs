//! Logging: `tracing` to stderr, human or JSON, filtered by `log.filter` or `RUST_LOG`.
//! Standard output is left to the commands' own reports (and `dev-kafka`'s address line).

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

use crate::config::{LogFormat, LogSettings};

/// Installs the global subscriber. Safe to call more than once (later calls are ignored), so
/// tests and commands need not coordinate.
pub fn init(settings: &LogSettings) {
    let filter = std::env::var("RUST_LOG")
        .ok()
        .and_then(|directives| directives.parse::<EnvFilter>().ok())
        .unwrap_or_else(|| EnvFilter::new(&settings.filter));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let _ = match settings.format {
        LogFormat::Human => builder.with_target(false).try_init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(false)
            .try_init(),
    };
}
