//! Isolating the items a batch fails on: split the failed batch in halves and attempt each,
//! recursively, so every item the server accepts is committed and only the ones it rejects
//! by themselves are left — without any I/O here; the attempt is passed in.
//!
//! Bisecting is only worth it when the failure is about the data (a constraint, a value out of
//! range): then it is deterministic and follows the offending item. For a failure of the
//! database as a whole (an outage, a timeout) every half fails the same way, and splitting
//! would only multiply the attempts; the caller says which errors are which, and bisecting
//! stops at the first error of the other kind.

use std::collections::VecDeque;
use std::future::Future;

/// What isolating came to. Every item is in exactly one of the three.
#[derive(Debug)]
pub(crate) struct Isolation<J, T, E> {
    /// Items of a sub-batch the attempt succeeded on, with their results.
    pub done: Vec<(J, T)>,
    /// Items attempted alone that still failed with an isolatable error: the server rejects
    /// each of them by itself.
    pub rejected: Vec<(J, E)>,
    /// Items not settled because an attempt failed with an error that is not isolatable,
    /// and that error: bisecting stopped there.
    pub failed: Option<(Vec<J>, E)>,
}

/// Bisects `jobs`, whose attempt as one batch failed with `error`. `attempt` runs one
/// sub-batch (all of it or nothing: a transaction) and returns one result per item.
/// Sub-batches are attempted in order, oldest items first, halving breadth first, so a batch
/// of `n` items with one rejected item costs about `2 log2 n` attempts.
pub(crate) async fn isolate<J, T, E, F, Fut>(
    jobs: Vec<J>,
    error: E,
    mut attempt: F,
    isolatable: impl Fn(&E) -> bool,
) -> Isolation<J, T, E>
where
    F: FnMut(&[J]) -> Fut,
    Fut: Future<Output = Result<Vec<T>, E>>,
{
    let mut outcome = Isolation {
        done: Vec::new(),
        rejected: Vec::new(),
        failed: None,
    };
    let mut failing: VecDeque<(Vec<J>, E)> = VecDeque::from([(jobs, error)]);
    while let Some((mut chunk, error)) = failing.pop_front() {
        if outcome.failed.is_some() || !isolatable(&error) {
            stop(&mut outcome, chunk, error);
            continue;
        }
        if chunk.len() <= 1 {
            outcome.rejected.extend(chunk.pop().map(|job| (job, error)));
            continue;
        }
        let right = chunk.split_off(chunk.len() / 2);
        for half in [chunk, right] {
            if outcome.failed.is_some() {
                stop_without_error(&mut outcome, half);
                continue;
            }
            match attempt(&half).await {
                Ok(results) => outcome.done.extend(half.into_iter().zip(results)),
                Err(error) if isolatable(&error) => failing.push_back((half, error)),
                Err(error) => stop(&mut outcome, half, error),
            }
        }
    }
    outcome
}

fn stop<J, T, E>(outcome: &mut Isolation<J, T, E>, jobs: Vec<J>, error: E) {
    match &mut outcome.failed {
        Some((failed, _)) => failed.extend(jobs),
        None => outcome.failed = Some((jobs, error)),
    }
}

fn stop_without_error<J, T, E>(outcome: &mut Isolation<J, T, E>, jobs: Vec<J>) {
    if let Some((failed, _)) = &mut outcome.failed {
        failed.extend(jobs);
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::collections::BTreeSet;

    use futures::executor::block_on;
    use proptest::prelude::*;

    use super::*;

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Failure {
        /// The server rejects this item.
        Data(u32),
        /// The database is unreachable.
        Outage,
    }

    fn is_data(error: &Failure) -> bool {
        matches!(error, Failure::Data(_))
    }

    /// A database that rejects any batch holding a poison item, and goes down after
    /// `outage_after` attempts.
    struct Database {
        poison: BTreeSet<u32>,
        outage_after: Option<usize>,
        attempts: Cell<usize>,
    }

    impl Database {
        fn attempt(&self, jobs: &[u32]) -> Result<Vec<u32>, Failure> {
            self.attempts.set(self.attempts.get() + 1);
            if self.outage_after.is_some_and(|n| self.attempts.get() > n) {
                return Err(Failure::Outage);
            }
            match jobs.iter().find(|job| self.poison.contains(job)) {
                Some(&job) => Err(Failure::Data(job)),
                None => Ok(jobs.iter().map(|job| job * 10).collect()),
            }
        }

        fn run(&self, jobs: Vec<u32>) -> Isolation<u32, u32, Failure> {
            let error = self.attempt(&jobs).expect_err("the whole batch fails");
            block_on(isolate(
                jobs,
                error,
                |chunk: &[u32]| std::future::ready(self.attempt(chunk)),
                is_data,
            ))
        }
    }

    fn database(poison: &[u32], outage_after: Option<usize>) -> Database {
        Database {
            poison: poison.iter().copied().collect(),
            outage_after,
            attempts: Cell::new(0),
        }
    }

    #[test]
    fn one_rejected_item_is_left_alone_and_the_rest_is_done() {
        let db = database(&[37], None);
        let outcome = db.run((0..100).collect());
        assert_eq!(outcome.rejected, vec![(37, Failure::Data(37))]);
        assert!(outcome.failed.is_none());
        let done: Vec<u32> = outcome.done.iter().map(|(job, _)| *job).collect();
        assert_eq!(done.len(), 99);
        assert!(outcome.done.iter().all(|(job, result)| *result == job * 10));
        assert!(!done.contains(&37));
        // The whole batch, then two halves per level down to the single item.
        assert!(db.attempts.get() <= 1 + 2 * 7, "{}", db.attempts.get());
    }

    #[test]
    fn a_single_item_batch_is_rejected_without_another_attempt() {
        let db = database(&[5], None);
        let outcome = db.run(vec![5]);
        assert_eq!(outcome.rejected, vec![(5, Failure::Data(5))]);
        assert!(outcome.done.is_empty());
        assert_eq!(db.attempts.get(), 1);
    }

    #[test]
    fn an_outage_while_bisecting_stops_and_leaves_everything_unsettled_unsettled() {
        let db = database(&[3], Some(2));
        let outcome = db.run((0..8).collect());
        let (failed, error) = outcome.failed.expect("stopped by the outage");
        assert_eq!(error, Failure::Outage);
        assert!(outcome.rejected.is_empty());
        let mut all: Vec<u32> = outcome.done.iter().map(|(job, _)| *job).collect();
        all.extend(&failed);
        all.sort();
        assert_eq!(all, (0..8).collect::<Vec<_>>());
        // No attempt after the outage was seen.
        assert_eq!(db.attempts.get(), 3);
    }

    #[test]
    fn an_error_that_is_not_isolatable_is_not_bisected() {
        let db = database(&[], Some(0));
        let outcome = db.run((0..8).collect());
        assert_eq!(outcome.failed.map(|(jobs, _)| jobs.len()), Some(8));
        assert_eq!(db.attempts.get(), 1);
    }

    proptest! {
        #[test]
        fn every_item_is_settled_once_and_exactly_the_poison_is_rejected(
            n in 1u32..200,
            poison in prop::collection::btree_set(0u32..200, 1..6),
            outage_after in prop::option::weighted(0.3, 0usize..40),
        ) {
            let poison: Vec<u32> = poison.into_iter().filter(|p| *p < n).collect();
            prop_assume!(!poison.is_empty());
            let db = database(&poison, outage_after.map(|k| k + 1));
            let outcome = db.run((0..n).collect());

            let done: BTreeSet<u32> = outcome.done.iter().map(|(job, _)| *job).collect();
            let rejected: BTreeSet<u32> = outcome.rejected.iter().map(|(job, _)| *job).collect();
            let failed: BTreeSet<u32> = outcome
                .failed
                .as_ref()
                .map(|(jobs, _)| jobs.iter().copied().collect())
                .unwrap_or_default();
            prop_assert_eq!(done.len() + rejected.len() + failed.len(), n as usize);
            prop_assert_eq!(
                done.iter().chain(&rejected).chain(&failed).copied().collect::<BTreeSet<_>>(),
                (0..n).collect::<BTreeSet<_>>()
            );
            prop_assert!(done.iter().all(|job| !poison.contains(job)));
            prop_assert!(rejected.iter().all(|job| poison.contains(job)));
            for (job, error) in &outcome.rejected {
                prop_assert_eq!(*error, Failure::Data(*job));
            }
            if outcome.failed.is_none() {
                prop_assert_eq!(rejected, poison.iter().copied().collect::<BTreeSet<_>>());
            }
        }
    }
}
