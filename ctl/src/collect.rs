//! `ctl collect`: sealed segments from every host into one collection directory, over the
//! system's ssh (as `push-pinglist` reaches hosts).
//!
//! Layout: `OUT/<YYYY-MM-DD>/<host>/<shard>/<file>.rseg.zst`, the date (UTC) of the segment's
//! first record as its name carries it; damaged files go to `OUT/damaged/<host>/<shard>/`.
//!
//! - Only sealed files (`*.rseg.zst`) are listed: the agent writes `.rseg` while open and seals
//!   through a `.tmp` it renames, so a listed file never changes again.
//! - A file arrives as `<file>.part` and is renamed into place only after the segment reader
//!   validated all of it (every chunk's checksum, the close block): a `.rseg.zst` in the
//!   collection is always whole and verified, and a re-run fetches only what is not there
//!   (a stray `.part` is fetched again from the start).
//! - The agent's quota may evict a sealed file at any time. A transfer already started reads
//!   the unlinked file to its end (POSIX keeps the inode while it is open), so nothing is cut
//!   short under it; a file evicted between the listing and its transfer is reported as
//!   `evicted`, never as a failure of the host.
//! - `--remove` deletes a file on its host only once the local copy is verified; damaged files
//!   stay on the host.
//! - Hosts are handled `parallel` at a time, each transfer at most `bwlimit` bytes per second.

use std::io::{BufRead, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rocemesh_formats::segment::{DamageKind, SEALED_SUFFIX, SegmentReader, name_first_ms};

use crate::remote::{RemotePath, Ssh, run_parallel, sh_quote};

/// How to collect.
#[derive(Debug, Clone)]
pub struct Options {
    /// How hosts are reached (its timeout bounds the listing and each removal).
    pub ssh: Ssh,
    /// The agent's segment directory on each host; `{host}` is replaced by the host's name.
    pub remote_dir: RemotePath,
    /// The collection directory.
    pub out: PathBuf,
    /// Hosts handled at once.
    pub parallel: usize,
    /// Bytes per second of each transfer at most (0: unlimited).
    pub bwlimit_bytes_per_s: u64,
    /// Delete each file on its host once its local copy is verified.
    pub remove: bool,
    /// A host whose newest sealed segment is older than this is `stale` (its agent seals
    /// nothing: stopped, stuck, or its disk full).
    pub stale_after: Duration,
}

/// What happened on one host.
#[derive(Debug, Clone, Default)]
pub struct HostReport {
    pub host: String,
    /// Why the host could not be collected (unreachable, no segment directory...); empty: ok.
    pub error: String,
    /// Sealed files on the host.
    pub listed: usize,
    /// Fetched and verified in this run.
    pub fetched: usize,
    /// Already in the collection.
    pub present: usize,
    /// Fetched but damaged: set apart under `damaged/`.
    pub damaged: Vec<String>,
    /// Evicted by the agent's quota between the listing and the transfer.
    pub evicted: usize,
    /// Transfers that failed (retried by the next run).
    pub failed: Vec<String>,
    /// Deleted on the host after verification.
    pub removed: usize,
    /// Bytes fetched.
    pub bytes: u64,
    /// Age of the host's newest sealed segment.
    pub newest_age: Option<Duration>,
    /// Stale: see [`Options::stale_after`].
    pub stale: bool,
    pub elapsed: Duration,
}

impl HostReport {
    /// Whether anything needs the operator.
    pub fn is_problem(&self) -> bool {
        !self.error.is_empty() || !self.damaged.is_empty() || !self.failed.is_empty() || self.stale
    }
}

/// One sealed file on a host.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Listed {
    /// Path under the segment directory (`<shard>/<file>`).
    rel: String,
    bytes: u64,
    mtime_s: u64,
}

/// Collect from `hosts`; `done` is called as each host finishes (a progress bar).
pub fn collect(hosts: &[String], opts: &Options, done: impl Fn(&HostReport) + Sync) -> Vec<HostReport> {
    run_parallel(hosts, opts.parallel, |h| collect_host(h, opts), done)
}

fn collect_host(host: &str, opts: &Options) -> HostReport {
    let start = Instant::now();
    let mut r = HostReport { host: host.to_owned(), ..HostReport::default() };
    let dir = opts.remote_dir.for_host(host);
    let files = match list(host, &dir, &opts.ssh) {
        Ok(f) => f,
        Err(e) => {
            r.error = e;
            r.elapsed = start.elapsed();
            return r;
        }
    };
    r.listed = files.len();
    let now_s = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    // After `--remove` the host holds nothing sealed until its next seal: what was collected
    // counts too (by its first record's time, which is at most a segment's age before its seal).
    let newest = files.iter().map(|f| f.mtime_s).chain(newest_collected_s(&opts.out, host)).max();
    r.newest_age = newest.map(|m| Duration::from_secs(now_s.saturating_sub(m)));
    r.stale = r.newest_age.is_none_or(|a| a > opts.stale_after);
    let mut verified = Vec::new();
    let mut wanted = Vec::new();
    for f in &files {
        let local = local_path(&opts.out, host, &f.rel);
        let damaged = opts.out.join("damaged").join(host).join(&f.rel);
        if size_of(&local) == Some(f.bytes) {
            r.present += 1;
            verified.push(f.rel.clone());
        } else if size_of(&damaged) == Some(f.bytes) {
            r.damaged.push(f.rel.clone());
        } else {
            wanted.push(f);
        }
    }
    for batch in wanted.chunks(FILES_PER_SESSION) {
        for (f, result) in batch.iter().zip(fetch_batch(host, &dir, batch, opts)) {
            match result {
                Fetched::Verified(bytes) => {
                    r.fetched += 1;
                    r.bytes += bytes;
                    verified.push(f.rel.clone());
                }
                Fetched::Damaged(bytes, why) => {
                    r.bytes += bytes;
                    r.damaged.push(format!("{} ({why})", f.rel));
                }
                Fetched::Evicted => r.evicted += 1,
                Fetched::Failed(why) => r.failed.push(format!("{}: {why}", f.rel)),
            }
        }
    }
    if opts.remove && !verified.is_empty() {
        match remove(host, &dir, &verified, &opts.ssh) {
            Ok(()) => r.removed = verified.len(),
            Err(e) => r.failed.push(format!("removing {} verified files: {e}", verified.len())),
        }
    }
    r.elapsed = start.elapsed();
    r
}

/// Sealed files under `dir` on `host`, oldest first (the quota evicts those first).
fn list(host: &str, dir: &str, ssh: &Ssh) -> Result<Vec<Listed>, String> {
    // Exit 3: no such directory (the agent never ran, or a wrong --remote-dir), said as such.
    let command = format!(
        "cd {} 2>/dev/null || exit 3; find . -type f -name '*{SEALED_SUFFIX}' -printf '%P\\t%s\\t%T@\\n'",
        sh_quote(dir)
    );
    let out = ssh.run(host, &command, None).map_err(|e| e.to_string())?;
    if out.exit_code == Some(3) {
        return Err(format!("no segment directory {dir} (fix: --remote-dir, the agent's segment_dir)"));
    }
    if !out.success() {
        return Err(out.failure_summary(ssh.timeout));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let mut files = Vec::new();
    for line in text.lines().filter(|l| !l.is_empty()) {
        let mut parts = line.split('\t');
        let (Some(rel), Some(bytes), Some(mtime)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(format!("unexpected listing line {line:?}"));
        };
        // A name with a path separator beyond <shard>/<file>, or `..`, is not the agent's.
        if rel.split('/').count() > 2
            || rel.split('/').any(|c| c == ".." || c.is_empty())
            || rel.chars().any(|c| c.is_whitespace() || c.is_control())
        {
            return Err(format!("unexpected file {rel:?} in {dir}"));
        }
        let bytes = bytes.parse().map_err(|_| format!("unexpected size in {line:?}"))?;
        let mtime_s = mtime.split('.').next().and_then(|s| s.parse().ok()).unwrap_or(0);
        files.push(Listed { rel: rel.to_owned(), bytes, mtime_s });
    }
    files.sort_by(|a, b| (a.mtime_s, &a.rel).cmp(&(b.mtime_s, &b.rel)));
    Ok(files)
}

/// `OUT/<date>/<host>/<rel>`, the date from the file name's leading Unix milliseconds.
pub fn local_path(out: &Path, host: &str, rel: &str) -> PathBuf {
    let name = rel.rsplit('/').next().unwrap_or(rel);
    let date = name_first_ms(name).map_or_else(|| "undated".to_owned(), date_of_ms);
    out.join(date).join(host).join(rel)
}

/// UTC calendar date of Unix milliseconds, `YYYY-MM-DD`.
fn date_of_ms(ms: u64) -> String {
    rocemesh_formats::time::utc_date((ms / 1_000) as i64)
}

/// First-record time (Unix s) of the newest file of `host` in the collection.
fn newest_collected_s(out: &Path, host: &str) -> Option<u64> {
    let mut dates: Vec<PathBuf> = std::fs::read_dir(out).ok()?.flatten().map(|e| e.path()).collect();
    dates.sort();
    // Date directories sort by date; the newest one holding the host has its newest file.
    for d in dates.iter().rev().filter(|d| d.file_name().is_some_and(|n| n != "damaged" && n != "undated")) {
        let newest = std::fs::read_dir(d.join(host))
            .into_iter()
            .flatten()
            .flatten()
            .flat_map(|shard| std::fs::read_dir(shard.path()).into_iter().flatten().flatten())
            .filter_map(|f| name_first_ms(&f.file_name().to_string_lossy()))
            .max();
        if let Some(ms) = newest {
            return Some(ms / 1_000);
        }
    }
    None
}

fn size_of(p: &Path) -> Option<u64> {
    std::fs::metadata(p).ok().filter(|m| m.is_file()).map(|m| m.len())
}

enum Fetched {
    Verified(u64),
    Damaged(u64, String),
    Evicted,
    Failed(String),
}

/// Files per ssh session: one connection costs a handshake (about 0.3 s on these machines, more
/// through a jump host), so files are streamed many to a session.
const FILES_PER_SESSION: usize = 200;

/// Fetch `files` of `host` (under `dir`) in one ssh session; one result per file, in order.
/// A session that breaks fails the rest of its files (the next run fetches them).
fn fetch_batch(host: &str, dir: &str, files: &[&Listed], opts: &Options) -> Vec<Fetched> {
    let mut out: Vec<Fetched> = Vec::with_capacity(files.len());
    let fail_rest = |out: &mut Vec<Fetched>, why: &str| {
        while out.len() < files.len() {
            out.push(Fetched::Failed(why.to_owned()));
        }
    };
    // Per file: open it first (fd 3), then its size from the open file, then the bytes from the
    // same open file: a file the quota evicts meanwhile is still read whole (POSIX keeps the
    // inode), and a file already gone is `E` (evicted), never a short read.
    let names: Vec<String> = files.iter().map(|f| sh_quote(&f.rel)).collect();
    let command = format!(
        "cd {} || exit 3; for f in {}; do {{ s=$(stat -L -c %s /dev/fd/3) && printf 'F %s %s\\n' \"$s\" \"$f\" && \
         cat <&3; }} 3<\"$f\" 2>/dev/null || printf 'E %s\\n' \"$f\"; done",
        sh_quote(dir),
        names.join(" ")
    );
    let mut child = match Command::new(&opts.ssh.program)
        .args(opts.ssh.args(host, &command))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            fail_rest(&mut out, &format!("running {}: {e}", opts.ssh.program.display()));
            return out;
        }
    };
    let mut stderr = child.stderr.take();
    let err_reader = std::thread::spawn(move || {
        let mut s = Vec::new();
        if let Some(e) = stderr.as_mut() {
            let _ = e.read_to_end(&mut s);
        }
        s
    });
    let Some(stdout) = child.stdout.take() else {
        fail_rest(&mut out, "no pipe from ssh");
        return out;
    };
    let mut stream = Throttled::new(std::io::BufReader::with_capacity(256 * 1024, stdout), opts.bwlimit_bytes_per_s);
    // Receiving (ssh's decryption) and verifying (zstd and checksums) each take a core: a
    // verifier thread takes each file as it lands while the next one streams in.
    let mut slots: Vec<Option<Fetched>> = files.iter().map(|_| None).collect();
    std::thread::scope(|sc| {
        let (tx, rx) = std::sync::mpsc::channel::<(usize, PathBuf, PathBuf, PathBuf)>();
        let verifier = sc.spawn(move || {
            rx.into_iter()
                .map(|(i, part, local, damaged)| (i, verify_and_place(&part, files[i], &local, &damaged)))
                .collect::<Vec<_>>()
        });
        for (i, f) in files.iter().enumerate() {
            let local = local_path(&opts.out, host, &f.rel);
            let damaged = opts.out.join("damaged").join(host).join(&f.rel);
            match receive_one(&mut stream, f, &local) {
                Ok(Received::Done(r)) => slots[i] = Some(r),
                Ok(Received::Part(part)) => {
                    if let Err(std::sync::mpsc::SendError((_, part, ..))) = tx.send((i, part, local, damaged)) {
                        let _ = std::fs::remove_file(part);
                        slots[i] = Some(Fetched::Failed("the verifier thread is gone".into()));
                    }
                }
                Err(why) => {
                    slots[i] = Some(Fetched::Failed(why));
                    break;
                }
            }
        }
        drop(tx);
        // A panicked verifier leaves its files without a result: failed below, fetched again by
        // the next run (their `.part` files are overwritten then).
        if let Ok(done) = verifier.join() {
            for (i, r) in done {
                slots[i] = Some(r);
            }
        }
    });
    // Everything up to the first missing result came through; the rest did not.
    for r in slots {
        match r {
            Some(r) => out.push(r),
            None => break,
        }
    }
    let _ = child.kill();
    let status = child.wait();
    let stderr = err_reader.join().unwrap_or_default();
    if out.len() < files.len() || out.iter().any(|r| matches!(r, Fetched::Failed(_))) {
        let why = match status.map(|s| s.code()) {
            Ok(Some(3)) => format!("no segment directory {dir}"),
            _ => crate::remote::excerpt(&stderr),
        };
        for r in &mut out {
            if let Fetched::Failed(w) = r
                && !why.is_empty()
            {
                *w = format!("{w} ({why})");
            }
        }
        fail_rest(&mut out, if why.is_empty() { "the ssh session ended early" } else { &why });
    }
    out
}

/// What the stream gave for one file.
enum Received {
    /// Nothing to verify (evicted, or not the listed file).
    Done(Fetched),
    /// Its bytes, whole and fsynced, in this `.part` file.
    Part(PathBuf),
}

/// The stream's next file: its header, then its bytes into `.part`. `Err` when the stream itself
/// broke (the session's remaining files cannot be trusted).
fn receive_one(stream: &mut impl BufRead, f: &Listed, local: &Path) -> Result<Received, String> {
    let mut header = Vec::new();
    let n = (&mut *stream).take(4096).read_until(b'\n', &mut header).map_err(|e| format!("receiving: {e}"))?;
    if n == 0 {
        return Err("the ssh session ended early".into());
    }
    let header = String::from_utf8_lossy(&header);
    let header = header.trim_end_matches('\n');
    if header == format!("E {}", f.rel) {
        return Ok(Received::Done(Fetched::Evicted));
    }
    let size: u64 = match header.strip_prefix("F ").and_then(|r| r.split_once(' ')) {
        Some((size, name)) if name == f.rel => size.parse().map_err(|_| format!("bad header {header:?}"))?,
        _ => return Err(format!("unexpected header {header:?} for {}", f.rel)),
    };
    let part = PathBuf::from(format!("{}.part", local.display()));
    let written = (|| -> std::io::Result<u64> {
        if let Some(d) = part.parent() {
            std::fs::create_dir_all(d)?;
        }
        let mut file = std::fs::File::create(&part)?;
        let n = std::io::copy(&mut (&mut *stream).take(size), &mut file)?;
        file.sync_all()?;
        Ok(n)
    })();
    let written = match written {
        Ok(n) => n,
        Err(e) => {
            let _ = std::fs::remove_file(&part);
            return Err(format!("receiving {} into {}: {e}", f.rel, part.display()));
        }
    };
    if written != size {
        let _ = std::fs::remove_file(&part);
        return Err(format!("{}: got {written} bytes of {size}", f.rel));
    }
    if size != f.bytes {
        // Sealed files do not change: a different size is not the file that was listed.
        let _ = std::fs::remove_file(&part);
        return Ok(Received::Done(Fetched::Failed(format!("{} bytes, listed as {}", size, f.bytes))));
    }
    Ok(Received::Part(part))
}

fn verify_and_place(part: &Path, f: &Listed, local: &Path, damaged: &Path) -> Fetched {
    let verdict = match SegmentReader::open(part) {
        Ok(r) if !r.is_sealed() => Err("not sealed".to_owned()),
        // Summaries set aside cost no record: the file's records are whole.
        Ok(r) if r.damage().iter().any(|d| d.kind != DamageKind::Summary) => {
            Err(format!("{} damaged region(s)", r.damage().len()))
        }
        Ok(_) => Ok(()),
        Err(e) => Err(e
            .to_string()
            .replace(&format!("{}: ", part.display()), "")
            .replace(&part.display().to_string(), &f.rel)),
    };
    let (target, result) = match verdict {
        Ok(()) => (local, Fetched::Verified(f.bytes)),
        Err(why) => (damaged, Fetched::Damaged(f.bytes, why)),
    };
    let placed = target
        .parent()
        .map_or(Ok(()), std::fs::create_dir_all)
        .and_then(|()| std::fs::rename(part, target))
        .and_then(|()| sync_dir(target));
    match placed {
        Ok(()) => result,
        Err(e) => {
            let _ = std::fs::remove_file(part);
            Fetched::Failed(format!("placing {}: {e}", target.display()))
        }
    }
}

fn sync_dir(file: &Path) -> std::io::Result<()> {
    match file.parent() {
        Some(d) => std::fs::File::open(d)?.sync_all(),
        None => Ok(()),
    }
}

/// A reader that sleeps until the bytes read so far fit `bytes_per_s` (0: unlimited): the
/// pipe and ssh's window back up, and the host's `cat` waits.
struct Throttled<R> {
    inner: R,
    bytes_per_s: u64,
    read: u64,
    start: Instant,
}

impl<R> Throttled<R> {
    fn new(inner: R, bytes_per_s: u64) -> Self {
        Self { inner, bytes_per_s, read: 0, start: Instant::now() }
    }

    fn account(&mut self, n: usize) {
        self.read += n as u64;
        if self.bytes_per_s > 0 {
            let due = Duration::from_secs_f64(self.read as f64 / self.bytes_per_s as f64);
            if let Some(wait) = due.checked_sub(self.start.elapsed()) {
                std::thread::sleep(wait);
            }
        }
    }
}

impl<R: Read> Read for Throttled<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.account(n);
        Ok(n)
    }
}

impl<R: BufRead> BufRead for Throttled<R> {
    fn fill_buf(&mut self) -> std::io::Result<&[u8]> {
        self.inner.fill_buf()
    }

    fn consume(&mut self, amt: usize) {
        self.inner.consume(amt);
        self.account(amt);
    }
}

/// Delete `rels` under `dir` on `host`.
fn remove(host: &str, dir: &str, rels: &[String], ssh: &Ssh) -> Result<(), String> {
    // In batches: a command line has a limit, and thousands of files are normal after a week.
    for chunk in rels.chunks(500) {
        let names: Vec<String> = chunk.iter().map(|r| sh_quote(r)).collect();
        let command = format!("cd {} && rm -f -- {}", sh_quote(dir), names.join(" "));
        let out = ssh.run(host, &command, None).map_err(|e| e.to_string())?;
        if !out.success() {
            return Err(out.failure_summary(ssh.timeout));
        }
    }
    Ok(())
}

/// The summary: one line per host with a problem, then the totals.
pub fn render(reports: &[HostReport], elapsed: Duration) -> String {
    let mut out = String::new();
    for r in reports.iter().filter(|r| r.is_problem()) {
        let mut why = Vec::new();
        if !r.error.is_empty() {
            why.push(r.error.clone());
        }
        if r.stale {
            why.push(match r.newest_age {
                Some(a) => format!("stale: newest sealed segment {} s old", a.as_secs()),
                None => "stale: no sealed segment".to_owned(),
            });
        }
        for d in &r.damaged {
            why.push(format!("damaged, set apart: {d}"));
        }
        for f in &r.failed {
            why.push(format!("failed: {f}"));
        }
        out.push_str(&format!("{}: {}\n", r.host, why.join("; ")));
    }
    let ok = reports.iter().filter(|r| r.error.is_empty()).count();
    let failed = reports.len() - ok;
    let stale = reports.iter().filter(|r| r.error.is_empty() && r.stale).count();
    let sum = |f: fn(&HostReport) -> usize| reports.iter().map(f).sum::<usize>();
    let bytes: u64 = reports.iter().map(|r| r.bytes).sum();
    let secs = elapsed.as_secs_f64().max(1e-3);
    out.push_str(&format!(
        "hosts: {ok} ok ({stale} stale), {failed} failed; files: {} fetched, {} already here, {} damaged, {} evicted \
         before transfer, {} failed, {} removed; {:.1} MiB in {:.1} s ({:.1} MiB/s)\n",
        sum(|r| r.fetched),
        sum(|r| r.present),
        sum(|r| r.damaged.len()),
        sum(|r| r.evicted),
        sum(|r| r.failed.len()),
        sum(|r| r.removed),
        bytes as f64 / (1 << 20) as f64,
        secs,
        bytes as f64 / (1 << 20) as f64 / secs
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_come_from_the_names_leading_milliseconds() {
        assert_eq!(date_of_ms(0), "1970-01-01");
        assert_eq!(date_of_ms(1_795_513_339_092), "2026-11-24");
        assert_eq!(date_of_ms(951_782_400_000), "2000-02-29");
        let p = local_path(Path::new("/c"), "h1", "mlx5_0/1795513339092-h1-mlx5_0-1a5a4e58-000000.rseg.zst");
        assert_eq!(p, Path::new("/c/2026-11-24/h1/mlx5_0/1795513339092-h1-mlx5_0-1a5a4e58-000000.rseg.zst"));
        assert!(local_path(Path::new("/c"), "h1", "x/foo.rseg.zst").starts_with("/c/undated/h1"));
    }
}
