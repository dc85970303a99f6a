//! `analyze watch`: the SLA report, continuously, over a collection directory (what `ctl
//! collect` fills). This module owns the watch's state file and the rule that says a window is
//! complete; the rows themselves are [`crate::report`]'s, read a range at a time by
//! [`crate::ingest::Plan`] exactly as `analyze report` reads them.
//!
//! - Input: sealed segments (`*.rseg.zst`) only. An open segment is still being written, and
//!   `ctl collect` renames a file into place only once whole, so a listed sealed file never
//!   changes.
//! - A window `[s, e)` is complete, and its rows are emitted, when both hold:
//!   - every live writer (RNIC) has written past it: the newest T1 of its files is at least
//!     `e`. A writer is live while its newest T1 is within the grace of the fleet's newest;
//!     a dead agent does not hold the report back for longer than that.
//!   - the fleet's newest T1 is at least `e + grace`. A writer's older file arriving after its
//!     newer one (a collection that failed once and was retried) is still in time then.
//! - Windows are emitted in time order, each exactly once: the state keeps the end of the
//!   emitted windows and every file seen. A new file with records before that end is late: its
//!   late records are counted and said (a `late` line), never reported.
//! - A file damaged when first seen is said then (a `problem` line) and left out. A file that
//!   was whole then and cannot be read again when its windows are emitted (a retention sweep
//!   removed it) is said once, at that pass; the state marks it so that the passes emitting its
//!   later windows neither read it nor say it again.
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
//!   `--flush`, at once), and are those of `localize_ranges` over the files overlapping the
//!   block and its context, so a restart or another grouping of passes gives the same lines.
//!   A block's windows are read `(block + 2) / block` times over, and four passes each.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};

use rocemesh_formats::inventory::Inventory;
use rocemesh_formats::segment::{SEALED_SUFFIX, SegmentReader};
use serde::{Deserialize, Serialize};

use crate::ingest::{self, Fields, FileProblem};
use crate::inspect::find_segments;
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
    /// How far (data time) the fleet's newest record must be past a window's end.
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

/// Bump when the state's meaning changes; an older state is refused with the fix.
const STATE_VERSION: u32 = 1;

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
    /// Every sealed file seen, by path.
    files: BTreeMap<PathBuf, Seen>,
}

/// What the state keeps of one file.
#[derive(Serialize, Deserialize, Debug, Clone, Default)]
struct Seen {
    /// `host/device` of the writer.
    writer: String,
    first_ns: u64,
    last_ns: u64,
    records: u64,
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

/// A problem's text without its digits: what the same problem of a file says again whatever
/// part of it was read (a count of records naming undefined ids grows with the ranges read).
fn problem_shape(problem: &str) -> String {
    problem.chars().filter(|c| !c.is_ascii_digit()).collect()
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
    /// Windows up to `emitted_to_ns` are complete and emitted.
    Emitted { emitted_to_ns: u64, windows: u64, rows: u64, records: u64, files_read: u64 },
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
    /// Windows emitted.
    pub windows: u64,
    /// Rows emitted.
    pub rows: u64,
    /// Findings (entity, window) emitted.
    pub findings: u64,
    /// Problems and late files said.
    pub said: u64,
}

/// A watch over one directory: its state and output, open.
#[derive(Debug)]
pub struct Watch<'a> {
    cfg: &'a Config,
    inventory: Option<&'a Inventory>,
    state: State,
    output: Option<(std::fs::File, PathBuf)>,
}

impl<'a> Watch<'a> {
    /// Opens (or starts) the state and the output. Output past what the state counts is cut
    /// off, and said on stderr: those windows were never recorded as emitted.
    pub fn open(cfg: &'a Config, inventory: Option<&'a Inventory>) -> Result<Watch<'a>, WatchError> {
        let state = load_state(cfg)?;
        let output = match &cfg.output {
            None => None,
            Some(p) => {
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
                Some((f, p.clone()))
            }
        };
        Ok(Watch { cfg, inventory, state, output })
    }

    /// End of the emitted windows, Unix ns (0: none yet).
    pub fn emitted_to_ns(&self) -> u64 {
        self.state.emitted_to_ns
    }

    /// One pass: take in new files, emit the windows now complete, save the state.
    pub fn pass(&mut self) -> Result<Pass, WatchError> {
        let mut pass = Pass::default();
        let mut lines: Vec<String> = Vec::new();
        self.take_new_files(&mut pass, &mut lines)?;
        self.emit_complete(&mut pass, &mut lines)?;
        self.emit_findings(&mut pass, &mut lines)?;
        if !lines.is_empty() {
            self.write(&lines)?;
        }
        save_state(&self.cfg.state, &self.state)?;
        Ok(pass)
    }

    fn take_new_files(&mut self, pass: &mut Pass, lines: &mut Vec<String>) -> Result<(), WatchError> {
        let dir = &self.cfg.dir;
        let found = find_segments(std::slice::from_ref(dir)).map_err(io(dir, "list the collection directory"))?;
        for path in found.into_iter().filter(|p| p.to_string_lossy().ends_with(SEALED_SUFFIX)) {
            if self.state.files.contains_key(&path) {
                continue;
            }
            pass.new_files += 1;
            let seen = match SegmentReader::open(&path) {
                Err(e) => {
                    let problem = e.to_string();
                    lines.push(json(&Line::Problem { file: &path, problem: &problem }));
                    pass.said += 1;
                    Seen { unreadable: Some(problem), ..Seen::default() }
                }
                Ok(r) => {
                    let mut said = BTreeSet::new();
                    for d in ingest::damage_problems(&path, &r) {
                        lines.push(json(&Line::Problem { file: &path, problem: &d.problem }));
                        pass.said += 1;
                        // The plans that read it for its windows find the same damage.
                        said.insert(problem_shape(&d.problem));
                    }
                    let id = r.identity();
                    let (first_ns, last_ns) = r.time_range().unwrap_or((0, 0));
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
                        lines.push(json(&Line::Late { file: &path, records: late, windows_start_ns: &windows }));
                        pass.said += 1;
                    }
                    Seen {
                        writer: format!("{}/{}", id.host, id.device),
                        first_ns,
                        last_ns,
                        records,
                        unreadable: None,
                        gone: None,
                        said,
                    }
                }
            };
            self.state.files.insert(path, seen);
        }
        Ok(())
    }

    /// The end of the complete windows (see the module documentation), window-aligned.
    fn complete_to(&self) -> u64 {
        let window_ns = self.cfg.window_ns;
        let readable = self.state.files.values().filter(|s| s.records > 0 && s.unreadable.is_none());
        let mut newest_by_writer: BTreeMap<&str, u64> = BTreeMap::new();
        for s in readable {
            let n = newest_by_writer.entry(&s.writer).or_default();
            *n = (*n).max(s.last_ns);
        }
        let Some(&newest) = newest_by_writer.values().max() else {
            return 0;
        };
        if self.cfg.flush {
            return (newest / window_ns).saturating_add(1).saturating_mul(window_ns);
        }
        let grace = self.cfg.grace_ns;
        let live = newest_by_writer.values().copied().filter(|&n| n.saturating_add(grace) >= newest);
        let to = live.fold(newest.saturating_sub(grace), u64::min);
        to / window_ns * window_ns
    }

    fn emit_complete(&mut self, pass: &mut Pass, lines: &mut Vec<String>) -> Result<(), WatchError> {
        let (from, to) = (self.state.emitted_to_ns, self.complete_to());
        if to <= from {
            return Ok(());
        }
        let files = self.files_within(from, to);
        let window_ns = self.cfg.window_ns;
        let mut plan = ingest::plan(&files, Fields::Report, self.inventory, window_ns);
        let mut rows = Vec::new();
        let mut records = 0u64;
        for (a, b) in plan.ranges(self.cfg.range_records) {
            let (a, b) = (a.max(from), b.min(to));
            if a >= b {
                continue;
            }
            let probes = plan.read(a, b);
            records += probes.t1_unix_ns.len() as u64;
            let prepared = report::prepare_with(probes, &plan.ds.rnics, &plan.ds.services, window_ns)?;
            rows.extend(prepared.rows(&self.cfg.scopes, Span::PerWindow, &self.cfg.sla)?);
        }
        self.say_problems(plan.finish().problems, pass, lines);
        // Within a window, `report`'s order (violations first); windows in time order.
        report::sort_rows(&mut rows);
        rows.sort_by_key(|r| r.window_start_ns);
        let windows = rows.iter().map(|r| r.window_start_ns).collect::<BTreeSet<_>>().len() as u64;
        lines.extend(rows.iter().map(|r| json(&Line::Row(r))));
        lines.push(json(&Line::Emitted {
            emitted_to_ns: to,
            windows,
            rows: rows.len() as u64,
            records,
            files_read: files.len() as u64,
        }));
        pass.windows += windows;
        pass.rows += rows.len() as u64;
        self.state.emitted_to_ns = to;
        Ok(())
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
            let mut plan = ingest::plan(&files, Fields::All, self.inventory, window_ns);
            if let Some(inv) = self.inventory {
                plan.ds.add_single_paths(inv);
            }
            let ranges: Vec<(u64, u64)> = plan
                .ranges(self.cfg.range_records)
                .into_iter()
                .map(|(a, b)| (a.max(lo), b.min(hi)))
                .filter(|(a, b)| a < b)
                .collect();
            let l = localize::localize_ranges(&mut plan, ranges, &opts);
            localised += 1;
            records += plan.records_read() as u64;
            self.say_problems(plan.finish().problems, pass, lines);
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
    Ok(state)
}

/// Written to a temporary beside it, synced, then renamed over it: a crash leaves the old state
/// or the new one, never a torn one.
fn save_state(path: &Path, state: &State) -> Result<(), WatchError> {
    let tmp = path.with_extension("tmp");
    let text = serde_json::to_vec(state).map_err(|e| WatchError::State { path: path.into(), reason: e.to_string() })?;
    let mut f = std::fs::File::create(&tmp).map_err(io(&tmp, "create the new state"))?;
    f.write_all(&text).map_err(io(&tmp, "write the new state"))?;
    f.sync_all().map_err(io(&tmp, "sync the new state"))?;
    std::fs::rename(&tmp, path).map_err(io(path, "rename the new state into place"))?;
    Ok(())
}
