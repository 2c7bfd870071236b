//! Routes admitted records to the DB writers: an event by its `event_id`, so one event is never
//! in two concurrent transactions of this process (no lock waits between our own writers); a
//! dead letter by its offset. Withdrawals (a revoke's) go to every writer.

use std::hash::BuildHasher;

use actix::Recipient;

use super::messages::{Epoch, TopicPartition, Withdraw, Work, WriteJob, WriteJobs};

/// How the committer reaches one writer.
pub struct WriterLink {
    pub jobs: Recipient<WriteJobs>,
    pub withdraw: Recipient<Withdraw>,
}

pub struct Dispatcher {
    writers: Vec<WriterLink>,
    /// Hashes every event's id: foldhash rather than SipHash, a tenth of the cost.
    router: foldhash::fast::RandomState,
}

impl Dispatcher {
    pub fn new(writers: Vec<WriterLink>) -> Self {
        assert!(
            !writers.is_empty(),
            "the pipeline needs at least one writer"
        );
        Dispatcher {
            writers,
            router: Default::default(),
        }
    }

    /// Sends jobs to their writers, one message per writer.
    pub fn dispatch(&self, jobs: impl IntoIterator<Item = WriteJob>) {
        let jobs = jobs.into_iter();
        // Routed by a hash, each writer gets about its share: room for a margin over it, so
        // that the lists are not copied as they grow (a thousand jobs at a time).
        let share = jobs.size_hint().0 / self.writers.len();
        let mut per_writer: Vec<Vec<WriteJob>> = (0..self.writers.len())
            .map(|_| Vec::with_capacity(share + share / 4 + 8))
            .collect();
        for job in jobs {
            let index = match &job.work {
                Work::Event(event) => self.route(&event.event_id),
                Work::DeadLetter(_) => job.offset.unsigned_abs() as usize % self.writers.len(),
            };
            per_writer[index].push(job);
        }
        for (writer, jobs) in self.writers.iter().zip(per_writer) {
            if !jobs.is_empty() {
                writer.jobs.do_send(WriteJobs(jobs));
            }
        }
    }

    /// Asks every writer for the jobs of these assignments it has not started; returns how
    /// many answers to expect.
    pub fn withdraw(&self, id: u64, partitions: &[(TopicPartition, Epoch)]) -> usize {
        for writer in &self.writers {
            writer.withdraw.do_send(Withdraw {
                id,
                partitions: partitions.to_vec(),
            });
        }
        self.writers.len()
    }

    fn route(&self, event_id: &str) -> usize {
        (self.router.hash_one(event_id) % self.writers.len() as u64) as usize
    }
}
