//! A thread of its own for the periodic offset commits. librdkafka reports nothing back for a
//! manual asynchronous commit, and a synchronous one can wait long on a slow coordinator, so the
//! supervisor hands commits to this thread instead of blocking its fetch loop. One commit runs
//! at a time, in order, so the group's position never goes backwards by our doing.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::mpsc::{self, Receiver, Sender, SyncSender};
use std::thread::JoinHandle;
use std::time::Duration;

use rdkafka::consumer::Consumer;
use tracing::warn;

use super::HistoryConsumer;
use super::context::commit_sync;
use crate::actors::messages::{CommitPosition, TopicPartition};
use crate::metrics::Stats;

struct CommitJob {
    positions: Vec<CommitPosition>,
    reason: &'static str,
    done: Option<SyncSender<()>>,
}

pub struct CommitWorker {
    sender: Option<Sender<CommitJob>>,
    thread: Option<JoinHandle<()>>,
}

impl CommitWorker {
    pub fn start(consumer: Arc<HistoryConsumer>, stats: Arc<Stats>) -> Self {
        let (sender, receiver) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("history-commits".into())
            .spawn(move || run(consumer, stats, receiver))
            .expect("cannot start the commit thread");
        CommitWorker {
            sender: Some(sender),
            thread: Some(thread),
        }
    }

    /// Queues a commit.
    pub fn commit(&self, positions: Vec<CommitPosition>, reason: &'static str) {
        if let Some(sender) = &self.sender {
            let _ = sender.send(CommitJob {
                positions,
                reason,
                done: None,
            });
        }
    }

    /// Queues a commit and waits until it (and everything queued before it) is done.
    pub fn commit_and_wait(
        &self,
        positions: Vec<CommitPosition>,
        reason: &'static str,
        timeout: Duration,
    ) {
        let Some(sender) = &self.sender else {
            return;
        };
        let (done, finished) = mpsc::sync_channel(1);
        let job = CommitJob {
            positions,
            reason,
            done: Some(done),
        };
        if sender.send(job).is_ok() && finished.recv_timeout(timeout).is_err() {
            warn!(
                timeout_ms = timeout.as_millis() as u64,
                "commit did not finish in time"
            );
        }
    }

    /// Lets queued commits finish, then ends the thread (releasing its consumer handle).
    pub fn stop(&mut self) {
        self.sender.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for CommitWorker {
    fn drop(&mut self) {
        self.stop();
    }
}

fn run(consumer: Arc<HistoryConsumer>, stats: Arc<Stats>, jobs: Receiver<CommitJob>) {
    while let Ok(first) = jobs.recv() {
        // Whatever queued up meanwhile is merged: only the newest position per partition counts.
        let mut batch = vec![first];
        batch.extend(jobs.try_iter());
        let reason = batch
            .iter()
            .map(|job| job.reason)
            .find(|&reason| reason != "periodic")
            .unwrap_or("periodic");
        let mut newest: HashMap<TopicPartition, CommitPosition> = HashMap::new();
        for job in &batch {
            for position in &job.positions {
                newest.insert(position.tp.clone(), position.clone());
            }
        }
        // A partition revoked since the request was made is its next owner's to commit.
        let context = consumer.context();
        let mut positions: Vec<CommitPosition> = newest
            .into_values()
            .filter(|position| context.epoch_of(&position.tp) == Some(position.epoch))
            .collect();
        positions.sort_by(|a, b| a.tp.cmp(&b.tp));
        if !positions.is_empty() {
            commit_sync(&*consumer, &positions, &stats, reason);
        }
        for job in batch {
            if let Some(done) = job.done {
                let _ = done.send(());
            }
        }
    }
}
