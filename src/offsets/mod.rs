//! Offset bookkeeping: which offsets of a partition are in flight, how far it is safe to
//! commit, and which positions of which assignments are still to be sent. Pure data
//! structures; the OffsetCommitter actor owns one window per partition, the Kafka side the
//! ledger.

pub(crate) mod done;
pub(crate) mod ledger;
pub(crate) mod reset;
mod window;

pub use done::{DoneOffsets, Encoded, Run, Unreadable};
pub use ledger::{CommitLedger, CommitPlan};
pub use window::{Generation, OffsetWindow, Rewind, TrackResult, UntrackedOffset};

#[cfg(test)]
mod done_props;
#[cfg(test)]
mod window_props;
