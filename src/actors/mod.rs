//! The actor system (actix): a Kafka supervisor, one partition actor per assigned partition, a
//! pool of DB writers and the OffsetCommitter. `messages` lists what they exchange, and how a
//! record travels from fetch to offset commit.

mod batch;
pub(crate) mod committer;
pub(crate) mod dispatcher;
pub mod messages;
mod parked;
pub mod partition;
pub mod pipeline;
pub(crate) mod supervisor;
pub(crate) mod trace_check;
pub mod window_fill;
pub(crate) mod writer;

pub use pipeline::Pipeline;
