//! The column copy: preallocated vectors split into disjoint per-file slices ([`split`]), filled
//! in parallel from each file's chunks with both id columns remapped on the way ([`fill`]), and
//! only the chunks whose records fall in the range being read.

use super::dict::Remap;
use super::model::{Fields, NO_SERVICE, Probes};
use rocemesh_formats::segment::SegmentReader;

/// One file's share of every column.
pub(super) struct Slices<'a> {
    pub(super) t1: &'a mut [u64],
    pub(super) rtt: &'a mut [i32],
    pub(super) pd: &'a mut [i32],
    pub(super) rd: &'a mut [i32],
    pub(super) prober: &'a mut [u32],
    pub(super) target: &'a mut [u32],
    pub(super) label: &'a mut [u32],
    pub(super) epoch: &'a mut [u32],
    pub(super) kind: &'a mut [u8],
    pub(super) outcome: &'a mut [u8],
    pub(super) arrived: &'a mut [u8],
    pub(super) ts_source: &'a mut [u8],
    pub(super) service: &'a mut [u32],
    pub(super) index: &'a mut [u64],
}

pub(super) fn split<'a>(p: &'a mut Probes, counts: &[usize]) -> Vec<Slices<'a>> {
    let mut rest = Slices {
        t1: &mut p.t1_unix_ns,
        rtt: &mut p.network_rtt_ns,
        pd: &mut p.prober_delay_ns,
        rd: &mut p.responder_delay_ns,
        prober: &mut p.prober,
        target: &mut p.target,
        label: &mut p.flow_label,
        epoch: &mut p.responder_epoch,
        kind: &mut p.kind,
        outcome: &mut p.outcome,
        arrived: &mut p.arrived,
        ts_source: &mut p.ts_source,
        service: &mut p.service,
        index: &mut p.index,
    };
    let mut out = Vec::with_capacity(counts.len());
    for &n in counts {
        macro_rules! cut {
            ($f:ident) => {{
                // Columns left out (see [`Fields`]) are empty and stay so.
                let at = n.min(rest.$f.len());
                let (a, b) = std::mem::take(&mut rest.$f).split_at_mut(at);
                rest.$f = b;
                a
            }};
        }
        out.push(Slices {
            t1: cut!(t1),
            rtt: cut!(rtt),
            pd: cut!(pd),
            rd: cut!(rd),
            prober: cut!(prober),
            target: cut!(target),
            label: cut!(label),
            epoch: cut!(epoch),
            kind: cut!(kind),
            outcome: cut!(outcome),
            arrived: cut!(arrived),
            ts_source: cut!(ts_source),
            service: cut!(service),
            index: cut!(index),
        });
    }
    out
}

/// Copies one file's records (those with T1 in `range`, every one without) into its slices;
/// returns how many prober or target ids its dictionary does not define as RNICs or services
/// (remapped to `u32::MAX`, the unknown RNIC of reports). A service probe's target becomes its
/// remote RNIC and its service id goes to the service column: table lookups, nothing allocated.
/// `offset`: the file's first record's position in the whole input ([`Probes::index`], written
/// when that slice is not empty).
pub(super) fn fill(
    reader: &SegmentReader,
    m: &Remap,
    out: &mut Slices<'_>,
    fields: Fields,
    range: Option<(u64, u64)>,
    offset: u64,
    planned: usize,
) -> u64 {
    let mut at = 0;
    let mut unknown_ids = 0u64;
    let remap = |table: &[u32], v: u32| table.get(v as usize).copied().unwrap_or(u32::MAX);
    // Which of a chunk's rows to take: all of them (a plain copy, the usual case), or the
    // ones inside the range (and planned), which only a chunk straddling a boundary needs.
    let mut picked: Vec<u32> = Vec::new();
    for (base, c, keep) in planned_chunks(reader, planned) {
        // Position of the chunk's first record in the whole input.
        let first = offset + base;
        let mut whole = keep == c.len();
        if let Some((from, to)) = range {
            let (lo, hi) = chunk_span(c);
            if hi < from || !within(lo, 0, to) {
                continue;
            }
            whole &= within(lo, from, to) && within(hi, from, to);
        }
        if !whole {
            picked.clear();
            picked.extend(
                c.t1_unix_ns[..keep]
                    .iter()
                    .enumerate()
                    .filter(|(_, t)| range.is_none_or(|(from, to)| within(t.to_native(), from, to)))
                    .map(|(i, _)| i as u32),
            );
        }
        let n = if whole { c.len() } else { picked.len() };
        let r = at..at + n;
        macro_rules! copy {
            ($dst:expr, $src:expr, $v:ident => $e:expr) => {{
                if whole {
                    for (o, $v) in $dst[r.clone()].iter_mut().zip($src.iter()) {
                        *o = $e;
                    }
                } else {
                    for (o, &i) in $dst[r.clone()].iter_mut().zip(&picked) {
                        let $v = &$src[i as usize];
                        *o = $e;
                    }
                }
            }};
        }
        copy!(out.t1, c.t1_unix_ns, v => v.to_native());
        copy!(out.rtt, c.network_rtt_ns, v => v.to_native());
        copy!(out.pd, c.prober_delay_ns, v => v.to_native());
        copy!(out.rd, c.responder_delay_ns, v => v.to_native());
        copy!(out.prober, c.prober, v => remap(&m.prober, v.to_native()));
        copy!(out.target, c.target, v => remap(&m.target, v.to_native()));
        unknown_ids +=
            out.prober[r.clone()].iter().chain(&out.target[r.clone()]).filter(|&&v| v == u32::MAX).count() as u64;
        // The column exists when some file defines a service; it was made all NO_SERVICE.
        if !out.service.is_empty() && !m.service.is_empty() {
            copy!(out.service, c.target, v => m
                .service
                .get(v.to_native() as usize)
                .copied()
                .unwrap_or(NO_SERVICE));
        }
        if fields == Fields::All {
            copy!(out.label, c.flow_label, v => v.to_native());
            copy!(out.epoch, c.responder_epoch, v => v.to_native());
            copy!(out.kind, c.kind, v => *v);
        }
        copy!(out.outcome, c.outcome, v => *v);
        copy!(out.arrived, c.arrived, v => *v);
        copy!(out.ts_source, c.ts_source, v => *v);
        if !out.index.is_empty() {
            if whole {
                for (k, o) in out.index[r.clone()].iter_mut().enumerate() {
                    *o = first + k as u64;
                }
            } else {
                for (o, &i) in out.index[r.clone()].iter_mut().zip(&picked) {
                    *o = first + u64::from(i);
                }
            }
        }
        at += n;
    }
    unknown_ids
}

/// The smallest and largest T1 of a chunk.
pub(super) fn chunk_span(c: &rocemesh_formats::record::ArchivedProbeColumns) -> (u64, u64) {
    c.t1_unix_ns.iter().fold((u64::MAX, 0), |(lo, hi), t| (lo.min(t.to_native()), hi.max(t.to_native())))
}

/// A file's chunks (those the reader holds: a partial read holds some), each with its first
/// record's position in the file and how many of its records were planned: those among the
/// first `planned` of the file. A file that grew since its plan (an open segment an agent still
/// appends to) is read as planned, so that every pass over a plan's ranges sees the same records.
pub(super) fn planned_chunks(
    reader: &SegmentReader,
    planned: usize,
) -> impl Iterator<Item = (u64, &rocemesh_formats::record::ArchivedProbeColumns, usize)> {
    let planned = planned as u64;
    reader
        .probe_chunks_at()
        .take_while(move |(base, _)| *base < planned)
        .map(move |(base, c)| (base, c, (c.len() as u64).min(planned - base) as usize))
}

/// Whether `t` is in the range `[from, to)`, `to = u64::MAX` included (see [`Plan::ranges`]).
pub(super) fn within(t: u64, from: u64, to: u64) -> bool {
    t >= from && (t < to || to == u64::MAX)
}
