//! The checks made from outside: every commit an instance logged against the database (each
//! record before it durable first, positions never moving backwards), and at the end nothing
//! lost, nothing twice, every poison record kept, every partition committed to its end.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use history_devkit::group::GroupInspector;
use history_devkit::workload::{PlannedRecord, RecordKind};

use crate::broker::SentCommit;
use crate::producer::Deliveries;
use crate::schedule::{GROUP, PARTITIONS, TOPIC};

/// A commit the service logged: (instance, partition, offset, when it was logged — after the
/// broker confirmed it), and the epoch of the assignment it was made for.
pub type CommitSeen = (usize, i32, i64, chrono::DateTime<chrono::Utc>, u64);

/// When.
type At = chrono::DateTime<chrono::Utc>;

/// What an instance's log says of one of its assignments: (instance, partition, epoch, from,
/// until — `None` while it lasts). It ends when the instance released the partition after a
/// revoke, lost it, or (re)started.
pub type Owned = (usize, i32, u64, At, Option<At>);

/// When an instance's Kafka client said a partition's log was truncated and reset its position
/// (librdkafka's "Partition log truncation detected"): (instance, partition, when). The
/// service then reads the partition again from where the client resumed, and its position goes
/// back with it — by design (README, *logs that move back*). librdkafka's mock answers a leader
/// epoch it has no records of with "no offset" (`rd_kafka_mock_partition_offset_for_leader_epoch`
/// returns -1 where Kafka answers the end of the nearest earlier epoch), so a leadership moved
/// twice between productions reads as a truncation and the client resets to the log start.
pub type Truncated = (usize, i32, At);

/// Checks every commit the instances logged: each record before the committed offset must
/// already be in the database (its event recorded, or its dead letter stored), and a
/// partition's committed position never moves backwards.
pub struct Checker {
    handle: std::thread::JoinHandle<CheckerReport>,
    stop: Arc<AtomicBool>,
}

pub struct CheckerReport {
    pub checked: usize,
    pub covered: usize,
    pub violations: Vec<String>,
    /// Every commit the instances logged, per partition, in the order they left; with the
    /// assignments and truncations their logs told, for [`CheckerReport::backward`].
    commits: Vec<Vec<Committed>>,
    owned: Vec<Owned>,
    truncated: Vec<Truncated>,
    /// The longest time between two advances of any partition's committed position.
    pub longest_stall: Duration,
}

/// A copy of an earlier OffsetCommit request that reached the broker after a later one
/// (`SentCheck::late_copies`): (partition, the position it set the broker back to, when).
pub type LateCopy = (i32, i64, At);

/// The commits that moved a partition's position backwards, by whose doing.
#[derive(Debug, Default)]
pub struct Backward {
    /// The service's: each a violation.
    pub service: Vec<String>,
    /// Made while two instances held the partition at once, each committing within an
    /// assignment it held by its own log, both confirmed by the broker: the broker assigned the
    /// partition twice (librdkafka's mock KIP-848 group does, to a member that rejoined after
    /// being fenced, while the partition's owner had not revoked it). Reported apart, not
    /// counted as the service's: no member can see another's assignment. A zombie's commit —
    /// made after its own log lost the partition — is not this.
    pub double_assigned: Vec<String>,
    /// Made after the committing instance's client reported the partition's log truncated
    /// within the same assignment ([`Truncated`]): the position follows the log back.
    pub after_truncation: Vec<String>,
    /// The first position of a later assignment, equal to the one a late copy of an earlier
    /// request set the broker back to after the higher commit ([`LateCopy`]): the new owner
    /// starts where the broker's committed position stands, and the old one lost the partition
    /// before its re-assertion could repair it. Nothing is lost (the records from there are
    /// read again and found applied). Within one assignment the service re-asserts its own
    /// position, so a regression there is never this.
    pub after_late_copy: Vec<String>,
}

impl CheckerReport {
    /// The backward commits, classified with the late copies the wire showed.
    pub fn backward(&mut self, late_copies: &[LateCopy]) -> Backward {
        backward_commits(&mut self.commits, &self.owned, &self.truncated, late_copies)
    }
}

impl Checker {
    pub fn finish(self) -> CheckerReport {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.join().expect("checker")
    }
}

pub fn spawn_checker(
    feed: Receiver<CommitSeen>,
    database_url: String,
    records: Vec<PlannedRecord>,
    delivered: Arc<Mutex<Deliveries>>,
    owned: Arc<Mutex<Vec<Owned>>>,
    truncated: Arc<Mutex<Vec<Truncated>>>,
) -> Checker {
    let stop = Arc::new(AtomicBool::new(false));
    let stopping = stop.clone();
    let handle = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let mut verified = vec![0i64; PARTITIONS as usize];
        let mut checked = 0;
        let mut covered = 0;
        let mut violations = Vec::new();
        // Every commit seen, per partition, to check the order once all are in.
        let mut history: Vec<Vec<Committed>> = vec![Vec::new(); PARTITIONS as usize];
        let mut pending: Vec<CommitSeen> = Vec::new();
        let mut client: Option<tokio_postgres::Client> = None;
        loop {
            match feed.recv_timeout(Duration::from_millis(200)) {
                Ok(commit) => pending.push(commit),
                Err(_) if stopping.load(Ordering::Relaxed) && pending.is_empty() => break,
                Err(_) => {}
            }
            pending.extend(feed.try_iter());
            let mut retry = Vec::new();
            for (instance, partition, offset, at, epoch) in pending.drain(..) {
                let from = verified[partition as usize];
                if offset <= from {
                    // Every record below `from` was found durable by an earlier check.
                    covered += 1;
                    history[partition as usize].push((at, offset, instance, epoch));
                    continue;
                }
                // The records of this partition between what is verified and the commit.
                let wanted: Vec<(i64, &PlannedRecord)> = {
                    let delivered = delivered.lock().unwrap();
                    (from..offset)
                        .filter_map(|o| {
                            delivered
                                .by_place
                                .get(&(partition, o))
                                .map(|&i| (o, &records[i]))
                        })
                        .collect()
                };
                if (wanted.len() as i64) < offset - from && !stopping.load(Ordering::Relaxed) {
                    // Deliveries not all reported yet: look again shortly.
                    retry.push((instance, partition, offset, at, epoch));
                    continue;
                }
                match runtime.block_on(not_durable_at(
                    &mut client,
                    &database_url,
                    partition,
                    &wanted,
                    at,
                )) {
                    Ok(late) => {
                        for (offset_late, durable) in late {
                            violations.push(format!(
                                "instance {instance} committed partition {partition} to {offset} \
                                 at {at} while offset {offset_late} was not recorded (durable: \
                                 {durable:?})"
                            ));
                        }
                        verified[partition as usize] = offset;
                        checked += 1;
                        history[partition as usize].push((at, offset, instance, epoch));
                    }
                    // The database is restarting: the rows cannot have gone, check again later.
                    Err(_) => {
                        client = None;
                        retry.push((instance, partition, offset, at, epoch));
                    }
                }
            }
            pending = retry;
            if !pending.is_empty() {
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        let owned = owned.lock().unwrap().clone();
        let truncated = truncated.lock().unwrap().clone();
        for commits in &mut history {
            commits.sort();
        }
        CheckerReport {
            checked,
            covered,
            violations,
            longest_stall: longest_stall(&history),
            commits: history,
            owned,
            truncated,
        }
    });
    Checker { handle, stop }
}

/// A confirmed commit: when, the offset, the instance, the assignment's epoch.
type Committed = (At, i64, usize, u64);

/// The assignment, by its instance's own log, within which a commit was made, if any.
fn held(owned: &[Owned], partition: i32, commit: &Committed) -> Option<(At, Option<At>)> {
    let &(at, _, instance, epoch) = commit;
    owned
        .iter()
        .find(|&&(i, p, e, from, until)| {
            i == instance
                && p == partition
                && e == epoch
                && from <= at
                && until.is_none_or(|until| at <= until)
        })
        .map(|&(_, _, _, from, until)| (from, until))
}

/// Commits that moved a partition's position backwards, in the order they left (each commit
/// line's `queued_at`, taken under the ledger's lock; within one instance the order the broker
/// applies them), by whose doing ([`Backward`]).
fn backward_commits(
    history: &mut [Vec<Committed>],
    owned: &[Owned],
    truncated: &[Truncated],
    late_copies: &[LateCopy],
) -> Backward {
    let mut backward = Backward::default();
    for (partition, commits) in history.iter_mut().enumerate() {
        commits.sort();
        let partition = partition as i32;
        for pair in commits.windows(2) {
            let ((higher_at, before, first, first_epoch), (at, after, second, second_epoch)) =
                (pair[0], pair[1]);
            if after >= before {
                continue;
            }
            let line = format!(
                "partition {partition}: instance {second} committed {after} at {at}, after \
                 instance {first} had committed {before}: the position moved backwards"
            );
            // Each within an assignment its instance held, the two overlapping: two live owners
            // at once, both confirmed.
            let twice = first != second
                && match (
                    held(owned, partition, &pair[0]),
                    held(owned, partition, &pair[1]),
                ) {
                    (Some((a_from, a_until)), Some((b_from, b_until))) => {
                        a_from <= b_until.unwrap_or(at) && b_from <= a_until.unwrap_or(at)
                    }
                    _ => false,
                };
            // The committing instance's client reset the partition after a truncation it
            // detected, within the assignment the commit was made in.
            let truncation = held(owned, partition, &pair[1]).and_then(|(from, _)| {
                truncated.iter().find(|&&(i, p, when)| {
                    i == second && p == partition && from <= when && when <= at
                })
            });
            // Another assignment's commit of exactly the position a late copy set the broker
            // back to, after the higher commit and before this one.
            let late_copy = if (first, first_epoch) != (second, second_epoch) {
                late_copies.iter().find(|&&(p, offset, when)| {
                    p == partition && offset == after && higher_at <= when && when <= at
                })
            } else {
                None
            };
            if twice {
                backward.double_assigned.push(format!(
                    "{line}, both holding it (assigned twice by the broker)"
                ));
            } else if let Some((_, _, when)) = truncation {
                backward.after_truncation.push(format!(
                    "{line}, its client having reset the partition at {when} after detecting a \
                     log truncation"
                ));
            } else if let Some((_, _, when)) = late_copy {
                backward.after_late_copy.push(format!(
                    "{line}, a new assignment starting where a late copy of an earlier request \
                     set the broker back at {when}"
                ));
            } else {
                backward.service.push(line);
            }
        }
    }
    backward
}

/// The longest time between two advances of a partition's committed position, over every
/// partition (`history` sorted by time).
fn longest_stall(history: &[Vec<Committed>]) -> Duration {
    let mut longest = Duration::ZERO;
    for commits in history {
        let mut last: Option<(chrono::DateTime<chrono::Utc>, i64)> = None;
        for &(at, offset, _, _) in commits {
            match last {
                Some((since, position)) if offset > position => {
                    longest = longest.max((at - since).to_std().unwrap_or_default());
                    last = Some((at, offset));
                }
                None => last = Some((at, offset)),
                Some(_) => {}
            }
        }
    }
    longest
}

/// The offsets among `wanted` whose effect was not durable at `committed_at`: missing from the
/// database, or committed there later (by the row's transaction commit timestamp).
async fn not_durable_at(
    connection: &mut Option<tokio_postgres::Client>,
    database_url: &str,
    partition: i32,
    wanted: &[(i64, &PlannedRecord)],
    committed_at: chrono::DateTime<chrono::Utc>,
) -> Result<Vec<(i64, Option<chrono::DateTime<chrono::Utc>>)>, tokio_postgres::Error> {
    if connection.is_none() {
        let (client, driver) = tokio_postgres::connect(database_url, tokio_postgres::NoTls).await?;
        tokio::spawn(driver);
        *connection = Some(client);
    }
    let client = connection.as_ref().expect("connected above");
    let mut ids = Vec::new();
    let mut poison = Vec::new();
    for (offset, record) in wanted {
        match &record.kind {
            RecordKind::Event { event_id } | RecordKind::Duplicate { event_id } => {
                ids.push((*offset, event_id.clone()))
            }
            RecordKind::Poison { .. } => poison.push(*offset),
        }
    }
    let id_list: Vec<&str> = ids.iter().map(|(_, id)| id.as_str()).collect();
    let durable: HashMap<String, chrono::DateTime<chrono::Utc>> = client
        .query(
            "SELECT h.event_id, pg_xact_commit_timestamp(h.xmin) FROM history_events h \
             JOIN inbox i USING (event_id) WHERE h.event_id = ANY($1)",
            &[&id_list],
        )
        .await?
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    let stored: HashMap<i64, chrono::DateTime<chrono::Utc>> = client
        .query(
            "SELECT \"offset\", pg_xact_commit_timestamp(xmin) FROM dead_letters \
             WHERE topic = $1 AND partition = $2 AND \"offset\" = ANY($3)",
            &[&TOPIC, &partition, &poison],
        )
        .await?
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    let late = |at: Option<&chrono::DateTime<chrono::Utc>>| at.is_none_or(|at| *at > committed_at);
    let mut found: Vec<(i64, Option<chrono::DateTime<chrono::Utc>>)> = ids
        .iter()
        .filter(|(_, id)| late(durable.get(id)))
        .map(|(offset, id)| (*offset, durable.get(id).copied()))
        .collect();
    found.extend(
        poison
            .iter()
            .filter(|offset| late(stored.get(offset)))
            .map(|offset| (*offset, stored.get(offset).copied())),
    );
    Ok(found)
}

/// What the check of the commits read off the wire found.
#[derive(Debug, Default)]
pub struct SentCheck {
    /// Positions the brokers were sent for the run's group and topic.
    pub sent: usize,
    /// Of them, those checked against the database (the rest were at or below a position
    /// already checked).
    pub checked: usize,
    pub violations: Vec<String>,
    /// Positions below one sent before that repeat a position sent before it: an earlier
    /// request reaching the broker late, not a new commit of the service's (reported, not
    /// counted; the re-assertion repairs what it lowers).
    pub late_copies: Vec<String>,
    /// The same, as the positions they set the broker back to.
    pub late_copy_positions: Vec<LateCopy>,
}

/// Every OffsetCommit the brokers were sent, whether or not the service logged it — one in
/// flight when its instance was killed, one librdkafka held and sent after the service's
/// deadline, one the broker refused: each record before a position must have been durable
/// when the position left, and within one assignment no position may be sent below one sent
/// before. An assignment is the instance's own (by the member id its log names and the time
/// its log held the partition) and the member's generation: the mock's KIP-848 group can keep
/// a member's epoch while the member loses a partition and gets it back, and a later
/// assignment may rightly commit lower.
pub fn check_sent(
    runtime: &tokio::runtime::Runtime,
    database_url: &str,
    records: &[PlannedRecord],
    delivered: &Deliveries,
    sent: &[SentCommit],
    owned: &[Owned],
    members: &HashMap<String, usize>,
) -> SentCheck {
    let mut check = SentCheck::default();
    let mut ours: Vec<&SentCommit> = sent
        .iter()
        .filter(|commit| commit.group == GROUP && commit.topic == TOPIC)
        .collect();
    ours.sort_by_key(|commit| commit.at);
    check.sent = ours.len();
    if ours.is_empty() {
        check
            .violations
            .push("no OffsetCommit of the group was read off the wire".to_owned());
        return check;
    }
    // The instance's assignment a commit was sent within, if its log says.
    let assignment = |commit: &SentCommit| {
        let instance = *members.get(&commit.member)?;
        owned
            .iter()
            .find(|&&(i, p, _, from, until)| {
                i == instance
                    && p == commit.partition
                    && from <= commit.at
                    && until.is_none_or(|until| commit.at <= until)
            })
            .map(|&(_, _, epoch, _, _)| epoch)
    };
    let mut highest: HashMap<(&str, i32, i32, Option<u64>), i64> = HashMap::new();
    let mut sent_before: HashSet<(&str, i32, i32, Option<u64>, i64)> = HashSet::new();
    for commit in &ours {
        let key = (
            commit.member.as_str(),
            commit.generation,
            commit.partition,
            assignment(commit),
        );
        if let Some(&before) = highest.get(&key) {
            if commit.offset < before {
                let line = format!(
                    "member {} (generation {}) was sent partition {} offset {} at {} after \
                     {before} within the same assignment",
                    commit.member, commit.generation, commit.partition, commit.offset, commit.at
                );
                if sent_before.contains(&(key.0, key.1, key.2, key.3, commit.offset)) {
                    // The same position, sent before the higher one: a copy of an earlier
                    // request that reached the broker late (a frozen connection forwards what
                    // it held when it thaws, after librdkafka resent it on another).
                    check
                        .late_copies
                        .push(format!("{line}: a late copy of an earlier request"));
                    check
                        .late_copy_positions
                        .push((commit.partition, commit.offset, commit.at));
                } else {
                    check
                        .violations
                        .push(format!("{line}: the position went back"));
                }
            }
        }
        sent_before.insert((key.0, key.1, key.2, key.3, commit.offset));
        let entry = highest.entry(key).or_insert(commit.offset);
        *entry = (*entry).max(commit.offset);
    }
    let mut client = None;
    let mut verified = vec![0i64; PARTITIONS as usize];
    for commit in ours {
        let (partition, offset) = (commit.partition, commit.offset);
        let from = verified[partition as usize];
        if offset <= from {
            continue;
        }
        let wanted: Vec<(i64, &PlannedRecord)> = (from..offset)
            .filter_map(|o| {
                delivered
                    .by_place
                    .get(&(partition, o))
                    .map(|&i| (o, &records[i]))
            })
            .collect();
        let late = runtime
            .block_on(not_durable_at(
                &mut client,
                database_url,
                partition,
                &wanted,
                commit.at,
            ))
            .expect("the database answers once the run is over");
        for (offset_late, durable) in late {
            check.violations.push(format!(
                "member {} was sent partition {partition} offset {offset} at {} while offset \
                 {offset_late} was not recorded (durable: {durable:?})",
                commit.member, commit.at
            ));
        }
        verified[partition as usize] = offset;
        check.checked += 1;
    }
    check
}

/// What the final look at the database and the group found.
#[derive(Default)]
pub struct FinalCheck {
    pub records: usize,
    pub distinct_events: usize,
    pub duplicates: usize,
    pub poison: usize,
    pub lost: usize,
    pub doubled: usize,
    /// Records acknowledged by the broker and never stored (events without a row, poison
    /// without its dead letter).
    pub unseen: usize,
    pub violations: Vec<String>,
}

/// Once every instance stopped: each distinct event recorded once with its inbox marker, every
/// poison record's dead letter stored, every partition committed to its end.
pub fn final_checks(
    runtime: &tokio::runtime::Runtime,
    database_url: &str,
    brokers: &str,
    records: &[PlannedRecord],
    delivered: &[Option<(i32, i64)>],
    ends: &[i64],
) -> FinalCheck {
    let mut found = FinalCheck::default();
    let mut distinct = HashSet::new();
    let mut poison = HashMap::new();
    for (record, place) in records.iter().zip(delivered) {
        match &record.kind {
            RecordKind::Event { event_id } => {
                distinct.insert(event_id.clone());
            }
            RecordKind::Duplicate { .. } => found.duplicates += 1,
            RecordKind::Poison { reason } => {
                poison.insert(place.expect("delivered"), *reason);
            }
        }
    }
    found.records = records.len();
    found.distinct_events = distinct.len();
    found.poison = poison.len();
    let url = database_url.to_owned();
    let (history, inbox, orphans, letters) = runtime.block_on(async move {
        let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(connection);
        let history: Vec<String> = client
            .query("SELECT event_id FROM history_events", &[])
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        let inbox: Vec<String> = client
            .query("SELECT event_id FROM inbox", &[])
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        let orphans: i64 = client
            .query_one(
                "SELECT count(*) FROM inbox i WHERE NOT EXISTS \
                 (SELECT 1 FROM history_events h WHERE h.event_id = i.event_id)",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        let letters: Vec<(i32, i64, String)> = client
            .query(
                "SELECT partition, \"offset\", reason_code FROM dead_letters",
                &[],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2)))
            .collect();
        (history, inbox, orphans, letters)
    });
    let history_set: HashSet<&String> = history.iter().collect();
    found.lost = distinct
        .iter()
        .filter(|id| !history_set.contains(id))
        .count();
    found.doubled = history.len() - history_set.len();
    let strangers = history_set
        .iter()
        .filter(|id| !distinct.contains(**id))
        .count();
    if strangers > 0 {
        found
            .violations
            .push(format!("{strangers} history rows of unknown events"));
    }
    if inbox.len() != distinct.len() {
        found.violations.push(format!(
            "{} inbox markers for {} events",
            inbox.len(),
            distinct.len()
        ));
    }
    if orphans > 0 {
        found
            .violations
            .push(format!("{orphans} inbox markers without a history row"));
    }
    let stored: HashMap<(i32, i64), String> =
        letters.into_iter().map(|(p, o, r)| ((p, o), r)).collect();
    found.unseen = found.lost;
    for (place, reason) in &poison {
        match stored.get(place) {
            Some(found) if found == reason => {}
            other => {
                if other.is_none() {
                    found.unseen += 1;
                }
                found.violations.push(format!(
                    "poison at {place:?} ({reason}): dead letter {other:?}"
                ))
            }
        }
    }
    if stored.len() != poison.len() {
        found.violations.push(format!(
            "{} dead letters for {} poison records",
            stored.len(),
            poison.len()
        ));
    }
    let inspector = GroupInspector::new(brokers, GROUP).unwrap();
    let committed = inspector
        .committed(TOPIC, PARTITIONS, Duration::from_secs(10))
        .unwrap();
    for (partition, (committed, end)) in committed.iter().zip(ends).enumerate() {
        if *end > 0 && *committed != Some(*end) {
            found.violations.push(format!(
                "partition {partition}: committed {committed:?}, end {end}"
            ));
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(second: i64) -> At {
        chrono::DateTime::from_timestamp(1_800_000_000 + second, 0).unwrap()
    }

    /// Instance 1 holds partition 4 (epoch 3) from 10 s; instance 2 is given it (epoch 7) at
    /// 20 s while 1 still holds it, until 1 releases it at 30 s.
    fn owned() -> Vec<Owned> {
        vec![(1, 4, 3, at(10), Some(at(30))), (2, 4, 7, at(20), None)]
    }

    #[test]
    fn a_regression_between_two_live_owners_is_the_brokers_double_assignment() {
        let mut history = vec![Vec::new(); 5];
        history[4] = vec![(at(21), 176, 1, 3), (at(22), 148, 2, 7)];
        let Backward {
            service,
            double_assigned: broker,
            ..
        } = backward_commits(&mut history, &owned(), &[], &[]);
        assert!(service.is_empty(), "{service:?}");
        assert_eq!(broker.len(), 1);
    }

    #[test]
    fn a_commit_after_its_instance_lost_the_partition_is_the_services() {
        // Instance 1's commit at 31 s, after its own log released the partition: a zombie's.
        let mut history = vec![Vec::new(); 5];
        history[4] = vec![(at(25), 300, 2, 7), (at(31), 290, 1, 3)];
        let Backward {
            service,
            double_assigned: broker,
            ..
        } = backward_commits(&mut history, &owned(), &[], &[]);
        assert_eq!((service.len(), broker.len()), (1, 0));
        // So is one of an epoch the instance never held, and one instance going backwards.
        history[4] = vec![(at(21), 176, 1, 3), (at(22), 148, 2, 6)];
        assert_eq!(
            backward_commits(&mut history, &owned(), &[], &[])
                .service
                .len(),
            1
        );
        history[4] = vec![(at(21), 176, 2, 7), (at(22), 148, 2, 7)];
        assert_eq!(
            backward_commits(&mut history, &owned(), &[], &[])
                .service
                .len(),
            1
        );
    }

    #[test]
    fn a_regression_after_the_client_reset_a_truncated_log_is_the_logs() {
        // Instance 2 holds partition 4 from 20 s; at 26 s its client resets it after a
        // truncation, and its commit at 27 s goes back.
        let mut history = vec![Vec::new(); 5];
        history[4] = vec![(at(25), 300, 2, 7), (at(27), 31, 2, 7)];
        let Backward {
            service,
            after_truncation: truncation,
            ..
        } = backward_commits(&mut history, &owned(), &[(2, 4, at(26))], &[]);
        assert_eq!((service.len(), truncation.len()), (0, 1));
        // Not a reset of another partition, another instance, or one before the assignment.
        for reset in [(2, 3, at(26)), (1, 4, at(26)), (2, 4, at(15))] {
            let Backward {
                service,
                after_truncation: truncation,
                ..
            } = backward_commits(&mut history, &owned(), &[reset], &[]);
            assert_eq!((service.len(), truncation.len()), (1, 0), "{reset:?}");
        }
        // Nor one after the commit.
        let service = backward_commits(&mut history, &owned(), &[(2, 4, at(28))], &[]).service;
        assert_eq!(service.len(), 1);
    }

    #[test]
    fn a_new_assignment_starting_where_a_late_copy_set_the_broker_back_is_the_late_copys() {
        // Instance 1 commits 167 at 21 s (epoch 3); a late copy of its earlier 166 reaches the
        // broker at 23 s; instance 2's assignment (epoch 7) commits 166 at 25 s.
        let late = [(4, 166, at(23))];
        let mut history = vec![Vec::new(); 5];
        history[4] = vec![(at(21), 167, 1, 3), (at(25), 166, 2, 7)];
        let found = backward_commits(&mut history, &[], &[], &late);
        assert_eq!((found.service.len(), found.after_late_copy.len()), (0, 1));
        // Not within one assignment (the service re-asserts its own position there), not
        // another position, another partition, or a copy before the higher commit or after
        // the lower one.
        let mut same = vec![Vec::new(); 5];
        same[4] = vec![(at(21), 167, 1, 3), (at(25), 166, 1, 3)];
        assert_eq!(
            backward_commits(&mut same, &[], &[], &late).service.len(),
            1
        );
        for copy in [
            (4, 165, at(23)),
            (3, 166, at(23)),
            (4, 166, at(20)),
            (4, 166, at(26)),
        ] {
            let found = backward_commits(&mut history, &[], &[], &[copy]);
            assert_eq!(
                (found.service.len(), found.after_late_copy.len()),
                (1, 0),
                "{copy:?}"
            );
        }
    }
}
