//! `ctl push-pinglist`: copy each host's pinglist to the host, atomically, many at a time.
//!
//! Over ssh, the file goes to the remote shell's stdin and is written as a temporary file
//! next to the target, checked for length (a dropped connection must not install half a
//! list), fsynced where the remote `sync` accepts a file, and renamed over the target: the
//! agent, which reloads the file when it changes, sees the old list or the new one. With
//! [`Destination::Dir`] the same is done locally into `DIR/<host>/pinglist.toml` (a shared
//! filesystem the agents read).
//!
//! When the pinglist directory holds the fleet key file (`ctl keys rotate`), it goes first, to
//! the same directory as the pinglist on the host, readable only by its owner and the agent's
//! group, named explicitly (`--key-group`, the package's `rocemesh` by default; never the
//! directory's, which may be anyone's): a pinglist never arrives without the keys its probes
//! will be checked with. In directory mode it is written mode 0600, its owner's only.

use rocemesh_formats::inventory::FileError;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::error::Error;
use crate::import::natural_cmp;
use crate::pinglist_dir::{PinglistDir, atomic_write};
use crate::remote::{RemotePath, Ssh, run_parallel, sh_quote};

/// The file name under `DIR/<host>/` in directory mode.
pub const DIR_FILE_NAME: &str = "pinglist.toml";

/// Where the pinglists go.
#[derive(Debug, Clone)]
pub enum Destination {
    /// To each host over ssh, at `remote_path` (`{host}` replaced by the host's name).
    Ssh { ssh: Ssh, remote_path: RemotePath },
    /// Into `DIR/<host>/pinglist.toml`.
    Dir(PathBuf),
}

impl Destination {
    /// Where `host`'s pinglist is at the destination, for messages.
    pub fn location(&self, host: &str) -> String {
        match self {
            Destination::Ssh { remote_path, .. } => format!("{host}:{}", remote_path.for_host(host)),
            Destination::Dir(dir) => dir_path(dir, host).display().to_string(),
        }
    }
}

/// `DIR/<host>/pinglist.toml`.
pub fn dir_path(dir: &Path, host: &str) -> PathBuf {
    dir.join(host).join(DIR_FILE_NAME)
}

/// How one host's push went.
#[derive(Debug, Clone, PartialEq)]
pub struct HostResult {
    pub host: String,
    pub ok: bool,
    pub seconds: f64,
    /// Why it failed (empty when it did not).
    pub error: String,
    /// The generation pushed.
    pub generation: Option<u64>,
}

/// Pushes the pinglists of `hosts` from `from` to `dest`, `parallel` hosts at a time, calling
/// `done` as each host finishes. Never stops early: every host gets its result.
pub fn push(
    from: &PinglistDir,
    hosts: &[String],
    dest: &Destination,
    key_group: &str,
    parallel: usize,
    done: impl Fn(&HostResult) + Sync,
) -> Vec<HostResult> {
    // The key file is the fleet's, not a host's: read and validated once for every host. A
    // refused one fails every host, each with the reason.
    let keys = from.keys().map(|r| r.map(|(bytes, _)| bytes).map_err(|e| e.to_string()));
    run_parallel(hosts, parallel, |host| push_one(from, keys.as_ref(), host, dest, key_group), done)
}

fn push_one(
    from: &PinglistDir,
    keys: Option<&Result<Vec<u8>, String>>,
    host: &str,
    dest: &Destination,
    key_group: &str,
) -> HostResult {
    let start = Instant::now();
    let result = |ok: bool, error: String, generation: Option<u64>| HostResult {
        host: host.to_owned(),
        ok,
        seconds: start.elapsed().as_secs_f64(),
        error,
        generation,
    };
    // Validated before it leaves the bastion: an agent must never be handed a file it refuses.
    let (bytes, pinglist) = match from.read(host) {
        Ok(read) => read,
        Err(e) => return result(false, format!("local pinglist refused: {e}"), None),
    };
    let generation = Some(pinglist.generation);
    if let Some(keys) = keys {
        let bytes = match keys {
            Ok(bytes) => bytes,
            Err(e) => return result(false, format!("local key file refused: {e}"), generation),
        };
        if let Err(e) = push_keys(host, dest, bytes, key_group) {
            return result(false, format!("key file not installed (pinglist not pushed): {e}"), generation);
        }
    }
    match dest {
        Destination::Dir(dir) => {
            let path = dir_path(dir, host);
            let written =
                path.parent().map_or(Ok(()), std::fs::create_dir_all).and_then(|()| atomic_write(&path, &bytes, true));
            match written {
                Ok(()) => result(true, String::new(), generation),
                Err(e) => result(false, format!("{}: {e}", path.display()), generation),
            }
        }
        Destination::Ssh { ssh, remote_path } => {
            let command = push_command(&remote_path.for_host(host), bytes.len());
            match ssh.run(host, &command, Some(&bytes)) {
                Ok(out) if out.success() => result(true, String::new(), generation),
                Ok(out) => result(false, out.failure_summary(ssh.timeout), generation),
                Err(e) => result(false, e.to_string(), generation),
            }
        }
    }
}

/// Where the key file goes for a pinglist at `pinglist_path`: beside it.
pub fn keys_path_beside(pinglist_path: &str) -> String {
    match pinglist_path.rfind('/') {
        Some(i) => format!("{}/{}", &pinglist_path[..i], rocemesh_formats::keys::FILE_NAME),
        None => rocemesh_formats::keys::FILE_NAME.to_owned(),
    }
}

fn push_keys(host: &str, dest: &Destination, bytes: &[u8], key_group: &str) -> Result<(), String> {
    match dest {
        Destination::Dir(dir) => {
            let path = dir.join(host).join(rocemesh_formats::keys::FILE_NAME);
            std::fs::create_dir_all(dir.join(host))
                .and_then(|()| crate::keys::write_private(&path, bytes))
                .map_err(|e| format!("{}: {e}", path.display()))
        }
        Destination::Ssh { ssh, remote_path } => {
            let command = install_command(&keys_path_beside(&remote_path.for_host(host)), bytes.len(), Some(key_group));
            match ssh.run(host, &command, Some(bytes)) {
                Ok(out) if out.success() => Ok(()),
                Ok(out) => Err(out.failure_summary(ssh.timeout)),
                Err(e) => Err(e.to_string()),
            }
        }
    }
}

/// The remote command that installs stdin at `path`, refusing anything but `len` bytes.
/// Run by `sh` whatever the login shell is.
pub fn push_command(path: &str, len: usize) -> String {
    install_command(path, len, None)
}

/// [`push_command`]; with `secret_group`, the file is a secret: created mode 0600 (umask 077),
/// given that group, then made 0640 (the key file: the agent reads it through its group,
/// nobody else can).
fn install_command(path: &str, len: usize, secret_group: Option<&str>) -> String {
    // A key file the agent's group cannot read would make the agent refuse every packet, so a
    // failed chgrp fails the push (with the file left as it was) instead of passing quietly.
    let (umask, chgrp) = match secret_group {
        Some(group) => (
            "077",
            format!(
                r#"chgrp -- {g} "$t" && chmod 0640 -- "$t" || {{ echo "--key-group "{g}" not given to $f: name the group the agent reads it through (the package creates rocemesh), and push as root or as a member of it" >&2; exit 1; }}"#,
                g = sh_quote(group)
            ),
        ),
        None => ("022", String::new()),
    };
    // Directories under 027 (the agent's group enters them), the file under its own umask.
    let script = format!(
        r#"set -eu
f={path}
d=$(dirname -- "$f")
umask 027
mkdir -p -- "$d"
umask {umask}
t="$d/.$(basename -- "$f").ctl-tmp.$$"
trap 'rm -f -- "$t"' EXIT
cat > "$t"
{chgrp}
n=$(($(wc -c < "$t")))
if [ "$n" -ne {len} ]; then echo "received $n of {len} bytes; $f left as it was" >&2; exit 1; fi
sync -- "$t" 2>/dev/null || sync
mv -f -- "$t" "$f"
trap - EXIT
sync -- "$d" 2>/dev/null || true
"#,
        path = sh_quote(path),
    );
    format!("sh -c {}", sh_quote(&script))
}

/// Records `results` in the TSV file `--retry-failed` reads (host, result, seconds, error).
/// Hosts already in the file and not in `results` keep their line, so that pushing a few
/// hosts after a full push does not forget the full push's failures.
pub fn write_results(path: &Path, results: &[HostResult]) -> Result<(), Error> {
    let mut merged: Vec<HostResult> = match read_results(path) {
        Ok(old) => old.into_iter().filter(|o| !results.iter().any(|r| r.host == o.host)).collect(),
        Err(_) => Vec::new(),
    };
    merged.extend(results.iter().cloned());
    merged.sort_by(|a, b| natural_cmp(&a.host, &b.host));
    let mut text = String::from(
        "# ctl push-pinglist results, the last push of each host; `ctl push-pinglist --retry-failed FILE` retries the failed\n",
    );
    text.push_str("host\tresult\tseconds\terror\n");
    for r in &merged {
        let error: String = r.error.chars().map(|c| if c.is_control() || c == '\t' { ' ' } else { c }).collect();
        let _ = writeln!(text, "{}\t{}\t{:.2}\t{error}", r.host, if r.ok { "ok" } else { "failed" }, r.seconds);
    }
    atomic_write(path, text.as_bytes(), false).map_err(|e| Error::io(path, "write the push results", e))
}

/// The hosts a results file lists as failed, in file order.
pub fn read_failed(path: &Path) -> Result<Vec<String>, Error> {
    Ok(read_results(path)?.into_iter().filter(|r| !r.ok).map(|r| r.host).collect())
}

/// Every line of a results file.
pub fn read_results(path: &Path) -> Result<Vec<HostResult>, Error> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, "read the push results", e))?;
    let mut results = Vec::new();
    let fix = "pass the results file a push wrote (--results), or delete it";
    for (i, line) in text.lines().enumerate() {
        if line.starts_with('#') || line.trim().is_empty() || line.starts_with("host\t") {
            continue;
        }
        let fields: Vec<&str> = line.split('\t').collect();
        if fields.len() < 2 {
            return Err(Error::File(FileError::new(
                path,
                Some(i + 1),
                "",
                "not a result line (host<TAB>result<TAB>seconds<TAB>error)",
                fix,
            )));
        }
        let ok = match fields[1] {
            "ok" => true,
            "failed" => false,
            other => {
                return Err(Error::File(FileError::new(
                    path,
                    Some(i + 1),
                    "result",
                    format!("result {other:?} is neither ok nor failed"),
                    fix,
                )));
            }
        };
        results.push(HostResult {
            host: fields[0].to_owned(),
            ok,
            seconds: fields.get(2).and_then(|s| s.parse().ok()).unwrap_or(0.0),
            error: fields.get(3).map_or_else(String::new, |s| (*s).to_owned()),
            generation: None,
        });
    }
    Ok(results)
}

/// The result table: one row per host, failures last so that they stay on screen.
pub fn render_table(results: &[HostResult]) -> String {
    let width = results.iter().map(|r| r.host.len()).max().unwrap_or(4).max(4);
    let mut out = format!("{:<width$}  {:<6}  {:>8}  error\n", "host", "result", "seconds");
    let (ok, failed): (Vec<&HostResult>, Vec<&HostResult>) = results.iter().partition(|r| r.ok);
    for r in ok.iter().chain(failed.iter()) {
        let _ = writeln!(
            out,
            "{:<width$}  {:<6}  {:>8.2}  {}",
            r.host,
            if r.ok { "ok" } else { "FAILED" },
            r.seconds,
            r.error
        );
    }
    let slowest = results.iter().map(|r| r.seconds).fold(0.0, f64::max);
    let _ = writeln!(out, "{} ok, {} failed; slowest {:.2} s", ok.len(), failed.len(), slowest);
    out
}

/// How long a push waits for one host by default.
pub const DEFAULT_HOST_TIMEOUT: Duration = Duration::from_secs(60);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pinglist_dir::{Manifest, write_pinglists};
    use rocemesh_formats::pinglist::{self, Pinglist};

    fn pl(host: &str) -> Pinglist {
        Pinglist {
            version: pinglist::VERSION,
            host: host.to_owned(),
            generation: 9,
            generated_unix_ns: 1,
            timeout_ms: 500,
            targets: Vec::new(),
        }
    }

    #[test]
    fn the_push_command_installs_exactly_what_it_is_given() {
        let tmp = tempfile::tempdir().unwrap();
        let target = tmp.path().join("a dir/it's/pinglist.toml");
        let body = b"version = 1\n";
        let run = |len: usize, input: &[u8]| {
            let mut child = std::process::Command::new("sh")
                .arg("-c")
                .arg(push_command(&target.display().to_string(), len))
                .stdin(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            std::io::Write::write_all(child.stdin.as_mut().unwrap(), input).unwrap();
            child.wait_with_output().unwrap()
        };
        let out = run(body.len(), body);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(std::fs::read(&target).unwrap(), body);
        // A short transfer leaves the old file, says so, and leaves no temporary behind.
        let out = run(100, b"version = 2\n");
        assert!(!out.status.success());
        assert!(String::from_utf8_lossy(&out.stderr).contains("received 12 of 100 bytes"));
        assert_eq!(std::fs::read(&target).unwrap(), body);
        assert_eq!(std::fs::read_dir(target.parent().unwrap()).unwrap().count(), 1);
    }

    /// The key file's install creates its directory 0750 (the agent's group enters it) and the
    /// file 0640 with the named group: a directory made under the file's umask 077 was 0700,
    /// and the agent could read neither the keys nor the pinglist pushed after them.
    #[test]
    fn the_key_install_makes_a_directory_the_agents_group_can_enter() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let target = tmp.path().join("new/etc/fleet-keys.toml");
        let group = String::from_utf8(std::process::Command::new("id").arg("-gn").output().unwrap().stdout).unwrap();
        let body = b"version = 1\n";
        let mut child = std::process::Command::new("sh")
            .arg("-c")
            .arg(install_command(&target.display().to_string(), body.len(), Some(group.trim())))
            .stdin(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        std::io::Write::write_all(child.stdin.as_mut().unwrap(), body).unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(target.parent().unwrap()), 0o750);
        assert_eq!(mode(&target), 0o640);
    }

    #[test]
    fn directory_mode_and_results_round_trip() {
        let tmp = tempfile::tempdir().unwrap();
        let gen_dir = tmp.path().join("gen");
        let manifest = Manifest { generation: 9, generated_unix_ns: 1, seed: 0, hosts: 2, generations_to_cover: 1 };
        write_pinglists(&gen_dir, &[pl("h1"), pl("h2")], &manifest).unwrap();
        std::fs::write(gen_dir.join("bad.toml"), "version = 1\n").unwrap();
        let from = PinglistDir::open(&gen_dir).unwrap();
        let shared = tmp.path().join("shared");
        let hosts = from.select(None).unwrap();
        let results = push(&from, &hosts, &Destination::Dir(shared.clone()), "rocemesh", 2, |_| {});
        let ok: Vec<(&str, bool)> = results.iter().map(|r| (r.host.as_str(), r.ok)).collect();
        assert_eq!(ok, [("bad", false), ("h1", true), ("h2", true)]);
        assert!(results[0].error.contains("local pinglist refused"), "{}", results[0].error);
        assert_eq!(Pinglist::load(dir_path(&shared, "h2")).unwrap(), pl("h2"));
        assert!(!shared.join("bad").exists());

        let file = tmp.path().join("results.tsv");
        write_results(&file, &results).unwrap();
        assert_eq!(read_failed(&file).unwrap(), ["bad"]);
        let table = render_table(&results);
        assert!(table.lines().nth(3).unwrap().starts_with("bad   FAILED"), "{table}");
        assert!(table.ends_with("2 ok, 1 failed; slowest 0.00 s\n") || table.contains("2 ok, 1 failed"), "{table}");

        // A later push of some hosts keeps the others' lines.
        let h1_failed = HostResult { ok: false, error: "later\tfailure".into(), ..results[1].clone() };
        write_results(&file, &[h1_failed]).unwrap();
        assert_eq!(read_failed(&file).unwrap(), ["bad", "h1"]);
        assert_eq!(read_results(&file).unwrap()[1].error, "later failure");

        std::fs::write(&file, "host\tresult\nh1\tmaybe\n").unwrap();
        let e = read_failed(&file).unwrap_err().to_string();
        assert!(e.contains(":2: result"), "{e}");
    }

    /// The process's umask, read without changing it.
    fn umask() -> u32 {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let line = status.lines().find(|l| l.starts_with("Umask:")).expect("Linux >= 4.7 shows the umask");
        u32::from_str_radix(line.split_whitespace().nth(1).unwrap(), 8).unwrap()
    }

    /// Key files are written private with their own mode, never by flipping the process's
    /// umask: 32 hosts pushed at once, five times over, each with the key file, must leave every
    /// pinglist and host directory with the umask's modes and every key file 0600. (The umask
    /// flipped to 077 by one thread's key write gave other threads' pinglists 0600 and host
    /// directories 0700 at random.)
    #[test]
    fn parallel_directory_pushes_with_keys_leave_every_mode_as_it_should_be() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let gen_dir = tmp.path().join("gen");
        let hosts: Vec<Pinglist> = (0..32).map(|i| pl(&format!("h{i:02}"))).collect();
        let manifest = Manifest { generation: 9, generated_unix_ns: 1, seed: 0, hosts: 32, generations_to_cover: 1 };
        write_pinglists(&gen_dir, &hosts, &manifest).unwrap();
        crate::keys::rotate(&gen_dir, 1_764_000_000, 600).unwrap();
        let from = PinglistDir::open(&gen_dir).unwrap();
        let names = from.select(None).unwrap();
        let mask = umask();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        for round in 0..5 {
            let shared = tmp.path().join(format!("shared{round}"));
            let results = push(&from, &names, &Destination::Dir(shared.clone()), "rocemesh", 32, |_| {});
            assert!(results.iter().all(|r| r.ok), "{results:?}");
            for h in &names {
                let dir = shared.join(h);
                assert_eq!(mode(&dir), 0o777 & !mask, "{}", dir.display());
                assert_eq!(mode(&dir_path(&shared, h)), 0o666 & !mask, "{h}'s pinglist");
                assert_eq!(mode(&dir.join(rocemesh_formats::keys::FILE_NAME)), 0o600, "{h}'s key file");
                let left: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().map(|e| e.file_name()).collect();
                assert_eq!(left.len(), 2, "no temporary file left behind: {left:?}");
            }
        }
        assert_eq!(mode(&crate::keys::path(&gen_dir)), 0o600, "the key file itself");
    }
}
