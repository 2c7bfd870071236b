//! The rdkafka consumer: its configuration, callbacks, and the stream of records and
//! rebalance events the Kafka supervisor consumes.

pub(crate) mod assignments;
pub(crate) mod authentication;
pub(crate) mod bounded_commit;
pub(crate) mod client_health;
pub mod client_memory;
pub(crate) mod commit_turn;
pub(crate) mod commit_worker;
pub mod context;
pub mod dead_letter_topic;
pub mod done_lists;
pub(crate) mod error_log;
pub mod features;
pub(crate) mod fetch_sizing;
pub(crate) mod intake;
pub mod messages;
pub(crate) mod passed_over;
pub(crate) mod properties;
pub(crate) mod replay;
pub(crate) mod reset_watch;
pub(crate) mod split_queues;
pub(crate) mod tail;
pub(crate) mod topic_watch;
pub(crate) mod watermark_queries;

use std::sync::Arc;
use std::time::Duration;

use futures::{FutureExt, Stream};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, Message, Timestamp};
use secrecy::ExposeSecret;

pub use context::{RebalanceEvent, SupervisorContext};

use crate::config::{ConfigError, GroupProtocol, KafkaSettings};
use crate::domain::budget::{Fetch, Held, Split};
use crate::domain::rotation::{Pace, Rotation, TURN_LEAST};
use crate::domain::{Record, TopicPartition};
use intake::{Intake, RoomWait};
use passed_over::HandedOver;
use split_queues::{SplitQueue, SplitQueues};
use watermark_queries::WatermarkQueries;

/// The consumer could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum KafkaSetupError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("kafka consumer: {0}")]
    Kafka(#[from] KafkaError),
    /// librdkafka refused to create a client. Its message quotes values it rejects, so the
    /// text is scrubbed of every configured property value before it gets here.
    #[error("cannot create the kafka {client}: {reason}")]
    Client {
        client: &'static str,
        reason: String,
    },
}

/// Creates a client from `config`, turning any error into [`KafkaSetupError::Client`] with
/// every configured property value cut out of its text: the one way a client error is built.
pub(crate) fn create_client<T>(
    client: &'static str,
    settings: &KafkaSettings,
    create: impl FnOnce() -> Result<T, KafkaError>,
) -> Result<T, KafkaSetupError> {
    create().map_err(|err| {
        let values = settings.property_values();
        let text = match &err {
            // Its Display repeats the key and the value after librdkafka's own description.
            KafkaError::ClientConfig(_, description, key, _) => {
                format!("librdkafka rejects `{key}`: {description}")
            }
            other => other.to_string(),
        };
        KafkaSetupError::Client {
            client,
            reason: crate::config::redact(&text, values.iter().map(|v| v.expose_secret())),
        }
    })
}

/// A producer to the same cluster (dead-letter topic, replays), from [`producer_config`].
pub fn create_producer<T: rdkafka::config::FromClientConfig>(
    settings: &KafkaSettings,
) -> Result<T, KafkaSetupError> {
    let config = producer_config(settings)?;
    create_client("producer", settings, || config.create())
}

pub type HistoryConsumer = StreamConsumer<SupervisorContext>;

/// Something the consumer produced, in the order it happened.
#[derive(Debug)]
pub enum KafkaItem {
    /// A record, with its share of the budget.
    Record(TopicPartition, Record, Held),
    Rebalance(RebalanceEvent),
    /// The client's position in a partition moved past offsets it handed no record of
    /// (transaction markers, records of aborted transactions): nothing below it is to come in
    /// this assignment beyond the records handed over before this item.
    PassedOver(TopicPartition, i64),
    /// A consumer error; librdkafka retries by itself, so these are reported, not fatal.
    Error(KafkaError),
}

/// The librdkafka settings of the consumer. Offsets are only ever committed explicitly, and
/// only positions the OffsetCommitter computed: no auto-commit, no auto offset store. Its
/// prefetch is the client's half of the instance's budget (`budget`: its queue, unless
/// `kafka.fetch_queue_*` set it within the budget, and `fetch`, the size of its requests).
pub fn consumer_config(
    settings: &KafkaSettings,
    budget: &Split,
    partitions: usize,
    fetch: &Fetch,
) -> Result<ClientConfig, ConfigError> {
    let mut config = ClientConfig::new();
    // Set in all (`kafka.fetch_queue_*`) or derived from the budget; shared among the
    // partitions' queues either way.
    let partitions = partitions.max(1);
    let or_budget = |explicit: u64, derived: usize| match explicit {
        0 => derived.to_string(),
        explicit => (explicit as usize / partitions).max(1).to_string(),
    };
    let budget = &budget.among(partitions);
    config
        .set("bootstrap.servers", &settings.brokers)
        .set("group.id", &settings.group_id)
        .set("client.id", &settings.client_id)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        // A group without a committed position starts at the oldest record: a projection
        // must not skip history.
        .set("auto.offset.reset", "earliest")
        .set("enable.partition.eof", "false")
        // Events of aborted producer transactions never happened: never recorded.
        .set("isolation.level", "read_committed")
        // A topic created later, or partitions added to one, are seen within this (librdkafka's
        // default is 5 minutes).
        .set(
            "topic.metadata.refresh.interval.ms",
            settings.metadata_refresh_ms.to_string(),
        )
        .set(
            "statistics.interval.ms",
            settings.statistics_interval_ms.to_string(),
        )
        .set("fetch.wait.max.ms", settings.fetch_wait_max_ms.to_string())
        // The client fetches a partition while its queue holds less than this (each partition
        // has a queue of its own: `budget` is the client's queue shared among them,
        // `Split::among`), and one response per broker adds at most fetch.max.bytes on the
        // wire, decompressed whole: together, the client's half of the budget (`Split::fetch`).
        .set(
            "queued.max.messages.kbytes",
            or_budget(settings.fetch_queue_kbytes, budget.queue_kbytes),
        )
        .set(
            "queued.min.messages",
            or_budget(settings.fetch_queue_messages, budget.queue_records),
        )
        .set("fetch.max.bytes", fetch.max_bytes.to_string())
        .set(
            "max.partition.fetch.bytes",
            fetch.partition_bytes.to_string(),
        )
        .set("message.max.bytes", fetch.message_max_bytes.to_string())
        // With the prefetch bounded, a partition whose queue is full is fetched again as soon
        // as it drains; librdkafka's default (1 s) idles the consumer during a backlog.
        .set("fetch.queue.backoff.ms", "10")
        .set("group.protocol", settings.group_protocol.name());
    if settings.is_static_member() {
        config.set("group.instance.id", &settings.group_instance_id);
    }
    match settings.group_protocol {
        GroupProtocol::Classic => {
            let session_timeout = settings.session_timeout().as_millis() as u64;
            config
                .set("session.timeout.ms", session_timeout.to_string())
                .set(
                    "heartbeat.interval.ms",
                    (session_timeout / 3).clamp(1, 3000).to_string(),
                )
                // Incremental cooperative rebalancing: a member joining or leaving revokes only
                // the partitions that move, and the others keep flowing. `kafka.properties` may
                // override it (e.g. `range,roundrobin` for an eager group); every rebalance path
                // works with both.
                .set("partition.assignment.strategy", "cooperative-sticky");
        }
        // The broker owns the session timeout, the heartbeat interval and the assignment
        // (librdkafka refuses the first three here); assignments arrive incrementally, and
        // the client reports its rebalance protocol as cooperative.
        GroupProtocol::Consumer => {
            if !settings.remote_assignor.is_empty() {
                config.set("group.remote.assignor", &settings.remote_assignor);
            }
        }
    }
    for (key, value) in settings.librdkafka_properties()? {
        config.set(key, value.expose_secret());
    }
    Ok(config)
}

/// The settings of a producer to the same cluster (dead-letter topic, replays): the brokers and
/// the pass-through security properties.
pub fn producer_config(settings: &KafkaSettings) -> Result<ClientConfig, ConfigError> {
    let mut config = cluster_config(settings, "producer")?;
    config
        .set("enable.idempotence", "true")
        .set("linger.ms", "5");
    Ok(config)
}

/// The brokers, a client id of `role`, and the pass-through properties a client that is not
/// the group's consumer takes (security, networking).
fn cluster_config(settings: &KafkaSettings, role: &str) -> Result<ClientConfig, ConfigError> {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", &settings.brokers)
        .set("client.id", format!("{}-{role}", settings.client_id));
    for (key, value) in settings.librdkafka_properties()? {
        if !CONSUMER_ONLY.iter().any(|prefix| key.starts_with(prefix)) {
            config.set(key, value.expose_secret());
        }
    }
    Ok(config)
}

/// What the service reads of the cluster at start-up, to size its fetches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClusterShape {
    /// The cluster's brokers: the consumer fetches from every broker that leads a partition it
    /// reads, each response costing memory of its own.
    pub brokers: usize,
    /// The partitions of the configured topics that exist: the most this instance can be
    /// assigned, each with a prefetch queue of its own (`split_queues`).
    pub partitions: usize,
}

/// The cluster's brokers and the configured topics' partitions, from one metadata request per
/// topic, all within `timeout`.
pub fn cluster_shape(
    settings: &KafkaSettings,
    timeout: Duration,
    errors: error_log::ClientErrorLog,
) -> Result<ClusterShape, KafkaSetupError> {
    let config = cluster_config(settings, "metadata")?;
    let context = error_log::LoggedClientContext::sharing(errors);
    let client: rdkafka::consumer::BaseConsumer<error_log::LoggedClientContext> =
        create_client("metadata client", settings, || {
            config.create_with_context(context)
        })?;
    let deadline = std::time::Instant::now() + timeout;
    let mut shape = ClusterShape {
        brokers: 0,
        partitions: 0,
    };
    // A topic's metadata lists every broker too, without every topic of a large cluster.
    for topic in &settings.topics {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let metadata = client.fetch_metadata(Some(topic), left)?;
        shape.brokers = shape.brokers.max(metadata.brokers().len());
        shape.partitions += metadata
            .topics()
            .iter()
            .filter(|found| found.name() == topic && found.error().is_none())
            .map(|found| found.partitions().len())
            .sum::<usize>();
    }
    Ok(shape)
}

/// The service's copy of a record the client handed over.
pub(crate) fn record_of(message: &impl Message) -> Record {
    Record {
        offset: message.offset(),
        key: message.key().map(<[u8]>::to_vec),
        payload: message.payload().map(<[u8]>::to_vec),
        timestamp_ms: match message.timestamp() {
            Timestamp::NotAvailable => None,
            Timestamp::CreateTime(ms) | Timestamp::LogAppendTime(ms) => Some(ms),
        },
    }
}

/// Consumer properties a producer must not be given (librdkafka warns about each).
const CONSUMER_ONLY: [&str; 9] = [
    "group.",
    "session.timeout",
    "heartbeat.",
    "auto.",
    "enable.auto",
    "fetch.",
    "queued.",
    "partition.assignment",
    "max.poll",
];

/// Creates the consumer and subscribes it, its fetches sized for `fetch`, its prefetch queue
/// shared among `partitions` (each has one of its own). Configuration errors (an unknown
/// librdkafka property, a bad value) surface here, at start-up.
pub fn subscribe(
    settings: &KafkaSettings,
    budget: &Split,
    partitions: usize,
    fetch: &Fetch,
    context: SupervisorContext,
) -> Result<Arc<HistoryConsumer>, KafkaSetupError> {
    let config = consumer_config(settings, budget, partitions, fetch)?;
    let consumer: HistoryConsumer =
        create_client("consumer", settings, || config.create_with_context(context))?;
    let topics: Vec<&str> = settings.topics.iter().map(String::as_str).collect();
    consumer.subscribe(&topics)?;
    Ok(Arc::new(consumer))
}

/// Most records taken from the client in one turn of the stream (a turn waits only for its
/// first record; the rest are those the client already holds, while the budget has room).
const RECORDS_PER_TURN: usize = 1024;

/// The consumer as a stream of items, in turns: each turn waits for the first record (or a
/// rebalance, or the fetching state to change), then takes what the client already holds
/// without waiting, up to `RECORDS_PER_TURN` and while the budget has room. Rebalance
/// callbacks run while the consumer queue is polled, so the events they queue are yielded
/// before the record that poll returned. Each assigned partition's records come from a queue of
/// its own (`split_queues`), one partition's record after another's, until a batch of it is
/// larger than its turn allows: it is then taken from the consumer queue, in fetch order with
/// the others given back, the consumer queue taking a turn for each. A record is taken from
/// the client only while the `intake` has room; when it had none for longer than the pace room
/// came at lately (`room_wait`: at least its least wait), every partition is paused and the
/// client polled for callbacks alone until the service holds half of its budget (`intake`).
pub(crate) fn item_stream(
    consumer: Arc<HistoryConsumer>,
    intake: Arc<Intake>,
    room_wait: RoomWait,
) -> impl Stream<Item = Vec<KafkaItem>> {
    let mut positions = tokio::time::interval(PASSED_OVER_CHECK);
    positions.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut rotation_due = tokio::time::interval(ROTATION_CHECK);
    rotation_due.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let state = Polling {
        split: SplitQueues::default(),
        carried: Vec::new(),
        largest_batch: 0,
        watermarks: WatermarkQueries::default(),
        rotation: Rotation::default(),
        rotation_due,
        rotating: false,
        look_now: false,
        fetch_order_since_look: 0,
        quantum: crate::domain::rotation::QUANTUM_LEAST,
        handed_count: 0,
        pace: Pace::default(),
        batch_records: 0,
        consumer,
        intake,
        known: Vec::new(),
        handed: HandedOver::default(),
        positions,
        main_due: tokio::time::Instant::now(),
        room_wait,
    };
    futures::stream::unfold(state, move |mut state| async move {
        let mut check_positions = false;
        let mut check_seats = false;
        let rotating = state.consumer.context().turns_ended();
        let received = tokio::select! {
            biased;
            _ = state.consumer.context().notify.notified() => None,
            _ = state.positions.tick() => {
                check_positions = true;
                None
            }
            _ = state.rotation_due.tick(), if rotating => {
                check_seats = true;
                None
            }
            received = next_record(&state.consumer, &state.intake, &mut state.split, &mut state.main_due, &mut state.room_wait) => received,
        };
        let mut items = Vec::new();
        state.rebalances(&mut items);
        if check_seats {
            state.rotate(&mut items);
        }
        if check_positions {
            state.ask_watermarks();
            items.extend(passed_over(
                &state.consumer,
                &mut state.known,
                &mut state.handed,
            ));
        }
        let paused = state.intake.flow(|flow| flow.is_instance_paused());
        let Some(first) = received else {
            return Some((items, state));
        };
        let mut taken = 1;
        let mut next = Some(first);
        while let Some(received) = next.take() {
            state.take(received, paused, &mut items);
            if state.split.has_outgrown() {
                state.rejoin_outgrown();
            }
            // Paused, the stream only polls for callbacks: one record at a time.
            if paused || taken == RECORDS_PER_TURN || !state.intake.has_room() || state.look_now {
                break;
            }
            next = state.ready();
            taken += 1;
        }
        if state.look_now {
            state.rotate(&mut items);
        }
        Some((items, state))
    })
}

/// What the record stream polls with.
struct Polling {
    /// Declared first: the queues are dropped before the stream's handle on the consumer.
    split: SplitQueues<HistoryConsumer>,
    /// The assigned partitions without a queue of their own: taken from the consumer queue.
    carried: Vec<TopicPartition>,
    /// The largest record batch a queue showed (the one that ended the turns, or one shown
    /// since): what each seated partition may be sent before it is looked at.
    largest_batch: usize,
    /// The watermarks asked of the brokers for partitions in fetch order the client has not
    /// fetched since the turns ended.
    watermarks: WatermarkQueries,
    /// After the turns ended: the backlogged partitions, seated (fetching, each with a queue
    /// of its own) or waiting (paused) for a seat.
    rotation: Rotation<TopicPartition>,
    /// When the seats are next looked at.
    rotation_due: tokio::time::Interval,
    /// Whether backlogged partitions take turns for seats now.
    rotating: bool,
    /// Whether the seats are to be looked at before more records are taken: a turn ended by
    /// its most records, or fetch order handed over more than a turn since the last look.
    look_now: bool,
    /// While rotating, the records taken in fetch order since the seats were last looked at.
    fetch_order_since_look: u64,
    /// The records of a turn at the last look.
    quantum: u64,
    /// The records handed over so far; how fast they are released.
    handed_count: u64,
    pace: Pace,
    /// The records of the largest batch a queue showed (with `largest_batch`).
    batch_records: u64,
    consumer: Arc<HistoryConsumer>,
    intake: Arc<Intake>,
    known: Vec<TopicPartition>,
    handed: HandedOver,
    positions: tokio::time::Interval,
    /// When the consumer queue is next polled even though partition queues have records.
    main_due: tokio::time::Instant,
    /// The wait for room under way, kept across the ticks that interrupt it, which would
    /// otherwise restart it for good, and how long it lasts before the instance pauses.
    room_wait: RoomWait,
}

impl Polling {
    /// The rebalance events the callbacks queued, in order, with the partition queues
    /// following them.
    fn rebalances(&mut self, items: &mut Vec<KafkaItem>) {
        for event in self.consumer.context().take_events() {
            self.follow(&event);
            items.push(KafkaItem::Rebalance(event));
        }
    }

    /// What the client holds already, without waiting: a partition queue's next record in
    /// turn, or else the consumer queue's next item (whose poll may run rebalance callbacks).
    fn ready(&mut self) -> Option<Taken> {
        if let Some(taken) = main_turn(&self.consumer, &mut self.split) {
            return Some(taken);
        }
        if let Some((tp, taken)) = self.split.take(self.consumer.context().planned_turns()) {
            return Some(Taken::Record(tp, taken));
        }
        let received = self.consumer.recv().now_or_never()?;
        Some(Taken::main(received))
    }

    /// Adds what a poll took to the turn's items: a record with its share of the budget, or
    /// an error. A poll of the consumer queue may have run rebalance callbacks: their events
    /// go first.
    fn take(&mut self, received: Taken, paused: bool, items: &mut Vec<KafkaItem>) {
        if matches!(received, Taken::Main(_)) {
            self.rebalances(items);
        }
        match received {
            Taken::Record(tp, Ok(record)) => items.push(self.hand_over(tp, record, paused)),
            Taken::Main(Ok((topic, partition, record))) => {
                let tp = intern(&mut self.known, &topic, partition);
                // A partition in fetch order whose backlog is not known yet (its watermarks
                // came with the fetch just taken) is looked at after a turn's records, not at
                // the next look: by then fetch order would have taken a batch of it whole
                // (2,900 records of one partition in the first 0.1 s of the rotation, a fair
                // share of the first 5 s being 700).
                if self.rotating {
                    self.fetch_order_since_look += 1;
                    self.look_now |= self.fetch_order_since_look >= self.quantum;
                }
                items.push(self.hand_over(tp, record, paused));
            }
            Taken::Record(_, Err((err, reason))) => {
                // Taken from the consumer queue, librdkafka hands a partition's error (a batch
                // it cannot decompress, at its offset) to the error callback as well: the
                // client's health reads it there.
                rdkafka::ClientContext::error(
                    self.consumer.context().as_ref(),
                    err.clone(),
                    &reason,
                );
                items.push(KafkaItem::Error(err))
            }
            Taken::Main(Err(err)) => items.push(KafkaItem::Error(err)),
        }
    }

    /// A record taken from the client, with its share of the budget.
    fn hand_over(&mut self, tp: TopicPartition, record: Record, paused: bool) -> KafkaItem {
        // A record came from a broker: whatever said they were all down is over.
        self.consumer.context().health().broker_up();
        self.handed.record(&tp, record.offset);
        self.handed_count += 1;
        if self.rotating {
            self.look_now |= self.rotation.handed(&tp);
        }
        let held = self.intake.take(&record);
        if paused {
            // Assigned after the pause: kept (it is counted), and paused with the rest.
            let changes = self
                .intake
                .flow(|flow| flow.fetched_while_paused(tp.clone()));
            intake::apply(self.consumer.as_ref(), &changes);
        }
        KafkaItem::Record(tp, record, held)
    }

    /// A queue showed a fetched batch larger than a partition's turn allows. The first ends the
    /// turns ([`Self::end_turns`]); after it, a partition with a queue of its own that shows one
    /// is backlogged: it keeps its seat in the rotation, or takes one ([`Self::rotate`] sends
    /// it to wait if the seats are over), and the batch sets how many seats the budget holds.
    fn rejoin_outgrown(&mut self) {
        if !self.consumer.context().turns_ended() {
            self.end_turns();
            return;
        }
        let now = std::time::Instant::now();
        for outgrown in self.split.take_outgrown() {
            self.shown(&outgrown);
            if self.rotation.contains(&outgrown.tp) || !self.split.contains(&outgrown.tp) {
                continue;
            }
            // A partition kept on its queue while quiet ([`Self::end_turns`]) is backlogged
            // now: a seat while the seats turn, fetch order otherwise.
            if self.rotating {
                self.rotation.seat(outgrown.tp, now);
            } else if self.split.rejoin(self.consumer.as_ref(), &outgrown.tp)
                && !self.carried.contains(&outgrown.tp)
            {
                self.carried.push(outgrown.tp);
                self.carried_changed();
            }
        }
    }

    /// A queue showed a batch larger than a turn: the largest sets the seats.
    fn shown(&mut self, outgrown: &split_queues::Outgrown) {
        self.largest_batch = self.largest_batch.max(outgrown.batch);
        let records = outgrown.batch as u64 * outgrown.queued_records as u64
            / outgrown.queued_bytes.max(1) as u64;
        self.batch_records = self.batch_records.max(records);
    }

    /// The records of `tp` not yet handed over, by the watermarks the client last saw (or a
    /// broker told), if known.
    fn behind(&self, tp: &TopicPartition) -> Option<(i64, i64, i64)> {
        let cached =
            split_queues::watermarks(self.consumer.as_ref(), tp).filter(|&(_, high)| high >= 0);
        let (low, high) = cached.or_else(|| self.watermarks.answer(tp))?;
        let behind = split_queues::not_handed_over(low, high, self.handed.next(tp))?;
        Some((low, high, behind))
    }

    /// Whether `tp`'s log is known to hold no more past what was handed over than fits a turn:
    /// by [`Self::behind`], or, with nothing handed over and the log's start not known, by the
    /// high watermark itself (a partition still empty is known to hold nothing more).
    fn is_quiet(&self, tp: &TopicPartition, turns: &crate::domain::turns::Turns) -> bool {
        let behind = self.behind(tp).map(|(_, _, behind)| behind).or_else(|| {
            let cached =
                split_queues::watermarks(self.consumer.as_ref(), tp).filter(|&(_, high)| high >= 0);
            let (_, high) = cached.or_else(|| self.watermarks.answer(tp))?;
            split_queues::not_handed_over(0, high, self.handed.next(tp))
        });
        behind.is_some_and(|behind| self.split.fits_a_turn(behind, turns))
    }

    /// After the turns ended, while fetch order would be slow to come round to every
    /// backlogged partition ([`Pace`]), they take turns for the seats the budget holds with
    /// batches as large as the largest shown ([`crate::domain::rotation`]): a partition in
    /// fetch order with more records to read than fit a turn is paused, given a queue of its
    /// own and waits for a seat (provisionally, with turns of the least quantum, from the
    /// turns' end until the pace is first measured); a seated one with nothing left to hand
    /// over goes back to fetch order; then the seats whose slice ended change hands. A
    /// partition sent to wait is paused under the fetching decisions' lock, and what its queue
    /// held of fetches past what was handed over is dropped (fetched again from there when its
    /// turn comes); one whose turn came is resumed.
    fn rotate(&mut self, items: &mut Vec<KafkaItem>) {
        self.look_now = false;
        self.fetch_order_since_look = 0;
        let context = self.consumer.context().clone();
        if !context.turns_ended() {
            return;
        }
        let Some(turns) = context.planned_turns().copied() else {
            return;
        };
        let now = std::time::Instant::now();
        let backlogged = |polling: &Self, tp: &TopicPartition| {
            polling
                .behind(tp)
                .is_some_and(|(_, _, behind)| !polling.split.fits_a_turn(behind, &turns))
        };
        let joining: Vec<TopicPartition> = self
            .carried
            .iter()
            .filter(|tp| backlogged(self, tp))
            .cloned()
            .collect();
        // Kept on their queues while quiet ([`Self::end_turns`]), backlogged since: each would
        // otherwise be taken in turn beside all the seats together.
        let kept: Vec<TopicPartition> = self
            .split
            .partitions()
            .filter(|tp| !self.rotation.contains(tp) && backlogged(self, tp))
            .cloned()
            .collect();
        let released = self
            .handed_count
            .saturating_sub(self.intake.level().records as u64);
        self.pace.sample(now, released);
        self.lift_quiet(&turns);
        let in_rotation = self.rotation.len() + kept.len();
        let backlogged = joining.len() + in_rotation;
        if !self.rotating && !self.pace.is_measured() {
            self.rotating = true;
            tracing::info!(
                backlogged,
                "backlogged partitions take turns for seats until the pace of the hand-over is \
                 measured (a quarter of a second): with a slow database, fetch order would give \
                 the first seconds to the partitions whose batches came first"
            );
        }
        if !self
            .pace
            .rotates(self.rotating, backlogged, self.batch_records)
        {
            if self.rotating {
                self.stop_rotating();
            }
            return;
        }
        if !self.rotating {
            self.rotating = true;
            tracing::info!(
                backlogged,
                batch_records = self.batch_records,
                round_ms = ?self.pace.round(backlogged, self.batch_records).map(|round| round.as_millis()),
                seats = turns.seats(self.largest_batch),
                "backlogged partitions take turns for seats: in fetch order one batch of each \
                 would take longer than 4 s to be handed over at this pace (measured twice in a \
                 row), and the partitions whose batches came last would wait as long"
            );
        }
        for tp in joining {
            if self.split_off(&tp, false) {
                self.rotation.wait(tp);
            }
        }
        for tp in kept {
            let consumer = self.consumer.clone();
            self.intake.flow(|flow| {
                let changes = flow.wait_turn(tp.clone());
                intake::apply(consumer.as_ref(), &changes);
            });
            self.rotation.wait(tp.clone());
            if let Some(fetched) = self.split.discard_stale(&tp) {
                self.take(Taken::Record(tp, fetched), false, items);
            }
        }
        // Left with nothing to hand over, a seated partition leaves the rotation and keeps its
        // queue, quiet, while there is room for one (it would be lifted out of fetch order).
        let caught_up: Vec<TopicPartition> = self
            .rotation
            .seated()
            .filter(|tp| self.behind(tp).is_some_and(|(_, _, behind)| behind == 0))
            .cloned()
            .collect();
        for tp in caught_up {
            self.rotation.remove(&tp);
            if self.quiet_room(&turns) == 0
                && self.split.rejoin(self.consumer.as_ref(), &tp)
                && !self.carried.contains(&tp)
            {
                self.carried.push(tp);
            }
        }
        let seats = turns.seats(self.largest_batch);
        // Before the pace is known, the least: a turn then lasts its least time.
        let quantum = if !self.pace.is_measured() {
            crate::domain::rotation::QUANTUM_LEAST
        } else {
            self.pace.quantum(self.rotation.len(), self.batch_records)
        };
        self.quantum = quantum;
        // A turn takes no more than its partition's share of the budget (or its quantum, if
        // more), so that the room a burst frees (the whole budget, when the rotation begins)
        // goes round the seats.
        let share = self.intake.limits().records as u64 / self.rotation.len().max(1) as u64;
        self.rotation.limit_turns(share.max(quantum));
        let swaps = self
            .rotation
            .turn(now, seats, quantum, TURN_LEAST, ROTATION_SLICE);
        if !swaps.leave.is_empty() || !swaps.enter.is_empty() {
            let consumer = self.consumer.clone();
            self.intake.flow(|flow| {
                for tp in &swaps.leave {
                    let changes = flow.wait_turn(tp.clone());
                    intake::apply(consumer.as_ref(), &changes);
                }
                for tp in &swaps.enter {
                    let changes = flow.take_turn(tp);
                    intake::apply(consumer.as_ref(), &changes);
                }
            });
            for tp in &swaps.leave {
                if let Some(fetched) = self.split.discard_stale(tp) {
                    tracing::error!(%tp, "a partition sent to wait for its turn still had a record to take: it is taken");
                    self.take(Taken::Record(tp.clone(), fetched), false, items);
                }
            }
            tracing::debug!(
                left = ?swaps.leave,
                entered = ?swaps.enter,
                seats,
                quantum,
                waiting = self.rotation.waiting_len(),
                "seats of the rotation changed hands"
            );
        }
        crate::metrics::set_partitions_waiting_turn(self.rotation.waiting_len());
        self.carried_changed();
    }

    /// After the turns ended, a quiet partition in fetch order (one whose log holds no more past
    /// what was handed over than fits a turn — given back when the turns ended before its
    /// watermark was known, which a quick end of the turns makes the rule) gets a queue of its
    /// own, taken in turn beside the others: in the consumer queue its new records would wait
    /// behind whatever fetch order holds of the backlogged ones (1.5–1.9 s for the first
    /// events of `bench --fairness`, until the seats began). None of its records is taken out
    /// of order ([`Self::split_off`]).
    fn lift_quiet(&mut self, turns: &crate::domain::turns::Turns) {
        let quiet: Vec<TopicPartition> = self
            .carried
            .iter()
            .filter(|tp| self.is_quiet(tp, turns))
            .take(self.quiet_room(turns))
            .cloned()
            .collect();
        for tp in quiet {
            self.split_off(&tp, true);
        }
    }

    /// Takes `tp` out of fetch order into a queue of its own: paused first (the pause returns
    /// once librdkafka took it, so what the consumer queue holds of it is stale, dropped unread,
    /// and its next fetch starts at the last record handed over), then split; resumed at once
    /// if `resume`, else left to wait for a seat. Returns whether it has its queue (if not, it
    /// stays in fetch order, fetching).
    fn split_off(&mut self, tp: &TopicPartition, resume: bool) -> bool {
        let consumer = self.consumer.clone();
        let wake = self.split.wake();
        let opened = self.intake.flow(|flow| {
            let changes = flow.wait_turn(tp.clone());
            intake::apply(consumer.as_ref(), &changes);
            let queue = SplitQueue::open(consumer.clone(), tp.clone(), wake);
            if resume || queue.is_none() {
                let changes = flow.take_turn(tp);
                intake::apply(consumer.as_ref(), &changes);
            }
            queue
        });
        let Some(queue) = opened else {
            return false;
        };
        self.split.insert(queue);
        self.carried.retain(|carried| carried != tp);
        true
    }

    /// How many more quiet partitions may hold queues of their own: as many as the seats the
    /// budget holds, whatever their number. Each holds no more than a turn while quiet, but a
    /// backlog arriving on all of them at once sends each a batch before it is looked at, which
    /// fetch order's one queue would not (47 of 48 partitions kept so held 65.6 MB against a
    /// bound of 51.9 in `flow_control::a_backlog_arriving_after_the_turns_ended_…`).
    fn quiet_room(&self, turns: &crate::domain::turns::Turns) -> usize {
        let quiet = self
            .split
            .partitions()
            .filter(|tp| !self.rotation.contains(tp))
            .count();
        turns.seats(self.largest_batch).saturating_sub(quiet)
    }

    /// The database keeps pace again: every partition of the rotation is taken in fetch order,
    /// those waiting resumed.
    fn stop_rotating(&mut self) {
        self.rotating = false;
        let seated: Vec<TopicPartition> = self.rotation.seated().cloned().collect();
        let waiting: Vec<TopicPartition> = self.rotation.waiting().cloned().collect();
        let consumer = self.consumer.clone();
        self.intake.flow(|flow| {
            for tp in &waiting {
                let changes = flow.take_turn(tp);
                intake::apply(consumer.as_ref(), &changes);
            }
        });
        for tp in seated.iter().chain(&waiting) {
            self.rotation.remove(tp);
            if self.split.rejoin(self.consumer.as_ref(), tp) && !self.carried.contains(tp) {
                self.carried.push(tp.clone());
            }
        }
        tracing::info!(
            partitions = seated.len() + waiting.len(),
            "backlogged partitions no longer take turns for seats: the database keeps pace, and \
             fetch order comes round to each within a second or so"
        );
        crate::metrics::set_partitions_waiting_turn(0);
        self.carried_changed();
    }

    /// Partitions are taken in fetch order from now on: a partition's queue showed a fetched
    /// batch larger than the turns allow, and with a batch like it in every partition's queue
    /// the client would hold more than its share of the budget. Every queue is given back to
    /// the consumer queue, records and all (each partition's in order); under a slow database
    /// the backlogged ones then take turns for seats ([`Self::rotate`]).
    fn end_turns(&mut self) {
        let context = self.consumer.context();
        let Some(turns) = context.turns().copied() else {
            return;
        };
        let Some(outgrown) = self.split.outgrown_first() else {
            return;
        };
        context.end_turns();
        self.shown(&outgrown);
        // A partition whose backlog fits a turn keeps its queue: given back, its new records
        // would wait in the consumer queue behind the runs fetched of the backlogged ones
        // (a quiet partition's event waited 1.5 s there under a slow database before the seats
        // began). As many as the seats at most ([`Self::quiet_room`]); one that shows a larger
        // batch later is given back then, or takes a seat ([`Self::rejoin_outgrown`]).
        let room = turns.seats(self.largest_batch);
        let quiet: Vec<TopicPartition> = self
            .split
            .partitions()
            .filter(|tp| self.is_quiet(tp, &turns))
            .take(room)
            .cloned()
            .collect();
        let (rejoined, queued_at_end) = self
            .split
            .rejoin_all_but(self.consumer.as_ref(), |tp| quiet.contains(tp));
        for tp in rejoined {
            if !self.carried.contains(&tp) {
                self.carried.push(tp);
            }
        }
        self.carried_changed();
        let max_in_flight_bytes = turns.budget_bytes;
        let needed = turns.budget_for(outgrown.batch);
        tracing::warn!(
            tp = %outgrown.tp,
            queued_records = outgrown.queued_records,
            queued_bytes = outgrown.queued_bytes,
            queued_at_end,
            batch_bytes = outgrown.batch,
            partition_share_bytes = turns.share_each,
            partitions = turns.partitions,
            max_in_flight_bytes,
            needed,
            "partitions no longer take turns: a fetch brought a record batch larger than a \
             partition's turn allows (its share of the Kafka client's queue and half the rest of \
             its share of the client's part of pipeline.max_in_flight_bytes; producers' batches \
             reach a megabyte writing a backlog), and a batch like it in \
             each partition's queue would exceed the budget. Records are taken in the order they \
             were fetched; when that would take over 4 s to come round to every backlogged \
             partition (a slow database), they take turns for seats: as many fetch at once as \
             the client's part of the budget holds batches of this size, each for as many \
             records as make a round of every backlogged partition's turn last 2.5 s (a quarter \
             of a second at least) or a second while others wait, paused (what the client fetched of a partition \
             past what was taken is fetched again at its next turn). Raise \
             pipeline.max_in_flight_bytes to the value named for every partition to take turns \
             at once with batches of this size"
        );
    }

    /// After the turns ended, asks the brokers for the watermarks of the partitions in fetch
    /// order the client has not fetched since (a partition's backlog decides whether it takes
    /// turns for a seat: [`Self::rotate`]).
    fn ask_watermarks(&mut self) {
        if !self.consumer.context().turns_ended() {
            return;
        }
        self.watermarks.answered();
        let ask: Vec<TopicPartition> = self
            .carried
            .iter()
            .filter(|tp| self.behind(tp).is_none())
            .cloned()
            .collect();
        self.watermarks.ask(&self.consumer, ask);
    }

    /// The consumer queue's part of the turns and the gauges follow the partitions it carries.
    fn carried_changed(&mut self) {
        self.split.set_carried(self.carried.len());
        let splits = self.consumer.context().planned_turns().is_some();
        crate::metrics::set_partitions_in_fetch_order(self.carried.len());
        crate::metrics::set_partitions_waiting_turn(self.rotation.waiting_len());
        crate::metrics::set_partitions_in_turn(
            splits && self.carried.is_empty() && self.rotation.is_empty(),
        );
    }

    /// Opens the queues of assigned partitions, drops those of revoked ones.
    fn follow(&mut self, event: &RebalanceEvent) {
        match event {
            RebalanceEvent::Assigned(partitions) => {
                for (tp, _) in partitions {
                    self.handed.forget(tp);
                    let context = self.consumer.context();
                    let own_queue = if !context.splits_partitions() {
                        // The rebalance callback may have split it off before the turns ended.
                        self.split.remove(tp);
                        if context.turns_ended()
                            && !split_queues::rejoin(self.consumer.as_ref(), tp)
                        {
                            tracing::error!(%tp, "the partition's queue could not be given back to the consumer queue: its records are not taken");
                        }
                        false
                    } else {
                        match SplitQueue::open(self.consumer.clone(), tp.clone(), self.split.wake())
                        {
                            Some(queue) => {
                                self.split.insert(queue);
                                true
                            }
                            None => {
                                // Its records come through the consumer queue, as they would
                                // unsplit.
                                tracing::warn!(%tp, "the partition's queue could not be split off");
                                false
                            }
                        }
                    };
                    if !own_queue && !self.carried.contains(tp) {
                        self.carried.push(tp.clone());
                    }
                }
            }
            RebalanceEvent::Revoked { partitions, .. } => {
                for (tp, _) in partitions {
                    self.handed.forget(tp);
                    self.split.remove(tp);
                    self.rotation.remove(tp);
                    self.carried.retain(|carried| carried != tp);
                    self.watermarks.forget(tp);
                }
            }
        }
        self.carried_changed();
    }
}

/// What a poll took.
enum Taken {
    /// From a partition's own queue: a record, or an error with its description.
    Record(TopicPartition, split_queues::Fetched),
    /// From the consumer queue: an error, or a record (with its topic and partition) of a
    /// partition that was not split.
    Main(Result<(String, i32, Record), KafkaError>),
}

impl Taken {
    fn main(received: Result<BorrowedMessage<'_>, KafkaError>) -> Self {
        Taken::Main(received.map(|message| {
            (
                message.topic().to_owned(),
                message.partition(),
                record_of(&message),
            )
        }))
    }
}

/// How often the seats of the rotation are looked at, after the turns ended: often enough
/// beside turns of a few hundred milliseconds that a turn is not a look longer than its
/// quantum (looks every 250 ms made turns of 0.5 s last 0.75 s).
const ROTATION_CHECK: Duration = Duration::from_millis(100);

/// The longest a backlogged partition keeps its seat while others wait, whatever it handed
/// over (a database far slower, or a partition whose window is full).
const ROTATION_SLICE: Duration = Duration::from_secs(1);

/// How often the client's positions are compared with the records it handed over.
const PASSED_OVER_CHECK: Duration = Duration::from_secs(1);

/// The longest a rebalance waits for the record stream to poll the consumer queue while every
/// partition queue has records (beside the turn under way).
const MAIN_QUEUE_POLL_EVERY: Duration = Duration::from_millis(100);

/// The partitions whose client position moved past the last record handed over (see
/// [`passed_over`](self::passed_over)). Read between polls, on the polling task: every record
/// the client handed over before is already among the items yielded.
fn passed_over(
    consumer: &HistoryConsumer,
    known: &mut Vec<TopicPartition>,
    handed: &mut HandedOver,
) -> Vec<KafkaItem> {
    let Ok(positions) = consumer.position() else {
        return Vec::new();
    };
    positions
        .elements()
        .iter()
        .filter_map(|element| {
            let rdkafka::Offset::Offset(position) = element.offset() else {
                return None;
            };
            let tp = intern(known, element.topic(), element.partition());
            let passed = handed.passed_over(&tp, position)?;
            Some(KafkaItem::PassedOver(tp, passed))
        })
        .collect()
}

/// The next record (or error) to take, or `None` when only the fetching state changed.
async fn next_record(
    consumer: &HistoryConsumer,
    intake: &Intake,
    split: &mut SplitQueues<HistoryConsumer>,
    main_due: &mut tokio::time::Instant,
    room_wait: &mut RoomWait,
) -> Option<Taken> {
    let wake = split.wake();
    if !intake.flow(|flow| flow.is_instance_paused()) {
        if room_wait.room(intake).await {
            // Rebalance callbacks run only where the consumer queue is polled, and the
            // partitions' own queues may never run dry (a backlog behind a database slower than
            // the broker): it is polled, without waiting, at least this often all the same.
            // Not every turn: a turn may be a record or two when the budget frees in bits.
            let now = tokio::time::Instant::now();
            if now >= *main_due {
                *main_due = now + MAIN_QUEUE_POLL_EVERY;
                if let Some(received) = consumer.recv().now_or_never() {
                    return Some(Taken::main(received));
                }
            }
            // The partitions the consumer queue carries take their turns with the others.
            if let Some(taken) = main_turn(consumer, split) {
                return Some(taken);
            }
            loop {
                if let Some((tp, taken)) = split.take(consumer.context().planned_turns()) {
                    return Some(Taken::Record(tp, taken));
                }
                tokio::select! {
                    received = consumer.recv() => return Some(Taken::main(received)),
                    // A partition queue has records (or had, and they were taken since).
                    _ = wake.notified() => {}
                }
            }
        }
        let assigned = intake::assignment(consumer);
        let changes = intake.flow(|flow| flow.pause_instance(&assigned));
        intake::apply(consumer, &changes);
        metrics::counter!(crate::metrics::INSTANCE_PAUSES_TOTAL).increment(1);
        tracing::debug!(
            level = ?intake.level(),
            waited = ?room_wait.limit(),
            "the budget stayed full: fetching paused until half of it is free"
        );
    }
    // Paused: the partition queues keep what they fetched until the budget has room again;
    // the consumer queue is still polled, for rebalances and errors.
    tokio::select! {
        _ = intake.low() => {
            let changes = intake.flow(|flow| flow.resume_instance());
            intake::apply(consumer, &changes);
            tracing::debug!(level = ?intake.level(), "fetching resumed");
            None
        }
        received = consumer.recv() => Some(Taken::main(received)),
    }
}

/// The consumer queue's next item, when its turn among the partition queues has come (it
/// carries partitions in fetch order) and it has one; never waits.
fn main_turn(
    consumer: &HistoryConsumer,
    split: &mut SplitQueues<HistoryConsumer>,
) -> Option<Taken> {
    if !split.main_due() {
        return None;
    }
    let received = consumer.recv().now_or_never();
    split.main_polled(received.is_some());
    received.map(Taken::main)
}

/// Reuses one `TopicPartition` per partition instead of allocating a topic name per record.
fn intern(known: &mut Vec<TopicPartition>, topic: &str, partition: i32) -> TopicPartition {
    if let Some(tp) = known
        .iter()
        .find(|tp| tp.partition == partition && &*tp.topic == topic)
    {
        return tp.clone();
    }
    let tp = TopicPartition::new(topic, partition);
    known.push(tp.clone());
    tp
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use rdkafka::consumer::BaseConsumer;

    use super::*;
    use crate::config::Settings;

    fn config(pairs: &[(&str, &str)]) -> ClientConfig {
        let environment: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let settings = Settings::read_from(None, Some(environment)).unwrap();
        let budget = settings.pipeline.budget();
        let fetch = budget.fetch(3, settings.kafka.max_compression_ratio as usize);
        consumer_config(&settings.kafka, &budget, 1, &fetch).unwrap()
    }

    /// librdkafka checks the properties against each other only when a client is created.
    fn accepted_by_librdkafka(config: &ClientConfig) {
        if let Err(err) = config.create::<BaseConsumer>() {
            panic!("librdkafka refuses the consumer's configuration: {err}");
        }
    }

    #[test]
    fn the_classic_protocol_gets_its_session_timeout_and_the_cooperative_assignor() {
        let config = config(&[("HISTORY__KAFKA__SESSION_TIMEOUT_MS", "6000")]);
        assert_eq!(config.get("group.protocol"), Some("classic"));
        assert_eq!(config.get("session.timeout.ms"), Some("6000"));
        assert_eq!(config.get("heartbeat.interval.ms"), Some("2000"));
        assert_eq!(
            config.get("partition.assignment.strategy"),
            Some("cooperative-sticky")
        );
        assert_eq!(config.get("group.instance.id"), None);
        assert_eq!(
            config.get("topic.metadata.refresh.interval.ms"),
            Some("10000")
        );
        accepted_by_librdkafka(&config);
    }

    #[test]
    fn the_consumer_protocol_leaves_timeouts_and_assignment_to_the_broker() {
        let config = config(&[
            ("HISTORY__KAFKA__GROUP_PROTOCOL", "consumer"),
            ("HISTORY__KAFKA__REMOTE_ASSIGNOR", "uniform"),
            ("HISTORY__KAFKA__GROUP_INSTANCE_ID", "history-0"),
        ]);
        assert_eq!(config.get("group.protocol"), Some("consumer"));
        assert_eq!(config.get("group.remote.assignor"), Some("uniform"));
        assert_eq!(config.get("group.instance.id"), Some("history-0"));
        for refused in [
            "session.timeout.ms",
            "heartbeat.interval.ms",
            "partition.assignment.strategy",
            "group.protocol.type",
        ] {
            assert_eq!(config.get(refused), None, "{refused}");
        }
        accepted_by_librdkafka(&config);
    }
}
