//! Stages 5 and 6: who is blamed. [`Llrs`] gathers every (element, window) excess (pass 3) for the
//! false-discovery cut; [`BlameStream`] covers each window against it (pass 4, [`cover`]):
//! the element that explains most at the highest share, specialised to a contained element
//! clearly worse or generalised to a containing one, once for loss and once for slowness, with a
//! window settled once its next is covered. [`hysteresis`] then holds a finding from its first
//! bad window until enough quiet ones pass, so a flap is one finding.

use super::baseline::Baselines;
use super::evidence::{Elements, Evidence, Group, Null, counter, element_counts};
use super::render::{percent, slow_sources};
use super::statistics::{NULL_MIN_PROBES, bh_llr_cut, excess_llr, null_quartile, ratio_bar, split_llr};
use super::tally::{Acc, Mode};
use super::{Finding, Options};
use crate::ingest::Dataset;
use crate::probe::TsSources;
use std::collections::{BTreeMap, BTreeSet};

/// A candidate is replaced by an element it contains (a link of a picked spine, an RNIC of a
/// picked ToR) when that element's bad share is higher than the rest's with a log-likelihood
/// ratio of at least this (about p < 1e-5 for one test): the cover prefers the single
/// explanation that fits, and a ToR-wide 6% made of two dead RNICs of 64 does not fit.
pub(super) const SPECIALISE_LLR: f64 = 12.0;

/// Per (kind, entity): the windows it was blamed in, each with its score and evidence.
#[derive(Debug, Default)]
pub(super) struct Held(pub(super) BTreeMap<(String, String), BTreeMap<u32, (f64, String)>>);

impl Held {
    /// Blames `entity` in window `w`, keeping the strongest evidence of the window.
    pub(super) fn hold(&mut self, kind: &str, entity: &str, w: u32, score: f64, evidence: String) {
        let e = self.0.entry((kind.to_owned(), entity.to_owned())).or_default();
        let slot = e.entry(w).or_insert((score, evidence.clone()));
        if score > slot.0 {
            *slot = (score, evidence);
        }
    }
}

/// The modes a cover runs in, with the word its evidence uses.
pub(super) const MODES: [(Mode, &str); 2] = [(Mode::Lossy, "lost"), (Mode::Slow, "slow")];

/// What blaming needs of the fleet's elements: fixed for a run (RNICs and ToRs are numbered
/// first, [`Elements::new`]).
pub(super) struct Blamer {
    pub(super) tor_rnic_elements: BTreeMap<u32, Vec<u32>>,
    pub(super) rnic_elements: BTreeSet<u32>,
}

impl Blamer {
    pub(super) fn new(ds: &Dataset) -> Blamer {
        Blamer::of(&Elements::new(ds))
    }

    pub(super) fn of(e: &Elements) -> Blamer {
        let mut tor_rnic_elements: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
        for (i, &t) in e.tor_element.iter().enumerate() {
            tor_rnic_elements.entry(t).or_default().push(e.rnic_element[i]);
        }
        Blamer { tor_rnic_elements, rnic_elements: e.rnic_element.iter().copied().collect() }
    }

    /// The window's null share in `mode`: the fleet's own bad share (the lower quartile over
    /// RNICs: a dead RNIC of a large ToR and a lossy ToR together made half the RNICs lossy, and
    /// a median null of 1% hid the ToR; untouched by a spine's loss spread over every ToR),
    /// floored. `counts` is left holding each element's (bad, total).
    pub(super) fn null_share(&self, groups: &[Group], mode: Mode, opts: &Options, counts: &mut [(u32, u32)]) -> f64 {
        element_counts(groups, |_, _| true, counter(mode), counts);
        let mut rnic_shares: Vec<f64> = self
            .rnic_elements
            .iter()
            .map(|&r| counts[r as usize])
            .filter(|c| c.1 >= NULL_MIN_PROBES)
            .map(|(bad, total)| f64::from(bad) / f64::from(total))
            .collect();
        let floor = if mode == Mode::Slow { opts.slow_null_floor } else { opts.loss_null_floor };
        null_quartile(&mut rnic_shares).max(floor)
    }
}

/// Stage 5's first half: the log-likelihood ratio of every (element, window) tested, per mode,
/// for one false-discovery cut over all windows. Only ratios that could pass are kept
/// ([`bh_llr_cut`]): what is kept grows with the candidates, not the input.
#[derive(Debug, Clone)]
pub(super) struct Llrs {
    pub(super) fdr: f64,
    /// Ratios below this cannot pass: -ln(fdr), less a margin for rounding.
    pub(super) keep_from: f64,
    pub(super) kept: [Vec<f64>; 2],
    pub(super) tests: [u64; 2],
}

impl Llrs {
    pub(super) fn new(fdr: f64) -> Llrs {
        Llrs { fdr, keep_from: -fdr.ln() - 1e-6, kept: Default::default(), tests: [0; 2] }
    }

    pub(super) fn add(&mut self, e: &Evidence, elements: usize, b: &Blamer, opts: &Options) {
        for groups in e.by_window.values() {
            self.add_window(groups, elements, b, opts);
        }
    }

    /// One window's tests.
    pub(super) fn add_window(&mut self, groups: &[Group], elements: usize, b: &Blamer, opts: &Options) {
        let mut counts = vec![(0u32, 0u32); elements];
        for (m, &(mode, _)) in MODES.iter().enumerate() {
            let share = b.null_share(groups, mode, opts, &mut counts);
            for &(bad, total) in counts.iter().filter(|c| c.1 > 0) {
                self.tests[m] += 1;
                let g = excess_llr(bad, total, share);
                if g >= self.keep_from {
                    self.kept[m].push(g);
                }
            }
        }
    }

    /// Adds another's tests (taken at the same false-discovery rate).
    pub(super) fn merge(&mut self, other: &Llrs) {
        for m in 0..2 {
            self.tests[m] += other.tests[m];
            self.kept[m].extend(other.kept[m].iter().copied().filter(|&g| g >= self.keep_from));
        }
    }

    /// The cut per mode.
    pub(super) fn cuts(self) -> [f64; 2] {
        let [loss, slow] = self.kept;
        [bh_llr_cut(loss, self.tests[0], self.fdr), bh_llr_cut(slow, self.tests[1], self.fdr)]
    }
}

/// One window between its cover and its findings: its groups, null shares and picks per mode.
pub(super) struct Window {
    pub(super) w: u32,
    pub(super) groups: Vec<Group>,
    pub(super) shares: [f64; 2],
    pub(super) picks: [Vec<Pick>; 2],
}

/// Stage 5's second half, window by window in time order: one cover for loss and one for
/// slowness over the evidence, against the window's null and the cut over all windows; every
/// RNIC of a ToR picked is the ToR. A window's picks are held once its next window's are known
/// ([`BlameStream::settle`]): a pick at the edge of a neighbouring window's may be that one's
/// tail. Slowness evidence says which timestamp sources' baselines the probes were judged
/// against. At most two windows are held at a time.
pub(super) struct BlameStream {
    pub(super) cuts: [f64; 2],
    /// Covered, not yet settled.
    pub(super) pending: Option<Window>,
    /// The window settled last: its number and its picks as the cover made them.
    pub(super) before_prev: Option<(u32, [Vec<u32>; 2])>,
}

impl BlameStream {
    pub(super) fn new(cuts: [f64; 2]) -> BlameStream {
        BlameStream { cuts, pending: None, before_prev: None }
    }

    /// One range's evidence (ranges in time order).
    pub(super) fn add(
        &mut self,
        e: Evidence,
        el: &Elements,
        b: &Blamer,
        base: &Baselines,
        opts: &Options,
        held: &mut Held,
    ) {
        let mut counts = vec![(0u32, 0u32); el.names.len()];
        for (w, groups) in e.by_window {
            let mut explained = vec![false; groups.len()];
            let mut shares = [0.0; 2];
            let mut picks: [Vec<Pick>; 2] = Default::default();
            for (m, &(mode, _)) in MODES.iter().enumerate() {
                shares[m] = b.null_share(&groups, mode, opts, &mut counts);
                let null = Null { share: shares[m], llr_cut: self.cuts[m] };
                let mut p = cover(&groups, &mut explained, mode, el.names.len(), opts, null);
                // Every RNIC of a ToR picked (a lossy two-RNIC ToR can read so): that is the ToR.
                for (tor, members) in &b.tor_rnic_elements {
                    if members.len() >= 2 && members.iter().all(|m| p.iter().any(|x| x.0 == *m)) {
                        let parts: Vec<Pick> = p.iter().filter(|x| members.contains(&x.0)).copied().collect();
                        p.retain(|x| !members.contains(&x.0));
                        let (bad, total) = parts.iter().fold((0, 0), |a, x| (a.0 + x.2, a.1 + x.3));
                        let ratio = f64::from(bad) / f64::from(total.max(1));
                        p.push((*tor, ratio, bad, total));
                    }
                }
                picks[m] = p;
            }
            let next = Window { w, groups, shares, picks };
            if let Some(pending) = self.pending.take() {
                self.settle(pending, Some(&next), el, base, held);
            }
            self.pending = Some(next);
        }
    }

    /// After the last range.
    pub(super) fn finish(&mut self, el: &Elements, base: &Baselines, held: &mut Held) {
        if let Some(pending) = self.pending.take() {
            self.settle(pending, None, el, base, held);
        }
    }

    /// Holds a window's picks, the neighbours' tails put back ([`neighbours_tails`]).
    pub(super) fn settle(
        &mut self,
        mut win: Window,
        next: Option<&Window>,
        el: &Elements,
        base: &Baselines,
        held: &mut Held,
    ) {
        let before = pick_ids(&win.picks);
        let prev = self.before_prev.as_ref().filter(|(w, _)| w.checked_add(1) == Some(win.w)).map(|(_, p)| p);
        let next = next.filter(|n| win.w.checked_add(1) == Some(n.w)).map(|n| pick_ids(&n.picks));
        let tails = neighbours_tails(&mut win, prev, next.as_ref());
        let w = win.w;
        for (m, &(mode, how)) in MODES.iter().enumerate() {
            let share = win.shares[m];
            for &(e, ratio, bad, total) in &win.picks[m] {
                let (kind, name) = &el.names[e as usize];
                let mut ev = format!(
                    "{name}: {bad}/{total} probes crossing it {how} ({}) against the fleet's {} in the window \
                     (log-likelihood ratio {:.0})",
                    percent(ratio),
                    percent(share),
                    excess_llr(bad, total, share)
                );
                if mode == Mode::Slow {
                    let ts = win
                        .groups
                        .iter()
                        .filter(|g| g.elements.contains(&e))
                        .fold(TsSources::default(), |m, g| TsSources(m.0 | g.acc.slow_ts));
                    ev.push_str(&slow_sources(ts, base, w));
                }
                if let Some(&x) = tails.get(&(m, e)) {
                    let x = &el.names[x as usize].1;
                    ev.push_str(&format!(
                        " (the edge of its finding in a neighbouring window: every probe {how} across {x} in this \
                         window crossed it too)"
                    ));
                }
                held.hold(kind, name, w, ratio, ev);
            }
        }
        self.before_prev = Some((w, before));
    }
}

/// One pick of a cover: (element, bad share, bad, total).
pub(super) type Pick = (u32, f64, u32, u32);

/// The elements picked, per mode.
pub(super) fn pick_ids(p: &[Vec<Pick>; 2]) -> [Vec<u32>; 2] {
    std::array::from_fn(|m| p[m].iter().map(|x| x.0).collect())
}

/// Re-attributes a pick found in window `win` only to an element picked in a neighbouring
/// window (same mode; `prev` and `next` as their covers picked) that every one of its bad
/// probes crossed: a fault that ends (or begins) within a window leaves a few bad probes there,
/// and they cross every element of their paths, the far end's uplink as well as the faulty one.
/// The far end's has fewer probes, hence the higher share, and the cover would name it for that
/// window (the rxe lab: a lossy tor1 uplink healed 0.4 s into a window left 3 lost tor1<->tor2
/// probes, and tor2|spine0 was named on them). The neighbouring finding explains them as well
/// and is the simpler account. Returns, per (mode, element put in), the element taken out.
pub(super) fn neighbours_tails(
    win: &mut Window,
    prev: Option<&[Vec<u32>; 2]>,
    next: Option<&[Vec<u32>; 2]>,
) -> BTreeMap<(usize, u32), u32> {
    let mut tails = BTreeMap::new();
    for (m, &(mode, _)) in MODES.iter().enumerate() {
        let count = counter(mode);
        let near: Vec<u32> = prev.iter().chain(next.iter()).flat_map(|p| p[m].iter().copied()).collect();
        let isolated: Vec<u32> = win.picks[m].iter().map(|p| p.0).filter(|x| !near.contains(x)).collect();
        for x in isolated {
            let crossed_by_all = |y: u32| {
                win.groups
                    .iter()
                    .filter(|g| g.elements.contains(&x) && count(&g.acc).0 > 0)
                    .all(|g| g.elements.contains(&y))
            };
            let Some(y) = near.iter().copied().find(|&y| y != x && crossed_by_all(y)) else { continue };
            win.picks[m].retain(|p| p.0 != x);
            if win.picks[m].iter().any(|p| p.0 == y) {
                continue;
            }
            let (bad, total) = win
                .groups
                .iter()
                .filter(|g| g.elements.contains(&y))
                .map(|g| count(&g.acc))
                .fold((0, 0), |a, c| (a.0 + c.0, a.1 + c.1));
            win.picks[m].push((y, f64::from(bad) / f64::from(total.max(1)), bad, total));
            tails.insert((m, y), x);
        }
    }
    tails
}

/// Folds a finding's windows into an element containing it (an RNIC's ToR, a link's spine or
/// ToR) where that element holds in the same or a neighbouring window: a faint spine or ToR
/// fault shows, in the window of its onset or end, through too few probes to be named whole,
/// and its few lost probes may all cross one link or RNIC. The suite's generator never puts two
/// faults in one ToR or on one spine, because no prober could tell them apart; this rule is
/// where that shows.
pub(super) fn absorb_edges(e: &Elements, held: &mut Held) {
    let mut containers: BTreeMap<(String, String), Vec<(String, String)>> = BTreeMap::new();
    for (r, t) in e.rnic_element.iter().zip(&e.tor_element) {
        let (rk, rn) = &e.names[*r as usize];
        let (tk, tn) = &e.names[*t as usize];
        containers.entry(((*rk).into(), rn.clone())).or_default().push(((*tk).into(), tn.clone()));
    }
    for (kind, name) in &e.names {
        if *kind == "link"
            && let Some((tor, spine)) = name.split_once('|')
        {
            containers
                .entry(("link".into(), name.clone()))
                .or_default()
                .extend([("spine".into(), spine.to_owned()), ("tor".into(), tor.to_owned())]);
        }
    }
    let keys: Vec<(String, String)> = held.0.keys().filter(|k| containers.contains_key(*k)).cloned().collect();
    for key in keys {
        let windows: Vec<u32> = held.0[&key].keys().copied().collect();
        for w in windows {
            let near = |ws: &BTreeMap<u32, (f64, String)>| {
                ws.contains_key(&w) || ws.contains_key(&(w + 1)) || (w > 0 && ws.contains_key(&(w - 1)))
            };
            if let Some(c) = containers[&key].iter().find(|c| held.0.get(*c).is_some_and(near)).cloned()
                && let Some(ws) = held.0.get_mut(&key)
                && let Some((score, ev)) = ws.remove(&w)
            {
                let ev = format!("{ev} (at the edge of {} {}'s finding)", c.0, c.1);
                held.0.entry(c).or_default().entry(w).or_insert((score, ev));
            }
        }
        if held.0.get(&key).is_some_and(BTreeMap::is_empty) {
            held.0.remove(&key);
        }
    }
}

/// Stage 6: the windows an entity was blamed in become findings: a run of windows with gaps of
/// at most `close_after_quiet_windows` quiet ones is one finding (its gaps counted as flaps);
/// a finding whose last window is the data's last is still holding (`end_ns` = `None`).
/// Network findings first, then by start.
pub(super) fn hysteresis(
    held: Held,
    window_ns: u64,
    last_window: Option<u32>,
    close_after_quiet_windows: u64,
) -> Vec<Finding> {
    let mut findings = Vec::new();
    for ((kind, entity), ws) in held.0 {
        let mut runs: Vec<Vec<(u32, f64, String)>> = Vec::new();
        for (w, (score, ev)) in ws {
            match runs.last_mut() {
                Some(run) if u64::from(w - run.last().map_or(w, |r| r.0)) <= close_after_quiet_windows + 1 => {
                    run.push((w, score, ev))
                }
                _ => runs.push(vec![(w, score, ev)]),
            }
        }
        for run in runs {
            let first = run[0].0;
            let last = run[run.len() - 1].0;
            let flaps = 1 + run.windows(2).filter(|p| p[1].0 > p[0].0 + 1).count() as u64;
            let (score, evidence) =
                run.iter().max_by(|a, b| a.1.total_cmp(&b.1)).map(|r| (r.1, r.2.clone())).unwrap_or_default();
            findings.push(Finding {
                kind: kind.clone(),
                entity: entity.clone(),
                start_ns: u64::from(first) * window_ns,
                end_ns: (Some(last) != last_window).then_some((u64::from(last) + 1) * window_ns),
                windows: run.len() as u64,
                flaps,
                score,
                evidence,
            });
        }
    }
    let order = |k: &str| match k {
        "rnic" | "tor" | "link" | "spine" => 0,
        "ambiguous" => 1,
        _ => 2,
    };
    findings.sort_by(|a, b| (order(&a.kind), a.start_ns, &a.entity).cmp(&(order(&b.kind), b.start_ns, &b.entity)));
    findings
}

/// Greedy cover of the bad probes by elements: (element, ratio, bad, total) in pick order.
///
/// Each round tallies, per element, the bad and all probes crossing it (probes not yet
/// explained). A candidate has at least `lost_min` bad probes, a bad share of at least the
/// mode's minimum and `excess_over_null_min` x the null, and a log-likelihood ratio against the
/// null ([`excess_llr`]) that passes the false-discovery cut. The round takes the candidate with
/// the largest log-likelihood ratio: the element that explains the most bad probes at the
/// highest share, so a dead ToR beats its RNICs (same share, more probes), a dead RNIC beats its
/// ToR (same bad probes, higher share), and a spine whose links all lose alike beats each link.
/// Then it specialises: while an element whose probes all cross the pick (an RNIC of a picked
/// ToR, a link of a picked spine) is a candidate whose share lies above the rest of the pick's
/// by [`SPECIALISE_LLR`], that element is the pick instead (two dead RNICs of 64 under one ToR
/// are two RNICs, not a ToR at 6%). The probes the pick explains are removed and the round
/// repeats.
pub(super) fn cover(
    groups: &[Group],
    explained: &mut [bool],
    mode: Mode,
    elements: usize,
    opts: &Options,
    null: Null,
) -> Vec<(u32, f64, u32, u32)> {
    let count = counter(mode);
    let min_ratio = ratio_bar(mode == Mode::Slow, opts, null.share);
    let candidate = |(bad, total): (u32, u32)| -> Option<f64> {
        if bad < opts.lost_min || total == 0 {
            return None;
        }
        let ratio = f64::from(bad) / f64::from(total);
        if ratio < min_ratio || ratio < opts.excess_over_null_min * null.share {
            return None;
        }
        let llr = excess_llr(bad, total, null.share);
        (llr >= null.llr_cut).then_some(llr)
    };
    let mut picked = Vec::new();
    let mut tally: Vec<(u32, u32)> = vec![(0, 0); elements];
    let mut within: Vec<(u32, u32)> = vec![(0, 0); elements];
    let mut refused = vec![false; elements];
    loop {
        element_counts(groups, |g, _| !explained[g], &count, &mut tally);
        let Some(mut best) = (0..elements as u32)
            .filter(|&e| !refused[e as usize])
            .filter_map(|e| candidate(tally[e as usize]).map(|llr| (e, llr)))
            .max_by(|a, b| a.1.total_cmp(&b.1).then(b.0.cmp(&a.0)))
            .map(|c| c.0)
        else {
            break;
        };
        // Generalise: when an element containing the pick (its ToR, its spine) has other bad
        // probes, the pick is named only if its share is clearly above the rest of that
        // element's; otherwise that element is the explanation, and when it is itself below
        // the bar (a ToR whose loss began in the window's last seconds, a spine losing 0.1%),
        // the pick is refused, not kept as the ToR's unluckiest RNICs or the spine's
        // unluckiest link.
        let (bad, total) = tally[best as usize];
        let within_of = |e: u32, within: &mut [(u32, u32)]| {
            element_counts(groups, |g, group| !explained[g] && group.elements.contains(&e), &count, within);
        };
        within_of(best, &mut within);
        let mut counted = best;
        let wider = (0..elements as u32).filter(|&p| p != best).find(|&p| {
            let (pb, pt) = tally[p as usize];
            within[p as usize] == (bad, total)
                && pt > total
                && pb > bad
                && split_llr(bad, total, pb - bad, pt - total) < SPECIALISE_LLR
        });
        if let Some(p) = wider {
            if candidate(tally[p as usize]).is_some() && !refused[p as usize] {
                best = p;
            } else {
                refused[best as usize] = true;
                continue;
            }
        }
        loop {
            if counted != best {
                within_of(best, &mut within);
                counted = best;
            }
            let (bad, total) = within[best as usize];
            let mut next = None;
            let mut strongest = SPECIALISE_LLR;
            for c in (0..elements as u32).filter(|&c| c != best) {
                let (cb, ct) = within[c as usize];
                if ct == 0 || ct >= total || ct != tally[c as usize].1 || candidate((cb, ct)).is_none() {
                    continue;
                }
                let llr = split_llr(cb, ct, bad - cb, total - ct);
                if llr > strongest {
                    (strongest, next) = (llr, Some(c));
                }
            }
            match next {
                Some(c) => best = c,
                None => break,
            }
        }
        for (g, group) in groups.iter().enumerate() {
            if group.elements.contains(&best) {
                explained[g] = true;
            }
        }
        let (bad, total) = tally[best as usize];
        picked.push((best, f64::from(bad) / f64::from(total), bad, total));
    }
    prune(groups, picked, &count, opts)
}

/// Drops picks that the other picks explain. A probe crossing a lossy ToR and a lossy spine is
/// lossier than either, so its link can look worst of all and be picked first; it is kept only
/// if its probes fail clearly more than the other picks predict (each other pick's ratio
/// measured on probes that avoid the candidate, combined as independent drops).
pub(super) fn prune(
    groups: &[Group],
    mut picked: Vec<(u32, f64, u32, u32)>,
    count: &dyn Fn(&Acc) -> (u32, u32),
    opts: &Options,
) -> Vec<(u32, f64, u32, u32)> {
    // Most specific first: the fewest probes.
    let mut order: Vec<u32> = picked.iter().map(|p| p.0).collect();
    order.sort_by_key(|e| picked.iter().find(|p| p.0 == *e).map_or(0, |p| p.3));
    for e in order {
        if picked.len() < 2 {
            break;
        }
        let others: Vec<u32> = picked.iter().map(|p| p.0).filter(|&o| o != e).collect();
        let ratio_without = |f: u32| {
            let (mut bad, mut total) = (0u64, 0u64);
            for g in groups.iter().filter(|g| g.elements.contains(&f) && !g.elements.contains(&e)) {
                let (b, t) = count(&g.acc);
                bad += u64::from(b);
                total += u64::from(t);
            }
            if total == 0 { 0.0 } else { bad as f64 / total as f64 }
        };
        let rates: Vec<(u32, f64)> = others.iter().map(|&f| (f, ratio_without(f))).collect();
        let (mut observed, mut expected) = (0.0, 0.0);
        for g in groups.iter().filter(|g| g.elements.contains(&e)) {
            let (b, t) = count(&g.acc);
            let pass: f64 = rates.iter().filter(|(f, _)| g.elements.contains(f)).map(|(_, r)| 1.0 - r).product();
            observed += f64::from(b);
            expected += (1.0 - pass) * f64::from(t);
        }
        if observed <= expected * 1.3 + f64::from(opts.lost_min) {
            picked.retain(|p| p.0 != e);
        }
    }
    picked
}

#[cfg(test)]
mod tests {
    use super::super::testkit::*;

    /// Probes among 6 RNICs under two ToRs (r0-r2 under t0 = element 6, r3-r5 under t1 = 7),
    /// 10 per ordered pair, `lost(pr, tg)` of them lost.
    fn mesh_groups(lost: impl Fn(u32, u32) -> u32) -> Vec<Group> {
        let mut groups = Vec::new();
        for pr in 0..6 {
            for tg in (0..6).filter(|&t| t != pr) {
                let (tp, tt) = (6 + pr / 3, 6 + tg / 3);
                let mut elements = vec![pr, tg, tp];
                if tt != tp {
                    elements.push(tt);
                }
                let l = lost(pr, tg);
                groups.push(Group { elements, acc: Acc { valid: 10, lost: l, ok: 10 - l, ..Acc::default() } });
            }
        }
        groups
    }

    #[test]
    fn cover_picks_the_most_specific_sufficient_element() {
        let opts = Options::default();
        let dead_rnic = mesh_groups(|p, t| if p == 1 || t == 1 { 10 } else { 0 });
        let picks = cover(&dead_rnic, &mut vec![false; dead_rnic.len()], Mode::Lossy, 8, &opts, NULL);
        assert_eq!(picks.iter().map(|p| p.0).collect::<Vec<_>>(), [1], "a dead RNIC beats its ToR");
        let dead_tor = mesh_groups(|p, t| if p < 3 || t < 3 { 10 } else { 0 });
        let picks = cover(&dead_tor, &mut vec![false; dead_tor.len()], Mode::Lossy, 8, &opts, NULL);
        assert_eq!(picks.iter().map(|p| p.0).collect::<Vec<_>>(), [6], "a dead ToR beats its RNICs");
        let healthy = mesh_groups(|_, _| 0);
        assert!(cover(&healthy, &mut vec![false; healthy.len()], Mode::Lossy, 8, &opts, NULL).is_empty());
    }

    /// ToR-mesh groups of `n` RNICs (elements 0..n) under one ToR (element n), 10 probes per
    /// ordered pair, `lost(pr, tg)` lost.
    fn one_tor(n: u32, lost: impl Fn(u32, u32) -> u32) -> Vec<Group> {
        let mut groups = Vec::new();
        for pr in 0..n {
            for tg in (0..n).filter(|&t| t != pr) {
                let l = lost(pr, tg);
                groups.push(Group {
                    elements: vec![pr, tg, n],
                    acc: Acc { valid: 10, lost: l, ok: 10 - l, ..Acc::default() },
                });
            }
        }
        groups
    }

    /// Two dead RNICs of 64 make their ToR lose 6% of its probes, and the ToR explains every lost
    /// probe with the larger likelihood ratio; but those losses sit on two RNICs, so the cover
    /// names the two RNICs.
    #[test]
    fn two_dead_rnics_of_a_large_tor_are_two_rnics_not_the_tor() {
        let dead = |r: u32| r == 5 || r == 40;
        let groups = one_tor(64, |p, t| if dead(p) || dead(t) { 10 } else { 0 });
        let picks = cover(&groups, &mut vec![false; groups.len()], Mode::Lossy, 65, &Options::default(), NULL);
        let mut named: Vec<u32> = picks.iter().map(|p| p.0).collect();
        named.sort_unstable();
        assert_eq!(named, [5, 40]);
    }

    /// A ToR whose RNICs all lose about 1%, one of them a little more by chance, is the ToR.
    #[test]
    fn a_faint_tor_wide_loss_is_the_tor_not_its_unluckiest_rnic() {
        let groups = one_tor(16, |p, t| u32::from((p * 31 + t * 17) % 50 == 0) + u32::from(p == 3 && t % 5 == 0));
        let picks = cover(&groups, &mut vec![false; groups.len()], Mode::Lossy, 17, &Options::default(), NULL);
        assert_eq!(picks.iter().map(|p| p.0).collect::<Vec<_>>(), [16], "{picks:?}");
    }

    /// Runs [`blame`] over [`mesh_groups`]-shaped groups (RNICs h0-h5, ToRs t0 and t1) in one
    /// window, against baselines of one `ts` probe.
    fn blame_mesh(groups: Vec<Group>, ts: u8) -> Held {
        let mut names: Vec<(&'static str, String)> = (0..6).map(|i| ("rnic", format!("h{i}/d0"))).collect();
        names.extend([("tor", "t0".to_owned()), ("tor", "t1".to_owned())]);
        let el = Elements {
            names,
            rnic_element: (0..6).collect(),
            tor_element: (0..6).map(|i| 6 + i / 3).collect(),
            ..Elements::default()
        };
        let e = Evidence { by_window: BTreeMap::from([(0, groups)]) };
        let ds = dataset(1, 1, &[Rec(0, 0, 0, Outcome::Ok, 100_000, 1_000, ts)]);
        let opts = Options::default();
        let base = baselines(&ds.probes, &tor_ids(&ds), &opts);
        let b = Blamer::of(&el);
        let mut llrs = Llrs::new(opts.fdr);
        llrs.add(&e, el.names.len(), &b, &opts);
        let mut stream = BlameStream::new(llrs.cuts());
        let mut held = Held::default();
        stream.add(e, &el, &b, &base, &opts, &mut held);
        stream.finish(&el, &base, &mut held);
        absorb_edges(&el, &mut held);
        held
    }

    /// Links a (0), b (1) and c (2). Window 0: lossy a. Window 1: a healed early, leaving 3 lost
    /// probes that crossed a and b, with fewer probes across b, so the cover named b. They are
    /// a's: b is put back to a. Not when one of b's lost probes avoided a, nor when b is named
    /// in the next window too.
    #[test]
    fn an_isolated_pick_whose_bad_probes_all_cross_a_neighbouring_finding_is_that_finding() {
        let group = |elements: Vec<u32>, lost: u32| Group {
            elements,
            acc: Acc { valid: 100, lost, ok: 100 - lost, ..Acc::default() },
        };
        // Windows 0 and 2 as their covers picked them; window 1 as given.
        let prev: [Vec<u32>; 2] = [vec![0], vec![]];
        let window =
            |groups: Vec<Group>, picks: Vec<Pick>| Window { w: 1, groups, shares: [0.0; 2], picks: [picks, vec![]] };
        let tail = || vec![group(vec![0, 1], 3), group(vec![0, 2], 0), group(vec![0, 2], 0)];
        let mut win = window(tail(), vec![(1, 0.03, 3, 100)]);
        let tails = neighbours_tails(&mut win, Some(&prev), Some(&[vec![], vec![]]));
        assert_eq!(win.picks[0], vec![(0, 0.01, 3, 300)]);
        assert_eq!(tails, BTreeMap::from([((0, 0), 1)]));

        let mut own = tail();
        own.push(group(vec![2, 1], 1));
        let mut win = window(own, vec![(1, 0.02, 4, 200)]);
        assert!(neighbours_tails(&mut win, Some(&prev), None).is_empty());
        assert_eq!(win.picks[0], vec![(1, 0.02, 4, 200)]);

        let mut win = window(tail(), vec![(1, 0.03, 3, 100)]);
        assert!(neighbours_tails(&mut win, Some(&prev), Some(&[vec![1], vec![]])).is_empty());
        assert_eq!(win.picks[0], vec![(1, 0.03, 3, 100)]);
    }

    /// Every element slow alike (a fabric-wide slowdown): the window's null is the slowdown
    /// itself, and no one element is blamed for it.
    #[test]
    fn a_fabric_wide_slowdown_is_pinned_on_no_element() {
        let mut groups = mesh_groups(|_, _| 0);
        for g in &mut groups {
            g.acc.slow = 4;
        }
        let held = blame_mesh(groups, KS);
        assert!(held.0.is_empty(), "{:?}", held.0.keys().collect::<Vec<_>>());
    }

    /// A fleet slowed as a whole (28% of a healthy RNIC's probes slow) with one RNIC at 60%:
    /// more than twice the null, and far beyond chance, but under the bar of 64% (half of the
    /// probes the fleet's extra slowness left fast), which a busy machine's spread reaches. A slow RNIC, which slows every
    /// probe crossing it, is named in the same fleet.
    #[test]
    fn in_a_slowed_fleet_an_rnic_is_slow_only_when_most_of_its_otherwise_fast_probes_are() {
        let with_h0 = |slow_of_10: u32| {
            let mut groups = mesh_groups(|_, _| 0);
            for g in &mut groups {
                g.acc.slow = if g.elements[..2].contains(&0) { slow_of_10 } else { 2 };
            }
            blame_mesh(groups, KS)
        };
        let named = |h: &Held| h.0.keys().map(|k| format!("{} {}", k.0, k.1)).collect::<Vec<_>>();
        assert!(with_h0(6).0.is_empty(), "{:?}", named(&with_h0(6)));
        assert_eq!(named(&with_h0(10)), ["rnic h0/d0"]);
        let o = Options::default();
        assert_eq!(ratio_bar(true, &o, o.slow_null_floor), o.slow_ratio_min, "a healthy fleet's bar is unchanged");
        assert!((ratio_bar(true, &o, 0.28) - (0.5 + 0.5 * 0.27 / 0.99)).abs() < 1e-12);
        assert_eq!(ratio_bar(false, &Options::default(), 0.28), Options::default().loss_ratio_min);
    }

    #[test]
    fn blame_says_which_baseline_slow_probes_were_judged_against() {
        let mut groups = mesh_groups(|_, _| 0);
        for g in groups.iter_mut().filter(|g| g.elements[..2].contains(&4)) {
            g.acc.slow = 10;
            g.acc.slow_ts = TsSources::of(HP).0;
        }
        let held = blame_mesh(groups, HP);
        let blamed: Vec<&(String, String)> = held.0.keys().collect();
        assert_eq!(blamed, [&("rnic".to_owned(), "h4/d0".to_owned())]);
        let evidence = &held.0[&("rnic".to_owned(), "h4/d0".to_owned())][&0].1;
        assert_eq!(
            evidence,
            "h4/d0: 100/100 probes crossing it slow (100.0%) against the fleet's 20.0% in the window \
             (log-likelihood ratio 161); slow against the host_poll baseline (RTT above 150.0 us)"
        );
    }

    #[test]
    fn hysteresis_keeps_a_flap_one_finding_and_splits_long_quiet_spells() {
        let mut held = Held::default();
        for (w, score) in [(0, 0.5), (1, 0.9), (3, 0.4), (10, 0.7)] {
            held.hold("rnic", "h1/d0", w, score, format!("w{w}"));
        }
        held.hold("host", "h0", 2, 1.0, "stall".into());
        let f = hysteresis(held, W, Some(10), 3);
        type Summary<'a> = (&'a str, u64, Option<u64>, u64, u64, &'a str);
        let got: Vec<Summary> = f
            .iter()
            .map(|f| (f.kind.as_str(), f.start_ns, f.end_ns, f.windows, f.flaps, f.evidence.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                ("rnic", 0, Some(4 * W), 3, 2, "w1"),
                ("rnic", 10 * W, None, 1, 1, "w10"),
                ("host", 2 * W, Some(3 * W), 1, 1, "stall"),
            ],
            "network findings first; the last window's is still holding"
        );
    }

    /// Host-poll probes to and from one RNIC, far slower than the kernel-stamped rest: judged
    /// against their own source, they are not slow (a pooled baseline called that RNIC slow).
    #[test]
    fn rtt_evidence_stays_within_one_timestamp_source() {
        let mut recs = Vec::new();
        for w in 0..2 {
            for pr in 0..6u32 {
                for tg in (0..6).filter(|&t| t != pr) {
                    for _ in 0..10 {
                        let (rtt, ts) = if pr == 2 || tg == 2 { (150_000, HP) } else { (10_000, KS) };
                        recs.push(Rec(pr, tg, w, Outcome::Ok, rtt, 1_000, ts));
                    }
                }
            }
        }
        let mut ds = dataset(6, 2, &recs);
        let l = localize(&ds, &Options::default());
        assert!(l.findings.is_empty(), "{:?}", l.findings);
        let sources: Vec<(&str, &str, u64)> = l.baselines.iter().map(|b| (b.ts_source, b.scope, b.samples)).collect();
        assert_eq!(
            sources,
            [
                ("kernel_software", "inter_tor", 240),
                ("kernel_software", "tor_mesh", 160),
                ("host_poll", "inter_tor", 120),
                ("host_poll", "tor_mesh", 80)
            ],
            "most samples first"
        );
        assert_eq!((l.rtt_ns_p50, l.slow_threshold_ns), (10e3, 15e3), "the dominant source's");
        // The same probes read as one source, as before sources were told apart: h2 is "slow".
        ds.probes.ts_source.fill(KS);
        let pooled = localize(&ds, &Options::default());
        let blamed: Vec<(&str, &str)> = pooled.findings.iter().map(|f| (f.kind.as_str(), f.entity.as_str())).collect();
        assert_eq!(blamed, [("rnic", "h2/d0")]);
    }
}
