//! Whether every topic in `kafka.topics` exists. librdkafka reports a subscribed topic that does
//! not exist once, as a consumer error, and then waits for it in silence; an operator needs to
//! see it for as long as it lasts: `history_topic_missing{topic}` is 1, `/readyz` names it, and
//! an alert fires. A thread of its own asks the broker for the topics' metadata every
//! `kafka.metadata_refresh_ms` — the interval at which the client itself looks for them, so the
//! gauge drops to 0 about when the topic starts being consumed.

use std::collections::BTreeSet;
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::Duration;

use rdkafka::consumer::{Consumer, ConsumerContext};
use rdkafka::error::RDKafkaErrorCode;
use tracing::{info, warn};

use crate::metrics;

/// The configured topics found missing at the last look; shared with readiness.
#[derive(Debug, Default)]
pub struct MissingTopics(Mutex<BTreeSet<String>>);

impl MissingTopics {
    /// The missing topics, in name order.
    pub fn names(&self) -> Vec<String> {
        self.0.lock().unwrap().iter().cloned().collect()
    }

    /// Records whether `topic` exists; true when that changed.
    fn set(&self, topic: &str, missing: bool) -> bool {
        let mut names = self.0.lock().unwrap();
        if missing {
            names.insert(topic.to_owned())
        } else {
            names.remove(topic)
        }
    }
}

/// What the watch looks for, and where it tells it.
#[derive(Clone)]
pub struct TopicWatchSettings {
    pub topics: Vec<String>,
    pub interval: Duration,
    pub missing: Arc<MissingTopics>,
}

/// Longest wait for one metadata answer.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);

type Closed = Arc<(Mutex<bool>, Condvar)>;

/// The supervisor's handle on the watching thread; the thread ends when this is dropped.
pub(crate) struct TopicWatch {
    closed: Closed,
}

impl TopicWatch {
    /// Starts the thread. It holds the consumer only while it asks the broker, so closing the
    /// consumer is not held up by it for longer than one lookup.
    pub(crate) fn start<T, C>(consumer: Weak<T>, settings: TopicWatchSettings) -> Self
    where
        T: Consumer<C> + Send + Sync + 'static,
        C: ConsumerContext + 'static,
    {
        for topic in &settings.topics {
            metrics::set_topic_missing(topic, false);
        }
        let closed: Closed = Arc::default();
        std::thread::Builder::new()
            .name("history-topics".into())
            .spawn({
                let closed = closed.clone();
                move || run(consumer, settings, closed)
            })
            .expect("cannot start the topic watch thread");
        TopicWatch { closed }
    }
}

impl Drop for TopicWatch {
    fn drop(&mut self) {
        let (closed, wake) = &*self.closed;
        *closed.lock().unwrap() = true;
        wake.notify_one();
    }
}

fn run<T, C>(consumer: Weak<T>, settings: TopicWatchSettings, closed: Closed)
where
    T: Consumer<C>,
    C: ConsumerContext,
{
    let (flag, wake) = &*closed;
    loop {
        {
            let Some(consumer) = consumer.upgrade() else {
                return;
            };
            for topic in &settings.topics {
                if *flag.lock().unwrap() {
                    return;
                }
                if let Some(missing) = look_up(consumer.as_ref(), topic) {
                    report(&settings, topic, missing);
                }
            }
        }
        let guard = flag.lock().unwrap();
        let (guard, _) = wake
            .wait_timeout_while(guard, settings.interval, |closed| !*closed)
            .unwrap();
        if *guard {
            return;
        }
    }
}

/// Whether the broker says `topic` does not exist; `None` when it did not answer (an outage
/// says nothing about the topic, and the client's own errors report it).
fn look_up<C: ConsumerContext>(consumer: &impl Consumer<C>, topic: &str) -> Option<bool> {
    let metadata = consumer
        .client()
        .fetch_metadata(Some(topic), LOOKUP_TIMEOUT)
        .ok()?;
    let found = metadata.topics().iter().find(|t| t.name() == topic)?;
    match found.error().map(RDKafkaErrorCode::from) {
        Some(RDKafkaErrorCode::UnknownTopicOrPartition | RDKafkaErrorCode::UnknownTopic) => {
            Some(true)
        }
        Some(_) => None,
        None => Some(found.partitions().is_empty()),
    }
}

fn report(settings: &TopicWatchSettings, topic: &str, missing: bool) {
    metrics::set_topic_missing(topic, missing);
    if !settings.missing.set(topic, missing) {
        return;
    }
    if missing {
        warn!(
            topic,
            "a topic in kafka.topics does not exist: nothing is consumed from it until it is \
             created (history_topic_missing is 1, /readyz says not ready); once created it is \
             consumed within kafka.metadata_refresh_ms and a rebalance"
        );
    } else {
        info!(
            topic,
            "the topic exists now: consumed once the group assigns it"
        );
    }
}
