//! The actor system (actix): a Kafka supervisor, one partition actor per assigned partition, a
//! pool of DB writers and the OffsetCommitter. `messages` lists what they exchange, and how a
//! record travels from fetch to offset commit.

mod batch;
pub mod committer;
pub mod dispatcher;
pub mod inflow;
pub mod messages;
mod parked;
pub mod partition;
pub mod pipeline;
pub mod supervisor;
pub mod trace_check;
pub mod writer;

pub use pipeline::Pipeline;
