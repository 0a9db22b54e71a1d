//! CPU time of another process, from /proc.

use anyhow::{anyhow, Context as _};

/// User + system CPU seconds consumed so far by process `pid` (all its threads).
pub fn process_cpu_seconds(pid: u32) -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("--server-pid {pid}: cannot read /proc/{pid}/stat"))?;
    // The command name may hold spaces and parentheses: fields start after the last ')'.
    let rest = &stat[stat
        .rfind(')')
        .ok_or_else(|| anyhow!("malformed /proc/{pid}/stat"))?
        + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state(0) ... utime is field 14 overall → index 11 here, stime 12.
    let utime: u64 = f.get(11).ok_or_else(|| anyhow!("short stat"))?.parse()?;
    let stime: u64 = f.get(12).ok_or_else(|| anyhow!("short stat"))?.parse()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Ok((utime + stime) as f64 / hz)
}

#[cfg(test)]
mod tests {
    #[test]
    fn reads_own_cpu_time() {
        let t = super::process_cpu_seconds(std::process::id()).unwrap();
        assert!(t >= 0.0);
        assert!(super::process_cpu_seconds(u32::MAX).is_err());
    }
}
