//! Running it in production, one scenario per test: poison records, the dead-letter table and
//! topic and the operator's commands ([`dead_letters`]); metrics and readiness across a database
//! outage ([`observability`]); Kafka security settings, secrets and TLS ([`security`]).

mod dead_letters;
mod observability;
mod security;
