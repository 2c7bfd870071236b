//! A thread of its own for the periodic offset commits. librdkafka reports nothing back for a
//! manual asynchronous commit, and a synchronous one can wait long on a slow coordinator, so the
//! supervisor hands commits to this thread instead of blocking its fetch loop. The broker's
//! verdict goes back to the OffsetCommitter: only confirmed positions count as committed.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::mpsc::{self, Receiver, Sender};
use std::thread::JoinHandle;

use actix::Recipient;
use rdkafka::consumer::Consumer;

use super::HistoryConsumer;
use super::messages::CommitResult;
use crate::domain::{CommitPosition, CommitReason, TopicPartition};

struct CommitJob {
    positions: Vec<CommitPosition>,
    reason: CommitReason,
}

pub(crate) struct CommitWorker {
    sender: Option<Sender<CommitJob>>,
    thread: Option<JoinHandle<()>>,
}

impl CommitWorker {
    pub(crate) fn start(consumer: Arc<HistoryConsumer>, results: Recipient<CommitResult>) -> Self {
        let (sender, receiver) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("history-commits".into())
            .spawn(move || run(consumer, results, receiver))
            .expect("cannot start the commit thread");
        CommitWorker {
            sender: Some(sender),
            thread: Some(thread),
        }
    }

    /// Queues a commit; its outcome goes to the results recipient.
    pub(crate) fn commit(&self, positions: Vec<CommitPosition>, reason: CommitReason) {
        if let Some(sender) = &self.sender {
            let _ = sender.send(CommitJob { positions, reason });
        }
    }

    /// Lets queued commits finish, then ends the thread (releasing its consumer handle).
    pub(crate) fn stop(&mut self) {
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

fn run(
    consumer: Arc<HistoryConsumer>,
    results: Recipient<CommitResult>,
    jobs: Receiver<CommitJob>,
) {
    while let Ok(first) = jobs.recv() {
        // Whatever queued up meanwhile is merged: only the newest position per partition counts
        // (of two at one offset, the later: its list of done offsets is the longer).
        let mut batch = vec![first];
        batch.extend(jobs.try_iter());
        let reason = batch
            .iter()
            .map(|job| job.reason)
            .find(|&reason| reason != CommitReason::Periodic)
            .unwrap_or(CommitReason::Periodic);
        let mut newest: HashMap<TopicPartition, CommitPosition> = HashMap::new();
        for position in batch.into_iter().flat_map(|job| job.positions) {
            match newest.get(&position.tp) {
                Some(known) if (known.epoch, known.offset) > (position.epoch, position.offset) => {}
                _ => {
                    newest.insert(position.tp.clone(), position);
                }
            }
        }
        let mut positions: Vec<CommitPosition> = newest.into_values().collect();
        positions.sort_by(|a, b| a.tp.cmp(&b.tp));
        let deadline = std::time::Instant::now() + consumer.context().commit_timeout();
        let (outcome, _) = consumer
            .context()
            .commit(&*consumer, &positions, reason, deadline);
        results.do_send(CommitResult(outcome));
    }
}
