//! CPU time of another process, from /proc.

use anyhow::{anyhow, Context as _};

/// CPU seconds a process has consumed (all its threads), split by where they ran.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CpuTime {
    /// In the process's own code and libraries.
    pub user: f64,
    /// In the kernel on the process's behalf (syscalls, and on loopback the softirq work of
    /// delivering what it sends).
    pub system: f64,
}

impl CpuTime {
    pub fn total(self) -> f64 {
        self.user + self.system
    }

    fn since(self, before: CpuTime) -> CpuTime {
        CpuTime {
            user: self.user - before.user,
            system: self.system - before.system,
        }
    }
}

/// User and system CPU seconds consumed so far by process `pid`.
pub fn process_cpu(pid: u32) -> anyhow::Result<CpuTime> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("--server-pid {pid}: cannot read /proc/{pid}/stat"))?;
    parse_stat(&stat, clock_ticks_per_second())
        .ok_or_else(|| anyhow!("--server-pid {pid}: malformed /proc/{pid}/stat"))
}

/// User + system CPU seconds consumed so far by process `pid`.
pub fn process_cpu_seconds(pid: u32) -> anyhow::Result<f64> {
    process_cpu(pid).map(CpuTime::total)
}

fn clock_ticks_per_second() -> f64 {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_CLK_TCK) as f64 }
}

fn parse_stat(stat: &str, hz: f64) -> Option<CpuTime> {
    // The command name may hold spaces and parentheses: fields start after the last ')'.
    let rest = stat.get(stat.rfind(')')? + 2..)?;
    let mut f = rest.split_whitespace();
    // After the name: state is field 3 overall, utime field 14, stime field 15.
    let utime: u64 = f.nth(11)?.parse().ok()?;
    let stime: u64 = f.next()?.parse().ok()?;
    Some(CpuTime {
        user: utime as f64 / hz,
        system: stime as f64 / hz,
    })
}

/// The server CPU a benchmark run consumed: started before the load, read after it.
pub struct ServerCpuMeter {
    pid: u32,
    before: CpuTime,
}

impl ServerCpuMeter {
    /// `None` when no `--server-pid` was given.
    pub fn start(pid: Option<u32>) -> anyhow::Result<Option<Self>> {
        pid.map(|pid| {
            Ok(Self {
                pid,
                before: process_cpu(pid)?,
            })
        })
        .transpose()
    }

    pub fn stop(meter: Option<Self>) -> anyhow::Result<Option<CpuTime>> {
        meter
            .map(|m| Ok(process_cpu(m.pid)?.since(m.before)))
            .transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_own_cpu_time() {
        let t = process_cpu(std::process::id()).unwrap();
        assert!(t.user >= 0.0 && t.system >= 0.0);
        assert!(process_cpu_seconds(u32::MAX).is_err());
    }

    #[test]
    fn parses_utime_and_stime_after_a_name_with_spaces_and_parentheses() {
        // Fields 14 and 15 (utime, stime) are 250 and 50 ticks.
        let stat = "42 (a (b) c) S 1 42 42 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 1 0 5 0 0";
        let t = parse_stat(stat, 100.0).unwrap();
        assert_eq!(
            t,
            CpuTime {
                user: 2.5,
                system: 0.5
            }
        );
        assert_eq!(t.total(), 3.0);
        assert_eq!(parse_stat("42 (name) S 1 2", 100.0), None);
        assert_eq!(parse_stat("no parenthesis", 100.0), None);
    }

    #[test]
    fn a_meter_without_a_pid_measures_nothing() {
        let m = ServerCpuMeter::start(None).unwrap();
        assert!(ServerCpuMeter::stop(m).unwrap().is_none());
        let me = ServerCpuMeter::start(Some(std::process::id())).unwrap();
        let used = ServerCpuMeter::stop(me).unwrap().unwrap();
        assert!(used.user >= 0.0 && used.system >= 0.0);
    }
}
