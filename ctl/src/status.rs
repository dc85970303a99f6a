//! `ctl status`: which hosts hold the generation in the pinglist directory, and which hold an
//! older one, none, or one they would refuse.

use std::fmt::Write as _;
use std::path::Path;
use std::time::UNIX_EPOCH;

use rocemesh_formats::pinglist::Pinglist;

use crate::pinglist_dir::PinglistDir;
use crate::push::{Destination, dir_path};
use crate::remote::{run_parallel, sh_quote};

/// A host's pinglist as found at the destination.
#[derive(Debug, Clone, PartialEq)]
pub enum Fetched {
    Missing,
    Present {
        /// Modification time, when the remote `stat` could tell.
        mtime_unix_s: Option<i64>,
        text: String,
    },
}

/// Reads `host`'s pinglist at `dest`. `Err` when the host could not be asked (ssh failed).
/// In directory mode a generated directory (`DIR/<host>.toml`) is read too, so that two
/// generations on the bastion can be compared.
pub fn fetch(dest: &Destination, host: &str) -> Result<Fetched, String> {
    match dest {
        Destination::Dir(dir) => {
            for path in [dir_path(dir, host), dir.join(format!("{host}.toml"))] {
                match std::fs::read(&path) {
                    Ok(bytes) => {
                        let mtime_unix_s = std::fs::metadata(&path)
                            .and_then(|m| m.modified())
                            .ok()
                            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
                            .map(|d| d.as_secs() as i64);
                        return Ok(Fetched::Present {
                            mtime_unix_s,
                            text: String::from_utf8_lossy(&bytes).into_owned(),
                        });
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(format!("{}: {e}", path.display())),
                }
            }
            Ok(Fetched::Missing)
        }
        Destination::Ssh { ssh, remote_path } => {
            let out = ssh.run(host, &fetch_command(&remote_path.for_host(host)), None).map_err(|e| e.to_string())?;
            if !out.success() {
                return Err(out.failure_summary(ssh.timeout));
            }
            let text = String::from_utf8_lossy(&out.stdout);
            let (first, rest) = text.split_once('\n').unwrap_or((&text, ""));
            match first.trim() {
                "missing" => Ok(Fetched::Missing),
                mtime => Ok(Fetched::Present { mtime_unix_s: mtime.parse().ok(), text: rest.to_owned() }),
            }
        }
    }
}

/// Prints `missing`, or the file's mtime (GNU or BSD stat; `-` if neither) and then the file.
pub fn fetch_command(path: &str) -> String {
    let script = format!(
        r#"f={}
if [ -e "$f" ]; then
  stat -c %Y -- "$f" 2>/dev/null || stat -f %m -- "$f" 2>/dev/null || echo -
  exec cat -- "$f"
fi
echo missing
"#,
        sh_quote(path)
    );
    format!("sh -c {}", sh_quote(&script))
}

/// Where a host stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum State {
    /// Holds the generation in the directory.
    Current,
    /// Holds a newer generation than the directory (pushed from elsewhere?).
    Ahead,
    /// Holds an older generation.
    Stale,
    /// Holds no pinglist.
    Missing,
    /// Holds a file the agent refuses, or another host's list.
    Invalid,
    /// Could not be asked.
    Unreachable,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Current => "current",
            State::Ahead => "ahead",
            State::Stale => "stale",
            State::Missing => "missing",
            State::Invalid => "invalid",
            State::Unreachable => "unreachable",
        }
    }
}

/// One host's status.
#[derive(Debug, Clone, PartialEq)]
pub struct HostStatus {
    pub host: String,
    pub state: State,
    /// The generation in the local directory.
    pub expected: Option<u64>,
    /// The generation the host holds.
    pub found: Option<u64>,
    pub mtime_unix_s: Option<i64>,
    pub detail: String,
}

impl HostStatus {
    /// Anything but current is a problem worth an exit code.
    pub fn is_problem(&self) -> bool {
        self.state != State::Current
    }
}

/// Asks every host in `hosts` what it holds, `parallel` at a time.
pub fn status(
    from: &PinglistDir,
    hosts: &[String],
    dest: &Destination,
    parallel: usize,
    done: impl Fn(&HostStatus) + Sync,
) -> Vec<HostStatus> {
    run_parallel(hosts, parallel, |host| status_one(from, host, dest), done)
}

fn status_one(from: &PinglistDir, host: &str, dest: &Destination) -> HostStatus {
    let expected = from.read(host).ok().map(|(_, p)| p.generation);
    let mut s = HostStatus {
        host: host.to_owned(),
        state: State::Unreachable,
        expected,
        found: None,
        mtime_unix_s: None,
        detail: String::new(),
    };
    match fetch(dest, host) {
        Err(e) => s.detail = e,
        Ok(Fetched::Missing) => {
            s.state = State::Missing;
            s.detail = format!("no file at {}", dest.location(host));
        }
        Ok(Fetched::Present { mtime_unix_s, text }) => {
            s.mtime_unix_s = mtime_unix_s;
            match Pinglist::parse(&text, Path::new(&dest.location(host))) {
                Err(e) => {
                    s.state = State::Invalid;
                    s.detail = e.to_string();
                }
                Ok(p) if p.host != host => {
                    s.state = State::Invalid;
                    s.found = Some(p.generation);
                    s.detail = format!("holds the pinglist of host {:?}", p.host);
                }
                Ok(p) => {
                    s.found = Some(p.generation);
                    s.state = match expected {
                        Some(e) if p.generation == e => State::Current,
                        Some(e) if p.generation > e => State::Ahead,
                        Some(_) => State::Stale,
                        None => {
                            s.detail = "the local pinglist is unreadable; regenerate".to_owned();
                            State::Invalid
                        }
                    };
                }
            }
        }
    }
    s
}

/// `unix_s` as UTC `YYYY-MM-DD HH:MM:SS`.
pub fn format_utc(unix_s: i64) -> String {
    let c = rocemesh_formats::time::civil_utc(unix_s);
    format!("{:04}-{:02}-{:02} {:02}:{:02}:{:02}", c.year, c.month, c.day, c.hour, c.minute, c.second)
}

/// The status table, problems last, with a summary line.
pub fn render(statuses: &[HostStatus]) -> String {
    let width = statuses.iter().map(|s| s.host.len()).max().unwrap_or(4).max(4);
    let mut out = format!(
        "{:<width$}  {:<11}  {:>10}  {:>10}  {:<19}  detail\n",
        "host", "state", "holds", "expected", "modified (UTC)"
    );
    let mut sorted: Vec<&HostStatus> = statuses.iter().collect();
    sorted.sort_by_key(|s| s.state);
    let show = |g: Option<u64>| g.map_or_else(|| "-".to_owned(), |g| g.to_string());
    for s in &sorted {
        let _ = writeln!(
            out,
            "{:<width$}  {:<11}  {:>10}  {:>10}  {:<19}  {}",
            s.host,
            s.state.as_str(),
            show(s.found),
            show(s.expected),
            s.mtime_unix_s.map_or_else(|| "-".to_owned(), format_utc),
            s.detail
        );
    }
    let mut counts: Vec<(State, usize)> = Vec::new();
    for s in &sorted {
        match counts.last_mut() {
            Some((state, n)) if *state == s.state => *n += 1,
            _ => counts.push((s.state, 1)),
        }
    }
    let summary: Vec<String> = counts.iter().map(|(s, n)| format!("{n} {}", s.as_str())).collect();
    let _ = writeln!(out, "{}", if summary.is_empty() { "no hosts".to_owned() } else { summary.join(", ") });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_dates() {
        assert_eq!(format_utc(0), "1970-01-01 00:00:00");
        assert_eq!(format_utc(1_700_000_000), "2023-11-14 22:13:20");
        assert_eq!(format_utc(951_782_400), "2000-02-29 00:00:00");
        assert_eq!(format_utc(-1), "1969-12-31 23:59:59");
    }

    #[test]
    fn the_fetch_command_reports_missing_and_present_files() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("p l.toml");
        let run = || {
            let out = std::process::Command::new("sh")
                .arg("-c")
                .arg(fetch_command(&path.display().to_string()))
                .output()
                .unwrap();
            String::from_utf8(out.stdout).unwrap()
        };
        assert_eq!(run(), "missing\n");
        std::fs::write(&path, "version = 1\n").unwrap();
        let out = run();
        let (mtime, text) = out.split_once('\n').unwrap();
        let now = std::time::SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs() as i64;
        assert!((mtime.parse::<i64>().unwrap() - now).abs() < 60, "{out}");
        assert_eq!(text, "version = 1\n");
    }
}
