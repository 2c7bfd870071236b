//! Partitions whose committed position is past what the database holds (a database restored
//! from a backup, or emptied, while the group's offsets stayed): kept by the check made at each
//! assignment, read by `/readyz`.

use std::collections::BTreeMap;
use std::sync::Mutex;

use crate::domain::TopicPartition;

/// What the check found, per partition, as the sentence `/readyz` gives.
#[derive(Default)]
pub struct DatabaseBehind {
    partitions: Mutex<BTreeMap<(String, i32), String>>,
}

impl DatabaseBehind {
    /// `tp` lacks traces of resolved records: `finding` says which and what to do.
    pub fn found(&self, tp: &TopicPartition, finding: String) {
        self.partitions
            .lock()
            .unwrap()
            .insert((tp.topic.to_string(), tp.partition), finding);
    }

    /// `tp` was checked and found whole, or is no longer assigned here.
    pub fn clear(&self, tp: &TopicPartition) {
        self.partitions
            .lock()
            .unwrap()
            .remove(&(tp.topic.to_string(), tp.partition));
    }

    /// The findings, in partition order.
    pub fn findings(&self) -> Vec<String> {
        self.partitions.lock().unwrap().values().cloned().collect()
    }
}
