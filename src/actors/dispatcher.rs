//! Routes admitted records to the DB writers: an event by its `event_id`, so one event is never
//! in two concurrent transactions of this process (no lock waits between our own writers); a
//! dead letter by its offset.

use std::hash::BuildHasher;

use actix::Recipient;

use super::messages::{Work, WriteJob, WriteJobs};

pub struct Dispatcher {
    writers: Vec<Recipient<WriteJobs>>,
    router: std::collections::hash_map::RandomState,
}

impl Dispatcher {
    pub fn new(writers: Vec<Recipient<WriteJobs>>) -> Self {
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
        let mut per_writer: Vec<Vec<WriteJob>> = vec![Vec::new(); self.writers.len()];
        for job in jobs {
            let index = match &job.work {
                Work::Event(event) => self.route(&event.event_id),
                Work::DeadLetter(_) => job.offset.unsigned_abs() as usize % self.writers.len(),
            };
            per_writer[index].push(job);
        }
        for (writer, jobs) in self.writers.iter().zip(per_writer) {
            if !jobs.is_empty() {
                writer.do_send(WriteJobs(jobs));
            }
        }
    }

    fn route(&self, event_id: &str) -> usize {
        (self.router.hash_one(event_id) % self.writers.len() as u64) as usize
    }
}
