//! Running commands on hosts with the system OpenSSH client, many hosts at a time.
//!
//! The system `ssh` rather than an ssh library: it honours the operator's `~/.ssh/config`
//! (jump hosts, user names, host name rewriting), ssh-agent, known_hosts and certificates, which
//! is how bastions are set up; and nothing of ctl's needs more than "run this, feed it stdin".

use std::ffi::OsString;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::error::Error;

/// How to reach the hosts.
#[derive(Debug, Clone)]
pub struct Ssh {
    /// The client, `ssh` from `PATH` by default.
    pub program: PathBuf,
    /// Passed to ssh before ctl's own options. ssh keeps the first value it is given for an
    /// option, so these override ctl's defaults (`-o ConnectTimeout=30`).
    pub options: Vec<String>,
    /// ssh's `ConnectTimeout`.
    pub connect_timeout_secs: u32,
    /// The whole command, connection included; the client is killed after this.
    pub timeout: Duration,
}

impl Default for Ssh {
    fn default() -> Self {
        Ssh {
            program: PathBuf::from("ssh"),
            options: Vec::new(),
            connect_timeout_secs: 10,
            timeout: Duration::from_secs(60),
        }
    }
}

/// What a remote command did.
#[derive(Debug, Clone)]
pub struct RemoteOutput {
    /// ssh's exit code: the remote command's, or 255 when ssh itself failed; `None` when killed.
    pub exit_code: Option<i32>,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub elapsed: Duration,
    pub timed_out: bool,
}

impl RemoteOutput {
    pub fn success(&self) -> bool {
        self.exit_code == Some(0) && !self.timed_out
    }

    /// One line saying why it failed, for a result table.
    pub fn failure_summary(&self, timeout: Duration) -> String {
        let why = excerpt(&self.stderr);
        if self.timed_out {
            format!(
                "timed out after {} s{}",
                timeout.as_secs(),
                if why.is_empty() { String::new() } else { format!(": {why}") }
            )
        } else {
            match (self.exit_code, why.is_empty()) {
                (Some(255), true) => "ssh failed (exit 255) without a message".to_owned(),
                (Some(code), true) => format!("remote command exited {code}"),
                (None, true) => "ssh was killed by a signal".to_owned(),
                (_, false) => why,
            }
        }
    }
}

/// The last lines of `stderr`, joined and cut, for a table cell.
pub fn excerpt(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr);
    let lines: Vec<&str> = text.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    let tail = lines[lines.len().saturating_sub(2)..].join("; ");
    let clean: String = tail.chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
    if clean.chars().count() > 160 { format!("{}...", clean.chars().take(157).collect::<String>()) } else { clean }
}

impl Ssh {
    /// The arguments for running `command` on `host`.
    pub fn args(&self, host: &str, command: &str) -> Vec<OsString> {
        let mut args: Vec<OsString> = self.options.iter().map(OsString::from).collect();
        for option in [
            // A password or host-key prompt would hang a parallel push; fail instead.
            "BatchMode=yes".to_owned(),
            format!("ConnectTimeout={}", self.connect_timeout_secs),
            // A host that dies mid-transfer is noticed instead of waited on until the timeout.
            "ServerAliveInterval=5".to_owned(),
            "ServerAliveCountMax=3".to_owned(),
        ] {
            args.push("-o".into());
            args.push(option.into());
        }
        args.push("-T".into());
        // `--`: a host name is never read as an option.
        args.push("--".into());
        args.push(host.into());
        args.push(command.into());
        args
    }

    /// Runs `command` on `host` with `stdin` as its input. Fails only when ssh cannot be
    /// started; everything that happens remotely is in the [`RemoteOutput`].
    pub fn run(&self, host: &str, command: &str, stdin: Option<&[u8]>) -> Result<RemoteOutput, Error> {
        let start = Instant::now();
        let mut child = Command::new(&self.program)
            .args(self.args(host, command))
            .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| Error::Invalid {
                problem: format!("cannot run {}: {e}", self.program.display()),
                fix: "install the OpenSSH client (scripts/setup does), or point --ssh-program at it".to_owned(),
            })?;
        let stdout = collect(child.stdout.take());
        let stderr = collect(child.stderr.take());
        // A separate writer: ssh may not read its input before the remote side is ready, and
        // a file larger than the pipe buffer would otherwise block the timeout loop.
        let writer = match (stdin, child.stdin.take()) {
            (Some(bytes), Some(mut pipe)) => {
                let bytes = bytes.to_vec();
                Some(std::thread::spawn(move || {
                    let _ = pipe.write_all(&bytes);
                }))
            }
            _ => None,
        };
        let mut timed_out = false;
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break Some(status),
                Ok(None) if start.elapsed() >= self.timeout => {
                    timed_out = true;
                    let _ = child.kill();
                    break child.wait().ok();
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(5)),
                Err(_) => break None,
            }
        };
        if let Some(w) = writer {
            // After the child exited, the pipe is closed and the writer has returned.
            let _ = w.join();
        }
        let elapsed = start.elapsed();
        Ok(RemoteOutput {
            exit_code: status.and_then(|s| s.code()),
            stdout: stdout.finish(),
            stderr: stderr.finish(),
            elapsed,
            timed_out,
        })
    }
}

/// A pipe being read to its end on a thread of its own.
struct Collector {
    buffer: Arc<Mutex<Vec<u8>>>,
    done: std::sync::mpsc::Receiver<()>,
}

fn collect<R: Read + Send + 'static>(pipe: Option<R>) -> Collector {
    let buffer = Arc::new(Mutex::new(Vec::new()));
    let (tx, done) = std::sync::mpsc::channel();
    if let Some(mut pipe) = pipe {
        let sink = Arc::clone(&buffer);
        std::thread::spawn(move || {
            let mut chunk = [0u8; 8192];
            while let Ok(n) = pipe.read(&mut chunk) {
                if n == 0 {
                    break;
                }
                if let Ok(mut b) = sink.lock() {
                    b.extend_from_slice(&chunk[..n]);
                }
            }
            let _ = tx.send(());
        });
    }
    Collector { buffer, done }
}

impl Collector {
    /// What was read. A ControlPersist master started by this ssh inherits the pipes and keeps
    /// them open after ssh exits, so the end of the stream is waited for only briefly.
    fn finish(self) -> Vec<u8> {
        let _ = self.done.recv_timeout(Duration::from_secs(2));
        self.buffer.lock().map(|b| b.clone()).unwrap_or_default()
    }
}

/// `s` as one word for a POSIX shell.
pub fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// A remote file path in which `{host}` stands for the host's name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemotePath(String);

impl RemotePath {
    /// Checks `template`: absolute, a file (not ending in `/`), no control characters.
    pub fn new(template: &str) -> Result<RemotePath, Error> {
        let fix = "give an absolute file path, e.g. /etc/rocemesh/pinglist.toml or /srv/rocemesh/{host}/pinglist.toml";
        if template.ends_with('/') {
            return Err(Error::invalid(format!("remote path {template:?} is a directory"), fix));
        }
        Self::checked(template, fix)
    }

    /// Checks a directory `template`: absolute, no control characters.
    pub fn dir(template: &str) -> Result<RemotePath, Error> {
        Self::checked(template, "give an absolute directory, e.g. /var/lib/rocemesh/segments or /srv/{host}/segments")
    }

    fn checked(template: &str, fix: &str) -> Result<RemotePath, Error> {
        if !template.starts_with('/') {
            return Err(Error::invalid(format!("remote path {template:?} is not absolute"), fix));
        }
        if template.chars().any(char::is_control) {
            return Err(Error::invalid(format!("remote path {template:?} contains a control character"), fix));
        }
        Ok(RemotePath(template.to_owned()))
    }

    /// The path on `host`.
    pub fn for_host(&self, host: &str) -> String {
        self.0.replace("{host}", host)
    }

    pub fn template(&self) -> &str {
        &self.0
    }
}

/// Runs `work` on every item with at most `parallel` at a time, calling `done` as each
/// finishes (for a progress bar); the results are in the order of `items`.
pub fn run_parallel<T: Sync, R: Send>(
    items: &[T],
    parallel: usize,
    work: impl Fn(&T) -> R + Sync,
    done: impl Fn(&R) + Sync,
) -> Vec<R> {
    let next = AtomicUsize::new(0);
    let slots: Vec<Mutex<Option<R>>> = items.iter().map(|_| Mutex::new(None)).collect();
    std::thread::scope(|s| {
        for _ in 0..parallel.clamp(1, items.len().max(1)) {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(item) = items.get(i) else { break };
                    let result = work(item);
                    done(&result);
                    if let Ok(mut slot) = slots[i].lock() {
                        *slot = Some(result);
                    }
                }
            });
        }
    });
    slots.into_iter().filter_map(|m| m.into_inner().ok().flatten()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_survives_a_shell() {
        for s in ["plain", "with space", "it's", "'", "$(rm -rf /) `x` \"q\" \\ ; & |", ""] {
            let out = Command::new("sh").arg("-c").arg(format!("printf %s {}", sh_quote(s))).output().unwrap();
            assert_eq!(String::from_utf8(out.stdout).unwrap(), s);
        }
    }

    #[test]
    fn remote_paths_are_checked_and_expanded() {
        let p = RemotePath::new("/srv/{host}/pinglist.toml").unwrap();
        assert_eq!(p.for_host("h1"), "/srv/h1/pinglist.toml");
        assert!(RemotePath::new("etc/x").is_err());
        assert!(RemotePath::new("/etc/").is_err());
        assert!(RemotePath::new("/etc/x\n").is_err());
        let d = RemotePath::dir("/srv/{host}/segments/").unwrap();
        assert_eq!(d.for_host("h2"), "/srv/h2/segments/");
        assert!(RemotePath::dir("srv/segments").is_err());
        assert!(RemotePath::dir("/srv/\tsegments").is_err());
    }

    #[test]
    fn operator_options_come_first_and_the_host_after_double_dash() {
        let ssh = Ssh { options: vec!["-F".into(), "/cfg".into()], ..Ssh::default() };
        let args: Vec<String> = ssh.args("h1", "true").iter().map(|a| a.to_string_lossy().into_owned()).collect();
        assert_eq!(&args[..2], ["-F", "/cfg"]);
        assert_eq!(&args[args.len() - 3..], ["--", "h1", "true"]);
        assert!(args.contains(&"BatchMode=yes".to_owned()));
    }

    #[test]
    fn parallel_keeps_order_and_bounds_concurrency() {
        let running = AtomicUsize::new(0);
        let peak = AtomicUsize::new(0);
        let seen = AtomicUsize::new(0);
        let items: Vec<usize> = (0..40).collect();
        let out = run_parallel(
            &items,
            3,
            |&i| {
                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                peak.fetch_max(now, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(2));
                running.fetch_sub(1, Ordering::SeqCst);
                i * 2
            },
            |_| {
                seen.fetch_add(1, Ordering::SeqCst);
            },
        );
        assert_eq!(out, items.iter().map(|i| i * 2).collect::<Vec<_>>());
        assert_eq!(seen.load(Ordering::SeqCst), 40);
        assert!(peak.load(Ordering::SeqCst) <= 3);
    }
}
