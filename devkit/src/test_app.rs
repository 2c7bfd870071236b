//! [`TestApp`]: the service under test with everything it needs, in one call, in the style of
//! zero2prod's `spawn_app`: a throwaway database (migrated), an embedded broker with a topic of
//! its own, a group of its own, and the real `history-service run` binary as a child serving its
//! endpoints on a listening socket the test bound (port chosen by the OS, known before the child
//! starts). With what the tests do to it: produce, wait until the group committed, read the
//! metrics, stop.

use std::cell::Cell;
use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use history_service::app::{self, RunHandles, RunReport, ServiceError};
use history_service::config::Settings;

use crate::broker::EmbeddedBroker;
use crate::group::{self, GroupInspector};
use crate::probe::{self, Metrics};
use crate::process::{Process, Signal, local_listener};
use crate::test_db::TestDb;
use crate::workload::{self, Delivered, PlannedRecord};

/// How long [`TestApp::stop`] waits for the exit after SIGTERM.
const STOP_TIMEOUT: Duration = Duration::from_secs(60);

/// How long [`TestApp::metrics`] waits for `/metrics` to answer.
const METRICS_TIMEOUT: Duration = Duration::from_secs(10);

/// The environment of a service under test: the defaults, fast timers, a pool of 8, no HTTP.
/// Used as is for child processes, and through `Settings::load_from` in process.
pub fn service_env(
    database_url: &str,
    brokers: &str,
    group: &str,
    topic: &str,
) -> Vec<(String, String)> {
    [
        ("HISTORY__DATABASE__URL", database_url),
        ("HISTORY__DATABASE__POOL_SIZE", "8"),
        ("HISTORY__KAFKA__BROKERS", brokers),
        ("HISTORY__KAFKA__GROUP_ID", group),
        ("HISTORY__KAFKA__TOPICS", topic),
        (SESSION_TIMEOUT, "3000"),
        ("HISTORY__PIPELINE__COMMIT_INTERVAL_MS", "100"),
        ("HISTORY__PIPELINE__RETRY_INITIAL_MS", "50"),
        ("HISTORY__PIPELINE__RETRY_MAX_MS", "500"),
        ("HISTORY__PIPELINE__BATCH_LINGER_MS", "2"),
        ("HISTORY__HTTP__ENABLED", "false"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect()
}

const GROUP_PROTOCOL: &str = "HISTORY__KAFKA__GROUP_PROTOCOL";
const SESSION_TIMEOUT: &str = "HISTORY__KAFKA__SESSION_TIMEOUT_MS";

/// Sets `key` to `value` in an environment list, replacing an earlier value.
fn set_var(env: &mut Vec<(String, String)>, key: &str, value: &str) {
    env.retain(|(k, _)| k != key);
    env.push((key.to_owned(), value.to_owned()));
}

/// What [`TestApp::spawn`]'s `tweak` may change.
pub struct Options {
    /// Partitions of the topic the app creates.
    pub partitions: i32,
    /// Brokers of the embedded cluster the app starts (the topic's partitions are spread
    /// over them, each led by one).
    pub brokers: i32,
    /// Apply the service's migrations to the new database (otherwise it is left empty).
    pub migrate: bool,
    /// The topic; a random name unless set.
    pub topic: String,
    /// The consumer group; a random id unless set.
    pub group: String,
    /// Environment variables set after the test environment, overriding it.
    pub env: Vec<(String, String)>,
    /// A database to use instead of a new one (a second instance of the same deployment).
    pub database: Option<Arc<TestDb>>,
    /// An embedded broker to use instead of a new one.
    pub broker: Option<Arc<EmbeddedBroker>>,
    /// A cluster outside the app (`history-dev dev-kafka`, an address where nothing listens):
    /// no embedded broker is started and no topic created.
    pub external_brokers: Option<String>,
    /// Start the embedded broker behind a fault proxy ([`EmbeddedBroker::start_proxied`]).
    pub broker_proxied: bool,
    /// librdkafka properties the test's own clients need for the cluster (its security: an
    /// external broker that authenticates), for producing and reading the group's positions.
    pub client_properties: Vec<(String, String)>,
    create_topic: bool,
}

impl Options {
    /// Sets an environment variable of the service, overriding the test environment.
    pub fn env(&mut self, key: &str, value: impl AsRef<str>) -> &mut Self {
        set_var(&mut self.env, key, value.as_ref());
        self
    }

    /// Leaves the topic for the test to create ([`EmbeddedBroker::create_topic`]) after the
    /// service has started.
    pub fn topic_created_later(&mut self) -> &mut Self {
        self.create_topic = false;
        self
    }

    /// Runs the service under the consumer group protocol `protocol` (`classic`, `consumer`).
    pub fn protocol(&mut self, protocol: &str) -> &mut Self {
        self.env(GROUP_PROTOCOL, protocol)
    }

    /// Another instance of `app`'s deployment: its database, broker, topic, group and the
    /// variables it set (call it before changing any of them).
    pub fn share(&mut self, app: &TestApp) -> &mut Self {
        self.env = app.overrides.clone();
        self.database = Some(app.db.clone());
        self.broker = app.broker.clone();
        self.external_brokers = app.broker.is_none().then(|| app.brokers.clone());
        self.topic = app.topic.clone();
        self.partitions = app.partitions;
        self.group = app.group.clone();
        self.client_properties = app.client_properties.clone();
        self.create_topic = false;
        self
    }
}

impl Default for Options {
    fn default() -> Self {
        let id = rand::random::<u64>();
        Options {
            partitions: 1,
            brokers: 1,
            migrate: true,
            topic: format!("tickets.status.test-{:08x}", id as u32),
            group: format!("history-test-{:08x}", (id >> 32) as u32),
            env: Vec::new(),
            database: None,
            broker: None,
            broker_proxied: false,
            external_brokers: None,
            client_properties: Vec::new(),
            create_topic: true,
        }
    }
}

/// How long [`TestApp::ends`] keeps asking.
const ENDS_WITHIN: Duration = Duration::from_secs(30);

/// The service under test and what it runs against; see the module documentation. The child
/// is killed, if still running, and the database dropped when the app is dropped.
pub struct TestApp {
    // Declared first, so dropped first: no child outlives its database or broker.
    service: Option<Process>,
    pub db: Arc<TestDb>,
    broker: Option<Arc<EmbeddedBroker>>,
    /// The bootstrap servers the service and the test's clients use.
    pub brokers: String,
    pub topic: String,
    pub partitions: i32,
    pub group: String,
    env: Vec<(String, String)>,
    /// The variables set over the test environment ([`Options::env`], [`TestApp::set_env`]).
    overrides: Vec<(String, String)>,
    inspector: Arc<GroupInspector>,
    /// [`Options::client_properties`].
    client_properties: Vec<(String, String)>,
    port: Cell<Option<u16>>,
}

impl TestApp {
    /// Everything [`TestApp::spawn`] sets up, with the service not started yet
    /// ([`TestApp::start`], [`TestApp::run_in_process`]).
    pub async fn prepare(tweak: impl FnOnce(&mut Options)) -> TestApp {
        let mut options = Options::default();
        tweak(&mut options);
        let db = match options.database {
            Some(db) => db,
            None if options.migrate => Arc::new(TestDb::migrated().await),
            None => Arc::new(TestDb::create().await),
        };
        let (broker, brokers) = match (options.external_brokers, options.broker) {
            (Some(brokers), _) => (None, brokers),
            (None, Some(broker)) => {
                let brokers = broker.bootstrap_servers();
                (Some(broker), brokers)
            }
            (None, None) => {
                let broker = if options.broker_proxied {
                    EmbeddedBroker::start_proxied(options.brokers)
                } else {
                    EmbeddedBroker::start(options.brokers)
                };
                let broker = Arc::new(broker.expect("the embedded broker starts"));
                let brokers = broker.bootstrap_servers();
                (Some(broker), brokers)
            }
        };
        if let (Some(broker), true) = (&broker, options.create_topic) {
            broker
                .create_topic(&options.topic, options.partitions)
                .expect("the topic is created");
        }
        let mut env = service_env(&db.url(), &brokers, &options.group, &options.topic);
        // Served on the socket the app hands over, whatever `http.listen` says.
        set_var(&mut env, "HISTORY__HTTP__ENABLED", "true");
        for (key, value) in &options.env {
            set_var(&mut env, key, value);
        }
        // The broker owns the session timeout under the `consumer` protocol, and the service
        // refuses one set with it: the test environment's goes unless the test set it.
        let consumer_protocol = options
            .env
            .iter()
            .any(|(key, value)| key == GROUP_PROTOCOL && value == "consumer");
        if consumer_protocol && !options.env.iter().any(|(key, _)| key == SESSION_TIMEOUT) {
            env.retain(|(key, _)| key != SESSION_TIMEOUT);
        }
        let inspector = Arc::new(
            GroupInspector::with_properties(&brokers, &options.group, &options.client_properties)
                .expect("the group inspector is created"),
        );
        TestApp {
            service: None,
            db,
            broker,
            brokers,
            topic: options.topic,
            partitions: options.partitions,
            group: options.group,
            env,
            overrides: options.env,
            inspector,
            client_properties: options.client_properties,
            port: Cell::new(None),
        }
    }

    /// A database, a broker and topic, a group, and the service running against them.
    pub async fn spawn(tweak: impl FnOnce(&mut Options)) -> TestApp {
        let mut app = TestApp::prepare(tweak).await;
        app.start();
        app
    }

    /// Starts `history-service run` as a child, serving its endpoints on a listener bound here.
    /// Again after [`TestApp::stop`] (or a kill): a restart with the environment as it is then.
    pub fn start(&mut self) {
        if let Some(service) = self.service.as_mut() {
            assert!(
                service.exit_status().is_some(),
                "the service is already running"
            );
        }
        let listener = local_listener().expect("a local port to listen on");
        self.port
            .set(Some(listener.local_addr().expect("a bound socket").port()));
        let service = Process::command(crate::workspace_binary("history-service"))
            .arg("run")
            .env_remove("HISTORY_CONFIG")
            .envs(&self.env)
            .hand_over(listener)
            .spawn()
            .expect("history-service starts");
        self.service = Some(service);
    }

    /// The service's environment (the test environment with the tweaks).
    pub fn env(&self) -> &[(String, String)] {
        &self.env
    }

    /// Sets a variable for the next [`TestApp::start`].
    pub fn set_env(&mut self, key: &str, value: impl AsRef<str>) {
        set_var(&mut self.env, key, value.as_ref());
        set_var(&mut self.overrides, key, value.as_ref());
    }

    /// The settings the service reads from [`TestApp::env`].
    pub fn settings(&self) -> Settings {
        let env: HashMap<String, String> = self.env.iter().cloned().collect();
        Settings::load_from(None, Some(env)).expect("valid test settings")
    }

    /// Runs the service in this process (inside the test's actix system) until `shutdown`
    /// completes, for tests that look at its [`RunReport`]. Its endpoints are served on a
    /// listener handed over the same way; the metrics recorder is the process's, though, shared
    /// by every service run in it, so tests that read metrics run the child.
    pub async fn run_in_process(
        &self,
        shutdown: impl Future<Output = ()>,
    ) -> Result<RunReport, ServiceError> {
        let listener = local_listener().expect("a local port to listen on");
        self.port
            .set(Some(listener.local_addr().expect("a bound socket").port()));
        let handles = RunHandles::default();
        *handles.http_listener.lock().unwrap() = Some(listener);
        app::run(&self.settings(), app::Stop::when(shutdown), handles).await
    }

    /// The embedded broker, for topics and faults.
    pub fn broker(&self) -> &EmbeddedBroker {
        self.broker
            .as_deref()
            .expect("this app runs against an external broker")
    }

    /// The running (or last) service process.
    pub fn process(&mut self) -> &mut Process {
        self.service.as_mut().expect("the service was started")
    }

    /// Everything the service wrote to standard error so far.
    pub fn logs(&self) -> String {
        self.service.as_ref().map(Process::logs).unwrap_or_default()
    }

    /// The port of the service's endpoints.
    pub fn port(&self) -> u16 {
        self.port.get().expect("the service was started")
    }

    /// Sends `signal` and waits (bounded) for the exit; returns the exit code, `None` if the
    /// signal killed it.
    pub fn stop_with(&mut self, signal: Signal) -> Option<i32> {
        let service = self.process();
        service.signal(signal);
        match service.wait_exit(STOP_TIMEOUT) {
            Ok(status) => status.code(),
            Err(err) => panic!("{err}; its log:\n{}", service.logs()),
        }
    }

    /// SIGTERM, the graceful stop; returns the exit code.
    pub fn stop(&mut self) -> Option<i32> {
        self.stop_with(Signal::SIGTERM)
    }

    /// Produces the records to the app's topic; returns where each landed.
    pub async fn produce(&self, records: &[PlannedRecord]) -> Vec<Delivered> {
        let (brokers, topic, records) =
            (self.brokers.clone(), self.topic.clone(), records.to_vec());
        let properties = self.client_properties.clone();
        tokio::task::spawn_blocking(move || {
            let properties: Vec<(&str, &str)> = properties
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            workload::produce_with(&brokers, &topic, &records, &properties)
        })
        .await
        .unwrap()
        .expect("the records are produced")
    }

    /// Produces the records to the app's topic with an external client (the confluent-kafka
    /// Python client), `properties` set on it — `compression.type` above all; returns where
    /// each landed.
    pub async fn produce_externally(
        &self,
        records: &[PlannedRecord],
        properties: &[(&str, &str)],
    ) -> Vec<Delivered> {
        let (brokers, topic, records) =
            (self.brokers.clone(), self.topic.clone(), records.to_vec());
        let properties: Vec<(String, String)> = properties
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        tokio::task::spawn_blocking(move || {
            let properties: Vec<(&str, &str)> = properties
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            crate::external_producer::produce(&brokers, &topic, &records, &properties)
        })
        .await
        .unwrap()
        .unwrap_or_else(|err| panic!("the external producer: {err}"))
    }

    /// The end offset of each partition of the topic, asking the broker. A read that times out
    /// is tried again until [`ENDS_WITHIN`], each time with a client of its own: the
    /// inspector's client follows leaders moved and brokers stopped by a test only at its next
    /// metadata refresh, and one kept asking a decommissioned broker for 30 s in a CI run.
    pub async fn ends(&self) -> Vec<i64> {
        let (inspector, topic, partitions) =
            (self.inspector.clone(), self.topic.clone(), self.partitions);
        let (brokers, group, properties) = (
            self.brokers.clone(),
            self.group.clone(),
            self.client_properties.clone(),
        );
        tokio::task::spawn_blocking(move || {
            let deadline = Instant::now() + ENDS_WITHIN;
            let mut asked = inspector.ends(&topic, partitions, Duration::from_secs(5));
            loop {
                match asked {
                    Ok(ends) => return ends,
                    Err(err) if Instant::now() >= deadline => {
                        panic!("the topic's ends are not read within {ENDS_WITHIN:?}: {err}")
                    }
                    Err(_) => {}
                }
                asked = GroupInspector::with_properties(&brokers, &group, &properties)
                    .and_then(|fresh| fresh.ends(&topic, partitions, Duration::from_secs(5)));
            }
        })
        .await
        .unwrap()
    }

    /// The group's committed offset of each partition, read by a separate client.
    pub async fn committed(&self) -> Vec<Option<i64>> {
        let (inspector, topic, partitions) =
            (self.inspector.clone(), self.topic.clone(), self.partitions);
        tokio::task::spawn_blocking(move || {
            inspector
                .committed(&topic, partitions, Duration::from_secs(5))
                .expect("the committed offsets are read")
        })
        .await
        .unwrap()
    }

    /// The group's committed offset of each partition with its metadata, read by a separate
    /// client.
    pub async fn committed_with_metadata(&self) -> Vec<Option<(i64, String)>> {
        let (inspector, topic, partitions) =
            (self.inspector.clone(), self.topic.clone(), self.partitions);
        tokio::task::spawn_blocking(move || {
            inspector
                .committed_with_metadata(&topic, partitions, Duration::from_secs(5))
                .expect("the committed offsets are read")
        })
        .await
        .unwrap()
    }

    /// Commits `positions` (partition, offset, metadata) for the group from outside it, while
    /// no member runs (bounded: a commit that gets no answer fails the test).
    pub async fn commit_from_outside(&self, positions: &[(i32, i64, String)]) {
        let (inspector, topic, positions) = (
            self.inspector.clone(),
            self.topic.clone(),
            positions.to_vec(),
        );
        let commit = tokio::task::spawn_blocking(move || inspector.commit(&topic, &positions));
        tokio::time::timeout(Duration::from_secs(30), commit)
            .await
            .expect("the broker answers the commit")
            .unwrap()
            .expect("the commit is accepted");
    }

    /// Waits until the group has committed the end of every partition of the topic (read by
    /// a separate client, as an operator would); returns the committed offsets.
    pub async fn wait_committed(&self, timeout: Duration) -> Vec<Option<i64>> {
        let ends = self.ends().await;
        self.wait_committed_to(&ends, timeout).await
    }

    /// Waits until the group's committed offsets are `offsets` (nothing committed where 0).
    pub async fn wait_committed_to(&self, offsets: &[i64], timeout: Duration) -> Vec<Option<i64>> {
        match group::wait_committed(self.inspector.clone(), &self.topic, offsets, timeout, || {})
            .await
        {
            Ok(committed) => committed,
            Err(err) => panic!("{} {err}\n{}", self.group, self.logs()),
        }
    }

    /// Waits until the service has written at least `rows` history rows.
    pub async fn wait_rows(&self, rows: i64, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let written = self.db.count("history_events").await;
            if written >= rows {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{written} rows, not {rows}, within {timeout:?}:\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// GETs `path` from the service's endpoints: the status and body, `(0, "")` while nothing
    /// answers.
    pub async fn get(&self, path: &str) -> (u16, String) {
        let (port, path) = (self.port(), path.to_owned());
        tokio::task::spawn_blocking(move || probe::get(port, &path).unwrap_or((0, String::new())))
            .await
            .unwrap()
    }

    /// The service's `/metrics`, parsed, once it answers.
    pub async fn metrics(&self) -> Metrics {
        let deadline = Instant::now() + METRICS_TIMEOUT;
        loop {
            match self.get("/metrics").await {
                (200, body) => return Metrics::parse(&body),
                other => assert!(
                    Instant::now() < deadline,
                    "/metrics does not answer: {other:?}\n{}",
                    self.logs()
                ),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Reads `/metrics` until `done` holds for it, within `timeout`; returns that reading.
    pub async fn wait_for_metrics(
        &self,
        timeout: Duration,
        done: impl Fn(&Metrics) -> bool,
    ) -> Metrics {
        let deadline = Instant::now() + timeout;
        loop {
            let metrics = self.metrics().await;
            if done(&metrics) {
                return metrics;
            }
            assert!(
                Instant::now() < deadline,
                "the metrics never got there within {timeout:?}:\n{metrics}\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Polls `path` until `done` holds for its answer, within `timeout`; returns that answer.
    pub async fn wait_for_answer(
        &self,
        path: &str,
        timeout: Duration,
        done: impl Fn(u16, &str) -> bool,
    ) -> (u16, String) {
        let deadline = Instant::now() + timeout;
        loop {
            let (status, body) = self.get(path).await;
            if done(status, &body) {
                return (status, body);
            }
            assert!(
                Instant::now() < deadline,
                "{path} never as expected; last: {status} {body}\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until a line of the service's log contains every one of `parts`; returns it.
    pub async fn wait_for_log(&self, parts: &[&str], timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let logs = self.logs();
            if let Some(line) = logs
                .lines()
                .find(|line| parts.iter().all(|part| line.contains(part)))
            {
                return line.to_owned();
            }
            assert!(
                Instant::now() < deadline,
                "no log line with {parts:?}:\n{logs}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}
