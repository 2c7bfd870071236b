//! The `history-service` command line: its arguments (`args`), the commands run from them (here)
//! and what they print (`render`). Errors become `anyhow` here, at the binary's edge.

mod args;
mod render;

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;

pub use args::{Cli, Command, DeadLetterSelection, DeadLettersCommand, MigrateArgs, VerifyArgs};

use crate::actors::trace_check::TraceCheck;
use crate::config::Settings;
use crate::kafka::tail::TailReader;
use crate::store::dead_letters;
use crate::store::{Database, migrate, verify};

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
        Command::Run => {
            let result = runtime.block_on(run_service(&settings));
            // What the stop left running (a thread blocked on a broker that does not answer,
            // the runtime's tasks) is not waited for: the stop has already reported. Nor are
            // the C libraries' exit handlers run: OpenSSL's cleanup would free what a Kafka
            // client's thread still using TLS reads (a CI run saw the TLS test's service exit
            // by a signal after its last line, "history-service stopped").
            let code = exit_code(result);
            use std::io::Write as _;
            let _ = std::io::stdout().flush();
            let _ = std::io::stderr().flush();
            // SAFETY: `_exit` ends the process at once; everything to keep is written above.
            unsafe { libc::_exit(code) }
        }
        Command::DeadLetters(command) => runtime.block_on(run_dead_letters(&settings, &command)),
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

/// `run`'s exit status: 0 for a clean stop, 3 with leftovers, 2 for an error.
fn exit_code(result: anyhow::Result<u8>) -> i32 {
    match result {
        Ok(code) => code.into(),
        Err(err) => {
            eprintln!("error: {err:#}");
            2
        }
    }
}

/// `run`'s exit code when it stopped gracefully but the final commit did not cover every
/// record it wrote (the database or the broker did not answer in time): nothing is lost, the
/// next owner re-reads those records.
pub const EXIT_STOPPED_WITH_LEFTOVERS: u8 = 3;

async fn run_service(settings: &Settings) -> anyhow::Result<u8> {
    let stop = crate::app::shutdown_signals();
    let handles = crate::app::RunHandles::default();
    let report = crate::app::run(settings, stop, handles)
        .await
        .context("history-service failed")?;
    Ok(if report.left.is_clean() {
        0
    } else {
        EXIT_STOPPED_WITH_LEFTOVERS
    })
}

async fn run_dead_letters(
    settings: &Settings,
    command: &DeadLettersCommand,
) -> anyhow::Result<ExitCode> {
    let database = Database::from_settings(&settings.database)?;
    let client = database
        .connect()
        .await
        .with_context(|| format!("failed to connect to {}", database.target()))?;
    match command {
        DeadLettersCommand::List { filter, payload } => {
            let letters = dead_letters::list(&client, &filter.filter()).await?;
            render::dead_letters(&letters, *payload);
            let counts = dead_letters::count_by_reason(&client).await?;
            render::dead_letter_counts(letters.len(), &counts);
            Ok(ExitCode::SUCCESS)
        }
        DeadLettersCommand::Replay {
            filter,
            to_topic,
            all,
            dry_run,
            timeout,
        } => {
            if !filter.narrows() && !all {
                anyhow::bail!(
                    "replay needs a selection (--topic, --partition, --offset, --reason) or --all"
                );
            }
            let letters = dead_letters::list(&client, &filter.filter()).await?;
            if let (Some(offset), None) = (filter.offset, &filter.topic) {
                let topics: std::collections::BTreeSet<&str> =
                    letters.iter().map(|letter| letter.topic.as_str()).collect();
                if topics.len() > 1 {
                    anyhow::bail!(
                        "letters at offset {offset} of that partition are stored for several \
                         topics ({}): name one with --topic",
                        topics.into_iter().collect::<Vec<_>>().join(", ")
                    );
                }
            }
            if *dry_run {
                for letter in &letters {
                    let target = to_topic.as_deref().unwrap_or(&letter.topic);
                    println!("would replay {} to {target}", origin(letter));
                }
                println!("would replay {} dead letters", letters.len());
                return Ok(ExitCode::SUCCESS);
            }
            let timeout = Duration::from_secs(*timeout);
            replay_dead_letters(settings, &client, &letters, to_topic.as_deref(), timeout).await
        }
        DeadLettersCommand::Publish => publish_dead_letters(settings, &database).await,
        DeadLettersCommand::SetAside {
            topic,
            partition,
            offset,
            reason,
            wait,
        } => {
            let tp = crate::domain::TopicPartition::new(topic, *partition);
            let pool = database.pool(1, settings.database.connect_timeout());
            set_aside(
                &pool,
                &client,
                &tp,
                *offset,
                reason.as_deref(),
                Duration::from_secs(*wait),
            )
            .await
        }
    }
}

/// How often `set-aside` looks for the replica's answer.
const SET_ASIDE_POLL: Duration = Duration::from_millis(200);

/// `dead-letters set-aside`: asks, through `stuck_events`, the replica retrying the event at
/// `tp`/`offset` to store it as a dead letter, and waits up to `wait` for its answer.
async fn set_aside(
    pool: &crate::store::PgPool,
    client: &tokio_postgres::Client,
    tp: &crate::domain::TopicPartition,
    offset: i64,
    reason: Option<&str>,
    wait: Duration,
) -> anyhow::Result<ExitCode> {
    use crate::store::stuck;
    let Some(stuck) = stuck::lookup(pool, tp, offset).await? else {
        let letters = dead_letters::list(
            client,
            &dead_letters::DeadLetterFilter {
                topic: Some(tp.topic.to_string()),
                partition: Some(tp.partition),
                offset: Some(offset),
                reason_code: None,
                include_replayed: true,
                limit: 1,
            },
        )
        .await?;
        match letters.first() {
            Some(letter) => println!(
                "{tp} offset {offset} is not stuck: it is a dead letter already (reason {})",
                letter.reason_code
            ),
            None => println!(
                "{tp} offset {offset} is not stuck: no replica reports an event the database \
                 rejects there (a stuck event is named by the service's ERROR line and by \
                 history_stuck_event; an event written or a record dead-lettered is not stuck)"
            ),
        }
        return Ok(ExitCode::from(1));
    };
    if let (Some(by), Some(at)) = (&stuck.resolved_by, stuck.resolved_at) {
        let asked = stuck
            .request
            .as_ref()
            .map(|request| format!(" (asked by {} at {})", request.by, request.at.to_rfc3339()))
            .unwrap_or_default();
        println!(
            "{tp} offset {offset} (event_id {}) was set aside already{asked}: stored as a dead \
             letter by replica {by} at {}",
            stuck.event_id,
            at.to_rfc3339()
        );
        return Ok(ExitCode::SUCCESS);
    }
    stuck::request_set_aside(pool, tp, offset, &crate::replica::operator(), reason).await?;
    println!(
        "asked to set aside {tp} offset {offset} (event_id {}; the database rejects it: {}: {}; \
         retried by replica {} since {})",
        stuck.event_id,
        stuck.sqlstate,
        stuck.error,
        stuck.replica,
        stuck.stuck_since.to_rfc3339()
    );
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        if let Some(now) = stuck::lookup(pool, tp, offset).await? {
            if let (Some(by), Some(at)) = (now.resolved_by, now.resolved_at) {
                println!(
                    "set aside: {tp} offset {offset} is a dead letter now (reason set_aside), \
                     stored by replica {by} at {}; its partition moves on",
                    at.to_rfc3339()
                );
                return Ok(ExitCode::SUCCESS);
            }
        }
        if tokio::time::Instant::now() >= deadline {
            println!(
                "no replica has set it aside within {} s: the replica holding {tp} answers at \
                 its next retry (within pipeline.retry_max_ms); the request stands",
                wait.as_secs()
            );
            return Ok(ExitCode::from(1));
        }
        tokio::time::sleep(SET_ASIDE_POLL).await;
    }
}

/// Letters whose delivery is awaited at once during a replay.
const REPLAY_IN_FLIGHT: usize = 256;

fn origin(letter: &dead_letters::StoredDeadLetter) -> String {
    format!("{}/{}/{}", letter.topic, letter.partition, letter.offset)
}

/// `dead-letters replay`: publishes every letter, each delivery awaited until `timeout` from
/// the start at most, and marks a letter replayed only once the broker confirmed it. Letters
/// not confirmed in time, or refused, are left as they were and make it fail (exit 2).
async fn replay_dead_letters(
    settings: &Settings,
    client: &tokio_postgres::Client,
    letters: &[dead_letters::StoredDeadLetter],
    to_topic: Option<&str>,
    timeout: Duration,
) -> anyhow::Result<ExitCode> {
    use futures::StreamExt;

    let replayer = crate::kafka::replay::Replayer::new(&settings.kafka, timeout)?;
    let replayer = &replayer;
    let mut deliveries = futures::stream::iter(letters)
        .map(|letter| async move { (letter, replayer.replay(letter, to_topic).await) })
        .buffered(REPLAY_IN_FLIGHT);
    let (mut replayed, mut failed) = (0, 0);
    let mut first_error = None;
    while let Some((letter, delivered)) = deliveries.next().await {
        let target = to_topic.unwrap_or(&letter.topic);
        match delivered {
            Ok((partition, offset)) => {
                dead_letters::mark_replayed(client, letter).await?;
                println!(
                    "replayed {} to {target}/{partition}/{offset}",
                    origin(letter)
                );
                replayed += 1;
            }
            Err(err) => {
                println!("not replayed {} to {target}: {err}", origin(letter));
                failed += 1;
                first_error.get_or_insert(err);
            }
        }
    }
    println!("replayed {replayed} dead letters");
    match first_error {
        None => Ok(ExitCode::SUCCESS),
        Some(err) => anyhow::bail!(
            "{failed} of {} dead letters not replayed ({err}); they are not marked replayed: \
             run the replay again once the broker accepts them",
            letters.len()
        ),
    }
}

/// `dead-letters publish`: the relay's rounds, run once until nothing is pending or a round fails.
async fn publish_dead_letters(
    settings: &Settings,
    database: &Database,
) -> anyhow::Result<ExitCode> {
    let topic = &settings.dead_letter.topic;
    if topic.is_empty() {
        anyhow::bail!("dead_letter.topic is not set: there is no topic to publish to");
    }
    let publisher =
        crate::kafka::dead_letter_topic::DeadLetterPublisher::new(&settings.kafka, topic)?;
    let pool = database.pool(1, settings.database.connect_timeout());
    let (mut published, mut failed) = (0, 0);
    loop {
        // Every pending letter, whether its backoff is over or not: an operator asks now.
        let round = publisher
            .publish_round(
                &pool,
                settings.pipeline.retry_initial(),
                settings.pipeline.retry_max(),
                true,
            )
            .await?;
        published += round.published;
        failed += round.failed;
        if round.pending == 0 || round.failed > 0 {
            break;
        }
    }
    println!("published {published} dead letters to {topic}; {failed} failed");
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        println!("see `history-service dead-letters list` for each one's reason");
        ExitCode::from(1)
    })
}

async fn run_migrate(settings: &Settings, args: &MigrateArgs) -> anyhow::Result<ExitCode> {
    let database = Database::from_settings(&settings.database)?;
    let target = database.target();
    if args.create_database && migrate::create_database_if_missing(&database).await? {
        println!("created database {target}");
    }
    let report = migrate::run_migrations_within(&database, settings.database.migration_timeout())
        .await
        .with_context(|| format!("failed to migrate {target}"))?;
    render::migration(&target, &report);
    Ok(ExitCode::SUCCESS)
}

async fn run_verify(settings: &Settings, args: &VerifyArgs) -> anyhow::Result<ExitCode> {
    let database = Database::from_settings(&settings.database)?;
    let target = database.target();
    let client = database
        .connect()
        .await
        .with_context(|| format!("failed to connect to {target}"))?;
    let report = verify::verify(&client, args.limit)
        .await
        .with_context(|| format!("failed to check {target}"))?;
    render::verification(&target, &report);
    let behind = if args.no_kafka {
        false
    } else {
        verify_against_kafka(settings, &database).await?
    };
    Ok(if report.is_consistent() && !behind {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// How long verify waits for the cluster's metadata before it says it could not check.
const VERIFY_KAFKA_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// The newest records below the group's committed offset of every partition of `kafka.topics`
/// must be in the database; `true` if some partition's are not (a database restored from a
/// backup, or emptied, while the group's offsets stayed). A cluster that cannot be reached is
/// said, and does not fail the check of the database.
async fn verify_against_kafka(settings: &Settings, database: &Database) -> anyhow::Result<bool> {
    let reader = TailReader::new(&settings.kafka)?;
    let topics = settings.kafka.topics.clone();
    let partitions = tokio::task::spawn_blocking(move || {
        (reader.partitions(&topics, VERIFY_KAFKA_TIMEOUT), reader)
    })
    .await?;
    let (partitions, reader) = match partitions {
        (Ok(partitions), reader) => (partitions, reader),
        (Err(err), _) => {
            render::kafka_unchecked(&settings.kafka.group_id, &err.to_string());
            return Ok(false);
        }
    };
    let pool = database.pool(1, settings.database.connect_timeout());
    drop(reader);
    let check = TraceCheck::new(
        settings.kafka.clone(),
        pool,
        settings.pipeline.max_payload_bytes,
    );
    let verdicts = check.check(partitions).await;
    Ok(render::kafka_verification(
        &settings.kafka.group_id,
        &verdicts,
    ))
}
