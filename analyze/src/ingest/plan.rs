//! The plan: every file opened and validated once, its dictionary merged, and the input cut
//! into ranges of whole windows that hold at most a budget of records ([`Plan`]), each read
//! again when it is its turn; a file that changed between the plan and its read is a problem,
//! not a wrong answer.

use super::columns::{fill, planned_chunks, split, within};
use super::damage_problem;
use super::dict::{Merger, Remap, claim_services, unknown_ids_problem, writer_rnic};
use super::model::{AgentFile, Dataset, Fields, FileProblem, Probes};
use super::paths::PathTraces;
use rayon::prelude::*;
use rocemesh_formats::inventory::Inventory;
use rocemesh_formats::record::Endpoint;
use rocemesh_formats::segment::{
    Pick, SealedFrame, SealedSummary, SegmentError, SegmentReader, SummaryRead, WriterIdentity, read_summary,
};
use std::path::PathBuf;

/// How a problem of a file the first pass read, and a range could not, begins.
pub const READ_AGAIN_FAILED: &str = "could not be read again";

/// A file [`Plan`] reads again for each time range it overlaps.
#[derive(Debug)]
pub(super) struct Planned {
    pub(super) path: PathBuf,
    pub(super) remap: Remap,
    /// Smallest and largest T1.
    pub(super) first_ns: u64,
    pub(super) last_ns: u64,
    pub(super) records: usize,
    /// Entries and [`dictionary_hash`] of its dictionary.
    pub(super) dictionary: (usize, u64),
    /// A range could not read it as planned (said then): the later ones do not try again.
    pub(super) left_out: bool,
    /// Its first record's position in the whole input ([`Probes::index`]).
    pub(super) offset: u64,
    /// Its path traces were gathered ([`Plan::with_paths`]).
    pub(super) traced: bool,
    /// Its entry in [`Dataset::agents`].
    pub(super) agent: usize,
    /// The index of its zstd frames, from its sealed summary: empty for a file read whole
    /// (open, or sealed as one frame).
    pub(super) frames: Vec<SealedFrame>,
    /// Where the damage said of it lies (the plan's, then what partial reads found): each said
    /// once however many ranges and passes read it.
    pub(super) damage_said: Vec<u64>,
}

impl Planned {
    /// Opens the file for `pick`: in part where its frames are indexed, whole otherwise, and
    /// whole too when the index disagrees with what it inflates (a forged or damaged summary:
    /// the data is still read as it is), with why.
    pub(super) fn open(&self, pick: &Pick) -> Result<(SegmentReader, Option<String>), String> {
        match SegmentReader::open_part(&self.path, &self.frames, pick) {
            Ok(r) => Ok((r, None)),
            Err(e @ SegmentError::BadSealed { .. }) if !self.frames.is_empty() => {
                let why = format!("its frame index does not hold ({e}): read whole from now on");
                SegmentReader::open(&self.path).map(|r| (r, Some(why))).map_err(|e| e.to_string())
            }
            Err(e) => Err(e.to_string()),
        }
    }
}

/// Ingest one time range at a time, for passes whose windows are independent (`analyze
/// report`): memory follows the records of a range, not of the input. A first pass reads every
/// file once, one reader per thread at a time, for what the whole input decides (dictionaries
/// and so fleet-wide ids, services, each file's span and agent facts) and keeps none of its
/// records; [`Plan::read`] then copies a range's records from the files that overlap it. The
/// ids, RNICs, services and problems are those [`ingest_with`] gives for the same files; path
/// traces are not read ([`Dataset::paths`] stays empty).
#[derive(Debug)]
pub struct Plan {
    /// Everything but the probes ([`Dataset::probes`] stays empty).
    pub ds: Dataset,
    pub(super) files: Vec<Planned>,
    pub(super) fields: Fields,
    /// Unknown prober or target ids per file, summed over the ranges read.
    pub(super) unknown_ids: Vec<u64>,
    pub(super) window_ns: u64,
    /// Readers of the files that went on past the last range read (see [`Plan::read`]).
    pub(super) carried: Vec<(usize, SegmentReader)>,
    /// Records per window index, over every file.
    pub(super) per_window: std::collections::BTreeMap<u64, u64>,
    /// Records the ranges read so far (a file that cannot be read again is not in it).
    pub(super) read_records: usize,
    /// Whether ranges carry each record's position in the whole input ([`Plan::with_index`]).
    pub(super) indexed: bool,
    /// Path traces gathered from the files the ranges opened ([`Plan::with_paths`]).
    pub(super) traces: Option<PathTraces>,
}

/// What the first pass keeps of one file: its summary (`formats::segment::read_summary`) when
/// it is sealed with one, so that it is not inflated, else the same facts from reading it whole.
pub(super) struct Head {
    pub(super) identity: WriterIdentity,
    pub(super) facts: SealedSummary,
    /// Why a summary the file has could not be used (it was read whole instead).
    pub(super) unusable_summary: Option<String>,
}

impl Head {
    /// `Err`: the file cannot be read, and why.
    pub(super) fn of(path: &std::path::Path) -> Result<Head, String> {
        let unusable_summary = match read_summary(path) {
            Ok(SummaryRead::Found(s)) => {
                return Ok(Head { identity: s.identity, facts: s.facts, unusable_summary: None });
            }
            Ok(SummaryRead::Unusable(why)) => Some(why),
            // An error here is one `open` gives again, with its message.
            Ok(SummaryRead::Absent) | Err(_) => None,
        };
        let r = SegmentReader::open(path).map_err(|e| e.to_string())?;
        Ok(Head { identity: r.identity().clone(), facts: SealedSummary::of(&r, r.damage().to_vec()), unusable_summary })
    }

    /// Records per window index, ascending (a few dozen: a segment spans minutes).
    pub(super) fn per_window(&self, window_ns: u64) -> Vec<(u64, u64)> {
        // floor(t / (k s)) = floor(floor(t / 1 s) / k): seconds add up to whole windows.
        let window_s = window_ns / 1_000_000_000;
        let mut out: Vec<(u64, u64)> = Vec::new();
        for &(s, n) in &self.facts.per_second {
            let w = s / window_s;
            match out.last_mut() {
                Some((last, m)) if *last == w => *m += n,
                _ => out.push((w, n)),
            }
        }
        out
    }
}

/// Whether `r` holds what the first pass planned `f` from: the same records and dictionary. An
/// open segment may have grown since (its writer still appends: `analyze` run on a live agent's
/// directory); a writer never rewrites, so its planned part must be unchanged.
pub(super) fn as_planned(r: &SegmentReader, f: &Planned) -> bool {
    let (entries, hash) = f.dictionary;
    let d = r.dictionary();
    if r.is_sealed() {
        r.file_records() as usize == f.records && d.len() == entries && dictionary_hash(d) == hash
    } else {
        r.records() as usize >= f.records && d.len() >= entries && dictionary_hash(&d[..entries]) == hash
    }
}

/// Tells a file's dictionary from another's, so that a file whose records are read is the one
/// its first pass planned (a summary could be forged, a file replaced).
pub(super) fn dictionary_hash(d: &[Endpoint]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    d.hash(&mut h);
    h.finish()
}

/// See [`Plan`]: the first pass over `files`, for ranges of `window_ns` windows.
pub fn plan(files: &[PathBuf], fields: Fields, inventory: Option<&Inventory>, window_ns: u64) -> Plan {
    assert!(window_ns > 0 && window_ns.is_multiple_of(1_000_000_000), "the CLI's windows are whole seconds");
    // One reader per thread at a time: a reader holds its whole (decompressed) file.
    let heads: Vec<(PathBuf, Result<Head, String>)> = files.par_iter().map(|p| (p.clone(), Head::of(p))).collect();
    let mut ds = Dataset { files: files.len(), ..Dataset::default() };
    let mut merger = Merger::new(inventory);
    let mut kept = Vec::new();
    let mut remaps = Vec::new();
    for (path, head) in heads {
        match head {
            Err(problem) => ds.problems.push(FileProblem { path, problem, skipped: true }),
            Ok(h) => {
                if let Some(why) = &h.unusable_summary {
                    ds.problems.push(FileProblem {
                        path: path.clone(),
                        problem: format!("its summary cannot be used ({why}): read whole to plan"),
                        skipped: false,
                    });
                }
                ds.problems.extend(h.facts.damage.iter().map(|d| damage_problem(&path, d)));
                remaps.push(merger.add(&mut ds, &h.identity, &h.facts.dictionary));
                kept.push((path, h));
            }
        }
    }
    let rnic_ids = merger.finish(&mut ds, &mut remaps, inventory);
    let mut planned = Vec::new();
    let mut offset = 0u64;
    let mut per_window: std::collections::BTreeMap<u64, u64> = std::collections::BTreeMap::new();
    for ((path, h), m) in kept.into_iter().zip(remaps) {
        let first = h.facts.first_prober.map(|v| m.prober.get(v as usize).copied().unwrap_or(u32::MAX));
        let rnic = writer_rnic(&h.identity, first, &rnic_ids);
        claim_services(&mut ds, &m, rnic);
        let (first_ns, last_ns) = h.facts.time_range.unwrap_or((0, 0));
        for (w, n) in h.per_window(window_ns) {
            *per_window.entry(w).or_default() += n;
        }
        let records = h.facts.records as usize;
        let dictionary = (h.facts.dictionary.len(), dictionary_hash(&h.facts.dictionary));
        ds.agents.push(AgentFile {
            rnic,
            agent_epoch: h.identity.agent_epoch,
            first_ns,
            last_ns,
            records: h.facts.records,
            long_gaps: h.facts.send_gaps.long,
            median_gap_ns: h.facts.send_gaps.median_ns,
        });
        if h.facts.time_range.is_some() {
            planned.push(Planned {
                path,
                remap: m,
                first_ns,
                last_ns,
                records,
                dictionary,
                left_out: false,
                offset,
                traced: false,
                agent: ds.agents.len() - 1,
                frames: h.facts.frames,
                damage_said: h.facts.damage.iter().map(|d| d.offset).collect(),
            });
        }
        offset += h.facts.records;
    }
    let unknown_ids = vec![0; planned.len()];
    Plan {
        ds,
        files: planned,
        fields,
        unknown_ids,
        window_ns,
        carried: Vec::new(),
        per_window,
        read_records: 0,
        indexed: false,
        traces: None,
    }
}

impl Plan {
    /// [`say_opened`] of file `i`.
    pub(super) fn say_opened(&mut self, i: usize, r: &SegmentReader, index_failed: Option<String>) {
        say_opened(&mut self.files[i], &mut self.ds.problems, r, index_failed);
    }

    /// Whether ranges read from now on carry each record's position in the whole input
    /// ([`Probes::index`]: 8 B per record, so only while a reader needs it).
    pub fn with_index(&mut self, on: bool) {
        self.indexed = on;
    }

    /// The files that ranges open from now on give their path traces, placed into
    /// [`Dataset::paths`] by [`Plan::place_paths`] once a pass over every range opened them all.
    pub fn with_paths(&mut self) {
        self.traces.get_or_insert_default();
    }

    /// Places the path traces gathered since [`Plan::with_paths`] (see [`place_paths`]); later
    /// ranges gather none.
    pub fn place_paths(&mut self) {
        if let Some(t) = self.traces.take() {
            t.place(&mut self.ds);
        }
    }

    /// Starts another pass over the ranges: what [`Plan::records_read`] and the unknown-id
    /// problems count is the next pass's, and no reader is carried into its first range.
    pub fn rewind(&mut self) {
        self.read_records = 0;
        self.unknown_ids.iter_mut().for_each(|u| *u = 0);
        self.carried.clear();
    }

    /// The start of every window that holds a record of the readable files, ascending.
    pub fn windows_held(&self) -> impl Iterator<Item = u64> + '_ {
        let window_ns = self.window_ns;
        self.per_window.keys().map(move |&w| w.saturating_mul(window_ns))
    }

    /// Records in the readable files, as the first pass counted them.
    pub fn records(&self) -> usize {
        self.files.iter().map(|f| f.records).sum()
    }

    /// Records the ranges read so far: after every range, what the output counts (less than
    /// [`Plan::records`] when a file could not be read again).
    pub fn records_read(&self) -> usize {
        self.read_records
    }

    /// Consecutive time ranges `[from, to)` of whole windows that together hold every record,
    /// each holding at most `budget` records, or one window however many it holds (a window is
    /// never split). A stretch without records between two ranges belongs to neither. A range
    /// ending at `u64::MAX` includes it (a forged or corrupt T1 is still counted).
    pub fn ranges(&self, budget: usize) -> Vec<(u64, u64)> {
        let window_ns = self.window_ns;
        let mut ranges: Vec<(u64, u64)> = Vec::new();
        let mut held = 0u64;
        for (&w, &n) in &self.per_window {
            match ranges.last_mut() {
                Some(r) if held + n <= budget as u64 => {
                    r.1 = (w + 1).saturating_mul(window_ns);
                    held += n;
                }
                _ => {
                    ranges.push((w * window_ns, (w + 1).saturating_mul(window_ns)));
                    held = n;
                }
            }
        }
        ranges
    }

    /// The records with T1 in `[from, to)`, read from the files whose span overlaps it.
    ///
    /// A sealed file with a frame index is read in part: the zstd frames whose records reach
    /// into the range (and its path traces, the first time they are wanted), so a range holds
    /// about one frame group per file beyond its own records. A file sealed as one frame is
    /// inflated whole, and its reader kept for the next range while the file goes on past this
    /// one, so that it is not inflated again for each range.
    pub fn read(&mut self, from: u64, to: u64) -> Probes {
        let (mut reader, ds) = self.split();
        let probes = reader.read(from, to);
        ds.problems.append(&mut reader.problems);
        probes
    }

    /// `each` with every range's records in turn, as [`Plan::read`] reads them, while the next
    /// range is read on the other cores: a pass's stages run on one thread, and reading
    /// (inflating, decoding) is most of a range's work, so the two overlap instead of taking
    /// turns. Two ranges are held at a time. What reading finds wrong with a file is added to
    /// the dataset's problems after the stages are done with the range before, in the order
    /// a read of one range at a time adds it. Held to one thread (`RAYON_NUM_THREADS=1`, as
    /// an operator leaving a bastion's other cores alone sets it), it reads and counts in turn,
    /// one range held: a thread of its own would be a second core the setting did not give.
    pub fn each_range(&mut self, ranges: &[(u64, u64)], each: &mut dyn FnMut(&Dataset, &Probes)) {
        let overlap = rayon::current_num_threads() > 1;
        let (mut reader, ds) = self.split();
        let mut next = ranges.first().map(|&(from, to)| reader.read(from, to));
        ds.problems.append(&mut reader.problems);
        for i in 0..ranges.len() {
            let Some(probes) = next.take() else { break };
            std::thread::scope(|s| {
                let ahead = ranges.get(i + 1).filter(|_| overlap).map(|&(from, to)| {
                    let reader = &mut reader;
                    s.spawn(move || reader.read(from, to))
                });
                each(ds, &probes);
                drop(probes);
                next = ahead.map(|h| h.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)));
            });
            if !overlap {
                next = ranges.get(i + 1).map(|&(from, to)| reader.read(from, to));
            }
            ds.problems.append(&mut reader.problems);
        }
    }

    /// The plan as what reads a range and the dataset the stages read meanwhile.
    fn split(&mut self) -> (RangeReader<'_>, &mut Dataset) {
        let Plan { ds, files, fields, unknown_ids, carried, read_records, indexed, traces, .. } = self;
        let services = !ds.services.is_empty();
        let reader = RangeReader {
            files,
            fields: *fields,
            unknown_ids,
            carried,
            read_records,
            indexed: *indexed,
            traces,
            services,
            problems: Vec::new(),
        };
        (reader, ds)
    }

    /// Leaves file `i` out of every range from now on, said once.
    pub(super) fn left_out(&mut self, i: usize, problem: FileProblem) {
        left_out(&mut self.files[i], &mut self.ds.problems, problem);
    }

    /// The dataset, with the problems only the ranges read could tell (taken: the plan is
    /// spent).
    pub fn finish(&mut self) -> Dataset {
        for (f, &u) in self.files.iter().zip(&self.unknown_ids) {
            self.ds.problems.extend(unknown_ids_problem(&f.path, u));
        }
        self.files.clear();
        self.carried.clear();
        std::mem::take(&mut self.ds)
    }
}

/// Says once what opening file `f` ([`Planned::open`]) found: why its frame index failed (it
/// is not used again), and the damage a partial read `r` found that was not said of it yet (a
/// group whose zstd frame does not inflate, found when a range first reads it). A whole read's
/// damage is the plan's (an open segment's torn tail moves as its writer appends: not said
/// again).
fn say_opened(f: &mut Planned, problems: &mut Vec<FileProblem>, r: &SegmentReader, index_failed: Option<String>) {
    if let Some(why) = index_failed {
        f.frames.clear();
        problems.push(FileProblem { path: f.path.clone(), problem: why, skipped: false });
    }
    for d in r.damage().iter().filter(|_| r.is_partial()) {
        if !f.damage_said.contains(&d.offset) {
            f.damage_said.push(d.offset);
            problems.push(damage_problem(&f.path, d));
        }
    }
}

/// Leaves file `f` out of every range from now on, said once.
fn left_out(f: &mut Planned, problems: &mut Vec<FileProblem>, problem: FileProblem) {
    f.left_out = true;
    problems.push(problem);
}

/// Planned records of a file (see [`planned_chunks`]) with T1 in `[from, to)`.
pub(super) fn records_in(reader: &SegmentReader, from: u64, to: u64, planned: usize) -> usize {
    planned_chunks(reader, planned)
        .map(|(_, c, keep)| c.t1_unix_ns[..keep].iter().filter(|t| within(t.to_native(), from, to)).count())
        .sum()
}

/// What reading a range needs of a [`Plan`]: all of it but the dataset (see
/// [`Plan::each_range`]), with the problems it finds until they go to the dataset.
struct RangeReader<'a> {
    files: &'a mut Vec<Planned>,
    fields: Fields,
    unknown_ids: &'a mut Vec<u64>,
    carried: &'a mut Vec<(usize, SegmentReader)>,
    read_records: &'a mut usize,
    indexed: bool,
    traces: &'a mut Option<PathTraces>,
    /// Whether the dataset has traced services (the records then carry their service column).
    services: bool,
    problems: Vec<FileProblem>,
}

impl RangeReader<'_> {
    /// See [`Plan::read`].
    fn read(&mut self, from: u64, to: u64) -> Probes {
        let mut readers: Vec<(usize, SegmentReader)> =
            std::mem::take(self.carried).into_iter().filter(|(i, _)| self.files[*i].last_ns >= from).collect();
        let chosen: Vec<usize> = (0..self.files.len())
            .filter(|&i| self.files[i].first_ns < to && self.files[i].last_ns >= from && !self.files[i].left_out)
            .filter(|i| !readers.iter().any(|(c, _)| c == i))
            .collect();
        let last = if to == u64::MAX { to } else { to.saturating_sub(1) };
        let paths = self.traces.is_some();
        let opened: Vec<Result<(SegmentReader, Option<String>), String>> = chosen
            .par_iter()
            .map(|&i| {
                let f = &self.files[i];
                f.open(&Pick { probes: Some((from, last)), windows: false, paths: paths && !f.traced })
            })
            .collect();
        for (&i, r) in chosen.iter().zip(opened) {
            let r = r.map(|(r, why)| {
                say_opened(&mut self.files[i], &mut self.problems, &r, why);
                r
            });
            let f = &self.files[i];
            let problem = match r {
                Ok(r) if as_planned(&r, f) => {
                    readers.push((i, r));
                    continue;
                }
                // Not what the first pass planned from: a summary that lied (a sealed file's
                // plan comes from it), or another file put in its place since.
                Ok(r) => format!(
                    "{READ_AGAIN_FAILED}: it holds {} records and {} dictionary entries where the first pass (its summary, when sealed) said {} and {}{}: left out",
                    r.file_records(),
                    r.dictionary().len(),
                    f.records,
                    f.dictionary.0,
                    if r.dictionary().len() == f.dictionary.0 { " with other entries" } else { "" }
                ),
                // Read in the first pass, gone or changed since: its records of this range
                // are not counted, and the outputs say so.
                Err(problem) => format!("{READ_AGAIN_FAILED}: {problem}"),
            };
            let problem = FileProblem { path: f.path.clone(), problem, skipped: false };
            left_out(&mut self.files[i], &mut self.problems, problem);
        }
        if let Some(traces) = self.traces.as_mut() {
            for (i, r) in &readers {
                let f = &mut self.files[*i];
                if !f.traced {
                    f.traced = true;
                    traces.add(&mut self.problems, &f.path, r, &f.remap);
                }
            }
        }
        let files = &*self.files;
        let counts: Vec<usize> = readers.par_iter().map(|(i, r)| records_in(r, from, to, files[*i].records)).collect();
        *self.read_records += counts.iter().sum::<usize>();
        let mut probes = Probes::zeroed(counts.iter().sum(), self.fields, self.services);
        if self.indexed {
            probes.index = super::filled(probes.len(), 0);
        }
        let mut slices = split(&mut probes, &counts);
        let (files, fields) = (&*self.files, self.fields);
        let unknown: Vec<u64> = readers
            .par_iter()
            .zip(slices.par_iter_mut())
            .map(|((i, r), out)| {
                let f = &files[*i];
                fill(r, &f.remap, out, fields, Some((from, to)), f.offset, f.records)
            })
            .collect();
        for ((i, _), u) in readers.iter().zip(unknown) {
            self.unknown_ids[*i] += u;
        }
        // At most one file per writer goes on past a range: what is kept is bounded by the
        // fleet, not by the input. A partial reader holds this range's frames only.
        *self.carried = readers.into_iter().filter(|(i, r)| !r.is_partial() && self.files[*i].last_ns >= to).collect();
        probes
    }
}
