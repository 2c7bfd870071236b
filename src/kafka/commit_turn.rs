//! One commit of the process with librdkafka at a time.
//!
//! librdkafka does not always send commits in the order they were queued: while the group's
//! coordinator is unavailable, or after a commit was answered NOT_COORDINATOR or lost with its
//! connection, it holds the commit (`rd_kafka_cgrp_defer_offset_commit`, the cgrp's
//! `wait_coord_q`), and when the coordinator is back it sends it behind whatever was queued
//! meanwhile. An older, lower commit then lands after a newer one and moves the group's
//! position back. So a commit is queued only once the one before it has its verdict: the turn
//! is held while a commit waits for the broker, and a commit whose verdict did not come by its
//! deadline stays here, outstanding, until it does — every later commit first waits for that
//! verdict (within its own deadline) and is not sent while it is missing. The price is that a
//! coordinator that holds one commit holds all the later ones too; none of them could have
//! landed safely anyway.

use std::time::Instant;

use parking_lot::{Mutex, MutexGuard};

use super::bounded_commit::QueuedCommit;
use crate::domain::{CommitPosition, CommitReason};

/// A commit librdkafka has, whose verdict did not come by its deadline.
pub(crate) struct Outstanding {
    pub commit: QueuedCommit,
    pub positions: Vec<CommitPosition>,
    pub reason: CommitReason,
    pub queued_at: chrono::DateTime<chrono::Utc>,
    pub since: Instant,
}

/// The right to hand a commit to librdkafka; see the module documentation.
#[derive(Default)]
pub(crate) struct CommitTurn {
    outstanding: Mutex<Option<Outstanding>>,
}

/// The turn, held: the commit outstanding, if any, is the holder's to wait for.
pub(crate) type Turn<'a> = MutexGuard<'a, Option<Outstanding>>;

impl CommitTurn {
    /// The turn, once every other commit of the process stopped waiting for the broker; `None`
    /// if one still waits at `deadline`.
    pub(crate) fn take(&self, deadline: Instant) -> Option<Turn<'_>> {
        self.outstanding.try_lock_until(deadline)
    }

    /// Forgets the commit outstanding, if any: its verdict is no longer read. For the close,
    /// before the client goes (the commit's queue must not outlive it); the close itself waits
    /// for what librdkafka still sends.
    pub(crate) fn release(&self) -> Option<Outstanding> {
        self.outstanding.lock().take()
    }
}

impl std::fmt::Debug for CommitTurn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let outstanding = self.outstanding.try_lock().map(|held| held.is_some());
        f.debug_struct("CommitTurn")
            .field("outstanding", &outstanding)
            .finish()
    }
}
