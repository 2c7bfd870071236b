//! Offset bookkeeping: which offsets of a partition are in flight, and how far it is safe to
//! commit. Pure data structures; the OffsetCommitter actor owns one window per partition.

pub mod reset;
mod window;

pub use window::{OffsetWindow, TrackResult, UntrackedOffset};

#[cfg(test)]
mod window_props;
