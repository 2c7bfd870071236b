//! Integration tests against a real PostgreSQL (and, for the pipeline, a real Kafka-protocol
//! broker). One binary, so it links once. Every test creates and drops its own database.

mod common;

mod cli;
mod migrations;
mod repository;
