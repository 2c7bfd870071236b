//! Integration tests against a real PostgreSQL (and, for the pipeline, a real Kafka-protocol
//! broker). One binary, so it links once. Every test creates and drops its own database.

mod common;
mod mock_kafka;

mod authentication;
mod bad_day;
mod bench;
mod cli;
mod codecs;
mod commit_guards;
mod db_faults;
mod dead_letter_topic;
mod end_to_end;
mod fairness;
mod flow_control;
mod group_protocols;
mod handover;
mod image;
mod kafka_errors;
mod layers;
mod leaders_move;
mod migrations;
mod offset_reset;
mod operations;
mod operators_kit;
mod pacing;
mod pipeline;
mod redelivery;
mod repository;
mod restored_database;
mod revoke_stall;
mod rework;
mod set_aside;
mod slow_broker;
mod socket_activation;
mod stops;
mod store_semantics;
mod stuck_events;
mod transaction_markers;
