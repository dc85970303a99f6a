//! Ingest of window summaries (`formats::window`) instead of records: every file's summaries,
//! their keys in fleet-wide ids, for localisation on counters and histograms
//! (`crate::localize::localize_windows`). A file whose summaries do not count every one of its
//! records (written without them, still open, its summaries dropped or damaged) has its records
//! folded into summaries here, by the writer's own [`Summariser`], so each file is read one way
//! and counted exactly once.

use super::columns::planned_chunks;
use super::dict::Remap;
use super::model::{Dataset, Fields, FileProblem, NO_SERVICE};
use super::plan::{Plan, Planned, READ_AGAIN_FAILED, as_planned};
use rayon::prelude::*;
use rocemesh_formats::inventory::Inventory;
use rocemesh_formats::record::{EndpointRole, ProbeColumns};
use rocemesh_formats::segment::{LONG_GAP_FACTOR, LONG_GAP_MIN_NS};
use rocemesh_formats::segment::{Pick, SegmentReader};
use rocemesh_formats::window::{ArchivedWindowSummary, BUCKETS, Measure, STALL_NS, Summariser, WindowSummary};
use std::path::PathBuf;

/// Summary windows of folded files are this long where it divides the analysis window (the
/// agent's default), else the analysis window: short enough that a stall leaves out seconds of
/// a host's probes, not a whole analysis window.
const FOLD_WINDOW_S: u64 = rocemesh_formats::window::DEFAULT_WINDOW_S;

/// One histogram cell of a key as analysis keeps it: 4 bytes where the file's
/// (`formats::window::Cell`) takes 8, since the cells are most of what a summarised input
/// holds in memory (the bench's 10^8 probes: 2·10^8 cells) and every stage reads them all.
/// The bucket takes 11 bits ([`BUCKETS`] is 1,920), the measure 2, the timestamp source's code
/// 3 (`crate::probe::ts_code`: every stage reads a source through that code, so a source this
/// build does not know keeps its meaning), the count 16: a larger count is kept as several
/// cells of the same bucket, which every stage sums.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyCell(u32);

impl KeyCell {
    /// The largest count one cell holds.
    const MAX_COUNT: u32 = u16::MAX as u32;

    /// Probes.
    #[inline]
    pub fn count(self) -> u32 {
        self.0 >> 16
    }

    /// `formats::window::bucket_of` the value.
    #[inline]
    pub fn bucket(self) -> u16 {
        (self.0 & 0x7FF) as u16
    }

    /// What the cell measures.
    #[inline]
    pub fn measure(self) -> Measure {
        match (self.0 >> 11) & 3 {
            0 => Measure::NetworkRtt,
            1 => Measure::ProberDelay,
            _ => Measure::ResponderDelay,
        }
    }

    /// The timestamp source's code (`crate::probe::ts_code`), which every stage reads a source
    /// through.
    #[inline]
    pub fn ts_source(self) -> u8 {
        ((self.0 >> 13) & 7) as u8
    }

    /// Appends the cells of `count` probes in `bucket` of `measure` (a byte this build does not
    /// know, or a bucket past the last, adds none: no stage reads those), as many cells as the
    /// count needs.
    pub fn push(out: &mut Vec<KeyCell>, count: u32, bucket: u16, measure: u8, ts_source: u8) {
        let Some(m) = Measure::from_u8(measure) else { return };
        if bucket >= BUCKETS {
            return;
        }
        let base = u32::from(bucket) | (m as u32) << 11 | u32::from(crate::probe::ts_code(ts_source)) << 13;
        let mut left = count;
        while left > 0 {
            let n = left.min(Self::MAX_COUNT);
            out.push(KeyCell(base | n << 16));
            left -= n;
        }
    }
}

/// One (summary window, prober, target, label)'s probes, ids fleet-wide.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowKey {
    /// Start of the summary window, Unix ns.
    pub start_ns: u64,
    /// Prober and target RNIC ids ([`Dataset::rnics`]; `u32::MAX` for an id no dictionary
    /// defines); a service probe's target is its connection's remote RNIC.
    pub prober: u32,
    pub target: u32,
    /// The traced connection probed ([`Dataset::services`]), or [`NO_SERVICE`].
    pub service: u32,
    /// The flow label, or `formats::window::ALL_LABELS` when both ends share a ToR.
    pub flow_label: u32,
    /// Probe kind (0 tor_mesh, 1 inter_tor, 2 service).
    pub kind: u8,
    /// Probes by `crate::probe::Class`, in its discriminant order.
    pub counts: [u32; 7],
    /// Earliest and latest send, and earliest ok send (`u64::MAX` when none), Unix ns.
    pub first_ns: u64,
    pub last_ns: u64,
    pub first_ok_ns: u64,
    /// Responder epoch changes seen between its ok probes.
    pub epoch_changes: u32,
    /// Its histogram cells: `cells[cells.0..cells.1]` of its file's part.
    pub cells: (u32, u32),
}

/// Every file's window summaries.
#[derive(Debug, Default)]
pub struct Windows {
    /// One file's keys (in window and key order) and their cells, per file in file order: kept
    /// apart, so that a wide input is never copied into one growing table.
    parts: Vec<(Vec<WindowKey>, Vec<KeyCell>)>,
    /// Files read from their summaries, and files whose records were folded here.
    pub files_summarised: usize,
    pub files_folded: usize,
    /// Probes the keys count.
    pub probes: u64,
}

impl Windows {
    /// Keeps the keys of the summary windows that start in `[from_ns, to_ns)` (whole analysis
    /// windows, when both are multiples of one).
    pub fn retain_span(&mut self, from_ns: u64, to_ns: u64) {
        for (keys, _) in &mut self.parts {
            keys.retain(|k| (from_ns..to_ns).contains(&k.start_ns));
        }
        self.probes = self.iter().map(|(k, _)| k.probes()).sum();
    }

    /// Every key with its cells, in file order.
    pub fn iter(&self) -> impl Iterator<Item = (&WindowKey, &[KeyCell])> + '_ {
        self.keys_in(0..usize::MAX)
    }

    /// Keys in all, the positions [`Windows::keys_in`] counts.
    pub fn keys(&self) -> usize {
        self.parts.iter().map(|(keys, _)| keys.len()).sum()
    }

    /// The keys at positions `r` of [`Windows::iter`]'s order, with their cells: a block of the
    /// keys, for a stage to run over blocks on every core and merge them in order.
    pub fn keys_in(&self, r: std::ops::Range<usize>) -> impl Iterator<Item = (&WindowKey, &[KeyCell])> + '_ {
        let mut first = 0usize;
        self.parts.iter().flat_map(move |(keys, cells)| {
            let (from, to) = (r.start.saturating_sub(first), r.end.max(r.start).saturating_sub(first));
            first += keys.len();
            let part = &keys[from.min(keys.len())..to.min(keys.len())];
            part.iter().map(move |k| (k, &cells[k.cells.0 as usize..k.cells.1 as usize]))
        })
    }
}

impl Windows {
    /// Windows of these parts, each a table of keys (in window and key order) with the cells
    /// their ranges index (the live analyzer's windows).
    pub fn from_parts(parts: Vec<(Vec<WindowKey>, Vec<KeyCell>)>) -> Windows {
        let probes = parts.iter().flat_map(|(k, _)| k).map(WindowKey::probes).sum();
        Windows { parts, files_summarised: 0, files_folded: 0, probes }
    }

    /// The parts, as given to [`Windows::from_parts`].
    pub fn into_parts(self) -> Vec<(Vec<WindowKey>, Vec<KeyCell>)> {
        self.parts
    }
}

impl WindowKey {
    /// Probes of every class.
    pub fn probes(&self) -> u64 {
        self.counts.iter().map(|&c| u64::from(c)).sum()
    }
}

/// What one file contributes: its keys (file-local cell ranges), cells, stalls.
#[derive(Default)]
struct FileWindows {
    keys: Vec<WindowKey>,
    cells: Vec<KeyCell>,
    /// The shard's own stalls: (due, late), ns.
    stalls: Vec<(u64, u64)>,
    /// Probes whose prober or target id the file's dictionary does not define.
    unknown_ids: u64,
    folded: bool,
}

/// A file read for its summaries: its reader, what it contributes, and why its frame index
/// failed, if it did ([`Planned::open`]).
type Opened = (SegmentReader, FileWindows, Option<String>);

/// Whether the agents wrote window summaries, as the first of `files` that opens and holds
/// records says (one file read: `--evidence auto` chooses by it, the same way on every machine
/// and every run over the same files).
pub fn writes_window_summaries(files: &[PathBuf]) -> bool {
    files
        .iter()
        .filter_map(|p| SegmentReader::open(p).ok())
        .find(|r| r.records() > 0)
        .is_some_and(|r| r.window_summaries().next().is_some())
}

/// Reads `files` as [`super::plan`] plans them, then every file once for its window summaries
/// instead of its records (one reader per thread at a time; nothing of a file is kept but its
/// summaries' keys and cells). A file whose summaries do not divide the analysis windows of
/// `window_ns` has its records folded again. The dataset is the plan's, with the path traces
/// placed, and the shards' own stalls added to their files' long send gaps (a shard knows when
/// its schedule slipped; records leave it to be inferred from T1 gaps).
pub fn ingest_windows(files: &[PathBuf], inventory: Option<&Inventory>, window_ns: u64) -> (Dataset, Windows) {
    let mut plan = super::plan(files, Fields::All, inventory, window_ns);
    if let Some(inv) = inventory {
        plan.ds.add_single_paths(inv);
    }
    plan.with_paths();
    let w = plan.read_windows();
    plan.place_paths();
    (plan.finish(), w)
}

impl Plan {
    /// Every planned file's window summaries, read once (see [`ingest_windows`]).
    fn read_windows(&mut self) -> Windows {
        let mut out = Windows::default();
        let batch = rayon::current_num_threads().max(1);
        for first in (0..self.files.len()).step_by(batch) {
            let idx: Vec<usize> = (first..(first + batch).min(self.files.len())).collect();
            let (files, ds, window_ns) = (&self.files, &self.ds, self.window_ns);
            let opened: Vec<Result<Opened, String>> = idx
                .par_iter()
                .map(|&i| {
                    let f = &files[i];
                    let (r, why) = open_for_windows(f, window_ns)?;
                    let rnic = ds.agents[f.agent].rnic;
                    let fw = file_windows(ds, &r, &f.remap, rnic, window_ns, f.records);
                    Ok((r, fw, why))
                })
                .collect();
            for (i, r) in idx.into_iter().zip(opened) {
                let path = self.files[i].path.clone();
                let r = r.map(|(r, fw, why)| {
                    self.say_opened(i, &r, why);
                    (r, fw)
                });
                match r {
                    Ok((r, fw)) if as_planned(&r, &self.files[i]) => {
                        if let Some(traces) = &mut self.traces {
                            traces.add(&mut self.ds.problems, &path, &r, &self.files[i].remap);
                        }
                        // A shard's slip counts as a frozen host by the rule its records' send
                        // gaps are held to (`send_gaps`): beyond twice the usual spacing plus
                        // 100 ms.
                        let agent = &mut self.ds.agents[self.files[i].agent];
                        let limit = agent.median_gap_ns.saturating_mul(LONG_GAP_FACTOR).saturating_add(LONG_GAP_MIN_NS);
                        agent.long_gaps.extend(fw.stalls.iter().copied().filter(|s| s.1 > limit));
                        agent.long_gaps.sort_unstable();
                        self.read_records += self.files[i].records;
                        self.unknown_ids[i] += fw.unknown_ids;
                        out.add(fw);
                    }
                    Ok((r, _)) => self.left_out(
                        i,
                        FileProblem {
                            path,
                            problem: format!(
                                "{READ_AGAIN_FAILED}: it holds {} records where the first pass said {}: left out",
                                r.file_records(),
                                self.files[i].records
                            ),
                            skipped: false,
                        },
                    ),
                    Err(problem) => self.left_out(
                        i,
                        FileProblem { path, problem: format!("{READ_AGAIN_FAILED}: {problem}"), skipped: false },
                    ),
                }
            }
        }
        out
    }
}

impl Windows {
    fn add(&mut self, f: FileWindows) {
        self.probes += f.keys.iter().map(WindowKey::probes).sum::<u64>();
        self.parts.push((f.keys, f.cells));
        if f.folded {
            self.files_folded += 1;
        } else {
            self.files_summarised += 1;
        }
    }
}

/// The file's window summaries and path traces only, where its frames are indexed and its
/// summaries serve `window_ns` ([`summaries_serve`]); else the file whole, for its records to be
/// folded. With why its index failed, if it did ([`Planned::open`]).
fn open_for_windows(f: &Planned, window_ns: u64) -> Result<(SegmentReader, Option<String>), String> {
    let only = Pick { probes: None, windows: true, paths: true };
    let (r, why) = f.open(&only)?;
    if !r.is_partial() || summaries_serve(&r, window_ns) {
        return Ok((r, why));
    }
    drop(r);
    f.open(&Pick { probes: Some((0, u64::MAX)), ..only }).map(|(r, again)| (r, why.or(again)))
}

/// Whether `reader`'s summaries count every record of its file in windows that divide
/// `window_ns`: then they are read instead of its records.
fn summaries_serve(reader: &SegmentReader, window_ns: u64) -> bool {
    reader.summaries_complete()
        && reader
            .window_summaries()
            .all(|s| s.window_ns.to_native() > 0 && window_ns.is_multiple_of(s.window_ns.to_native()))
}

/// One file's summaries in fleet ids: its own where they count every record and divide the
/// analysis window, else its records folded.
fn file_windows(
    ds: &Dataset,
    reader: &SegmentReader,
    m: &Remap,
    rnic: u32,
    window_ns: u64,
    planned: usize,
) -> FileWindows {
    let own = summaries_serve(reader, window_ns);
    let mut f = FileWindows { folded: !own, ..FileWindows::default() };
    if own {
        let (keys, cells) = reader.window_summaries().fold((0, 0), |(k, c), s| (k + s.keys.len(), c + s.cells.len()));
        f.keys.reserve_exact(keys);
        f.cells.reserve_exact(cells);
        for s in reader.window_summaries() {
            add_summary(&mut f, s, m);
        }
    } else {
        for s in fold(ds, reader, m, rnic, window_ns, planned) {
            // Archived and native summaries hold the same fields; one path reads them.
            let bytes = rkyv::to_bytes::<rkyv::rancor::Error>(&s).expect("a summary always serialises");
            let a = rkyv::access::<ArchivedWindowSummary, rkyv::rancor::Error>(&bytes)
                .expect("a summary just serialised reads back");
            add_summary(&mut f, a, m);
        }
    }
    f
}

/// `s`'s keys and cells into `f`, ids remapped; its stalls become the file's long send gaps
/// (the shard knew its schedule slipped, where records leave it to be inferred from T1 gaps).
fn add_summary(f: &mut FileWindows, s: &ArchivedWindowSummary, m: &Remap) {
    let start_ns = s.start_unix_ns.to_native();
    for st in s.stalls.iter() {
        let (due, late) = (st.0.to_native(), st.1.to_native());
        if late > STALL_NS {
            f.stalls.push((due, late));
        }
    }
    let remap = |table: &[u32], v: u32| table.get(v as usize).copied().unwrap_or(u32::MAX);
    for (i, k) in s.keys.iter().enumerate() {
        let (pr, tg) = (k.prober.to_native(), k.target.to_native());
        let prober = remap(&m.prober, pr);
        let target = remap(&m.target, tg);
        let service = if m.service.is_empty() { NO_SERVICE } else { remap(&m.service, tg) };
        let counts: [u32; 7] = std::array::from_fn(|c| k.counts[c].to_native());
        if prober == u32::MAX || target == u32::MAX {
            f.unknown_ids += counts.iter().map(|&c| u64::from(c)).sum::<u64>();
        }
        let from = f.cells.len() as u32;
        for c in s.cells_of(i) {
            KeyCell::push(&mut f.cells, c.count.to_native(), c.bucket.to_native(), c.measure, c.ts_source);
        }
        f.keys.push(WindowKey {
            start_ns,
            prober,
            target,
            service: if service == u32::MAX { NO_SERVICE } else { service },
            flow_label: k.flow_label.to_native(),
            kind: k.kind,
            counts,
            first_ns: k.first_t1_ns.to_native(),
            last_ns: k.last_t1_ns.to_native(),
            first_ok_ns: k.first_ok_t1_ns.to_native(),
            epoch_changes: k.epoch_changes.to_native(),
            cells: (from, f.cells.len() as u32),
        });
    }
}

/// `reader`'s first `planned` records folded into summaries by the writer's [`Summariser`], with the writer's
/// ToR known from the fleet's RNICs.
fn fold(
    ds: &Dataset,
    reader: &SegmentReader,
    m: &Remap,
    rnic: u32,
    window_ns: u64,
    planned: usize,
) -> Vec<WindowSummary> {
    let fold_ns =
        if window_ns.is_multiple_of(FOLD_WINDOW_S * 1_000_000_000) { FOLD_WINDOW_S * 1_000_000_000 } else { window_ns };
    // Records are in completion order: a generous grace, and every window closed at the end.
    let mut s = Summariser::new(fold_ns, 60_000_000_000);
    let own_tor = ds.rnics.get(rnic as usize).map_or("", |r| r.tor.as_str());
    for e in reader.dictionary() {
        let tg = m.target.get(e.id as usize).copied().unwrap_or(u32::MAX);
        let tor = ds.rnics.get(tg as usize).map_or("", |r| r.tor.as_str());
        let same = e.role != EndpointRole::Service as u8 && !own_tor.is_empty() && tor == own_tor;
        s.set_same_tor(e.id, same);
    }
    let mut cols = ProbeColumns::default();
    let mut out = Vec::new();
    // The records the plan counted: an open segment may have grown since.
    for (_, c, keep) in planned_chunks(reader, planned) {
        cols.clear();
        for i in 0..keep {
            cols.push(&c.row(i));
        }
        s.fold(&cols);
        out.extend(s.ready().iter().cloned());
        s.clear_ready();
    }
    s.close_all();
    out.extend(s.ready().iter().cloned());
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use rocemesh_formats::window::bucket_of;

    #[test]
    fn a_packed_cell_reads_back_what_was_counted() {
        let mut cells = Vec::new();
        let bucket = bucket_of(123_456);
        KeyCell::push(&mut cells, 7, bucket, Measure::ResponderDelay as u8, 3);
        KeyCell::push(&mut cells, 1, BUCKETS - 1, Measure::NetworkRtt as u8, 0);
        let got: Vec<_> = cells.iter().map(|c| (c.count(), c.bucket(), c.measure(), c.ts_source())).collect();
        assert_eq!(got, vec![(7, bucket, Measure::ResponderDelay, 3), (1, BUCKETS - 1, Measure::NetworkRtt, 0)]);
    }

    /// A count past 16 bits is kept whole over several cells; a source this build does not
    /// know reads as `ts_code` reads it; a measure or bucket no stage reads adds nothing.
    #[test]
    fn a_packed_cell_keeps_every_probe_and_every_sources_meaning() {
        let mut cells = Vec::new();
        KeyCell::push(&mut cells, 200_000, 100, Measure::ProberDelay as u8, 1);
        assert_eq!(cells.len(), 4);
        assert_eq!(cells.iter().map(|c| c.count()).sum::<u32>(), 200_000);
        assert!(cells.iter().all(|c| c.bucket() == 100 && c.measure() == Measure::ProberDelay && c.ts_source() == 1));
        cells.clear();
        KeyCell::push(&mut cells, 1, 100, Measure::NetworkRtt as u8, 200);
        assert_eq!(cells[0].ts_source(), crate::probe::ts_code(200));
        let before = cells.len();
        KeyCell::push(&mut cells, 5, 100, 3, 0);
        KeyCell::push(&mut cells, 5, BUCKETS, Measure::NetworkRtt as u8, 0);
        KeyCell::push(&mut cells, 0, 100, Measure::NetworkRtt as u8, 0);
        assert_eq!(cells.len(), before);
    }
}
