//! `analyze watch`: the SLA report, continuously, over a collection directory (what `ctl
//! collect` fills). This module owns the watch's state file and the rule that says a window is
//! complete; the rows themselves are [`crate::report`]'s, read a range at a time by
//! [`crate::ingest::Plan`] exactly as `analyze report` reads them.
//!
//! - Input: sealed segments (`*.rseg.zst`) only. An open segment is still being written, and
//!   `ctl collect` renames a file into place only once whole, so a listed sealed file never
//!   changes.
//! - A window `[s, e)` is complete, and its rows are emitted, once the fleet's time is at least
//!   `e + grace`. The fleet's time is the newest T1 that more than a quarter of the live hosts
//!   have written ([`fleet_time`]; a host's files share its clock, so hosts vote, not RNICs): a
//!   host with its clock hours ahead (booted before chrony stepped it) or one forged record
//!   years ahead cannot drag the fleet's time with it, while three quarters of the hosts may
//!   go silent (a pod down for maintenance) without holding the report back. A host is live
//!   while it delivered a file within the grace of the analyzer's own clock, so a dead one
//!   stops counting. A host whose newest record is more than the grace ahead of the fleet's
//!   time, or whose records were a minute ahead of the analyzer's clock when they arrived, is
//!   an outlier: said once (an `outlier` line). Records ahead of the clock do not vote (the
//!   host votes with its newest record that was not), and a host ahead of the fleet's time
//!   cannot move it; its records are reported when the fleet reaches their windows.
//!   A writer's older file arriving after its newer one (a collection that failed once and was
//!   retried) is still in time while it is within the grace.
//! - Windows are emitted in time order, each exactly once: the state keeps the end of the
//!   emitted windows and the files it may still need. A new file with records before that end
//!   is late: its late records are counted and said (a `late` line), never reported. A host
//!   whose newest record is late too is behind (its clock, or its collection): an `outlier`
//!   line says so once.
//! - Bounded state and listing: a file whose records all lie more than the grace before what
//!   was emitted (rows and findings) is forgotten, and each host keeps only its newest time, so
//!   the state holds the files of about two graces whatever the collection's age. A pass lists
//!   the collection but skips `ctl collect`'s date directories that end more than a day before
//!   that horizon (a segment spans less than a day: the agent's `segment_max_age_s`). A listed
//!   file the state does not hold, whose name dates it before the horizon, is one forgotten
//!   unless it was renamed into place since the previous pass began (its ctime), which makes it
//!   a late arrival, said as such.
//! - A file damaged when first seen is said then (a `problem` line) and left out. A file that
//!   was whole then and cannot be read again when its windows are emitted (a retention sweep
//!   removed it) is said once, at that pass; the state marks it so that the passes emitting its
//!   later windows neither read it nor say it again.
//! - Rows are written a range at a time (`--range-records`), never a whole pass's at once.
//! - Crash safety: the output file is flushed and synced before the state that counts its bytes
//!   is renamed into place. At start, output beyond the state's count (lines of windows whose
//!   state was never saved) is cut off, so those windows are emitted again, once.
//! - Findings ([`Findings`]): what `analyze localize` blames in each window (before its
//!   hysteresis joins windows into findings), a `finding` line per (window, entity), each
//!   window's once. Localisation judges a window against the fleet's baselines and a
//!   false-discovery cut over the windows it reads, and looks at both neighbours of a window
//!   (a fault's edge), so windows are localised in fixed blocks of `block_windows` (aligned to
//!   multiples of the block's length, whatever the passes), each read with one window of
//!   context either side: a block's findings go out once the window after it is emitted (at
//!   `--flush`, at once), and are those of `analyze localize` over the files overlapping the
//!   block and its context (from their window summaries where the agents write them, else
//!   `localize_ranges` over their records), so a restart or another grouping of passes gives
//!   the same lines. A block's windows are read `(block + 2) / block` times over (from
//!   records, four passes each).

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};

use rocemesh_formats::inventory::Inventory;
use rocemesh_formats::segment::{SEALED_SUFFIX, SegmentReader, name_first_ms};
use serde::{Deserialize, Serialize};

use crate::ingest::{self, Fields, FileProblem};
use crate::localize::{self, Blamed};
use crate::report::{self, ReportError, Row, Scope, Sla, Span};

/// What a watch is asked to do.
#[derive(Debug, Clone)]
pub struct Config {
    /// The collection directory, searched recursively.
    pub dir: PathBuf,
    /// The state file (position across restarts).
    pub state: PathBuf,
    /// JSON lines are appended here; `None`: standard output only.
    pub output: Option<PathBuf>,
    /// Also write the lines to standard output when `output` is set.
    pub stdout: bool,
    /// Report window, ns.
    pub window_ns: u64,
    /// How far (data time) the fleet's time must be past a window's end; also how long (the
    /// analyzer's clock) a host may deliver nothing before it stops voting.
    pub grace_ns: u64,
    /// Scopes of the rows.
    pub scopes: Vec<Scope>,
    /// SLA thresholds.
    pub sla: Sla,
    /// Records held in memory at once (see `report --range-records`).
    pub range_records: usize,
    /// Emit every window of the files present, complete or not (the collection has ended).
    pub flush: bool,
    /// Localise the windows too; `None`: rows only.
    pub findings: Option<Findings>,
}

/// How a watch localises (see the module documentation).
#[derive(Debug, Clone)]
pub struct Findings {
    /// Localisation's tunables (its window is the watch's).
    pub options: localize::Options,
    /// Windows localised together (at least 1): a larger block costs less (each is read with a
    /// window of context either side) and waits longer for its last window.
    pub block_windows: u64,
}

/// Why a watch stopped.
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    /// The state file is unreadable, foreign, or disagrees with the options or the output.
    #[error("state file {}: {reason}", path.display())]
    State {
        /// The state file.
        path: PathBuf,
        /// What is wrong, and the fix.
        reason: String,
    },
    /// A file or directory could not be read or written.
    #[error("{}: {what}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// What was being done.
        what: &'static str,
        /// Why it failed.
        source: std::io::Error,
    },
    /// The report could not be computed or written.
    #[error(transparent)]
    Report(#[from] ReportError),
}

fn io<'p>(path: &'p Path, what: &'static str) -> impl FnOnce(std::io::Error) -> WatchError + 'p {
    move |source| WatchError::Io { path: path.to_path_buf(), what, source }
}

/// Bump when the state's meaning changes; an older state is refused with the fix. Version 2:
/// `files` holds the files still needed, not every file seen (so an analyze that reads only
/// version 1 must not take it: it would read every forgotten file as late); version 1 is
/// taken and migrated.
const STATE_VERSION: u32 = 2;

/// A host's records more than this ahead of the analyzer's clock are from the future: records
/// reach the analyzer only after they were written, and clocks under chrony or PTP agree to
/// milliseconds, so a minute leaves room for an analyzer whose own clock is that far off.
const CLOCK_AHEAD_MAX_NS: u64 = 60_000_000_000;

const AHEAD_OF_THE_CLOCK: &str = "records of it are ahead of this analyzer's clock: its clock runs ahead (a host booted \
     before chrony stepped it), or they are forged; they do not move the fleet's time, and are reported when the \
     fleet reaches their windows";
const AHEAD_OF_THE_FLEET: &str = "its newest record is more than the grace ahead of the fleet's time: its clock runs \
     ahead (a host booted before chrony stepped it), or the record is forged; it does not move the fleet's time, and \
     its records are reported when the fleet reaches their windows";

/// The fleet's time is the newest T1 that more than `1 / QUORUM_DIVISOR` of the live hosts have
/// written: a quarter. Clocks run ahead one host at a time (a boot before chrony steps the
/// clock, a forged record), while hosts go silent by racks and pods (maintenance, a collection
/// that fails for a pod), so the vote tolerates up to a quarter ahead and three quarters silent.
const QUORUM_DIVISOR: usize = 4;

/// Slack between the analyzer's clock and file ctimes when telling a file renamed in since the
/// previous pass began listing from one an earlier pass found and forgot: a ctime is read off
/// the kernel's coarse clock, which lags the fine one by at most a tick (10 ms at HZ=100).
const CTIME_SLACK_NS: u64 = 20_000_000;

/// A segment spans at most this (the agent's `segment_max_age_s` is at most a day), so a date
/// directory that ended more than this before the horizon holds nothing the watch still needs.
const SEGMENT_SPAN_MAX_NS: u64 = 86_400_000_000_000;

#[derive(Serialize, Deserialize, Debug, Default)]
struct State {
    version: u32,
    window_ns: u64,
    /// Every window starting before this has been emitted (0: none yet).
    emitted_to_ns: u64,
    /// Bytes of the output file that hold exactly the lines said so far.
    output_bytes: u64,
    /// Every window starting before this has had its findings emitted. A state written before
    /// watches localised has none: its findings begin where its rows stood.
    #[serde(default)]
    findings_to_ns: Option<u64>,
    /// Files whose records all lie before this are forgotten (module documentation).
    #[serde(default)]
    forget_before_ns: u64,
    /// The analyzer's clock when the previous pass began listing, less [`CTIME_SLACK_NS`]: a
    /// file renamed into place after this is new to the watch (`None`: no such pass yet).
    #[serde(default)]
    new_after_ns: Option<u64>,
    /// Every sealed file the watch may still need, by path.
    files: BTreeMap<PathBuf, Seen>,
    /// Every host with a file in the last two graces, by name.
    #[serde(default)]
    hosts: BTreeMap<String, HostSeen>,
}

/// What the state keeps of one file.
#[derive(Serialize, Deserialize, Debug, Clone, Default)]
struct Seen {
    /// `host/device` of the writer.
    writer: String,
    first_ns: u64,
    last_ns: u64,
    records: u64,
    /// The analyzer's clock when the listing that found it ended (0: a state that did not keep
    /// it); a file is forgotten only once the pass that found it is over (module docs).
    #[serde(default)]
    seen_at_ns: u64,
    /// Its newest T1 not ahead of the analyzer's clock when it was found (`last_ns` when none
    /// is ahead; 0 when all are).
    #[serde(default)]
    plausible_last_ns: u64,
    /// Why the file could not be read at all (it is then left out, as `report` leaves it out).
    unreadable: Option<String>,
    /// Why the file, readable when first seen, could not be read again when its windows were
    /// emitted (a retention sweep removed it, or it changed): said once, then not planned again.
    /// It still counts for its writer's completion: its records were seen.
    #[serde(default)]
    gone: Option<String>,
    /// What else reading it was said to have found (an unusable summary, records or path
    /// traces naming ids its dictionary does not define, damage), each once, by
    /// [`problem_shape`]: each pass and findings block plans the file again and finds them again.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    said: BTreeSet<String>,
}

/// What the state keeps of one host: its files' newest T1 and when one last arrived.
#[derive(Serialize, Deserialize, Debug, Clone, Default)]
struct HostSeen {
    /// The newest T1 of its files that was not ahead of the analyzer's clock when the file
    /// arrived ([`CLOCK_AHEAD_MAX_NS`]): what it votes with, so that one record from the future
    /// does not keep its later, honest files out of the vote.
    newest_ns: u64,
    /// The newest T1 that was ahead of the analyzer's clock when its file arrived (0: none, or
    /// the clock has reached it since and it is in `newest_ns`).
    #[serde(default)]
    future_ns: u64,
    /// The analyzer's clock when a new file of it was last found.
    seen_at_ns: u64,
    /// `ahead` or `behind` while it is said to be an outlier (said once, until back in line).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    outlier: Option<String>,
}

/// A problem's text without its digits: what the same problem of a file says again whatever
/// part of it was read (a count of records naming undefined ids grows with the ranges read).
fn problem_shape(problem: &str) -> String {
    problem.chars().filter(|c| !c.is_ascii_digit()).collect()
}

/// The host of a writer (`host/device`).
fn host_of(writer: &str) -> &str {
    writer.split_once('/').map_or(writer, |(h, _)| h)
}

/// A line of the output (JSON lines, tagged by `type`).
#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Line<'a> {
    /// A report row of a complete window (the fields of `analyze report --format json`'s rows).
    Row(&'a Row),
    /// A file could not be read, or parts of it were skipped; said once, when first seen.
    Problem { file: &'a Path, problem: &'a str },
    /// A file arrived with records in windows already emitted; they are not reported.
    Late { file: &'a Path, records: u64, windows_start_ns: &'a [u64] },
    /// A host whose records lie far from the fleet's (its clock, or its collection): `ahead`
    /// ones do not move the fleet's time, `behind` ones arrive after their windows were emitted.
    Outlier { host: &'a str, direction: &'a str, newest_ns: u64, reference_ns: u64, by_ns: u64, why: &'a str },
    /// Windows up to `emitted_to_ns` are complete and emitted; `fleet_ns` is the fleet's time
    /// that decided it, voted by `hosts_voting` of `hosts_known` hosts.
    Emitted {
        emitted_to_ns: u64,
        windows: u64,
        rows: u64,
        records: u64,
        files_read: u64,
        fleet_ns: u64,
        hosts_voting: u64,
        hosts_known: u64,
    },
    /// An entity localisation blamed in one window, with its evidence.
    Finding(&'a Blamed),
    /// Every window before `findings_to_ns` has had its findings emitted; `records` were read
    /// (each of the blocks' passes counts once).
    FindingsEmitted { findings_to_ns: u64, blocks: u64, findings: u64, records: u64 },
}

/// What one pass over the directory did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Pass {
    /// Files seen for the first time.
    pub new_files: u64,
    /// Sealed files the listing found (the skipped date directories' not counted).
    pub files_listed: u64,
    /// Files the state holds after the pass.
    pub files_kept: u64,
    /// Windows emitted.
    pub windows: u64,
    /// Rows emitted.
    pub rows: u64,
    /// Findings (entity, window) emitted.
    pub findings: u64,
    /// Problems, late files and outliers said.
    pub said: u64,
}

/// The fleet's time ([`fleet_time`]) and how it was voted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Vote {
    fleet_ns: u64,
    voting: u64,
}

/// The fleet's time among `newest` (each live host's newest T1, outliers ahead of the analyzer's
/// clock already left out): the `n / QUORUM_DIVISOR + 1`-th newest, which more than a quarter
/// of them have reached. `None` without a host.
fn fleet_time(newest: &mut [u64]) -> Option<Vote> {
    if newest.is_empty() {
        return None;
    }
    newest.sort_unstable_by(|a, b| b.cmp(a));
    let k = newest.len() / QUORUM_DIVISOR;
    Some(Vote { fleet_ns: newest[k], voting: newest.len() as u64 })
}

/// The time a `ctl collect` date directory's name (`YYYY-MM-DD`) ends, Unix ns.
fn date_dir_end_ns(name: &str) -> Option<u64> {
    let days = rocemesh_formats::time::parse_utc_date(name)?;
    u64::try_from(days + 1).ok().and_then(|d| d.checked_mul(86_400_000_000_000))
}

/// The first record's time a segment's name carries ([`name_first_ms`]), ns.
fn name_time_ns(path: &Path) -> Option<u64> {
    name_first_ms(path.file_name()?.to_str()?)?.checked_mul(1_000_000)
}

/// The analyzer's clock, Unix ns.
pub(crate) fn wall_now_ns() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

/// A watch over one directory: its state and output, open.
#[derive(Debug)]
pub struct Watch<'a> {
    cfg: &'a Config,
    inventory: Option<&'a Inventory>,
    state: State,
    output: Option<(std::fs::File, PathBuf)>,
    /// The state as last saved, less its listing time: a pass that changed nothing else
    /// rewrites nothing.
    saved: Vec<u8>,
}

impl<'a> Watch<'a> {
    /// Opens (or starts) the state and the output. Output past what the state counts is cut
    /// off, and said on stderr: those windows were never recorded as emitted.
    pub fn open(cfg: &'a Config, inventory: Option<&'a Inventory>) -> Result<Watch<'a>, WatchError> {
        let state = load_state(cfg)?;
        let output = match &cfg.output {
            None => None,
            Some(p) => Some((open_output(cfg, &state, p)?, p.clone())),
        };
        Ok(Watch { cfg, inventory, state, output, saved: Vec::new() })
    }

    /// End of the emitted windows, Unix ns (0: none yet).
    pub fn emitted_to_ns(&self) -> u64 {
        self.state.emitted_to_ns
    }

    /// One pass: take in new files, emit the windows now complete, forget what is no longer
    /// needed, save the state.
    pub fn pass(&mut self) -> Result<Pass, WatchError> {
        let mut pass = Pass::default();
        let mut lines: Vec<String> = Vec::new();
        let listed_from_ns = wall_now_ns();
        self.take_new_files(&mut pass, &mut lines)?;
        self.emit_complete(&mut pass, &mut lines)?;
        self.emit_findings(&mut pass, &mut lines)?;
        if !lines.is_empty() {
            self.write(&lines)?;
        }
        self.forget(listed_from_ns);
        pass.files_kept = self.state.files.len() as u64;
        // Saved when anything but the listing's time changed: that time matters only to tell
        // forgotten files, and it is saved with every pass that forgets one.
        let encode = |st: &State| {
            serde_json::to_vec(st)
                .map_err(|e| WatchError::State { path: self.cfg.state.clone(), reason: e.to_string() })
        };
        let new_after = self.state.new_after_ns.take();
        let canonical = encode(&self.state)?;
        self.state.new_after_ns = new_after;
        if canonical != self.saved {
            save_state(&self.cfg.state, &encode(&self.state)?)?;
            self.saved = canonical;
        }
        Ok(pass)
    }

    /// The sealed files of the collection the state does not hold and has not forgotten.
    fn list_new(&self, pass: &mut Pass) -> Result<Vec<PathBuf>, WatchError> {
        let horizon = self.state.forget_before_ns;
        let mut found = Vec::new();
        let mut dirs = vec![self.cfg.dir.clone()];
        while let Some(dir) = dirs.pop() {
            let entries = match std::fs::read_dir(&dir) {
                // A retention sweep removed it since its parent was listed: nothing to take in.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && dir != self.cfg.dir => continue,
                r => r.map_err(io(&dir, "list the collection directory"))?,
            };
            for e in entries {
                let e = e.map_err(io(&dir, "list the collection directory"))?;
                let ft = e.file_type().map_err(io(&dir, "list the collection directory"))?;
                let (path, name) = (e.path(), e.file_name());
                // A linked directory (a date or host directory on another disk) is followed.
                let is_dir = ft.is_dir() || (ft.is_symlink() && path.is_dir());
                let name = name.to_string_lossy();
                if is_dir {
                    let old =
                        date_dir_end_ns(&name).is_some_and(|end| end.saturating_add(SEGMENT_SPAN_MAX_NS) < horizon);
                    if !old {
                        dirs.push(path);
                    }
                    continue;
                }
                if !name.ends_with(SEALED_SUFFIX) {
                    continue;
                }
                pass.files_listed += 1;
                if self.state.files.contains_key(&path) || self.forgotten(&path) {
                    continue;
                }
                found.push(path);
            }
        }
        found.sort();
        Ok(found)
    }

    /// Whether `path`, which the state does not hold, is a file it forgot: its name dates it
    /// before the horizon and it was in place when the previous pass began listing.
    fn forgotten(&self, path: &Path) -> bool {
        use std::os::unix::fs::MetadataExt;
        let Some(new_after) = self.state.new_after_ns else { return false };
        if name_time_ns(path).is_none_or(|t| t >= self.state.forget_before_ns) {
            return false;
        }
        std::fs::metadata(path).is_ok_and(|m| {
            let ctime_ns = (m.ctime().max(0) as u64).saturating_mul(1_000_000_000) + m.ctime_nsec().max(0) as u64;
            ctime_ns < new_after
        })
    }

    fn take_new_files(&mut self, pass: &mut Pass, lines: &mut Vec<String>) -> Result<(), WatchError> {
        let found = self.list_new(pass)?;
        let seen_at_ns = wall_now_ns();
        let mut touched = BTreeSet::new();
        for path in found {
            pass.new_files += 1;
            let seen = match SegmentReader::open(&path) {
                Err(e) => {
                    let problem = e.to_string();
                    lines.push(json(&Line::Problem { file: &path, problem: &problem }));
                    pass.said += 1;
                    // Dated by its name, so that it is forgotten (not said again) in time.
                    let t = name_time_ns(&path).unwrap_or(u64::MAX);
                    Seen { unreadable: Some(problem), first_ns: t, last_ns: t, seen_at_ns, ..Seen::default() }
                }
                Ok(r) => {
                    let mut seen = self.judge_new(&path, &r, pass, lines);
                    seen.seen_at_ns = seen_at_ns;
                    if seen.records > 0 {
                        let name = host_of(&seen.writer).to_owned();
                        let h = self.state.hosts.entry(name.clone()).or_default();
                        h.newest_ns = h.newest_ns.max(seen.plausible_last_ns);
                        if seen.last_ns > seen.plausible_last_ns {
                            h.future_ns = h.future_ns.max(seen.last_ns);
                        }
                        h.seen_at_ns = seen_at_ns;
                        touched.insert(name);
                    }
                    seen
                }
            };
            self.state.files.insert(path, seen);
        }
        for name in &touched {
            self.judge_behind(name, pass, lines);
        }
        Ok(())
    }

    /// What a new readable file is, saying its damage and its late records.
    fn judge_new(&self, path: &Path, r: &SegmentReader, pass: &mut Pass, lines: &mut Vec<String>) -> Seen {
        let mut said = BTreeSet::new();
        for d in ingest::damage_problems(path, r) {
            lines.push(json(&Line::Problem { file: path, problem: &d.problem }));
            pass.said += 1;
            // The plans that read it for its windows find the same damage.
            said.insert(problem_shape(&d.problem));
        }
        let id = r.identity();
        // A file without a record is dated by its name, so that it is forgotten in time and not
        // opened again each pass.
        let (first_ns, last_ns) = r.time_range().or_else(|| name_time_ns(path).map(|t| (t, t))).unwrap_or((0, 0));
        let records: u64 = r.probe_chunks().map(|c| c.t1_unix_ns.len() as u64).sum();
        let emitted_to = self.state.emitted_to_ns;
        if records > 0 && first_ns < emitted_to {
            let window_ns = self.cfg.window_ns;
            let mut late = 0u64;
            let mut windows = BTreeSet::new();
            for t in r.probe_chunks().flat_map(|c| c.t1_unix_ns.iter().map(|t| t.to_native())) {
                if t < emitted_to {
                    late += 1;
                    windows.insert(t / window_ns * window_ns);
                }
            }
            let windows: Vec<u64> = windows.into_iter().collect();
            lines.push(json(&Line::Late { file: path, records: late, windows_start_ns: &windows }));
            pass.said += 1;
        }
        let clock_max = wall_now_ns().saturating_add(CLOCK_AHEAD_MAX_NS);
        let plausible_last_ns = if last_ns <= clock_max {
            last_ns
        } else {
            // Rare (a clock ahead, a forged record): the newest T1 that is not.
            let t1s = r.probe_chunks().flat_map(|c| c.t1_unix_ns.iter().map(|t| t.to_native()));
            t1s.filter(|&t| t <= clock_max).max().unwrap_or(0)
        };
        Seen {
            writer: format!("{}/{}", id.host, id.device),
            first_ns,
            last_ns,
            records,
            seen_at_ns: 0,
            plausible_last_ns,
            unreadable: None,
            gone: None,
            said,
        }
    }

    /// A host whose files arrived this pass: behind when even its newest record lies before
    /// the windows already emitted (said once), back in line once it does not.
    fn judge_behind(&mut self, name: &str, pass: &mut Pass, lines: &mut Vec<String>) {
        let emitted_to = self.state.emitted_to_ns;
        let Some(h) = self.state.hosts.get_mut(name) else { return };
        let behind = h.newest_ns < emitted_to;
        match h.outlier.as_deref() {
            Some("behind") if !behind => h.outlier = None,
            Some("behind") => {}
            _ if behind => {
                h.outlier = Some("behind".into());
                lines.push(json(&Line::Outlier {
                    host: name,
                    direction: "behind",
                    newest_ns: h.newest_ns,
                    reference_ns: emitted_to,
                    by_ns: emitted_to - h.newest_ns,
                    why: "its newest record lies before the windows already emitted: its clock runs behind the fleet's \
                          (check its time sync), or its files reach the collection that late; its records are not reported",
                }));
                pass.said += 1;
            }
            _ => {}
        }
    }

    /// The end of the complete windows, window-aligned, and the vote that decided it (module
    /// documentation); says hosts that turned outliers ahead.
    fn complete_to(&mut self, pass: &mut Pass, lines: &mut Vec<String>) -> (u64, Vote) {
        let window_ns = self.cfg.window_ns;
        let (now, grace) = (wall_now_ns(), self.cfg.grace_ns);
        let clock_max = now.saturating_add(CLOCK_AHEAD_MAX_NS);
        for h in self.state.hosts.values_mut().filter(|h| h.future_ns != 0 && h.future_ns <= clock_max) {
            // The clock has reached what was ahead of it: an ordinary record now.
            (h.newest_ns, h.future_ns) = (h.newest_ns.max(h.future_ns), 0);
        }
        if self.cfg.flush {
            let newest = self.state.hosts.values().map(|h| h.newest_ns.max(h.future_ns)).max().unwrap_or(0);
            let to = if self.state.hosts.is_empty() {
                0
            } else {
                (newest / window_ns).saturating_add(1).saturating_mul(window_ns)
            };
            return (to, Vote { fleet_ns: newest, voting: self.state.hosts.len() as u64 });
        }
        let live = |h: &HostSeen| h.seen_at_ns.saturating_add(grace) >= now && h.newest_ns > 0;
        let mut newest: Vec<u64> = self.state.hosts.values().filter(|h| live(h)).map(|h| h.newest_ns).collect();
        let vote = fleet_time(&mut newest);
        for (name, h) in &mut self.state.hosts {
            let (newest_ns, reference_ns, why) = if h.future_ns != 0 {
                (h.future_ns, now, AHEAD_OF_THE_CLOCK)
            } else if let Some(v) = vote.filter(|v| h.newest_ns > v.fleet_ns.saturating_add(grace)) {
                (h.newest_ns, v.fleet_ns, AHEAD_OF_THE_FLEET)
            } else {
                // Back in line; without a vote nothing is known either way.
                if vote.is_some() && h.outlier.as_deref() == Some("ahead") {
                    h.outlier = None;
                }
                continue;
            };
            if h.outlier.as_deref() != Some("ahead") {
                h.outlier = Some("ahead".into());
                lines.push(json(&Line::Outlier {
                    host: name,
                    direction: "ahead",
                    newest_ns,
                    reference_ns,
                    by_ns: newest_ns.saturating_sub(reference_ns),
                    why,
                }));
                pass.said += 1;
            }
        }
        let vote = vote.unwrap_or_default();
        (vote.fleet_ns.saturating_sub(grace) / window_ns * window_ns, vote)
    }

    fn emit_complete(&mut self, pass: &mut Pass, lines: &mut Vec<String>) -> Result<(), WatchError> {
        let (to, vote) = self.complete_to(pass, lines);
        let from = self.state.emitted_to_ns;
        if to <= from {
            return Ok(());
        }
        let files = self.files_within(from, to);
        let window_ns = self.cfg.window_ns;
        let mut plan = ingest::plan(&files, Fields::Report, self.inventory, window_ns);
        let (mut rows, mut windows, mut records) = (0u64, 0u64, 0u64);
        for (a, b) in plan.ranges(self.cfg.range_records) {
            let (a, b) = (a.max(from), b.min(to));
            if a >= b {
                continue;
            }
            let probes = plan.read(a, b);
            records += probes.t1_unix_ns.len() as u64;
            let prepared = report::prepare_with(probes, &plan.ds.rnics, &plan.ds.services, window_ns)?;
            let mut range_rows = prepared.rows(&self.cfg.scopes, Span::PerWindow, &self.cfg.sla)?;
            // Within a window, `report`'s order (violations first); windows in time order. Ranges
            // hold whole windows, in order, so a range's rows go out before the next is read.
            report::sort_rows(&mut range_rows);
            range_rows.sort_by_key(|r| r.window_start_ns);
            windows += range_rows.iter().map(|r| r.window_start_ns).collect::<BTreeSet<_>>().len() as u64;
            rows += range_rows.len() as u64;
            lines.extend(range_rows.iter().map(|r| json(&Line::Row(r))));
            self.write(lines)?;
            lines.clear();
        }
        self.say_problems(plan.finish().problems, pass, lines);
        lines.push(json(&Line::Emitted {
            emitted_to_ns: to,
            windows,
            rows,
            records,
            files_read: files.len() as u64,
            fleet_ns: vote.fleet_ns,
            hosts_voting: vote.voting,
            hosts_known: self.state.hosts.len() as u64,
        }));
        pass.windows += windows;
        pass.rows += rows;
        self.state.emitted_to_ns = to;
        Ok(())
    }

    /// Forgets the files and hosts no pass needs any more (module documentation); `listed_from_ns`
    /// is the analyzer's clock when this pass began listing.
    fn forget(&mut self, listed_from_ns: u64) {
        let st = &mut self.state;
        let findings_to = st.findings_to_ns.unwrap_or(st.emitted_to_ns);
        // Findings blocks read a window of context before them.
        let needed_from = st.emitted_to_ns.min(findings_to.saturating_sub(self.cfg.window_ns));
        let horizon = needed_from.saturating_sub(self.cfg.grace_ns).max(st.forget_before_ns);
        // Only files an earlier pass found (its listing ended before this one began): their
        // ctimes lie before the next pass's `new_after_ns`, so `forgotten` knows them.
        let found_before = listed_from_ns.saturating_sub(CTIME_SLACK_NS);
        st.files.retain(|p, s| s.last_ns >= horizon || s.seen_at_ns >= found_before || name_time_ns(p).is_none());
        let (now, grace) = (listed_from_ns, self.cfg.grace_ns);
        st.hosts.retain(|_, h| h.newest_ns >= horizon || h.seen_at_ns.saturating_add(grace) >= now);
        st.forget_before_ns = horizon;
        st.new_after_ns = Some(listed_from_ns.saturating_sub(CTIME_SLACK_NS));
    }

    /// The readable files whose records may lie in `[from, to)`.
    fn files_within(&self, from: u64, to: u64) -> Vec<PathBuf> {
        self.state
            .files
            .iter()
            .filter(|(_, s)| {
                s.records > 0 && s.unreadable.is_none() && s.gone.is_none() && s.last_ns >= from && s.first_ns < to
            })
            .map(|(p, _)| p.clone())
            .collect()
    }

    /// What a plan found in the files it read, each said once: a file gone or changed since it
    /// was first seen (a retention sweep: its records in the windows read are not in the
    /// output), and anything else of a file (see [`Seen::said`]).
    fn say_problems(&mut self, problems: Vec<FileProblem>, pass: &mut Pass, lines: &mut Vec<String>) {
        for p in problems {
            let gone = p.skipped || p.problem.starts_with(ingest::READ_AGAIN_FAILED);
            let new = match self.state.files.get_mut(&p.path) {
                // Windows of a file are often emitted over several passes, each with its own
                // plan: without these marks, each would say the file again.
                Some(seen) if gone => seen.gone.replace(p.problem.clone()).is_none(),
                Some(seen) => seen.said.insert(problem_shape(&p.problem)),
                None => true,
            };
            if new {
                lines.push(json(&Line::Problem { file: &p.path, problem: &p.problem }));
                pass.said += 1;
            }
        }
    }

    /// Localises the blocks whose findings are due (see the module documentation).
    fn emit_findings(&mut self, pass: &mut Pass, lines: &mut Vec<String>) -> Result<(), WatchError> {
        // The config outlives this borrow of self, which say_problems needs mutably.
        let cfg: &'a Config = self.cfg;
        let Some(f) = &cfg.findings else {
            // Findings asked for later begin where the rows stand, not at the collection's start.
            self.state.findings_to_ns = Some(self.state.emitted_to_ns);
            return Ok(());
        };
        let window_ns = self.cfg.window_ns;
        let block_ns = f.block_windows.max(1).saturating_mul(window_ns);
        let emitted = self.state.emitted_to_ns;
        // A block is due once the window after it is emitted: its context on the right.
        let to = if self.cfg.flush { emitted } else { emitted.saturating_sub(window_ns) / block_ns * block_ns };
        let from = self.state.findings_to_ns.unwrap_or(emitted);
        if to <= from {
            return Ok(());
        }
        // Only blocks whose windows hold records: a new state starts at zero, collections have
        // gaps, and a file's span is no guide (one forged T1 stretches it over decades, which
        // would be millions of blocks). The plan counts records per window from the summaries.
        let mut held = ingest::plan(&self.files_within(from, to), Fields::Report, self.inventory, window_ns);
        let blocks: BTreeSet<u64> =
            held.windows_held().filter(|w| (from..to).contains(w)).map(|w| w / block_ns).collect();
        self.say_problems(held.finish().problems, pass, lines);
        let (mut findings, mut records, mut localised) = (0u64, 0u64, 0u64);
        let opts = localize::Options { window_s: window_ns / 1_000_000_000, ..f.options.clone() };
        for &b in &blocks {
            let (start, end) = ((b * block_ns).max(from), (b + 1).saturating_mul(block_ns).min(to));
            let (lo, hi) = (start.saturating_sub(window_ns), end.saturating_add(window_ns).min(emitted));
            let files = self.files_within(lo, hi);
            if files.is_empty() {
                continue;
            }
            // As `analyze localize` reads them by default: the agents' window summaries where
            // they write them, else the records, a range at a time.
            let (l, ds, read) = localize::localize_files(
                &files,
                self.inventory,
                &opts,
                localize::EvidenceFrom::Auto,
                self.cfg.range_records,
                (lo, hi),
            );
            records += read;
            self.say_problems(ds.problems, pass, lines);
            localised += 1;
            let mut blamed: Vec<&Blamed> =
                l.blamed.iter().filter(|x| (start..end).contains(&x.window_start_ns)).collect();
            blamed
                .sort_by(|a, b| (a.window_start_ns, &a.kind, &a.entity).cmp(&(b.window_start_ns, &b.kind, &b.entity)));
            findings += blamed.len() as u64;
            lines.extend(blamed.into_iter().map(|x| json(&Line::Finding(x))));
        }
        lines.push(json(&Line::FindingsEmitted { findings_to_ns: to, blocks: localised, findings, records }));
        pass.findings += findings;
        self.state.findings_to_ns = Some(to);
        Ok(())
    }

    fn write(&mut self, lines: &[String]) -> Result<(), WatchError> {
        let mut text = String::with_capacity(lines.iter().map(|l| l.len() + 1).sum());
        for l in lines {
            text.push_str(l);
            text.push('\n');
        }
        if let Some((f, p)) = &mut self.output {
            f.write_all(text.as_bytes()).map_err(io(p, "append to the output"))?;
            // Synced before the state that counts these bytes is saved (module docs).
            f.sync_data().map_err(io(p, "sync the output"))?;
            self.state.output_bytes += text.len() as u64;
        }
        if self.output.is_none() || self.cfg.stdout {
            let mut out = std::io::stdout().lock();
            out.write_all(text.as_bytes()).map_err(ReportError::Output)?;
            out.flush().map_err(ReportError::Output)?;
        }
        Ok(())
    }
}

fn json(line: &Line<'_>) -> String {
    // Serialising these plain structs cannot fail (string keys, finite or null floats).
    serde_json::to_string(line).unwrap_or_else(|e| format!("{{\"type\":\"problem\",\"problem\":\"{e}\"}}"))
}

fn load_state(cfg: &Config) -> Result<State, WatchError> {
    let path = &cfg.state;
    let bad = |reason: String| WatchError::State { path: path.clone(), reason };
    let mut text = String::new();
    match std::fs::File::open(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(State {
                version: STATE_VERSION,
                window_ns: cfg.window_ns,
                findings_to_ns: Some(0),
                ..State::default()
            });
        }
        Err(e) => return Err(io(path, "open the state")(e)),
        Ok(mut f) => f.read_to_string(&mut text).map_err(io(path, "read the state"))?,
    };
    let mut state: State =
        serde_json::from_str(&text).map_err(|e| bad(format!("not a watch state ({e}); move it away to start over")))?;
    state.findings_to_ns.get_or_insert(state.emitted_to_ns);
    if state.version == 1 {
        state.version = STATE_VERSION;
    }
    if state.version != STATE_VERSION {
        return Err(bad(format!(
            "version {} where this analyze writes {STATE_VERSION}; move it away to start over",
            state.version
        )));
    }
    if state.window_ns != cfg.window_ns {
        return Err(bad(format!(
            "written with --window-s {} (this run asks {}): pass that, or use another state file",
            state.window_ns / 1_000_000_000,
            cfg.window_ns / 1_000_000_000
        )));
    }
    if state.hosts.is_empty() {
        // A state written before hosts were kept: its files say their hosts' newest times, and
        // the hosts count as live for one grace, as if their files had just arrived.
        let now = wall_now_ns();
        for s in state.files.values().filter(|s| s.records > 0 && s.unreadable.is_none()) {
            let h = state.hosts.entry(host_of(&s.writer).to_owned()).or_default();
            h.newest_ns = h.newest_ns.max(s.last_ns.min(now.saturating_add(CLOCK_AHEAD_MAX_NS)));
            h.seen_at_ns = now;
        }
    }
    Ok(state)
}

/// Opens the output at `p`, cutting off what was written after the last saved state.
fn open_output(cfg: &Config, state: &State, p: &Path) -> Result<std::fs::File, WatchError> {
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(p)
        .map_err(io(p, "open the output"))?;
    let len = f.metadata().map_err(io(p, "stat the output"))?.len();
    if len < state.output_bytes {
        return Err(WatchError::State {
            path: cfg.state.clone(),
            reason: format!(
                "it counts {} bytes of {}, which holds {len}: the output was truncated or replaced; move the state file away to start over (every window is then emitted again)",
                state.output_bytes,
                p.display()
            ),
        });
    }
    if len > state.output_bytes {
        eprintln!(
            "analyze watch: {}: cutting {} bytes written after the last saved state (their windows are emitted again)",
            p.display(),
            len - state.output_bytes
        );
        f.set_len(state.output_bytes).map_err(io(p, "truncate the output"))?;
    }
    f.seek(std::io::SeekFrom::Start(state.output_bytes)).map_err(io(p, "seek the output"))?;
    Ok(f)
}

/// Written to a temporary beside it, synced, then renamed over it: a crash leaves the old state
/// or the new one, never a torn one.
fn save_state(path: &Path, text: &[u8]) -> Result<(), WatchError> {
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp).map_err(io(&tmp, "create the new state"))?;
    f.write_all(text).map_err(io(&tmp, "write the new state"))?;
    f.sync_all().map_err(io(&tmp, "sync the new state"))?;
    std::fs::rename(&tmp, path).map_err(io(path, "rename the new state into place"))?;
    Ok(())
}
