//! Integration tests against a real PostgreSQL (and, for the pipeline, a real Kafka-protocol
//! broker). One binary, so it links once. Every test creates and drops its own database.

mod common;
mod mock_kafka;

mod bench;
mod cli;
mod end_to_end;
mod migrations;
mod operations;
mod operators_kit;
mod pipeline;
mod repository;
