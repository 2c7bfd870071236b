//! CPU time of processes, read from `/proc/<pid>/stat`: what the benchmark charges to the
//! service and to PostgreSQL's backends (Linux only; elsewhere, or for a server on another
//! host, nothing is read and the figures are zero).

use std::collections::HashMap;
use std::time::Duration;

/// `utime + stime` of a process, in clock ticks, from the text of its `/proc/<pid>/stat`
/// (every thread of the process is included).
pub fn parse_stat_ticks(stat: &str) -> Option<u64> {
    // The command name (field 2) is in parentheses and may itself hold spaces and ')', so the
    // fields are counted from the last ')': state is field 3, utime 14, stime 15.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let utime: u64 = fields.nth(14 - 3)?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

/// Clock ticks as time, at `per_second` ticks a second.
pub fn ticks_to_duration(ticks: u64, per_second: u64) -> Duration {
    Duration::from_micros(ticks.saturating_mul(1_000_000) / per_second.max(1))
}

/// The kernel's clock ticks per second (`sysconf(_SC_CLK_TCK)`), the unit of `/proc/*/stat`.
pub fn ticks_per_second() -> u64 {
    // SAFETY: sysconf only reads a configuration value.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 { ticks as u64 } else { 100 }
}

/// `utime + stime` of a running process, in clock ticks; `None` if it cannot be read.
pub fn process_ticks(pid: u32) -> Option<u64> {
    parse_stat_ticks(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// The CPU a changing set of processes spends from a start on: a process already running at
/// the start counts from its time then, one that appears later counts whole (PostgreSQL starts
/// a backend per connection, and a pool connects lazily).
#[derive(Debug, Default, Clone)]
pub struct CpuTally {
    baseline: HashMap<u32, u64>,
    latest: HashMap<u32, u64>,
}

impl CpuTally {
    /// Starts counting, with these processes' ticks now as their baseline.
    pub fn start(readings: impl IntoIterator<Item = (u32, u64)>) -> Self {
        let baseline: HashMap<u32, u64> = readings.into_iter().collect();
        CpuTally {
            latest: baseline.clone(),
            baseline,
        }
    }

    /// Records the latest ticks of processes; one not seen before counts from zero.
    pub fn record(&mut self, readings: impl IntoIterator<Item = (u32, u64)>) {
        for (pid, ticks) in readings {
            self.baseline.entry(pid).or_insert(0);
            self.latest.insert(pid, ticks);
        }
    }

    /// Ticks spent since the start, over every process seen (its last reading counts for one
    /// that has exited since).
    pub fn ticks(&self) -> u64 {
        self.latest
            .iter()
            .map(|(pid, &ticks)| ticks.saturating_sub(self.baseline.get(pid).copied().unwrap_or(0)))
            .sum()
    }

    pub fn spent(&self) -> Duration {
        ticks_to_duration(self.ticks(), ticks_per_second())
    }

    /// Ticks spent since the start by the processes `which` selects.
    pub fn ticks_of(&self, which: impl Fn(u32) -> bool) -> u64 {
        self.latest
            .iter()
            .filter(|(pid, _)| which(**pid))
            .map(|(pid, &ticks)| ticks.saturating_sub(self.baseline.get(pid).copied().unwrap_or(0)))
            .sum()
    }

    pub fn spent_by(&self, which: impl Fn(u32) -> bool) -> Duration {
        ticks_to_duration(self.ticks_of(which), ticks_per_second())
    }
}

/// Reads the ticks of these processes, skipping those that cannot be read.
pub fn read_ticks(pids: impl IntoIterator<Item = u32>) -> Vec<(u32, u64)> {
    pids.into_iter()
        .filter_map(|pid| Some((pid, process_ticks(pid)?)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    // A real line (PostgreSQL's postmaster), utime 1402, stime 10108.
    const POSTMASTER: &str = "2216 (postgres) S 1 2216 2216 0 -1 4194304 413037 22646011 0 59 \
        1402 10108 17621 20 0 1 0 3986 222543872 7186 18446744073709551615";

    #[test]
    fn utime_and_stime_are_summed() {
        assert_eq!(parse_stat_ticks(POSTMASTER), Some(1402 + 10108));
    }

    #[test]
    fn a_command_name_with_spaces_and_parentheses_does_not_shift_the_fields() {
        let stat = POSTMASTER.replace("(postgres)", "(postgres: a) b (c)");
        assert_eq!(parse_stat_ticks(&stat), Some(1402 + 10108));
    }

    #[test]
    fn a_truncated_line_is_not_read() {
        assert_eq!(parse_stat_ticks("2216 (postgres) S 1 2216"), None);
        assert_eq!(parse_stat_ticks("garbage"), None);
    }

    #[test]
    fn ticks_become_microseconds_at_the_given_rate() {
        assert_eq!(ticks_to_duration(3, 100), Duration::from_millis(30));
        assert_eq!(ticks_to_duration(1, 1000), Duration::from_millis(1));
        assert_eq!(ticks_to_duration(7, 0), Duration::from_secs(7));
    }

    #[test]
    fn our_own_process_has_a_reading() {
        assert!(process_ticks(std::process::id()).is_some());
        assert!(ticks_per_second() > 0);
    }

    #[test]
    fn a_tally_counts_running_processes_from_the_start_and_new_ones_whole() {
        let mut tally = CpuTally::start([(10, 500), (11, 40)]);
        assert_eq!(tally.ticks(), 0);
        tally.record([(10, 530), (12, 7)]);
        assert_eq!(tally.ticks(), 30 + 7);
        // 11 was not seen again (it exited): it keeps what it had.
        tally.record([(10, 560), (11, 45), (12, 9)]);
        assert_eq!(tally.ticks(), 60 + 5 + 9);
        tally.record([(12, 20)]);
        assert_eq!(tally.ticks(), 60 + 5 + 20);
        assert_eq!(tally.ticks_of(|pid| pid == 12), 20);
        assert_eq!(tally.ticks_of(|pid| pid != 12), 60 + 5);
    }
}
