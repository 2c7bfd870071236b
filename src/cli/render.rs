//! What the commands print on standard output: the dead-letter table, the migration and the
//! verification reports. The log goes to standard error, so these stay readable by scripts.

use crate::actors::trace_check::Verdict;
use crate::domain::TopicPartition;
use crate::store::dead_letters::StoredDeadLetter;
use crate::store::migrate::MigrationReport;
use crate::store::verify::VerifyReport;

/// `dead-letters list`: one line per letter, its payload (with `payload`) and, when it is to be
/// published to the dead-letter topic, where that stands.
pub(super) fn dead_letters(letters: &[StoredDeadLetter], payload: bool) {
    println!(
        "{:<24} {:>9} {:>10}  {:<18} {:<20} {:<20} REASON",
        "TOPIC", "PARTITION", "OFFSET", "CODE", "FIRST SEEN", "REPLAYED"
    );
    for letter in letters {
        println!(
            "{:<24} {:>9} {:>10}  {:<18} {:<20} {:<20} {}",
            letter.topic,
            letter.partition,
            letter.offset,
            letter.reason_code,
            letter.first_seen.format("%Y-%m-%d %H:%M:%S"),
            letter.replayed_at.map_or("-".to_owned(), |at| at
                .format("%Y-%m-%d %H:%M:%S")
                .to_string()),
            letter.reason
        );
        if payload {
            println!("    payload: {}", preview(letter.payload.as_deref()));
        }
        if let Some(topic) = &letter.publish_to {
            println!("    {}", publish_state(topic, letter));
        }
    }
}

/// The line under the table: how many letters were shown, and all of them by reason code.
pub(super) fn dead_letter_counts(shown: usize, counts: &[(String, i64)]) {
    let summary: Vec<String> = counts
        .iter()
        .map(|(code, count)| format!("{code}={count}"))
        .collect();
    println!(
        "{} shown; all dead letters by reason: {}",
        shown,
        if summary.is_empty() {
            "none".to_owned()
        } else {
            summary.join(" ")
        }
    );
}

/// Where a letter stands with the dead-letter topic.
fn publish_state(topic: &str, letter: &StoredDeadLetter) -> String {
    match (&letter.published_at, &letter.publish_error) {
        (Some(at), _) => format!("published to {topic} at {}", at.format("%Y-%m-%d %H:%M:%S")),
        (None, error) => format!(
            "not yet published to {topic}: {} failed attempts{}",
            letter.publish_attempts,
            error
                .as_ref()
                .map_or(String::new(), |error| format!(", last error: {error}"))
        ),
    }
}

/// A payload for a terminal: escaped, at most 200 bytes.
fn preview(payload: Option<&[u8]>) -> String {
    match payload {
        None => "(null: tombstone)".to_owned(),
        Some(bytes) => {
            let shown = &bytes[..bytes.len().min(200)];
            let text: String = shown.escape_ascii().to_string();
            if bytes.len() > shown.len() {
                format!("{text}... ({} bytes)", bytes.len())
            } else {
                text
            }
        }
    }
}

/// `migrate`: what this run applied, or that there was nothing to apply.
pub(super) fn migration(target: &str, report: &MigrationReport) {
    if report.applied.is_empty() {
        println!("{target}: schema up to date ({} migrations)", report.known);
    } else {
        println!(
            "{target}: applied {} ({} migrations known)",
            report.applied.join(", "),
            report.known
        );
    }
}

/// `verify`: the counts, then either OK or each violation with the offending event_ids.
pub(super) fn verification(target: &str, report: &VerifyReport) {
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
        return;
    }
    offenders(
        "lost events (marker without history row)",
        &report.markers_without_row,
        report.markers_without_row_total,
    );
    offenders(
        "history rows without a marker",
        &report.rows_without_marker,
        report.rows_without_marker_total,
    );
}

/// What the check against the group's committed offsets found; `true` if a partition is behind.
pub(super) fn kafka_verification(group: &str, verdicts: &[(TopicPartition, Verdict)]) -> bool {
    let checked = verdicts
        .iter()
        .filter(|(_, v)| matches!(v, Verdict::Traced { .. }))
        .count();
    println!(
        "kafka group:                    {group}: {} partitions, {checked} with records below \
         the committed offset checked",
        verdicts.len()
    );
    let mut behind = false;
    for (tp, verdict) in verdicts {
        match verdict {
            Verdict::Behind { .. } => {
                behind = true;
                let finding = verdict.finding(tp, group).unwrap_or_default();
                println!(
                    "VIOLATION: the database lacks records the group committed past: {finding}"
                );
            }
            Verdict::Unchecked(why) => println!("NOT CHECKED: {tp}: {why}"),
            Verdict::Traced { .. } | Verdict::NothingToCheck => {}
        }
    }
    if !behind {
        println!(
            "OK: the database holds the newest records below each committed offset (the {} \
             newest of each partition checked)",
            crate::actors::trace_check::TAIL
        );
    }
    behind
}

/// The cluster could not be asked: the database alone was checked.
pub(super) fn kafka_unchecked(group: &str, why: &str) {
    println!(
        "NOT CHECKED: the committed offsets of group {group} against the database: the Kafka \
         cluster did not answer ({why}); --no-kafka skips this check"
    );
}

fn offenders(title: &str, ids: &[String], total: i64) {
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
