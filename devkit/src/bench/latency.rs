//! The latency phase: produce → row committed at a fixed offered load below saturation,
//! observed through a NOTIFY trigger on a database of its own.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};

use super::child::ServiceChild;
use super::report::Latency;
use super::{BenchOptions, LATENCY_TOPIC};
use crate::DevError;
use crate::workload;
use history_service::config::Settings;
use history_service::store::{Database, migrate};

pub(super) async fn measure_latency(
    settings: &Settings,
    options: &BenchOptions,
    brokers: &str,
    database: &tokio_postgres::Config,
    run_id: &str,
) -> Result<Latency, DevError> {
    let db = Database::plain(database.clone());
    let mut client = db.connect().await?;
    migrate::run_migrations(&mut client).await?;
    // The benchmark's probe, not part of the product's schema: every committed history row
    // notifies its event_id.
    client
        .batch_execute(
            "CREATE FUNCTION bench_notify() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN PERFORM pg_notify('history_bench', NEW.event_id); RETURN NULL; END $$;
             CREATE TRIGGER bench_notify AFTER INSERT ON history_events
             FOR EACH ROW EXECUTE FUNCTION bench_notify();",
        )
        .await
        .map_err(history_service::store::StoreError::from)?;
    let committed: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let listener = listen(database, committed.clone()).await?;

    let group = format!("bench-latency-{run_id}");
    let mut child =
        ServiceChild::spawn(settings, options, brokers, database, &group, LATENCY_TOPIC)?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.seen("partitions assigned").is_none() {
        if child.exited() || Instant::now() > deadline {
            let tail = child.log_tail();
            child.stop();
            return Err(DevError::Bench(format!(
                "the service did not join:\n{tail}"
            )));
        }
        actix_rt::time::sleep(Duration::from_millis(20)).await;
    }

    let total = options.latency_rate as usize * options.latency_seconds as usize;
    let sent = {
        let (brokers, rate, run_id) = (brokers.to_owned(), options.latency_rate, run_id.to_owned());
        tokio::task::spawn_blocking(move || produce_paced(&brokers, &run_id, total, rate))
            .await
            .expect("latency producer")?
    };
    let wait_until = Instant::now() + Duration::from_secs(30);
    while committed.lock().unwrap().len() < total && Instant::now() < wait_until {
        actix_rt::time::sleep(Duration::from_millis(50)).await;
    }
    child.stop();
    listener.abort();

    let committed = committed.lock().unwrap();
    // The first second warms up connections and caches; it is not the steady state.
    let warm_up = options.latency_rate as usize;
    let mut latencies: Vec<f64> = sent
        .iter()
        .skip(warm_up.min(sent.len() / 2))
        .filter_map(|(id, at)| {
            committed
                .get(id)
                .map(|done| (*done - *at).as_secs_f64() * 1e3)
        })
        .collect();
    if latencies.is_empty() {
        return Err(DevError::Bench("no latency sample arrived".into()));
    }
    latencies.sort_by(|a, b| a.total_cmp(b));
    let at = |q: f64| latencies[((latencies.len() - 1) as f64 * q).round() as usize];
    Ok(Latency {
        samples: latencies.len(),
        p50_ms: at(0.50),
        p99_ms: at(0.99),
        max_ms: *latencies.last().unwrap(),
    })
}

/// LISTENs for the probe's notifications, recording when each event's row was committed.
async fn listen(
    database: &tokio_postgres::Config,
    committed: Arc<Mutex<HashMap<String, Instant>>>,
) -> Result<tokio::task::JoinHandle<()>, DevError> {
    let (client, mut connection) = database
        .connect(tokio_postgres::NoTls)
        .await
        .map_err(history_service::store::StoreError::from)?;
    let handle = tokio::spawn(async move {
        let client = client;
        let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
        let listening = client.batch_execute("LISTEN history_bench");
        futures::pin_mut!(listening);
        let mut listening = Some(listening);
        loop {
            if let Some(pending) = listening.as_mut() {
                tokio::select! {
                    _ = pending => listening = None,
                    message = futures::StreamExt::next(&mut messages) => {
                        if !record(message, &committed) { return; }
                    }
                }
            } else {
                let message = futures::StreamExt::next(&mut messages).await;
                if !record(message, &committed) {
                    return;
                }
            }
        }
    });
    // Give LISTEN a moment to be registered before anything is produced.
    actix_rt::time::sleep(Duration::from_millis(200)).await;
    Ok(handle)
}

fn record(
    message: Option<Result<tokio_postgres::AsyncMessage, tokio_postgres::Error>>,
    committed: &Mutex<HashMap<String, Instant>>,
) -> bool {
    match message {
        Some(Ok(tokio_postgres::AsyncMessage::Notification(note))) => {
            committed
                .lock()
                .unwrap()
                .insert(note.payload().to_owned(), Instant::now());
            true
        }
        Some(Ok(_)) => true,
        _ => false,
    }
}

/// Produces `total` events at `rate` per second; returns each event's id and send time.
fn produce_paced(
    brokers: &str,
    run_id: &str,
    total: usize,
    rate: u32,
) -> Result<Vec<(String, Instant)>, DevError> {
    let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("linger.ms", "1")
        .create()?;
    let started = Instant::now();
    let mut sent = Vec::with_capacity(total);
    for n in 0..total {
        let due = started + Duration::from_secs_f64(n as f64 / f64::from(rate));
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        let event_id = format!("latency-{run_id}-{n}");
        let ticket = format!("ticket-{}", n % 1000);
        let payload =
            workload::event_payload(&event_id, &ticket, "open", "closed", chrono::Utc::now());
        let record = BaseRecord::<[u8], [u8]>::to(LATENCY_TOPIC)
            .key(ticket.as_bytes())
            .payload(&payload);
        let at = Instant::now();
        producer
            .send(record)
            .map_err(|(err, _)| DevError::Kafka(err))?;
        sent.push((event_id, at));
    }
    producer.flush(Duration::from_secs(30))?;
    Ok(sent)
}
