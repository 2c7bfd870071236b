//! The producer: the planned records at a steady rate, noting where each landed.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use history_devkit::workload::{self, PlannedRecord};
use rdkafka::producer::{Producer, ThreadedProducer};

use crate::schedule::TOPIC;

/// Where the produced records landed, as the producer learns it.
#[derive(Default)]
pub struct Deliveries {
    pub by_index: Vec<Option<(i32, i64)>>,
    pub by_place: HashMap<(i32, i64), usize>,
    pub failed: usize,
}

/// Produces the records one at a time at a steady rate over `over`, noting where each landed.
pub fn spawn_producer(
    brokers: String,
    records: Vec<PlannedRecord>,
    delivered: Arc<Mutex<Deliveries>>,
    over: Duration,
    done: Arc<AtomicBool>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let producer: ThreadedProducer<Recorder> = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", &brokers)
            .set("enable.idempotence", "true")
            .set("linger.ms", "5")
            .set("message.timeout.ms", "300000")
            .create_with_context(Recorder(delivered))
            .expect("producer");
        // One record at a time at a steady rate: the writers stay busy for the whole run.
        let started = Instant::now();
        let pace = over.as_secs_f64() / records.len().max(1) as f64;
        for (index, planned) in records.iter().enumerate() {
            let due = started + Duration::from_secs_f64(pace * index as f64);
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
            workload::send(&producer, TOPIC, planned, index).expect("send");
        }
        producer
            .flush(Duration::from_secs(300))
            .expect("every record delivered");
        let failed = producer.context().0.lock().unwrap().failed;
        assert_eq!(failed, 0, "records the producer could not deliver");
        done.store(true, Ordering::Relaxed);
    })
}

/// Notes where each record landed, as delivery reports arrive.
struct Recorder(Arc<Mutex<Deliveries>>);

impl rdkafka::ClientContext for Recorder {}

impl rdkafka::producer::ProducerContext for Recorder {
    type DeliveryOpaque = Box<usize>;

    fn delivery(&self, result: &rdkafka::producer::DeliveryResult<'_>, index: Box<usize>) {
        use rdkafka::Message;
        let mut deliveries = self.0.lock().unwrap();
        match result {
            Ok(message) => {
                let place = (message.partition(), message.offset());
                deliveries.by_index[*index] = Some(place);
                deliveries.by_place.insert(place, *index);
            }
            Err(_) => deliveries.failed += 1,
        }
    }
}
