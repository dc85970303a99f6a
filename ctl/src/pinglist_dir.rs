//! A directory of generated pinglists, `DIR/<host>.toml`, and its `generation.ctl` manifest.
//!
//! `gen-pinglists` writes it; `push-pinglist`, `diff` and `status` read it. Only `*.toml` files
//! are pinglists, so push results and the manifest can live beside them.
//!
//! **A generation is replaced as a whole, under a lock.** The writer holds an exclusive
//! `flock` on `DIR/.gen-pinglists.lock` and readers a shared one for as long as they use the
//! directory, so a push never sends some hosts the old generation and others the new, and
//! the writer may rewrite files in place: on this project's 2-core machine (tmpfs), replacing
//! 100,000 files each by a temporary file and a rename cost 1.8-2.5 s, rewriting them in place
//! 0.7-1.0 s (the `gen-pinglists` bench measures both as baselines). A marker,
//! `DIR/.gen-pinglists.incomplete`, exists from the first file written until the manifest is,
//! so the files of an interrupted run (a mix of generations) are refused by every reader.
//! Agents must not read this directory while it is regenerated: push replaces their copy by
//! rename.

use std::collections::HashSet;
use std::ffi::CStr;
use std::fs::File;
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rocemesh_formats::inventory::FileError;
use rocemesh_formats::keys::FleetKeys;
use rocemesh_formats::pinglist::Pinglist;
use serde::{Deserialize, Serialize};

use crate::error::Error;
use crate::import::natural_cmp;

/// The manifest's file name (not `.toml`: it is not a pinglist).
pub const MANIFEST: &str = "generation.ctl";
/// Locked exclusively by `gen-pinglists`, shared by every reader (see the module docs).
pub const LOCK: &str = ".gen-pinglists.lock";
/// Present while `gen-pinglists` writes, and after a run that did not finish.
pub const INCOMPLETE: &str = ".gen-pinglists.incomplete";

/// Takes `dir`'s generation lock: shared (waiting for a running `gen-pinglists`, which takes
/// seconds), or exclusive (failing at once if any reader holds it: a push can take minutes).
/// `None` for a reader that cannot create the lock file in a directory without one (a
/// read-only copy, where no `gen-pinglists` can write either).
fn lock(dir: &Path, exclusive: bool) -> Result<Option<Arc<File>>, Error> {
    let path = dir.join(LOCK);
    let file = match std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(&path) {
        Ok(f) => f,
        Err(e)
            if !exclusive
                && matches!(
                    e.kind(),
                    std::io::ErrorKind::PermissionDenied | std::io::ErrorKind::ReadOnlyFilesystem
                ) =>
        {
            match File::open(&path) {
                Ok(f) => f,
                Err(_) => return Ok(None),
            }
        }
        Err(e) => return Err(Error::io(&path, "open the generation lock", e)),
    };
    let op = if exclusive { libc::LOCK_EX | libc::LOCK_NB } else { libc::LOCK_SH };
    loop {
        // SAFETY: flock on a descriptor we own; no memory is passed.
        if unsafe { libc::flock(file.as_raw_fd(), op) } == 0 {
            return Ok(Some(Arc::new(file)));
        }
        let e = std::io::Error::last_os_error();
        match e.kind() {
            std::io::ErrorKind::Interrupted => continue,
            std::io::ErrorKind::WouldBlock => {
                return Err(Error::invalid(
                    format!("another ctl (push-pinglist, diff, status or gen-pinglists) is using {}", dir.display()),
                    "run gen-pinglists again when it has finished, or generate into another directory",
                ));
            }
            _ => return Err(Error::io(&path, "lock", e)),
        }
    }
}

/// What the last `gen-pinglists` into a directory wrote.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub generation: u64,
    pub generated_unix_ns: u64,
    pub seed: u64,
    pub hosts: usize,
    /// Every ToR pair is probed in any this many consecutive generations.
    pub generations_to_cover: u64,
}

/// Reads `DIR/generation.ctl`; `None` when there is none.
pub fn read_manifest(dir: &Path) -> Result<Option<Manifest>, Error> {
    let path = dir.join(MANIFEST);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(&path, "read the manifest", e)),
    };
    toml::from_str(&text).map(Some).map_err(|e| {
        Error::File(FileError::new(
            &path,
            e.span().map(|s| crate::error::line_of(&text, s.start)),
            "",
            format!("not a ctl manifest: {}", e.message()),
            "delete it; the next gen-pinglists rewrites it (pass --generation to say which generation comes next)",
        ))
    })
}

/// The generation after the newest one in `dir`: the manifest's, else the highest of its
/// pinglists' (when the manifest was removed), else 1 for an empty or new directory.
pub fn next_generation(dir: &Path) -> Result<u64, Error> {
    if let Some(m) = read_manifest(dir)? {
        return Ok(m.generation.saturating_add(1));
    }
    if !dir.exists() {
        return Ok(1);
    }
    let listing = PinglistDir::open(dir).ok();
    let mut newest = 0;
    for host in listing.iter().flat_map(|l| l.hosts.iter()) {
        if let Ok(p) = Pinglist::load(dir.join(format!("{host}.toml"))) {
            newest = newest.max(p.generation);
        }
    }
    Ok(newest.saturating_add(1))
}

/// The pinglists in a directory, locked against `gen-pinglists` while this lives.
#[derive(Debug, Clone)]
pub struct PinglistDir {
    dir: PathBuf,
    hosts: Vec<String>,
    _lock: Option<Arc<File>>,
}

impl PinglistDir {
    /// Lists `dir/*.toml`; refuses a directory without pinglists, or with the files of a
    /// `gen-pinglists` that did not finish. Waits for a running `gen-pinglists`.
    pub fn open(dir: &Path) -> Result<PinglistDir, Error> {
        let lock = if dir.is_dir() { lock(dir, false)? } else { None };
        if dir.join(INCOMPLETE).exists() {
            return Err(Error::invalid(
                format!(
                    "the last gen-pinglists into {} did not finish: its pinglists are a mix of two generations",
                    dir.display()
                ),
                "run ctl gen-pinglists into it again",
            ));
        }
        let entries = std::fs::read_dir(dir).map_err(|e| Error::io(dir, "list the pinglist directory", e))?;
        let mut hosts = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| Error::io(dir, "list the pinglist directory", e))?;
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            if let Some(host) = name.strip_suffix(".toml")
                && !host.is_empty()
                && !host.starts_with('.')
                && name != rocemesh_formats::keys::FILE_NAME
            {
                hosts.push(host.to_owned());
            }
        }
        if hosts.is_empty() {
            return Err(Error::invalid(
                format!("{} holds no pinglists (<host>.toml)", dir.display()),
                "generate them first: ctl gen-pinglists --inventory INV --out DIR --seed N",
            ));
        }
        hosts.sort_by(|a, b| natural_cmp(a, b));
        Ok(PinglistDir { dir: dir.to_path_buf(), hosts, _lock: lock })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Every host with a pinglist, in natural order.
    pub fn hosts(&self) -> &[String] {
        &self.hosts
    }

    /// `only`, checked against the directory, or every host.
    pub fn select(&self, only: Option<&[String]>) -> Result<Vec<String>, Error> {
        let Some(only) = only else { return Ok(self.hosts.clone()) };
        let mut out = Vec::with_capacity(only.len());
        for host in only {
            if !self.hosts.iter().any(|h| h == host) {
                return Err(Error::invalid(
                    format!("there is no pinglist for host {host:?} in {}", self.dir.display()),
                    "check the host name against the inventory, or regenerate the pinglists",
                ));
            }
            if !out.contains(host) {
                out.push(host.clone());
            }
        }
        Ok(out)
    }

    /// Where `host`'s pinglist is.
    pub fn path(&self, host: &str) -> PathBuf {
        self.dir.join(format!("{host}.toml"))
    }

    /// The fleet key file beside the pinglists (`ctl keys rotate`), its bytes as on disk and
    /// validated; `None` when the fleet has no keys.
    pub fn keys(&self) -> Option<Result<(Vec<u8>, FleetKeys), FileError>> {
        let path = self.dir.join(rocemesh_formats::keys::FILE_NAME);
        path.exists().then(|| FleetKeys::read(&path).map(|(text, keys)| (text.into_bytes(), keys)))
    }

    /// The pinglist of `host`, its bytes as on disk, validated, and checked to be `host`'s.
    pub fn read(&self, host: &str) -> Result<(Vec<u8>, Pinglist), FileError> {
        let path = self.path(host);
        let bytes = std::fs::read(&path).map_err(|e| {
            FileError::new(&path, None, "", format!("cannot read the pinglist: {e}"), "regenerate the pinglists")
        })?;
        let text = std::str::from_utf8(&bytes).map_err(|_| {
            FileError::new(&path, None, "", "the pinglist is not UTF-8 text", "regenerate the pinglists")
        })?;
        let pinglist = Pinglist::parse(text, &path)?;
        if pinglist.host != host {
            return Err(FileError::new(
                &path,
                None,
                "host",
                format!("the pinglist in {host}.toml is for host {:?}", pinglist.host),
                "regenerate the pinglists; a file must be named after its host",
            ));
        }
        Ok((bytes, pinglist))
    }
}

/// What [`write_pinglists`] did.
#[derive(Debug, Clone, Default)]
pub struct WriteReport {
    pub written: usize,
    pub bytes: u64,
    /// Pinglists of hosts no longer in the inventory, removed.
    pub pruned: Vec<String>,
}

/// Writes every pinglist to `dir/<host>.toml` (in place, on all cores), removes the
/// pinglists of hosts not in `pinglists`, and records `manifest`.
///
/// Crash safety (see the module docs for the lock). The incomplete marker is made durable
/// before the first file is touched and removed only after the manifest is written durably
/// (fsynced, renamed, the directory fsynced), so a process that dies mid-run leaves a
/// directory every reader refuses until the run is repeated; it then writes the same bytes
/// (the output is deterministic).
///
/// The pinglists themselves are not fsynced, neither one by one (100,000 device flushes on a
/// large fabric) nor once with syncfs before the manifest (that waits for the whole
/// generation, ~530 MiB for 100,000 hosts, to reach the disk: seconds per run). So after a
/// power loss the manifest can be on disk while some pinglists written just before it are
/// not: depending on the filesystem such a file comes back empty, cut short or zero-filled,
/// which `Pinglist::parse` refuses (push and diff report the host instead of installing it)
/// unless the cut falls between two targets. Rerun gen-pinglists after a power loss.
pub fn write_pinglists(dir: &Path, pinglists: &[Pinglist], manifest: &Manifest) -> Result<WriteReport, Error> {
    write_all(dir, pinglists.len(), Source::Made(pinglists), manifest)
}

/// [`write_pinglists`] for pinglists rendered on the fly, so that a large fabric's lists never
/// all sit in memory at once: `render(i, text, host)` (`i` in `0..n`) appends the `i`-th
/// pinglist's TOML to `text` and its host's name to `host` (`Generator::render_toml`); both
/// come empty. Each worker takes a contiguous share of `0..n`; files are named after their
/// hosts, so which worker writes which file does not change the output.
pub fn write_generated(
    dir: &Path,
    n: usize,
    render: impl Fn(usize, &mut String, &mut String) -> Result<(), Error> + Sync,
    manifest: &Manifest,
) -> Result<WriteReport, Error> {
    write_all(dir, n, Source::Rendered(&render), manifest)
}

type Render<'a> = &'a (dyn Fn(usize, &mut String, &mut String) -> Result<(), Error> + Sync);

enum Source<'a> {
    Made(&'a [Pinglist]),
    Rendered(Render<'a>),
}

fn write_all(dir: &Path, n: usize, source: Source<'_>, manifest: &Manifest) -> Result<WriteReport, Error> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, "create the output directory", e))?;
    let _lock = lock(dir, true)?;
    let marker = dir.join(INCOMPLETE);
    atomic_write(&marker, b"gen-pinglists is writing, or did not finish\n", true)
        .map_err(|e| Error::io(&marker, "write the incomplete marker", e))?;
    let dir_fd = File::open(dir).map_err(|e| Error::io(dir, "open the output directory", e))?;
    let dir_fd = &dir_fd;
    // Listed before writing: what this run creates is fresh by definition, and a new
    // directory then costs nothing to prune instead of a listing of 100,000 new files.
    let mut stale: HashSet<String> = pinglist_names(dir).into_iter().collect();
    let track_hosts = !stale.is_empty();
    let threads = std::thread::available_parallelism().map_or(1, |t| t.get()).min(n.max(1));
    let chunk = n.div_ceil(threads).max(1);
    let source = &source;
    let results: Vec<Result<(u64, Vec<String>), Error>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .step_by(chunk)
            .map(|start| {
                s.spawn(move || {
                    let mut bytes = 0u64;
                    let mut hosts = Vec::new();
                    let mut text = String::new();
                    let mut name = Vec::new();
                    let mut host = String::new();
                    for i in start..(start + chunk).min(n) {
                        text.clear();
                        host.clear();
                        match source {
                            Source::Made(lists) => {
                                serialise_into(&lists[i], &mut text)?;
                                host.push_str(&lists[i].host);
                            }
                            Source::Rendered(render) => render(i, &mut text, &mut host)?,
                        }
                        rewrite_at(dir_fd, &host, &mut name, text.as_bytes())
                            .map_err(|e| Error::io(&dir.join(format!("{host}.toml")), "write", e))?;
                        bytes += text.len() as u64;
                        if track_hosts {
                            hosts.push(host.clone());
                        }
                    }
                    Ok((bytes, hosts))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e))).collect()
    });
    let mut report = WriteReport { written: n, ..WriteReport::default() };
    for r in results {
        let (bytes, hosts) = r?;
        report.bytes += bytes;
        for host in &hosts {
            stale.remove(host);
        }
    }

    let mut stale: Vec<String> = stale.into_iter().collect();
    stale.sort_by(|a, b| natural_cmp(a, b));
    for host in stale {
        let path = dir.join(format!("{host}.toml"));
        // Only what is recognisably an old pinglist goes; anything else is the operator's.
        if Pinglist::load(&path).is_ok() {
            std::fs::remove_file(&path).map_err(|e| Error::io(&path, "remove the stale pinglist", e))?;
            report.pruned.push(host);
        }
    }
    let text = toml::to_string(manifest)
        .map_err(|e| Error::invalid(format!("cannot write the manifest: {e}"), "report this as a ctl bug"))?;
    let path = dir.join(MANIFEST);
    atomic_write(&path, format!("# written by ctl gen-pinglists\n{text}").as_bytes(), true)
        .map_err(|e| Error::io(&path, "write the manifest", e))?;
    std::fs::remove_file(&marker)
        .and_then(|()| dir_fd.sync_all())
        .map_err(|e| Error::io(&marker, "remove the incomplete marker", e))?;
    Ok(report)
}

/// Writes `bytes` over `<host>.toml` in the directory `dir`, relative to its descriptor: the
/// path is not walked again for each of 100,000 files. `name` is scratch for the C string.
fn rewrite_at(dir: &File, host: &str, name: &mut Vec<u8>, bytes: &[u8]) -> std::io::Result<()> {
    name.clear();
    name.extend_from_slice(host.as_bytes());
    name.extend_from_slice(b".toml\0");
    let name = CStr::from_bytes_with_nul(name)
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "the host name contains a NUL byte"))?;
    // SAFETY: a valid directory descriptor and a NUL-terminated name; the result is checked.
    let fd = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            name.as_ptr(),
            libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC | libc::O_CLOEXEC,
            0o644 as libc::c_uint,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` was just opened and is owned by nothing else.
    let mut file = File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    file.write_all(bytes)
}

/// The hosts of `dir/*.toml`, unsorted; none when `dir` cannot be listed.
fn pinglist_names(dir: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    entries
        .filter_map(|entry| {
            let name = entry.ok()?.file_name().into_string().ok()?;
            let host = name.strip_suffix(".toml")?;
            (!host.is_empty() && !host.starts_with('.') && name != rocemesh_formats::keys::FILE_NAME)
                .then(|| host.to_owned())
        })
        .collect()
}

/// The pinglist as the TOML every ctl command writes.
pub fn serialise(p: &Pinglist) -> Result<String, Error> {
    let mut text = String::new();
    serialise_into(p, &mut text)?;
    Ok(text)
}

/// [`serialise`], appended to `text` (a writer reuses one buffer for all its files).
pub fn serialise_into(p: &Pinglist, text: &mut String) -> Result<(), Error> {
    p.write_toml(text).map_err(|e| {
        Error::invalid(format!("cannot write the pinglist of {:?} as TOML: {e}", p.host), "report this as a ctl bug")
    })
}

/// Writes `path` durably and atomically (see [`atomic_write`]), for the inventory import.
pub fn write_file_atomically(path: &Path, bytes: &[u8]) -> Result<(), Error> {
    atomic_write(path, bytes, true).map_err(|e| Error::io(path, "write", e))
}

/// Replaces `path` with `bytes` so that a reader sees the old file or the new one, never a
/// part: a temporary file in the same directory, renamed over the target. With `durable`, the
/// data is fsynced before the rename and the directory after it, so that after a power loss
/// the name points at the new content or the old, not at an empty file. The file gets the
/// mode the process's umask gives a new file.
pub(crate) fn atomic_write(path: &Path, bytes: &[u8], durable: bool) -> std::io::Result<()> {
    write_replacing(path, bytes, durable, None)
}

/// [`atomic_write`] of a secret: the temporary file is created mode 0600 (`open` with that
/// mode, then `fchmod` to exactly it) before its first byte, whatever the umask. Never by
/// changing the umask: it is the process's, and parallel pushes write pinglists and host
/// directories under it at the same time.
pub(crate) fn atomic_write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    write_replacing(path, bytes, true, Some(0o600))
}

fn write_replacing(path: &Path, bytes: &[u8], durable: bool, mode: Option<u32>) -> std::io::Result<()> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    use std::sync::atomic::{AtomicU64, Ordering};
    // Unique per call: threads of one process write beside each other (parallel pushes).
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = dir.join(format!(".{name}.tmp.{}.{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed)));
    let result = (|| {
        let open = || std::fs::OpenOptions::new().write(true).create_new(true).mode(mode.unwrap_or(0o666)).open(&tmp);
        let mut f = match open() {
            // A crashed run of a process with our pid left it: it is ours to replace.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                std::fs::remove_file(&tmp)?;
                open()?
            }
            r => r?,
        };
        if let Some(mode) = mode {
            f.set_permissions(std::fs::Permissions::from_mode(mode))?;
        }
        f.write_all(bytes)?;
        if durable {
            f.sync_all()?;
        }
        drop(f);
        std::fs::rename(&tmp, path)?;
        if durable {
            std::fs::File::open(dir)?.sync_all()?;
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use rocemesh_formats::pinglist::{self};

    fn pl(host: &str, generation: u64) -> Pinglist {
        Pinglist {
            version: pinglist::VERSION,
            host: host.to_owned(),
            generation,
            generated_unix_ns: 5,
            timeout_ms: 500,
            targets: Vec::new(),
        }
    }

    fn manifest(generation: u64, hosts: usize) -> Manifest {
        Manifest { generation, generated_unix_ns: 5, seed: 1, hosts, generations_to_cover: 3 }
    }

    #[test]
    fn write_read_prune_and_next_generation() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("out");
        assert_eq!(next_generation(&dir).unwrap(), 1);
        let r = write_pinglists(&dir, &[pl("h10", 4), pl("h2", 4), pl("gone", 4)], &manifest(4, 3)).unwrap();
        assert_eq!((r.written, r.pruned.len()), (3, 0));
        std::fs::write(dir.join("notes.toml"), "operator's file").unwrap();
        std::fs::write(dir.join("push-results.tsv"), "x").unwrap();
        assert_eq!(next_generation(&dir).unwrap(), 5);

        let r = write_pinglists(&dir, &[pl("h10", 5), pl("h2", 5)], &manifest(5, 2)).unwrap();
        assert_eq!(r.pruned, ["gone"]);
        let listing = PinglistDir::open(&dir).unwrap();
        assert_eq!(listing.hosts(), ["h2", "h10", "notes"]);
        assert_eq!(listing.read("h10").unwrap().1, pl("h10", 5));
        assert!(listing.read("notes").unwrap_err().problem.contains("invalid TOML"));
        assert_eq!(read_manifest(&dir).unwrap(), Some(manifest(5, 2)));
        assert_eq!(next_generation(&dir).unwrap(), 6);

        // Without the manifest, the newest pinglist decides.
        std::fs::remove_file(dir.join(MANIFEST)).unwrap();
        assert_eq!(next_generation(&dir).unwrap(), 6);

        let e = listing.select(Some(&["h3".to_owned()])).unwrap_err().to_string();
        assert!(e.contains("no pinglist for host \"h3\""), "{e}");
        assert_eq!(listing.select(Some(&["h2".into(), "h2".into()])).unwrap(), ["h2"]);

        // A file under another host's name is refused.
        std::fs::copy(dir.join("h2.toml"), dir.join("h3.toml")).unwrap();
        let e = PinglistDir::open(&dir).unwrap().read("h3").unwrap_err();
        assert!(e.problem.contains("is for host \"h2\""), "{e}");
        // No temporary files are left behind.
        assert!(std::fs::read_dir(&dir).unwrap().all(|e| !e.unwrap().file_name().to_string_lossy().contains(".tmp.")));
    }

    #[test]
    fn readers_and_the_writer_exclude_each_other() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        write_pinglists(dir, &[pl("h1", 1), pl("h2", 1)], &manifest(1, 2)).unwrap();
        // Two readers at once are fine; a writer is refused while either holds the directory.
        let a = PinglistDir::open(dir).unwrap();
        let b = a.clone();
        let c = PinglistDir::open(dir).unwrap();
        drop(a);
        let e = write_pinglists(dir, &[pl("h1", 2)], &manifest(2, 1)).unwrap_err().to_string();
        assert!(e.contains("another ctl") && e.contains(&dir.display().to_string()), "{e}");
        drop((b, c));
        // Refused means untouched: still generation 1, both hosts, no marker.
        assert_eq!(read_manifest(dir).unwrap().unwrap().generation, 1);
        assert_eq!(PinglistDir::open(dir).unwrap().read("h2").unwrap().1, pl("h2", 1));
        write_pinglists(dir, &[pl("h1", 2)], &manifest(2, 1)).unwrap();
        assert_eq!(PinglistDir::open(dir).unwrap().hosts(), ["h1"]);
    }

    #[test]
    fn an_interrupted_generation_is_refused_until_rerun() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        write_pinglists(dir, &[pl("h1", 1), pl("h2", 1)], &manifest(1, 2)).unwrap();
        assert!(!dir.join(INCOMPLETE).exists());
        // What a run killed after rewriting h1 leaves: the marker, h1 of generation 2, h2 of 1.
        std::fs::write(dir.join(INCOMPLETE), "").unwrap();
        std::fs::write(dir.join("h1.toml"), pl("h1", 2).to_toml_string().unwrap()).unwrap();
        let e = PinglistDir::open(dir).unwrap_err().to_string();
        assert!(e.contains("did not finish") && e.contains("gen-pinglists"), "{e}");
        // The previous manifest still decides the next generation; the rerun clears the marker.
        assert_eq!(next_generation(dir).unwrap(), 2);
        write_pinglists(dir, &[pl("h1", 2), pl("h2", 2)], &manifest(2, 2)).unwrap();
        let listing = PinglistDir::open(dir).unwrap();
        assert_eq!(listing.read("h2").unwrap().1, pl("h2", 2));
    }

    #[test]
    fn an_empty_directory_says_how_to_fill_it() {
        let tmp = tempfile::tempdir().unwrap();
        let e = PinglistDir::open(tmp.path()).unwrap_err().to_string();
        assert!(e.contains("ctl gen-pinglists"), "{e}");
    }
}
