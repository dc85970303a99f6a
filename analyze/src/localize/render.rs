//! The text a person reads: the findings table ([`render_table`]), and the evidence strings
//! findings carry (which timestamp sources' baselines a slowness finding was judged against).

use super::baseline::Baselines;
use super::{Grade, Localization};
use crate::ingest::UnmappedHop;
use crate::probe::{TsSources, ts_name};
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// A share as a percentage with the digits a faint one needs: 100.0%, 1.3%, 0.052%.
pub(super) fn percent(x: f64) -> String {
    let p = x * 100.0;
    match p {
        p if p >= 1.0 || p == 0.0 => format!("{p:.1}%"),
        p if p >= 0.1 => format!("{p:.2}%"),
        p => format!("{p:.3}%"),
    }
}

/// `; slow against the kernel_software baseline (RTT above 12.1 us in a ToR, 14.0 us between
/// ToRs)`, one clause per source.
pub(super) fn slow_sources(ts: TsSources, base: &Baselines, w: u32) -> String {
    let parts: Vec<String> = ts
        .codes()
        .map(|c| {
            let both = &base.by_code[usize::from(c)];
            let shift = base.shift(w, c);
            let thresholds: Vec<String> = match (&both[0], &both[1]) {
                (Some(m), Some(i)) => vec![
                    format!("{:.1} us in a ToR", m.slow_threshold_ns * shift / 1e3),
                    format!("{:.1} us between ToRs", i.slow_threshold_ns * shift / 1e3),
                ],
                _ => vec![format!("{:.1} us", base.slow_ns_in(c, false, w) / 1e3)],
            };
            let scaled = if shift > 1.0 {
                format!(", x{shift:.2} with the fleet's ToR-mesh RTT in the window")
            } else {
                String::new()
            };
            format!("{} baseline (RTT above {}{scaled})", ts_name(c), thresholds.join(", "))
        })
        .collect();
    if parts.is_empty() { String::new() } else { format!("; slow against the {}", parts.join(" and the ")) }
}

/// A readable table of findings with their evidence.
pub fn render_table(l: &Localization) -> String {
    render_table_with(l, &[])
}

/// What localisation counted from, in words.
pub fn counted_from(e: &super::EvidenceUsed) -> String {
    if e.from != "window_summaries" {
        return "counted from the records".into();
    }
    let folded = match e.files_folded {
        0 => String::new(),
        n => format!(", and the records of {n} files without complete summaries, folded alike"),
    };
    format!(
        "counted from the window summaries of {} files{folded} (values within 1/64 of the records')",
        e.files_summarised
    )
}

/// [`render_table`] with a line of `notes` under each finding that has one (`notes[i]` for
/// `l.findings[i]`; what the switches saw, `crate::switches`).
pub fn render_table_with(l: &Localization, notes: &[Option<String>]) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "{} findings over {} windows, {} records", l.findings.len(), l.windows, l.records);
    if l.evidence.from == "window_summaries" {
        let _ = writeln!(s, "{}", counted_from(&l.evidence));
    }
    for b in &l.baselines {
        let _ = writeln!(
            s,
            "{} timestamps, {}: fleet RTT p50 {:.1} us, a probe is slow above {:.1} us; a host delay above {:.1} ms is a stall ({} samples)",
            b.ts_source,
            b.scope.replace('_', "-"),
            b.rtt_ns_p50 / 1e3,
            b.slow_threshold_ns / 1e3,
            b.host_noise_threshold_ns as f64 / 1e6,
            b.samples
        );
    }
    if let Some(top) = l.rtt_shifts.iter().max_by(|a, b| a.factor.total_cmp(&b.factor)) {
        let _ = writeln!(
            s,
            "the fleet's ToR-mesh RTT rose in {} windows (most: x{:.2} from {}, {}): their slow thresholds rose with it",
            l.rtt_shifts.len(),
            top.factor,
            crate::inspect::utc(top.window_start_ns),
            top.ts_source
        );
    }
    if l.inter_tor_without_path > 0 {
        let _ =
            writeln!(s, "{} inter-ToR probes had no path trace and could not vote on links", l.inter_tor_without_path);
    }
    if l.hops_learned > 0 {
        let _ = writeln!(
            s,
            "{} path-trace hop addresses no inventory switch lists were named as their traces' first or last \
             switch: the ToR of the prober or of the target",
            l.hops_learned
        );
    }
    render_unmapped_hops(&mut s, &l.unmapped_hops);
    let ne = &l.not_evidence;
    if !ne.local_drop_by_prober.is_empty() {
        let _ = writeln!(
            s,
            "probes dropped on their prober's own host (not network evidence): {}",
            worst_five(&ne.local_drop_by_prober, "RNICs")
        );
    }
    if ne.busy_host_rtt > 0 {
        let _ = writeln!(
            s,
            "{} host-stamped RTTs were no slowness evidence: a host on them was busy (windows busy: {})",
            ne.busy_host_rtt,
            worst_five(&ne.busy_host_windows, "hosts")
        );
    }
    if ne.unknown_outcome + ne.unknown_rnic > 0 {
        let _ = writeln!(
            s,
            "not evidence: {} records with an outcome byte this build does not know, {} naming an RNIC no dictionary defines",
            ne.unknown_outcome, ne.unknown_rnic
        );
    }
    let _ = writeln!(
        s,
        "{:<9} {:<24} {:<20} {:<20} {:>4} {:>5} evidence",
        "kind", "entity", "from (UTC)", "to (UTC)", "win", "flaps"
    );
    for (i, f) in l.findings.iter().enumerate() {
        let to = f.end_ns.map_or_else(|| "still holding".to_owned(), crate::inspect::utc);
        let _ = writeln!(
            s,
            "{:<9} {:<24} {:<20} {:<20} {:>4} {:>5} {}",
            f.kind,
            f.entity,
            crate::inspect::utc(f.start_ns),
            to,
            f.windows,
            f.flaps,
            f.evidence
        );
        if let Some(Some(note)) = notes.get(i) {
            let _ = writeln!(s, "{:<9} {note}", "");
        }
    }
    render_services(&mut s, l);
    s
}

/// The five largest counts of `by_name` as "name count", largest first, and how many more
/// `what` there are.
pub(super) fn worst_five(by_name: &BTreeMap<String, u64>, what: &str) -> String {
    let mut worst: Vec<(&String, &u64)> = by_name.iter().collect();
    worst.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    let shown: Vec<String> = worst.iter().take(5).map(|(n, c)| format!("{n} {c}")).collect();
    let more = worst.len().saturating_sub(5);
    format!("{}{}", shown.join(", "), if more > 0 { format!(" and {more} more {what}") } else { String::new() })
}

/// Addresses shown by name in [`render_unmapped_hops`]; the rest are counted.
pub(super) const UNMAPPED_SHOWN: usize = 10;

/// The unmapped-hops lines of [`render_table`]: which addresses, and how to name them.
pub(super) fn render_unmapped_hops(s: &mut String, hops: &[UnmappedHop]) {
    if hops.is_empty() {
        return;
    }
    let shown: Vec<String> =
        hops.iter().take(UNMAPPED_SHOWN).map(|h| format!("{} ({} traces)", h.addr, h.traces)).collect();
    let more = hops.len().saturating_sub(UNMAPPED_SHOWN);
    let _ = writeln!(
        s,
        "{} path-trace hop addresses no inventory switch lists; the traces through them were left out: {}{}",
        hops.len(),
        shown.join(", "),
        if more > 0 { format!(" and {more} more") } else { String::new() }
    );
    let _ =
        writeln!(s, "  fix: add them to the inventory with `ctl inventory switch-addrs` and pass it with --inventory");
}

/// The services section of [`render_table`].
pub(super) fn render_services(s: &mut String, l: &Localization) {
    if l.services.is_empty() {
        let _ = writeln!(s, "\nno traced service connections in the data");
        return;
    }
    let _ = writeln!(
        s,
        "\n{} traced service connections, worst first ({} high, {} medium)",
        l.services.len(),
        l.services.iter().filter(|x| x.grade == Grade::High).count(),
        l.services.iter().filter(|x| x.grade == Grade::Medium).count()
    );
    if !l.unresolved_services.is_empty() {
        let _ = writeln!(
            s,
            "services whose remote RNIC no agent, inventory or dictionary names ({}; listed under their GID): {}",
            l.unresolved_services.len(),
            l.unresolved_services.join(", ")
        );
    }
    let _ = writeln!(
        s,
        "{:>4} {:<6} {:>13} {:>7} {:>11}  {:<60} affected by",
        "rank", "grade", "lost/probes", "bad win", "rtt p99 us", "service"
    );
    for x in &l.services {
        let affected: Vec<String> = x
            .affected_by
            .iter()
            .map(|a| format!("{} {}{}", a.kind, a.entity, if a.confirmed { " (confirmed)" } else { "" }))
            .collect();
        let mut tail = affected.join(", ");
        if let Some(note) = &x.note {
            tail = if tail.is_empty() { format!("({note})") } else { format!("{tail} ({note})") };
        }
        let _ = writeln!(
            s,
            "{:>4} {:<6} {:>13} {:>7} {:>11}  {:<60} {}",
            x.rank,
            x.grade.name(),
            format!("{}/{}", x.lost, x.probes),
            x.bad_windows.len(),
            x.rtt_ns_p99.map_or_else(|| "-".into(), |v| format!("{:.1}", v as f64 / 1e3)),
            x.label,
            tail
        );
    }
}
