//! What the benchmark found: the human report and the machine-readable RESULT line.

use std::time::Duration;

use super::BenchOptions;

/// One throughput measurement.
#[derive(Debug, Clone, Copy, Default)]
pub struct Rate {
    pub events: usize,
    pub elapsed: Duration,
}

impl Rate {
    pub fn per_second(&self) -> f64 {
        self.events as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

#[derive(Debug, Clone, Default)]
pub struct Latency {
    pub samples: usize,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

#[derive(Debug, Clone)]
pub struct BenchReport {
    pub options: BenchOptions,
    pub distinct_events: usize,
    pub service: Rate,
    pub ceiling: Rate,
    pub server_ceiling: Rate,
    /// CPU of PostgreSQL's backends serving the service during the drain.
    pub service_pg_cpu: PgCpu,
    /// CPU of the service process during the drain.
    pub service_cpu: Duration,
    /// What a bare consumer of the same records pays per event ([`super::floor`]).
    pub floors: super::Floors,
    /// CPU of PostgreSQL's backends serving the (client-side) ceiling.
    pub ceiling_pg_cpu: PgCpu,
    /// CPU of PostgreSQL's backends running the server ceiling.
    pub server_pg_cpu: PgCpu,
    pub naive: Rate,
    pub peak_rss_mb: f64,
    pub transactions: Transactions,
    pub latency: Latency,
    /// The service's database holds every distinct event once, consistently.
    pub verified: bool,
}

impl BenchReport {
    pub fn render(&self) -> String {
        let o = &self.options;
        let mut out = format!(
            "history-dev bench: {} records ({:.0}% duplicates, {} distinct events), {} partitions, {} writers, batches of {}\n",
            o.events,
            o.duplicates * 100.0,
            self.distinct_events,
            o.partitions,
            o.writers,
            o.batch
        );
        out.push_str("  phase      records   seconds    events/s\n");
        for (name, rate, note) in [
            (
                "service",
                self.service,
                "first fetch to final offset commit",
            ),
            (
                "ceiling",
                self.ceiling,
                "batched statement alone, no Kafka, no actors",
            ),
            (
                "server",
                self.server_ceiling,
                "set-based insert, keys generated in the database",
            ),
            (
                "naive",
                self.naive,
                "one transaction and one offset commit per event",
            ),
        ] {
            out.push_str(&format!(
                "  {name:<8} {:>9} {:>9.2} {:>11.0}   ({note})\n",
                rate.events,
                rate.elapsed.as_secs_f64(),
                rate.per_second()
            ));
        }
        out.push_str(&format!(
            "  service peak RSS {:.1} MB; database verified: {}\n",
            self.peak_rss_mb,
            if self.verified { "yes" } else { "NO" }
        ));
        out.push_str(&format!(
            "  CPU per event: the service {:.1} us while it drains; PostgreSQL {:.1} us while the \
             service drains, {:.1} us in the ceiling, {:.1} us in the server ceiling (of which \
             autovacuum {:.1}, {:.1}, {:.1} us)\n",
            self.service_us_per_event(),
            self.pg_us_per_event(),
            per_event_us(self.ceiling_pg_cpu.total, self.ceiling.events),
            self.server_pg_us_per_event(),
            per_event_us(self.service_pg_cpu.autovacuum, self.service.events),
            per_event_us(self.ceiling_pg_cpu.autovacuum, self.ceiling.events),
            per_event_us(self.server_pg_cpu.autovacuum, self.server_ceiling.events),
        ));
        out.push_str(&format!(
            "  CPU per event of a bare poll loop on the same records: {:.2} us consumed and \
             copied, {:.2} us consumed, copied and decoded (the service's floor)\n",
            self.floors.consume_us, self.floors.decode_us
        ));
        out.push_str(&format!(
            "  service transactions: {}, {:.1} ms and {:.0} events each on average\n",
            self.transactions.count, self.transactions.mean_ms, self.transactions.mean_events
        ));
        out.push_str(&format!(
            "  latency (produce -> row committed) at {}/s for {} s: {} samples, p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms\n",
            o.latency_rate,
            o.latency_seconds,
            self.latency.samples,
            self.latency.p50_ms,
            self.latency.p99_ms,
            self.latency.max_ms
        ));
        out.push_str(&self.result_line());
        out.push('\n');
        out
    }

    fn pg_us_per_event(&self) -> f64 {
        per_event_us(self.service_pg_cpu.total, self.service.events)
    }

    fn service_us_per_event(&self) -> f64 {
        per_event_us(self.service_cpu, self.service.events)
    }

    fn server_pg_us_per_event(&self) -> f64 {
        per_event_us(self.server_pg_cpu.total, self.server_ceiling.events)
    }

    /// The machine-readable summary, the last line of the output.
    pub fn result_line(&self) -> String {
        let (service, ceiling, naive, server) = (
            self.service.per_second(),
            self.ceiling.per_second(),
            self.naive.per_second(),
            self.server_ceiling.per_second(),
        );
        format!(
            "RESULT events={} service_eps={:.0} ceiling_eps={:.0} naive_eps={:.0} ceiling_ratio={:.2} naive_ratio={:.1} peak_rss_mb={:.1} p99_ms={:.1} \
             server_ceiling_eps={:.0} server_ratio={:.2} pg_us_per_event={:.1} service_us_per_event={:.1} server_pg_us_per_event={:.1} \
             consume_us_per_event={:.2} decode_us_per_event={:.2}",
            self.options.events,
            service,
            ceiling,
            naive,
            service / ceiling.max(1e-9),
            service / naive.max(1e-9),
            self.peak_rss_mb,
            self.latency.p99_ms,
            server,
            service / server.max(1e-9),
            self.pg_us_per_event(),
            self.service_us_per_event(),
            self.server_pg_us_per_event(),
            self.floors.consume_us,
            self.floors.decode_us
        )
    }
}

/// PostgreSQL's CPU in a phase: every backend of the phase's database, and the part of it spent
/// by autovacuum workers (the tables grow by a million rows in a large run).
#[derive(Debug, Clone, Copy, Default)]
pub struct PgCpu {
    pub total: Duration,
    pub autovacuum: Duration,
}

pub(super) fn per_event_us(cpu: Duration, events: usize) -> f64 {
    cpu.as_secs_f64() * 1e6 / events.max(1) as f64
}

/// What the service's writers did during the drain.
#[derive(Debug, Clone, Copy, Default)]
pub struct Transactions {
    pub count: u64,
    pub mean_ms: f64,
    pub mean_events: f64,
}
