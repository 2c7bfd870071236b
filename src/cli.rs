//! The `history-service` command line. Errors become `anyhow` here, at the binary's edge.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};

use crate::config::Settings;
use crate::store::{migrate, verify};

#[derive(Debug, Parser)]
#[command(
    name = "history-service",
    version,
    about = "Keeps an exactly-once-in-effect projection of ticket status events from Kafka in PostgreSQL",
    long_about = None,
)]
pub struct Cli {
    /// Configuration file layered over the built-in defaults (environment variables
    /// HISTORY__SECTION__KEY override both).
    #[arg(
        long,
        short = 'c',
        global = true,
        env = "HISTORY_CONFIG",
        value_name = "PATH"
    )]
    pub config: Option<PathBuf>,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Apply pending database migrations, then exit. Safe to run from several replicas at once.
    Migrate(MigrateArgs),
    /// Check the database's invariants: every inbox marker has its history row and every row
    /// its marker. Exits 0 if they hold, 1 naming the offending event_ids if not, 2 on error.
    Verify(VerifyArgs),
}

#[derive(Debug, clap::Args)]
pub struct MigrateArgs {
    /// Create the configured database first if it does not exist.
    #[arg(long)]
    pub create_database: bool,
}

#[derive(Debug, clap::Args)]
pub struct VerifyArgs {
    /// Most offending event_ids listed per kind of violation.
    #[arg(long, default_value_t = 100)]
    pub limit: i64,
}

/// Parses the command line, runs the command, and maps the result to the exit code.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let settings = match Settings::load(cli.config.as_deref()) {
        Ok(settings) => settings,
        Err(err) => {
            eprintln!("error: {err}");
            return ExitCode::from(2);
        }
    };
    crate::telemetry::init(&settings.log);
    let runtime = actix_rt::System::new();
    let result = match cli.command {
        Command::Migrate(args) => runtime.block_on(run_migrate(&settings, &args)),
        Command::Verify(args) => runtime.block_on(run_verify(&settings, &args)),
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::from(2)
        }
    }
}

async fn run_migrate(settings: &Settings, args: &MigrateArgs) -> anyhow::Result<ExitCode> {
    let config = settings.database.postgres_config()?;
    let target = settings.database.display_target();
    if args.create_database && migrate::create_database_if_missing(&config).await? {
        println!("created database {target}");
    }
    let mut client = migrate::connect(&config)
        .await
        .with_context(|| format!("failed to connect to {target}"))?;
    let report = migrate::run_migrations(&mut client)
        .await
        .with_context(|| format!("failed to migrate {target}"))?;
    if report.applied.is_empty() {
        println!("{target}: schema up to date ({} migrations)", report.known);
    } else {
        println!(
            "{target}: applied {} ({} migrations known)",
            report.applied.join(", "),
            report.known
        );
    }
    Ok(ExitCode::SUCCESS)
}

async fn run_verify(settings: &Settings, args: &VerifyArgs) -> anyhow::Result<ExitCode> {
    let config = settings.database.postgres_config()?;
    let target = settings.database.display_target();
    let client = migrate::connect(&config)
        .await
        .with_context(|| format!("failed to connect to {target}"))?;
    let report = verify::verify(&client, args.limit)
        .await
        .with_context(|| format!("failed to check {target}"))?;
    println!("database:                       {target}");
    println!("inbox markers:                  {}", report.inbox_markers);
    println!("history rows:                   {}", report.history_rows);
    println!(
        "markers without a history row:  {}",
        report.markers_without_row_total
    );
    println!(
        "history rows without a marker:  {}",
        report.rows_without_marker_total
    );
    if report.is_consistent() {
        println!("OK: every inbox marker has its history row, and every row its marker");
        return Ok(ExitCode::SUCCESS);
    }
    print_offenders(
        "lost events (marker without history row)",
        &report.markers_without_row,
        report.markers_without_row_total,
    );
    print_offenders(
        "history rows without a marker",
        &report.rows_without_marker,
        report.rows_without_marker_total,
    );
    Ok(ExitCode::from(1))
}

fn print_offenders(title: &str, ids: &[String], total: i64) {
    if total == 0 {
        return;
    }
    println!("VIOLATION: {title}: {total}");
    for id in ids {
        println!("  {id}");
    }
    if total > ids.len() as i64 {
        println!("  ... and {} more", total - ids.len() as i64);
    }
}
