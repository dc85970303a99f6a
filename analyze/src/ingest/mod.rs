//! Ingest: segment files (open and sealed) into one columnar table with fleet-wide ids.
//!
//! Files are opened and validated in parallel; their dictionaries are merged into one
//! name -> id map (segment ids are per file); then every file's column chunks are copied, in
//! parallel, straight into disjoint slices of preallocated column vectors, remapping the two id
//! columns on the way. Those vectors become polars columns without another copy
//! ([`Probes::into_frame`]). Damaged files contribute what validated; unreadable ones are
//! reported and skipped.
//!
//! [`ingest_windows`] reads the files' window summaries instead of their records, for
//! localisation on counters and histograms.
//!
//! Ingest also keeps what only the file structure tells: which agent instance wrote which file
//! (restarts), and each prober's send-time gaps (a frozen host's timers fire late).
//!
//! Traced service connections (dictionary entries of role `Service`) become [`Service`]s. Their
//! probes travel the fabric to the connection's remote RNIC, so the target column holds that
//! RNIC's fleet id, and every analysis by RNIC (report scopes, localisation evidence) counts them
//! there; the [`Probes::service`] column keeps which connection each one probed. The remote RNIC
//! is, in this order ([`Resolution`]): the name the agent wrote (`ServiceConn::remote`); the
//! inventory RNIC whose GID (or IPv4-mapped address) is the entry's address; an RNIC entry of any
//! file's dictionary with that address; else an RNIC named after the GID (`gid:::ffff:10.0.1.2`),
//! which the outputs list as unresolved. The per-file tables that map segment ids do this
//! resolution once per dictionary entry, so the per-record copy stays a table lookup.
//!
//! Path traces ([`Dataset::paths`]) name their hops by dictionary entries of role `Switch`.
//! Simulated traces name the switch (`spine2`, address zero) and are taken as they are. The
//! agent's know only the address that answered (`name` is its text, `addr` the address): the
//! inventory's switch addresses ([`Inventory::switch_addrs`]) name it, so one switch seen from
//! several addresses or agents is one switch id. A hop whose address no inventory switch lists
//! (every such hop, without an inventory) is *unmapped*: its traces are left out, since they
//! would vote on an element nobody can name, and counted by address in
//! [`Dataset::unmapped_hops`]. A trace of an ACK path ends at the prober, which the responder
//! knows only by address (a dictionary entry of role `Peer`): it is the RNIC whose own dictionary
//! entry declares that address, else an RNIC entry of any file's dictionary with it, else the
//! inventory RNIC with it as ip or GID. A `Peer` is never an RNIC of its own; traces to one that
//! nothing resolves are left out and the file reported.

mod columns;
mod dict;
mod model;
mod paths;
mod plan;
#[cfg(test)]
mod tests;
mod windows;

use columns::{fill, split};
use dict::{Merger, Remap, agent_file, claim_services, unknown_ids_problem};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
pub(crate) use model::filled;
pub use model::{
    AgentFile, Dataset, Fields, FileProblem, NO_SERVICE, NO_TOR, PathKey, Probes, Resolution, Rnic, Service, TimedPath,
    UNKNOWN_RNIC, UnmappedHop,
};
use paths::place_paths;
pub use plan::{Plan, READ_AGAIN_FAILED, plan};
use rayon::prelude::*;
use rocemesh_formats::inventory::Inventory;
use rocemesh_formats::segment::SegmentReader;
use std::path::PathBuf;
pub use windows::{KeyCell, WindowKey, Windows, ingest_windows, writes_window_summaries};

/// A send gap is host-noise evidence from this length up (see [`send_gaps`]).
pub use rocemesh_formats::segment::LONG_GAP_MIN_NS;

/// Reads every file in `files` (see [`crate::inspect::find_segments`]). `progress` draws a bar on
/// stderr when it is a terminal.
pub fn ingest(files: &[PathBuf], progress: bool) -> Dataset {
    ingest_fields(files, progress, Fields::All)
}

/// [`ingest`] of some of the probe columns; the others are left empty.
pub fn ingest_fields(files: &[PathBuf], progress: bool, fields: Fields) -> Dataset {
    ingest_with(files, progress, fields, None)
}

/// [`ingest_fields`], resolving services' remote RNICs through `inventory` where the agent did
/// not name them (see the module documentation).
pub fn ingest_with(files: &[PathBuf], progress: bool, fields: Fields, inventory: Option<&Inventory>) -> Dataset {
    let bar = if progress && std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        let b = ProgressBar::with_draw_target(Some(files.len() as u64 * 2), ProgressDrawTarget::stderr());
        // The template is a constant that parses; were it ever broken, the plain bar loses
        // nothing but the message.
        b.set_style(
            ProgressStyle::with_template("{msg} {wide_bar} {pos}/{len}").unwrap_or(ProgressStyle::default_bar()),
        );
        b.set_message("reading segments");
        b
    } else {
        ProgressBar::hidden()
    };
    let opened: Vec<(PathBuf, Result<SegmentReader, String>)> = files
        .par_iter()
        .map(|p| {
            let r = SegmentReader::open(p).map_err(|e| e.to_string());
            bar.inc(1);
            (p.clone(), r)
        })
        .collect();
    let mut ds = Dataset { files: files.len(), ..Dataset::default() };
    let mut merger = Merger::new(inventory);
    let mut readers = Vec::new();
    let mut remaps: Vec<Remap> = Vec::new();
    for (path, r) in opened {
        let reader = match r {
            Ok(r) => r,
            Err(problem) => {
                ds.problems.push(FileProblem { path, problem, skipped: true });
                continue;
            }
        };
        ds.problems.extend(damage_problems(&path, &reader));
        remaps.push(merger.add(&mut ds, reader.identity(), reader.dictionary()));
        readers.push((path, reader));
    }
    let rnic_ids = merger.finish(&mut ds, &mut remaps, inventory);
    place_paths(&mut ds, &readers, &remaps);
    let counts: Vec<usize> = readers.iter().map(|(_, r)| r.probe_chunks().map(|c| c.len()).sum()).collect();
    let total: usize = counts.iter().sum();
    let mut probes = Probes::zeroed(total, fields, !ds.services.is_empty());
    {
        let mut slices = split(&mut probes, &counts);
        let filled: Vec<(AgentFile, u64)> = readers
            .par_iter()
            .zip(remaps.par_iter())
            .zip(slices.par_iter_mut())
            .map(|(((_, reader), m), out)| {
                let unknown_ids = fill(reader, m, out, fields, None, 0, usize::MAX);
                let agent = agent_file(reader, out.t1, out.prober.first().copied(), &rnic_ids);
                bar.inc(1);
                (agent, unknown_ids)
            })
            .collect();
        for (((path, _), m), (agent, unknown_ids)) in readers.iter().zip(&remaps).zip(filled) {
            claim_services(&mut ds, m, agent.rnic);
            ds.problems.extend(unknown_ids_problem(path, unknown_ids));
            ds.agents.push(agent);
        }
    }
    bar.finish_and_clear();
    ds.probes = probes;
    ds
}

/// What a file's reader says it had to skip, as problems of that file.
pub fn damage_problems<'a>(
    path: &'a std::path::Path,
    reader: &'a SegmentReader,
) -> impl Iterator<Item = FileProblem> + 'a {
    reader.damage().iter().map(move |d| damage_problem(path, d))
}

fn damage_problem(path: &std::path::Path, d: &rocemesh_formats::segment::Damage) -> FileProblem {
    FileProblem {
        path: path.to_path_buf(),
        problem: format!("{:?} at byte {}: {}", d.kind, d.offset, d.detail),
        skipped: false,
    }
}
