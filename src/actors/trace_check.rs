//! The check of the database against the group's committed offsets, made for each partition
//! when it is assigned (and by `history-service verify`): the newest records below the
//! committed position must have left their traces ([`crate::domain::traces`]). A database
//! restored from a backup, or emptied, while the group's offsets stayed lacks them, and the
//! group would never read those records again; the check says so (an ERROR naming the
//! partition and how to move the group back, `/readyz`, `history_database_behind` and the
//! `HistoryDatabaseBehindKafka` alert). The service goes on consuming from the committed
//! position: moving the group back is the operator's call, and safe (what the database already
//! holds is found again and skipped).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tracing::{debug, error, warn};

use crate::config::KafkaSettings;
use crate::domain::TopicPartition;
use crate::domain::traces::{Found, Trace, Untraced, untraced};
use crate::health::DatabaseBehind;
use crate::kafka::error_log::ClientErrorLog;
use crate::kafka::tail::TailReader;
use crate::metrics;
use crate::store::{PgPool, traces};

/// How many of the newest records below the committed position are checked. A restore or an
/// emptied database loses the newest first, so a few suffice; few enough to cost a rebalance
/// little (one small fetch and two queries per partition).
pub(crate) const TAIL: usize = 64;
/// The longest any one call to the cluster may take.
const KAFKA_TIMEOUT: Duration = Duration::from_secs(10);

/// What the check found for one partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// The group has no committed position, or the log holds no record below it.
    NothingToCheck,
    /// Every record checked left its trace.
    Traced { committed: i64, checked: usize },
    /// Records below the committed position left none.
    Behind { committed: i64, untraced: Untraced },
    /// The check could not be made.
    Unchecked(String),
}

impl Verdict {
    /// The operator's sentence for a partition found behind; `None` for any other verdict.
    pub(crate) fn finding(&self, tp: &TopicPartition, group: &str) -> Option<String> {
        let Verdict::Behind {
            committed,
            untraced,
        } = self
        else {
            return None;
        };
        let back_to = if untraced.count == untraced.checked {
            // Every record checked is missing: the loss goes back further than the check.
            "to the offset from which the backup lacks records, or to the earliest (records \
             already stored are skipped)"
                .to_owned()
        } else {
            format!("to offset {} or earlier", untraced.first)
        };
        Some(format!(
            "{tp}: {} of the {} newest records below the committed offset {committed} are not \
             in the database (offsets {} to {}); with every replica stopped, move group {group} \
             back {back_to}: kafka-consumer-groups --group {group} --topic {}:{} \
             --reset-offsets --to-offset N --execute",
            untraced.count, untraced.checked, untraced.first, untraced.last, tp.topic, tp.partition,
        ))
    }
}

/// What the check needs: how to reach the cluster, the pool, the decoder's limit.
pub(crate) struct TraceCheck {
    /// Each check makes a client of its own and drops it when done: between rebalances the
    /// service keeps no second connection to every broker, nor a second client's queue of
    /// errors while the cluster is away.
    kafka: Arc<KafkaSettings>,
    pool: PgPool,
    max_payload_bytes: usize,
    /// Set when the service stops: a check under way gives up at its next record.
    stopping: Arc<AtomicBool>,
    /// The process's log of client errors: a check while the cluster is away adds no lines
    /// of its own.
    errors: ClientErrorLog,
}

impl TraceCheck {
    pub(crate) fn new(kafka: KafkaSettings, pool: PgPool, max_payload_bytes: usize) -> Self {
        let kafka_error_interval = kafka.error_log_interval();
        TraceCheck {
            kafka: Arc::new(kafka),
            pool,
            max_payload_bytes,
            stopping: Arc::new(AtomicBool::new(false)),
            errors: ClientErrorLog::new(kafka_error_interval),
        }
    }

    /// The checks' clients log their errors through `errors`, shared with the consumer's.
    pub(crate) fn with_client_errors(mut self, errors: ClientErrorLog) -> Self {
        self.errors = errors;
        self
    }

    /// Tells a check under way, and any later one, to give up: the stop does not wait for
    /// the cluster's answers to a question nobody will act on.
    pub(crate) fn stop(&self) {
        self.stopping.store(true, Ordering::Relaxed);
    }

    /// Checks each partition against the group's committed position.
    pub(crate) async fn check(
        &self,
        partitions: Vec<TopicPartition>,
    ) -> Vec<(TopicPartition, Verdict)> {
        let kafka = self.kafka.clone();
        let max_payload = self.max_payload_bytes;
        let stopping = self.stopping.clone();
        let errors = self.errors.clone();
        let asked = partitions.clone();
        // The cluster's answers, on a thread of the check's own: the committed positions,
        // then each partition's tail, decoded into the traces its records must have left. Not
        // `spawn_blocking`: a runtime waits for its blocking tasks when it ends, and the stop
        // must not wait out a tail read (up to KAFKA_TIMEOUT a partition).
        let (answer, read) = tokio::sync::oneshot::channel();
        let spawned = std::thread::Builder::new()
            .name("history-trace-check".into())
            .spawn(move || {
                let stopped = || stopping.load(Ordering::Relaxed);
                let read = match TailReader::sharing(&kafka, errors) {
                    Ok(reader) => read_tails(&reader, partitions, max_payload, &stopped),
                    Err(err) => {
                        let why = format!("cannot create the checking client: {err}");
                        partitions
                            .into_iter()
                            .map(|tp| (tp, Err(why.clone())))
                            .collect()
                    }
                };
                let _ = answer.send(read);
            });
        let read = match spawned {
            Ok(_) => read
                .await
                .map_err(|_| "the check's thread ended without an answer".to_owned()),
            Err(err) => Err(format!("cannot start the check's thread: {err}")),
        };
        let read = match read {
            Ok(read) => read,
            Err(why) => {
                return asked
                    .into_iter()
                    .map(|tp| (tp, Verdict::Unchecked(why.clone())))
                    .collect();
            }
        };
        let mut verdicts = Vec::with_capacity(read.len());
        for (tp, tail) in read {
            let verdict = match tail {
                Err(why) => Verdict::Unchecked(why),
                Ok(None) => Verdict::NothingToCheck,
                Ok(Some((_, traces))) if traces.is_empty() => Verdict::NothingToCheck,
                Ok(Some((committed, traces))) => match self.found(&tp, &traces).await {
                    Err(err) => Verdict::Unchecked(format!("cannot query the database: {err}")),
                    Ok(found) => match untraced(&traces, &found) {
                        None => Verdict::Traced {
                            committed,
                            checked: traces.len(),
                        },
                        Some(untraced) => Verdict::Behind {
                            committed,
                            untraced,
                        },
                    },
                },
            };
            verdicts.push((tp, verdict));
        }
        verdicts
    }

    async fn found(
        &self,
        tp: &TopicPartition,
        traces: &[(i64, Trace)],
    ) -> Result<Found, crate::store::StoreError> {
        let mut markers = Vec::new();
        let mut letters = Vec::new();
        for (_, trace) in traces {
            match trace {
                Trace::Marker(id) => markers.push(id.as_str()),
                Trace::DeadLetter(offset) => letters.push(*offset),
            }
        }
        traces::found(&self.pool, tp, &markers, &letters).await
    }

    /// Checks partitions just assigned and reports what it finds: the log, the metric and
    /// `/readyz` (through `behind`).
    pub(crate) async fn on_assigned(
        &self,
        partitions: Vec<TopicPartition>,
        group: &str,
        behind: &DatabaseBehind,
    ) {
        for (tp, verdict) in self.check(partitions).await {
            match &verdict {
                Verdict::Behind {
                    committed,
                    untraced,
                } => {
                    metrics::set_database_behind(&tp, untraced.count);
                    let finding = verdict.finding(&tp, group).expect("behind");
                    error!(
                        topic = &*tp.topic,
                        partition = tp.partition,
                        committed,
                        first_missing = untraced.first,
                        missing = untraced.count,
                        checked = untraced.checked,
                        "the database lacks records the group committed past: it was restored \
                         from a backup or emptied while the group's offsets stayed, and the \
                         group will not read them again; {finding}"
                    );
                    behind.found(&tp, finding);
                }
                Verdict::Traced { committed, checked } => {
                    metrics::set_database_behind(&tp, 0);
                    behind.clear(&tp);
                    debug!(
                        topic = &*tp.topic,
                        partition = tp.partition,
                        committed,
                        checked,
                        "the database holds the newest records below the committed offset"
                    );
                }
                Verdict::NothingToCheck => {
                    metrics::set_database_behind(&tp, 0);
                    behind.clear(&tp);
                }
                Verdict::Unchecked(why) => warn!(
                    topic = &*tp.topic,
                    partition = tp.partition,
                    reason = %why,
                    "could not check the database against the committed offset (a database \
                     restored from a backup would go unnoticed for this assignment)"
                ),
            }
        }
    }
}

/// What the cluster holds for each partition: `None` where the group has no committed position,
/// else the position and the traces the records below it must have left.
type TailTraces = Result<Option<(i64, Vec<(i64, Trace)>)>, String>;

/// The committed positions, then each partition's tail, decoded into traces. Blocking.
fn read_tails(
    reader: &TailReader,
    partitions: Vec<TopicPartition>,
    max_payload: usize,
    stopped: &dyn Fn() -> bool,
) -> Vec<(TopicPartition, TailTraces)> {
    let committed = match reader.committed(&partitions, KAFKA_TIMEOUT) {
        Ok(committed) => committed,
        Err(err) => {
            let why = format!("cannot look up the committed offsets: {err}");
            return partitions
                .into_iter()
                .map(|tp| (tp, Err(why.clone())))
                .collect();
        }
    };
    committed
        .into_iter()
        .map(|(tp, committed)| {
            let Some(committed) = committed else {
                return (tp, Ok(None));
            };
            let tail = reader
                .tail(&tp, committed, TAIL, KAFKA_TIMEOUT, stopped)
                .map_err(|err| format!("cannot read the records below {committed}: {err}"))
                .map(|tail| {
                    let traces = tail
                        .records
                        .iter()
                        .map(|record| (record.offset, Trace::of(record, max_payload)))
                        .collect();
                    Some((committed, traces))
                });
            (tp, tail)
        })
        .collect()
}
