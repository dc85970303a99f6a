//! `ctl doctor`: `agent doctor --format json` on every host over ssh, and what the fleet's
//! answers add up to: each host's worst result and the checks that were not ok, then per check
//! (area and level) how many hosts and which, so that one misconfigured rack stands out from a
//! fleet-wide setting.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Deserialize;

use crate::remote::{RemotePath, Ssh, run_parallel, sh_quote};

/// One check of one host, as `agent doctor --format json` prints it.
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct Check {
    pub area: String,
    pub subject: String,
    pub level: String,
    pub detail: String,
    #[serde(default)]
    pub fix: String,
}

/// `agent doctor`'s JSON.
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct Report {
    pub worst: String,
    pub checks: Vec<Check>,
}

/// What one host answered.
#[derive(Clone, Debug, PartialEq)]
pub struct HostDoctor {
    pub host: String,
    /// The report, or why there is none (ssh failed, the agent is not installed, its output did
    /// not parse).
    pub report: Result<Report, String>,
}

impl HostDoctor {
    /// A host that warned, failed or could not be asked.
    pub fn is_problem(&self) -> bool {
        self.report.as_ref().map_or(true, |r| r.worst == "warn" || r.worst == "fail")
    }
}

/// Runs `agent` (the remote command that runs the agent binary, e.g. `rocemesh-agent` or
/// `sudo -n rocemesh-agent`) `doctor --format json --config CONFIG` on every host, `parallel`
/// at a time.
pub fn doctor(
    hosts: &[String],
    ssh: &Ssh,
    agent: &str,
    config: &RemotePath,
    parallel: usize,
    done: impl Fn(&HostDoctor) + Sync,
) -> Vec<HostDoctor> {
    let ask_one = |host: &String| {
        let command = format!("{agent} doctor --format json --config {}", sh_quote(&config.for_host(host)));
        HostDoctor { host: host.clone(), report: ask(ssh, host, &command) }
    };
    run_parallel(hosts, parallel, ask_one, done)
}

fn ask(ssh: &Ssh, host: &str, command: &str) -> Result<Report, String> {
    let out = ssh.run(host, command, None).map_err(|e| e.to_string())?;
    // The doctor exits 1 on a warning and 2 on a failure with its report on stdout; anything
    // else (ssh's 255, a shell's 127) left no report.
    if out.timed_out || !matches!(out.exit_code, Some(0..=2)) {
        return Err(out.failure_summary(ssh.timeout));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| {
        format!(
            "no doctor report ({e}): {}",
            crate::remote::excerpt(if out.stderr.is_empty() { &out.stdout } else { &out.stderr })
        )
    })
}

/// The per-host table, then the checks that were not ok across the fleet, most hosts first.
pub fn render(results: &[HostDoctor]) -> String {
    let mut s = String::new();
    let width = results.iter().map(|r| r.host.len()).max().unwrap_or(4).max(4);
    let _ = writeln!(s, "{:<width$} {:<5} not ok", "host", "worst");
    // (level, area) -> (subject: detail, hosts)
    let mut fleet: BTreeMap<(u8, String), Vec<String>> = BTreeMap::new();
    for r in results {
        match &r.report {
            Ok(rep) => {
                let bad: Vec<&Check> = rep.checks.iter().filter(|c| c.level == "warn" || c.level == "fail").collect();
                let list: Vec<String> = bad.iter().map(|c| format!("{} {} {}", c.level, c.area, c.subject)).collect();
                let _ = writeln!(s, "{:<width$} {:<5} {}", r.host, rep.worst, list.join(", "));
                for c in bad {
                    fleet.entry((rank(&c.level), c.area.clone())).or_default().push(r.host.clone());
                }
            }
            Err(e) => {
                let _ = writeln!(s, "{:<width$} {:<5} {e}", r.host, "-");
                fleet.entry((3, "unreachable".into())).or_default().push(r.host.clone());
            }
        }
    }
    if !fleet.is_empty() {
        let _ = writeln!(s, "\nacross {} hosts:", results.len());
        let mut rows: Vec<(&(u8, String), &Vec<String>)> = fleet.iter().collect();
        rows.sort_by(|a, b| b.0.0.cmp(&a.0.0).then(b.1.len().cmp(&a.1.len())).then(a.0.1.cmp(&b.0.1)));
        for ((level, area), hosts) in rows {
            let mut hosts = hosts.clone();
            hosts.dedup();
            let shown: Vec<&str> = hosts.iter().take(8).map(String::as_str).collect();
            let more = if hosts.len() > 8 { format!(" and {} more", hosts.len() - 8) } else { String::new() };
            let _ =
                writeln!(s, "  {:<4} {:<12} {:>5} hosts: {}{more}", name(*level), area, hosts.len(), shown.join(", "));
        }
    }
    let problems = results.iter().filter(|r| r.is_problem()).count();
    let _ = writeln!(s, "doctor: {} hosts, {} with a warning, a failure or no answer", results.len(), problems);
    s
}

fn rank(level: &str) -> u8 {
    match level {
        "fail" => 2,
        "warn" => 1,
        _ => 0,
    }
}

fn name(rank: u8) -> &'static str {
    match rank {
        3 => "-",
        2 => "fail",
        1 => "warn",
        _ => "ok",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(area: &str, subject: &str, level: &str) -> Check {
        Check {
            area: area.into(),
            subject: subject.into(),
            level: level.into(),
            detail: String::new(),
            fix: String::new(),
        }
    }

    fn host(name: &str, worst: &str, checks: Vec<Check>) -> HostDoctor {
        HostDoctor { host: name.into(), report: Ok(Report { worst: worst.into(), checks }) }
    }

    #[test]
    fn the_fleet_summary_counts_hosts_per_check_worst_first() {
        let results = vec![
            host("h1", "ok", vec![check("mtu", "eth0", "ok")]),
            host("h2", "warn", vec![check("mtu", "eth0", "warn"), check("pfc", "eth0", "info")]),
            host("h3", "fail", vec![check("mtu", "eth0", "warn"), check("gid", "mlx5_0/1", "fail")]),
            HostDoctor { host: "h4".into(), report: Err("ssh failed (exit 255) without a message".into()) },
        ];
        let text = render(&results);
        let rows: Vec<Vec<&str>> = text.lines().map(|l| l.split_whitespace().collect()).collect();
        assert_eq!(rows[1], ["h1", "ok"], "{text}");
        assert_eq!(rows[2], ["h2", "warn", "warn", "mtu", "eth0"], "info is not listed: {text}");
        assert_eq!(rows[3], ["h3", "fail", "warn", "mtu", "eth0,", "fail", "gid", "mlx5_0/1"], "{text}");
        assert_eq!(rows[4][..3], ["h4", "-", "ssh"], "{text}");
        let summary: Vec<&Vec<&str>> = rows.iter().skip_while(|r| r.first() != Some(&"across")).skip(1).collect();
        assert_eq!(summary.len(), 4, "three rows and the total: {text}");
        assert_eq!(*summary[0], ["-", "unreachable", "1", "hosts:", "h4"], "{text}");
        assert_eq!(*summary[1], ["fail", "gid", "1", "hosts:", "h3"], "{text}");
        assert_eq!(*summary[2], ["warn", "mtu", "2", "hosts:", "h2,", "h3"], "{text}");
        assert!(text.ends_with("doctor: 4 hosts, 3 with a warning, a failure or no answer\n"), "{text}");
        assert!(!results[0].is_problem() && results.iter().skip(1).all(HostDoctor::is_problem));
    }

    /// What the agent prints is what ctl reads: a real `agent doctor` report, of a host with
    /// nothing in its sysfs, through the JSON.
    #[test]
    fn the_agents_json_is_what_ctl_reads() {
        let dir = tempfile::tempdir().expect("tempdir");
        let none = |_: &str, _: &[&str]| None;
        let no_device = |d: &str| Err(format!("{d}: none"));
        let host = rocemesh_agent::doctor::Host {
            sys: dir.path().join("sys"),
            proc: dir.path().join("proc"),
            clock_caps: &no_device,
            run: &none,
            sample: std::time::Duration::ZERO,
        };
        let report = rocemesh_agent::doctor::run(None, &host);
        let json = serde_json::to_string(&report).expect("encode");
        let read: Report = serde_json::from_str(&json).expect("ctl reads the agent's report");
        assert_eq!(read.checks.len(), report.checks.len());
        let rdma = read.checks.iter().find(|c| c.area == "rdma").expect("the rdma check");
        assert_eq!(rdma.level, "warn");
        assert!(rdma.fix.contains("rdma link add"), "{rdma:?}");
    }
}
