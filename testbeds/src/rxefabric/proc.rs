//! Child processes of the fabric: commands that must succeed, and tools (pingpong, perftest) that
//! run in the background with their output captured and are killed when they overrun, because a
//! verbs program whose packets are dropped waits forever.

use std::io::Read;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

/// Runs `program args` and returns its stdout; an error names the command and carries stderr.
pub fn run(program: &str, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("could not start {program} (is it installed on the host?)"))?;
    if !out.status.success() {
        bail!(
            "`{program} {}` failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Like [`run`], for commands whose failure only means "nothing to undo" (deleting a qdisc that
/// is not there); returns whether it succeeded.
pub fn run_quietly(program: &str, args: &[&str]) -> bool {
    Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// What a finished (or killed) background command left.
#[derive(Debug, Clone)]
pub struct Captured {
    /// `None` when it was killed at its timeout.
    pub status: Option<ExitStatus>,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
}

impl Captured {
    pub fn success(&self) -> bool {
        self.status.is_some_and(|s| s.success())
    }

    /// One line for error messages: how it ended and the tail of its stderr.
    pub fn describe(&self) -> String {
        let how = match self.status {
            Some(s) => s.to_string(),
            None => format!("killed after {:.1} s", self.elapsed.as_secs_f64()),
        };
        let err: Vec<&str> = self.stderr.lines().filter(|l| !l.trim().is_empty()).collect();
        let out: Vec<&str> = self.stdout.lines().filter(|l| !l.trim().is_empty()).collect();
        let last = err.last().or(out.last()).copied().unwrap_or("no output");
        format!("{how}: {last}")
    }
}

/// A command running in the background with its output being collected.
#[derive(Debug)]
pub struct Running {
    child: Child,
    started: Instant,
    stdout: Option<JoinHandle<String>>,
    stderr: Option<JoinHandle<String>>,
}

impl Running {
    pub fn spawn(program: &str, args: &[String]) -> anyhow::Result<Running> {
        let mut child = Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("could not start {program}"))?;
        let collect = |r: Option<Box<dyn Read + Send>>| {
            r.map(|mut r| {
                std::thread::spawn(move || {
                    let mut buf = Vec::new();
                    let _ = r.read_to_end(&mut buf);
                    String::from_utf8_lossy(&buf).into_owned()
                })
            })
        };
        let stdout = collect(child.stdout.take().map(|s| Box::new(s) as Box<dyn Read + Send>));
        let stderr = collect(child.stderr.take().map(|s| Box::new(s) as Box<dyn Read + Send>));
        Ok(Running { child, started: Instant::now(), stdout, stderr })
    }

    /// True once the process has exited.
    pub fn exited(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)))
    }

    /// Waits up to `timeout`, then kills it; either way returns what it printed.
    pub fn finish(mut self, timeout: Duration) -> Captured {
        let deadline = Instant::now() + timeout;
        let status = loop {
            match self.child.try_wait() {
                Ok(Some(s)) => break Some(s),
                Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
                _ => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    break None;
                }
            }
        };
        let elapsed = self.started.elapsed();
        let join = |h: Option<JoinHandle<String>>| h.and_then(|h| h.join().ok()).unwrap_or_default();
        Captured { status, stdout: join(self.stdout.take()), stderr: join(self.stderr.take()), elapsed }
    }
}

/// Listening TCP ports in `/proc/net/tcp` or `/proc/net/tcp6` text.
pub fn listening_ports(proc_net_tcp: &str) -> Vec<u16> {
    const LISTEN: &str = "0A";
    proc_net_tcp
        .lines()
        .filter_map(|line| {
            let mut f = line.split_whitespace();
            let _slot = f.next()?;
            let local = f.next()?;
            let _remote = f.next()?;
            let state = f.next()?;
            let port = local.rsplit_once(':')?.1;
            (state == LISTEN).then(|| u16::from_str_radix(port, 16).ok()).flatten()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listening_ports_reads_both_families() {
        let tcp = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000:4853 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 11907 1 0000000000000000 100 0 0 10 0
   1: 0100000A:4853 0200000A:B2C4 01 00000000:00000000 00:00000000 00000000     0        0 11999 1 0000000000000000 20 4 30 10 -1
";
        let tcp6 = "  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000000000000:0016 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1234 1 0000000000000000 100 0 0 10 0
";
        assert_eq!(listening_ports(tcp), [18515]);
        assert_eq!(listening_ports(tcp6), [22]);
    }

    #[test]
    fn a_killed_command_reports_its_timeout() {
        let r = Running::spawn("sleep", &["5".to_string()]).unwrap();
        let c = r.finish(Duration::from_millis(100));
        assert!(c.status.is_none() && !c.success());
        assert!(c.describe().starts_with("killed after"), "{}", c.describe());
        let r = Running::spawn("sh", &["-c".to_string(), "echo out; echo err >&2; exit 3".to_string()]).unwrap();
        let c = r.finish(Duration::from_secs(10));
        assert_eq!(c.status.and_then(|s| s.code()), Some(3));
        assert_eq!((c.stdout.as_str(), c.stderr.as_str()), ("out\n", "err\n"));
        assert!(c.describe().ends_with(": err"), "{}", c.describe());
    }
}
