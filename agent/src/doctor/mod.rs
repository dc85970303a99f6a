//! `agent doctor`: what an operator runs on a node before enabling the service. Each check says
//! ok, warn or fail with the fix, or `info` where this host cannot tell (a NIC that exposes no
//! ECN settings, no chrony to ask): the exit code is the worst of ok (0), warn (1) and fail (2).
//!
//! - [`rdma`]: the RDMA devices and their ports: state, link layer, RoCE v2 GIDs and their
//!   netdevs, the MTU traffic will get, PFC and ECN/DSCP where the NIC or DCB says, and the
//!   completion clock a shard would choose.
//! - [`host`]: memlock, the capabilities and kernel BTF path tracing and the service tracer need,
//!   clock synchronisation, and the cores the config names (online, isolated, busy).
//! - Here: the config and its pinglist load, and the report (table or JSON).
//!
//! Everything is read from a sysfs and procfs root ([`Host`]), so the checks run on a fake tree
//! in tests; the completion clock asks libibverbs, which only a real device answers.

mod host;
mod rdma;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rocemesh_formats::pinglist::Pinglist;
use serde::Serialize;

use crate::config::AgentConfig;
use crate::verbs::clock::ClockCaps;

/// How a check came out, worst last.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Level {
    /// Fine.
    Ok,
    /// This host cannot say (not readable here); not counted in the exit code.
    Info,
    /// Works, but not as a production node should.
    Warn,
    /// The agent would not start, or would probe wrongly.
    Fail,
}

impl Level {
    fn name(self) -> &'static str {
        match self {
            Level::Ok => "ok",
            Level::Info => "info",
            Level::Warn => "warn",
            Level::Fail => "fail",
        }
    }
}

/// One finding of the doctor.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Check {
    /// What was checked (`rdma`, `gid`, `pfc`, `memlock`, `core`...).
    pub area: &'static str,
    /// Of what: a device and port, a core, a file.
    pub subject: String,
    pub level: Level,
    /// What was found, with the numbers.
    pub detail: String,
    /// What to do, where the level is not ok; empty otherwise.
    pub fix: String,
}

impl Check {
    fn new(area: &'static str, subject: impl Into<String>, level: Level, detail: impl Into<String>) -> Check {
        Check { area, subject: subject.into(), level, detail: detail.into(), fix: String::new() }
    }

    fn fix(mut self, fix: impl Into<String>) -> Check {
        self.fix = fix.into();
        self
    }
}

/// Where the doctor looks: the roots of sysfs and procfs, how a device's completion clock is
/// asked (libibverbs on a real host), and how the tools that know what sysfs does not (`dcb`,
/// `chronyc`, `timedatectl`) are run: their standard output when they exit 0, None otherwise.
pub struct Host<'a> {
    pub sys: PathBuf,
    pub proc: PathBuf,
    pub clock_caps: &'a dyn Fn(&str) -> Result<ClockCaps, String>,
    pub run: &'a dyn Fn(&str, &[&str]) -> Option<String>,
    /// How long the cores' load is sampled.
    pub sample: Duration,
}

impl std::fmt::Debug for Host<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Host").field("sys", &self.sys).field("proc", &self.proc).field("sample", &self.sample).finish()
    }
}

impl Host<'_> {
    /// This machine.
    pub fn this() -> Host<'static> {
        Host {
            sys: PathBuf::from("/sys"),
            proc: PathBuf::from("/proc"),
            clock_caps: &|d| crate::verbs::device::clock_caps(d).map_err(|e| e.to_string()),
            run: &run_tool,
            sample: Duration::from_millis(300),
        }
    }
}

/// A tool that has not answered in this long is killed and counts as unreadable: the doctor
/// must not hang on a wedged daemon (chronyc asks chronyd).
const TOOL_TIMEOUT: Duration = Duration::from_secs(3);

/// `program args`' standard output when it exits 0 within [`TOOL_TIMEOUT`].
fn run_tool(program: &str, args: &[&str]) -> Option<String> {
    use std::process::{Command, Stdio};
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    // Read as it comes: a tool whose output outgrows the pipe would otherwise never exit.
    let mut stdout = child.stdout.take()?;
    let reader = std::thread::spawn(move || {
        let mut out = String::new();
        std::io::Read::read_to_string(&mut stdout, &mut out).ok().map(|_| out)
    });
    let start = std::time::Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(status)) => {
                let out = reader.join().ok().flatten()?;
                return status.success().then_some(out);
            }
            Ok(None) if start.elapsed() < TOOL_TIMEOUT => std::thread::sleep(Duration::from_millis(10)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
        }
    }
}

/// Every check's result, in the order they ran.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub worst: Level,
    pub checks: Vec<Check>,
}

/// Runs every check; `config` is the agent's configuration file, when there is one to check.
pub fn run(config: Option<&Path>, host: &Host) -> Report {
    let mut checks = Vec::new();
    let cfg = match config {
        Some(path) => load(path, &mut checks),
        None => {
            checks.push(
                Check::new(
                    "config",
                    "-",
                    Level::Info,
                    "no --config: the config, pinglist and shard cores were not checked",
                )
                .fix("pass --config /etc/rocemesh/agent.toml"),
            );
            None
        }
    };
    checks.extend(rdma::checks(host, cfg.as_ref()));
    checks.extend(host::checks(host, cfg.as_ref()));
    let worst = checks.iter().map(|c| c.level).max().unwrap_or(Level::Ok);
    Report { worst, checks }
}

/// The config and its pinglist, loaded as `agent run` loads them.
fn load(path: &Path, checks: &mut Vec<Check>) -> Option<AgentConfig> {
    let cfg = match AgentConfig::load(path) {
        Ok(c) => c,
        Err(e) => {
            // The problem names the key and the fix.
            checks.push(Check::new("config", path.display().to_string(), Level::Fail, e.problem));
            return None;
        }
    };
    checks.push(Check::new(
        "config",
        path.display().to_string(),
        Level::Ok,
        format!("host {}, {} shards, mode {:?}", cfg.host, cfg.shards.len(), cfg.mode),
    ));
    let subject = cfg.pinglist.display().to_string();
    checks.push(match Pinglist::load(&cfg.pinglist) {
        Ok(pl) => Check::new(
            "pinglist",
            subject,
            Level::Ok,
            format!("generation {}, {} targets", pl.generation, pl.targets.len()),
        ),
        // The agent starts without one and waits for ctl's push.
        Err(e) => Check::new("pinglist", subject, Level::Warn, e.to_string())
            .fix("push one from the bastion: ctl push-pinglist --from DIR"),
    });
    Some(cfg)
}

impl Report {
    /// 0 when nothing is worse than ok or info, 1 with a warning, 2 with a failure.
    pub fn exit_code(&self) -> i32 {
        match self.worst {
            Level::Ok | Level::Info => 0,
            Level::Warn => 1,
            Level::Fail => 2,
        }
    }

    /// One line per check, its fix under it.
    pub fn render_table(&self) -> String {
        let mut s = String::new();
        let width = self.checks.iter().map(|c| c.subject.len()).max().unwrap_or(0).min(40);
        for c in &self.checks {
            let _ = writeln!(s, "{:<4} {:<10} {:<width$} {}", c.level.name(), c.area, c.subject, c.detail);
            if !c.fix.is_empty() {
                let _ = writeln!(s, "     {:<10} {:<width$} fix: {}", "", "", c.fix);
            }
        }
        let count = |l| self.checks.iter().filter(|c| c.level == l).count();
        let _ = writeln!(
            s,
            "doctor: {} ok, {} warn, {} fail, {} info: {}",
            count(Level::Ok),
            count(Level::Warn),
            count(Level::Fail),
            count(Level::Info),
            self.worst.name()
        );
        s
    }
}

/// The trimmed contents of `path`, if readable.
fn read(path: &Path) -> Option<String> {
    std::fs::read_to_string(path).ok().map(|s| s.trim().to_owned())
}

/// The names in directory `dir`, sorted (empty when unreadable).
fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    v.sort_by(|a, b| natural(a).cmp(&natural(b)));
    v
}

/// Sort key that puts `10` after `9`.
fn natural(s: &str) -> (usize, &str) {
    (s.len(), s)
}

#[cfg(test)]
mod tests;
