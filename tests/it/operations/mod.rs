//! Running it in production, one scenario per test: poison records, the dead-letter table and
//! topic and the operator's commands ([`dead_letters`]); metrics and readiness across a database
//! outage ([`observability`]); Kafka security settings, secrets and TLS ([`security`]).

mod dead_letters;
mod observability;
mod security;

use history_devkit::workload::WorkloadSpec;

/// The operations scenarios' workload: 10% duplicates over three partitions.
pub(super) fn spec(records: usize, poison: f64, prefix: &str, seed: u64) -> WorkloadSpec {
    WorkloadSpec {
        records,
        duplicates: 0.1,
        poison,
        partitions: 3,
        id_prefix: prefix.into(),
        tickets: 40,
        max_payload_bytes: 65536,
        seed,
    }
}
