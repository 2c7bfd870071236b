//! Watermarks asked of the brokers, off the record stream. A partition in fetch order is not
//! fetched while the consumer queue holds the others' backlog, so the client may not know its
//! high watermark (a quiet partition whose first fetch had not come back when the turns ended),
//! and without it the partition cannot be seen to have caught up. A thread asks the partitions
//! in turn, each with [`QUERY_TIMEOUT`], holding the client only during a query. A partition is
//! asked once per assignment while an answer is awaited or was told; one whose query failed (a
//! broker down, a leader moving) is asked again after a backoff ([`Queries`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::time::{Duration, Instant};

use rdkafka::consumer::{Consumer, ConsumerContext};

use crate::domain::TopicPartition;

/// How long a broker is given to tell a partition's watermarks.
const QUERY_TIMEOUT: Duration = Duration::from_secs(2);
/// The wait before a failed query is asked again; it doubles with each failure in a row.
const RETRY_FIRST: Duration = Duration::from_secs(1);
/// The longest wait between failed queries of a partition.
const RETRY_MOST: Duration = Duration::from_secs(30);

/// What was asked of a partition, and told: the bookkeeping, apart from the thread that asks.
#[derive(Debug, Default)]
pub(crate) struct Queries {
    partitions: HashMap<TopicPartition, Query>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Query {
    /// Asked; no answer yet.
    Awaited { failures: u32 },
    /// Asked and not answered: asked again at `again`.
    Failed { failures: u32, again: Instant },
    /// The low and high watermarks a broker told.
    Told { low: i64, high: i64 },
}

impl Queries {
    /// Of `partitions`, those to ask now: never asked, or failed with the backoff over. They
    /// count as asked from here on.
    pub(crate) fn asking_now(
        &mut self,
        partitions: Vec<TopicPartition>,
        now: Instant,
    ) -> Vec<TopicPartition> {
        partitions
            .into_iter()
            .filter(|tp| {
                let failures = match self.partitions.get(tp) {
                    None => 0,
                    Some(&Query::Failed { failures, again }) if again <= now => failures,
                    Some(_) => return false,
                };
                self.partitions
                    .insert(tp.clone(), Query::Awaited { failures });
                true
            })
            .collect()
    }

    /// A broker's answer for a partition asked, or its failure at `now`.
    pub(crate) fn answered(
        &mut self,
        tp: TopicPartition,
        answer: Option<(i64, i64)>,
        now: Instant,
    ) {
        // An answer for a partition revoked meanwhile (forgotten) is dropped.
        let Some(Query::Awaited { failures }) = self.partitions.get(&tp).copied() else {
            return;
        };
        let query = match answer {
            Some((low, high)) => Query::Told { low, high },
            None => Query::Failed {
                failures: failures + 1,
                again: now + backoff(failures),
            },
        };
        self.partitions.insert(tp, query);
    }

    /// The low and high watermarks a broker told for `tp`.
    pub(crate) fn told(&self, tp: &TopicPartition) -> Option<(i64, i64)> {
        match self.partitions.get(tp) {
            Some(&Query::Told { low, high }) => Some((low, high)),
            _ => None,
        }
    }

    /// The partition was revoked: what was asked and told of it is forgotten.
    pub(crate) fn forget(&mut self, tp: &TopicPartition) {
        self.partitions.remove(tp);
    }
}

/// The wait after the `failures + 1`-th failure in a row.
fn backoff(failures: u32) -> Duration {
    RETRY_FIRST
        .saturating_mul(1 << failures.min(16))
        .min(RETRY_MOST)
}

/// The queries, and the thread that asks them.
pub(crate) struct WatermarkQueries {
    queries: Queries,
    answers: Receiver<(TopicPartition, Option<(i64, i64)>)>,
    answer_to: Sender<(TopicPartition, Option<(i64, i64)>)>,
}

impl Default for WatermarkQueries {
    fn default() -> Self {
        let (answer_to, answers) = channel();
        WatermarkQueries {
            queries: Queries::default(),
            answers,
            answer_to,
        }
    }
}

impl WatermarkQueries {
    /// Takes in the answers that came, and the failures.
    pub(crate) fn answered(&mut self) {
        while let Ok((tp, answer)) = self.answers.try_recv() {
            self.queries.answered(tp, answer, Instant::now());
        }
    }

    /// The low and high watermarks a broker told for `tp`.
    pub(crate) fn answer(&self, tp: &TopicPartition) -> Option<(i64, i64)> {
        self.queries.told(tp)
    }

    /// Asks the brokers for the partitions of `partitions` not asked yet, or whose last query
    /// failed long enough ago.
    pub(crate) fn ask<K, C>(&mut self, consumer: &Arc<K>, partitions: Vec<TopicPartition>)
    where
        K: Consumer<C> + Send + Sync + 'static,
        C: ConsumerContext,
    {
        let partitions = self.queries.asking_now(partitions, Instant::now());
        if partitions.is_empty() {
            return;
        }
        let consumer = Arc::downgrade(consumer);
        let answer_to = self.answer_to.clone();
        let asked = partitions.clone();
        let asking = std::thread::Builder::new()
            .name("watermarks".into())
            .spawn(move || {
                for tp in partitions {
                    let Some(consumer) = consumer.upgrade() else {
                        return;
                    };
                    let answer = match consumer.fetch_watermarks(
                        &tp.topic,
                        tp.partition,
                        QUERY_TIMEOUT,
                    ) {
                        Ok(watermarks) => Some(watermarks),
                        Err(err) => {
                            tracing::debug!(%tp, error = %err, "the partition's watermarks could not be asked; asked again later");
                            None
                        }
                    };
                    if answer_to.send((tp, answer)).is_err() {
                        return;
                    }
                }
            });
        if let Err(err) = asking {
            tracing::warn!(error = %err, "the partitions' watermarks could not be asked; asked again later");
            let now = Instant::now();
            for tp in asked {
                self.queries.answered(tp, None, now);
            }
        }
    }

    /// The partition was revoked: what was asked and told of it is forgotten.
    pub(crate) fn forget(&mut self, tp: &TopicPartition) {
        self.queries.forget(tp);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tp(partition: i32) -> TopicPartition {
        TopicPartition::new("t", partition)
    }

    #[test]
    fn a_partition_is_asked_once_while_awaited_or_told() {
        let mut queries = Queries::default();
        let now = Instant::now();
        assert_eq!(
            queries.asking_now(vec![tp(0), tp(1)], now),
            vec![tp(0), tp(1)]
        );
        assert!(queries.asking_now(vec![tp(0), tp(1)], now).is_empty());
        queries.answered(tp(0), Some((3, 10)), now);
        assert_eq!(queries.told(&tp(0)), Some((3, 10)));
        assert_eq!(queries.told(&tp(1)), None);
        let much_later = now + Duration::from_secs(3600);
        assert!(
            queries
                .asking_now(vec![tp(0), tp(1)], much_later)
                .is_empty()
        );
    }

    #[test]
    fn a_failed_query_is_asked_again_after_a_backoff_that_doubles_up_to_its_most() {
        let mut queries = Queries::default();
        let mut now = Instant::now();
        assert_eq!(queries.asking_now(vec![tp(0)], now), vec![tp(0)]);
        let mut waits = Vec::new();
        for _ in 0..8 {
            queries.answered(tp(0), None, now);
            assert_eq!(queries.told(&tp(0)), None);
            // The first moment it is asked again, to a quarter of a second.
            let mut wait = Duration::ZERO;
            while queries.asking_now(vec![tp(0)], now + wait).is_empty() {
                wait += Duration::from_millis(250);
                assert!(wait <= RETRY_MOST, "never asked again");
            }
            waits.push(wait);
            now += wait;
        }
        assert_eq!(
            waits,
            [1, 2, 4, 8, 16, 30, 30, 30]
                .map(Duration::from_secs)
                .to_vec()
        );
        // An answer at last ends the retries.
        queries.answered(tp(0), Some((0, 7)), now);
        assert_eq!(queries.told(&tp(0)), Some((0, 7)));
        assert!(queries.asking_now(vec![tp(0)], now + RETRY_MOST).is_empty());
    }

    #[test]
    fn an_answer_after_a_revoke_is_dropped_and_a_new_assignment_asks_again() {
        let mut queries = Queries::default();
        let now = Instant::now();
        queries.asking_now(vec![tp(0)], now);
        queries.forget(&tp(0));
        queries.answered(tp(0), Some((0, 5)), now);
        assert_eq!(queries.told(&tp(0)), None);
        assert_eq!(queries.asking_now(vec![tp(0)], now), vec![tp(0)]);
    }
}
