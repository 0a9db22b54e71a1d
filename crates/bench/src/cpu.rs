//! CPU time of another process, from /proc, and of this process's threads.

use anyhow::{anyhow, Context as _};
use std::collections::BTreeMap;

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

/// CPU seconds this process's live threads have used, summed by thread name with its trailing
/// number dropped (`rampart-gpu-cpu-3` and `rampart-gpu-cpu-4` are one group).
pub fn thread_groups_cpu() -> BTreeMap<String, f64> {
    let hz = clock_ticks_per_second();
    let mut groups = BTreeMap::new();
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return groups;
    };
    for task in tasks.flatten() {
        // A thread may end between the listing and the read: skipped.
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
            continue;
        };
        if let (Some(name), Some(t)) = (thread_group(&stat), parse_stat(&stat, hz)) {
            *groups.entry(name).or_insert(0.0) += t.total();
        }
    }
    groups
}

/// The group of a thread's `stat` line: its name without a trailing number.
fn thread_group(stat: &str) -> Option<String> {
    let name = stat.get(stat.find('(')? + 1..stat.rfind(')')?)?;
    let group = name.trim_end_matches(|c: char| c.is_ascii_digit() || c == '-' || c == '_');
    Some(if group.is_empty() { name } else { group }.to_string())
}

/// CPU seconds the calling thread has used.
pub fn this_thread_cpu_seconds() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec for the call to write; the clock id is a constant.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } != 0 {
        return 0.0;
    }
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
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
    fn threads_group_by_name_without_their_number() {
        let line = |name: &str| format!("7 ({name}) S 1 7 7 0 -1 0 0 0 0 0 3 1 0 0 20 0");
        assert_eq!(
            thread_group(&line("rampart-gpu-cpu")).unwrap(),
            "rampart-gpu-cpu"
        );
        assert_eq!(thread_group(&line("rampart-gpu-1")).unwrap(), "rampart-gpu");
        assert_eq!(
            thread_group(&line("bench-submit-12")).unwrap(),
            "bench-submit"
        );
        assert_eq!(thread_group(&line("a (b) c")).unwrap(), "a (b) c");
        assert_eq!(thread_group(&line("42")).unwrap(), "42");
    }

    #[test]
    fn this_thread_and_its_group_are_measured() {
        let spun = std::thread::Builder::new()
            .name("cpu-test-spin-1".into())
            .spawn(|| {
                let start = this_thread_cpu_seconds();
                let mut x = 0u64;
                while this_thread_cpu_seconds() - start < 0.05 {
                    x = std::hint::black_box(x.wrapping_add(1));
                }
                let used = this_thread_cpu_seconds() - start;
                let groups = thread_groups_cpu();
                (used, groups.get("cpu-test-spin").copied())
            })
            .unwrap()
            .join()
            .unwrap();
        assert!(spun.0 >= 0.05, "{spun:?}");
        // /proc counts in clock ticks (usually 10 ms): at least some of the 50 ms shows.
        assert!(spun.1.is_some_and(|s| s > 0.0), "{spun:?}");
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
