//! Stage 4: the elements each counter's probes cross, and the counts per element. Both RNICs and
//! their ToRs for every probe; for inter-ToR probes also the links and spines of the traced (or
//! inventory-determined) forward and ACK paths. [`Elements`] names them by id across ranges;
//! [`Evidence`] is one range's counts, which the cover (stage 5) reads.

use super::tally::{Acc, Key, Mode, RangeTally, Tally, TallyContext, excluded};
use crate::ingest::Dataset;
use std::collections::{BTreeMap, HashMap};

type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// The fabric of a key whose probes cross none (within a ToR) or whose path is unknown.
const NO_FABRIC: u32 = u32::MAX;

/// The elements evidence is counted on, by id, kept across a pass's ranges: ids are given in
/// the order keys come, so ranges in time order number them as one table would.
#[derive(Debug, Default)]
pub(super) struct Elements {
    pub(super) ids: HashMap<(&'static str, String), u32>,
    /// (kind, name) by element id.
    pub(super) names: Vec<(&'static str, String)>,
    /// Element id of each RNIC and of each RNIC's ToR, by RNIC id.
    pub(super) rnic_element: Vec<u32>,
    pub(super) tor_element: Vec<u32>,
    /// The fabric (an index into `fabrics`) of an inter-ToR (window or `u32::MAX`, prober,
    /// target, label); `None` without a path. Bounded by the fleet's probed pairs and labels
    /// (and the windows of those whose path changed).
    pub(super) paths: FastMap<(u32, u32, u32, u32), Option<u32>>,
    /// The links and spines of each distinct forward and ACK path pair, and their index by
    /// content: the labels of a pair that take the same paths share one.
    pub(super) fabrics: Vec<Vec<u32>>,
    pub(super) fabric_ids: FastMap<Vec<u32>, u32>,
    /// Inter-ToR probes without a path to vote on.
    pub(super) without_path: u64,
}

impl Elements {
    /// The RNICs first, then their ToRs.
    pub(super) fn new(ds: &Dataset) -> Elements {
        let mut e = Elements::default();
        e.rnic_element = ds.rnics.iter().map(|r| e.intern("rnic", &r.name)).collect();
        e.tor_element = ds.rnics.iter().map(|r| e.intern("tor", &r.tor)).collect();
        e
    }

    pub(super) fn intern(&mut self, kind: &'static str, name: &str) -> u32 {
        let next = self.names.len() as u32;
        *self.ids.entry((kind, name.to_owned())).or_insert_with(|| {
            self.names.push((kind, name.to_owned()));
            next
        })
    }

    /// The fabric (links and spines of the traced, or inventory-determined, forward and ACK
    /// paths) of an inter-ToR key, as an index into [`Elements::fabric_elements`]; `None`
    /// without one.
    pub(super) fn fabric(&mut self, ds: &Dataset, key: Key, window_ns: u64) -> Option<u32> {
        let (w, pr, tg, label) = key;
        // A key whose path changed (a prober restarted with new ports) is looked up per
        // window, at the window's end; the rest once.
        let varies = ds.path_changes.contains_key(&(pr, tg, label)) || ds.path_changes.contains_key(&(tg, pr, label));
        let at_ns = if varies { (u64::from(w) + 1) * window_ns - 1 } else { u64::MAX };
        let cache_key = (if varies { w } else { u32::MAX }, pr, tg, label);
        if let Some(&f) = self.paths.get(&cache_key) {
            return f;
        }
        let fabric = self.trace(ds, cache_key, at_ns).map(|v| match self.fabric_ids.get(&v) {
            Some(&id) => id,
            None => {
                let id = self.fabrics.len() as u32;
                self.fabrics.push(v.clone());
                self.fabric_ids.insert(v, id);
                id
            }
        });
        self.paths.insert(cache_key, fabric);
        fabric
    }

    /// The element ids of fabric `id` ([`Elements::fabric`]).
    pub(super) fn fabric_elements(&self, id: u32) -> &[u32] {
        &self.fabrics[id as usize]
    }

    pub(super) fn trace(&mut self, ds: &Dataset, (_, pr, tg, label): Key, at_ns: u64) -> Option<Vec<u32>> {
        let traced = ds.path_at(&(pr, tg, label), at_ns).zip(ds.path_at(&(tg, pr, label), at_ns));
        let (rp, rt) = (pr as usize, tg as usize);
        let hops = match traced {
            Some(t) => Some(t),
            None => {
                let (ta, tb) = (&ds.rnics[rp].tor, &ds.rnics[rt].tor);
                ds.tor_paths.get(&(ta.clone(), tb.clone())).zip(ds.tor_paths.get(&(tb.clone(), ta.clone())))
            }
        };
        hops.map(|(fwd, rev)| {
            let mut v = Vec::new();
            for hops in [fwd, rev] {
                for (kind, name) in path_elements(&ds.switches, hops) {
                    let id = self.intern(kind, &name);
                    if !v.contains(&id) {
                        v.push(id);
                    }
                }
            }
            v
        })
    }
}

/// Stage 4's output for one range: per window, the counters that are evidence and the elements
/// they cross.
#[derive(Debug, Default)]
pub(super) struct Evidence {
    pub(super) by_window: BTreeMap<u32, Vec<Group>>,
}

/// Stage 4: the elements a probe's packets cross: both RNICs and ToRs always; for inter-ToR
/// probes, the links and spines of the traced forward and ACK paths (or the one path the
/// inventory allows).
pub(super) fn evidence(
    ds: &Dataset,
    range: &RangeTally,
    tally: &Tally,
    cx: &TallyContext,
    el: &mut Elements,
) -> Evidence {
    let mut e = Evidence::default();
    // Keys of one (window, prober, target) come together (the counters are sorted by key); of
    // those, the ones with the same fabric (every key within a ToR; the labels of an inter-ToR
    // pair that take the same paths) cross the same elements and are one group: the cover sums
    // and tests groups by the elements they cross, never by their label.
    let mut run = None;
    let mut run_groups: Vec<(u32, usize)> = Vec::new();
    for &(key, a, inter) in &range.acc {
        let (w, pr, tg, _) = key;
        if excluded(cx, &tally.heard_again, w, pr, tg) {
            continue;
        }
        let fabric = if inter {
            el.fabric(ds, key, cx.window_ns).unwrap_or_else(|| {
                el.without_path += u64::from(a.valid);
                NO_FABRIC
            })
        } else {
            NO_FABRIC
        };
        if run != Some((w, pr, tg)) {
            run = Some((w, pr, tg));
            run_groups.clear();
        }
        let groups = e.by_window.entry(w).or_default();
        if let Some(&(_, g)) = run_groups.iter().find(|(f, _)| *f == fabric) {
            groups[g].acc.add(&a);
            continue;
        }
        let (rp, rt) = (pr as usize, tg as usize);
        let mut elements = vec![el.rnic_element[rp], el.rnic_element[rt], el.tor_element[rp]];
        if el.tor_element[rt] != el.tor_element[rp] {
            elements.push(el.tor_element[rt]);
        }
        if fabric != NO_FABRIC {
            elements.extend_from_slice(el.fabric_elements(fabric));
        }
        run_groups.push((fabric, groups.len()));
        groups.push(Group { elements, acc: a });
    }
    e
}

/// The null a cover judges elements against in one window and mode: the fleet's own bad share
/// and the log-likelihood ratio Benjamini-Hochberg lets through.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Null {
    /// Bad share of a healthy probe: the lower quartile over RNICs in the window, floored.
    pub(super) share: f64,
    /// Candidates need at least this log-likelihood ratio ([`excess_llr`]).
    pub(super) llr_cut: f64,
}

/// Per element, (bad, total) over the groups `keep` lets through.
pub(super) fn element_counts(
    groups: &[Group],
    keep: impl Fn(usize, &Group) -> bool,
    count: impl Fn(&Acc) -> (u32, u32),
    out: &mut [(u32, u32)],
) {
    out.iter_mut().for_each(|t| *t = (0, 0));
    for (g, group) in groups.iter().enumerate() {
        if !keep(g, group) {
            continue;
        }
        let (bad, total) = count(&group.acc);
        for &e in &group.elements {
            out[e as usize].0 += bad;
            out[e as usize].1 += total;
        }
    }
}

pub(super) fn counter(mode: Mode) -> impl Fn(&Acc) -> (u32, u32) {
    move |a: &Acc| match mode {
        Mode::Slow => (a.slow, a.ok),
        Mode::Lossy => (a.lost, a.valid),
    }
}

pub(super) fn path_elements(switches: &[String], hops: &[u32]) -> Vec<(&'static str, String)> {
    let names: Vec<&str> = hops.iter().filter_map(|&h| switches.get(h as usize).map(String::as_str)).collect();
    let mut out = Vec::new();
    if names.len() < 2 {
        return out;
    }
    let half = names.len() / 2;
    for (i, pair) in names.windows(2).enumerate() {
        // Before the middle the path climbs (lower tier first); after it, it descends.
        let link = if i < half { format!("{}|{}", pair[0], pair[1]) } else { format!("{}|{}", pair[1], pair[0]) };
        out.push(("link", link));
    }
    for n in &names[1..names.len() - 1] {
        out.push(("spine", (*n).to_owned()));
    }
    out
}

/// Probes of one (window, prober, target, label), and the elements their packets cross.
#[derive(Debug)]
pub(super) struct Group {
    pub(super) elements: Vec<u32>,
    pub(super) acc: Acc,
}

#[cfg(test)]
mod tests {
    use super::super::testkit::*;

    #[test]
    fn evidence_lists_what_probes_cross_and_leaves_out_exclusions() {
        let recs = [
            Rec(0, 2, 0, Outcome::Ok, 10_000, 1_000, KS), // ToR-mesh: t0 -> t0
            Rec(0, 1, 0, Outcome::Lost, 0, 0, KS),        // inter-ToR, with an inventory path
            Rec(1, 2, 0, Outcome::Ok, 10_000, 1_000, KS), // inter-ToR, made pathless below
            Rec(0, 3, 1, Outcome::Ok, 10_000, 1_000, KS), // to an agent not running in window 1
        ];
        // Agents cover window 0 only.
        let mut ds = dataset(4, 1, &recs);
        ds.probes.kind = vec![0, 1, 1, 1];
        ds.probes.flow_label[2] = 5;
        ds.switches = vec!["t0".into(), "s0".into(), "t1".into()];
        // h0 <-> h1 label 0 is traced; h1 -> h2 label 5 is not, and the inventory knows only
        // the t1 -> t0 direction: pathless.
        ds.paths.insert((0, 1, 0), vec![0, 1, 2]);
        ds.paths.insert((1, 0, 0), vec![2, 1, 0]);
        ds.tor_paths.insert(("t1".into(), "t0".into()), vec![2, 1, 0]);
        let st = stages(&ds);
        let mut el = Elements::new(&ds);
        let e = evidence(&ds, &st.range, &st.tally, &st.cx(), &mut el);
        let named = |g: &Group| -> Vec<String> {
            g.elements.iter().map(|&x| format!("{}:{}", el.names[x as usize].0, el.names[x as usize].1)).collect()
        };
        let groups = &e.by_window[&W0];
        assert_eq!(groups.len(), 3, "window 1's probe to a stopped agent is left out: {:?}", e.by_window.keys());
        assert_eq!(
            named(&groups[0]),
            ["rnic:h0/d0", "rnic:h1/d0", "tor:t0", "tor:t1", "link:t0|s0", "link:t1|s0", "spine:s0"]
        );
        assert_eq!(named(&groups[1]), ["rnic:h0/d0", "rnic:h2/d0", "tor:t0"]);
        assert_eq!(named(&groups[2]), ["rnic:h1/d0", "rnic:h2/d0", "tor:t1", "tor:t0"]);
        assert_eq!(el.without_path, 1);
    }

    /// Keys crossing the same elements are one group, with their counters summed: a ToR-mesh
    /// pair's probes over any label (tally keys them without it), and the labels of an inter-ToR
    /// pair whose forward and ACK paths are the same. Labels on other paths stay apart.
    #[test]
    fn keys_crossing_the_same_elements_are_one_group() {
        let mut recs = Vec::new();
        for label in 0..4 {
            recs.push(Rec(0, 2, 0, Outcome::Ok, 10_000, 1_000, KS)); // ToR-mesh t0 -> t0
            recs.push(Rec(0, 1, 0, if label == 3 { Outcome::Lost } else { Outcome::Ok }, 10_000, 1_000, KS));
        }
        let mut ds = dataset(4, 1, &recs);
        for (i, label) in (0..4).flat_map(|l| [l, l]).enumerate() {
            ds.probes.flow_label[i] = label;
            ds.probes.kind[i] = u8::from(i % 2 == 1);
        }
        // t0 -> t1 over spine s0 for labels 0-2, over s1 for label 3; back over s0 always.
        ds.switches = vec!["t0".into(), "s0".into(), "t1".into(), "s1".into()];
        for label in 0..4 {
            ds.paths.insert((0, 1, label), if label == 3 { vec![0, 3, 2] } else { vec![0, 1, 2] });
            ds.paths.insert((1, 0, label), vec![2, 1, 0]);
        }
        let st = stages(&ds);
        assert_eq!(st.range.acc.len(), 5, "one ToR-mesh key, four inter-ToR keys: {:?}", st.range.acc);
        let mut el = Elements::new(&ds);
        let e = evidence(&ds, &st.range, &st.tally, &st.cx(), &mut el);
        let groups = &e.by_window[&W0];
        let summary: Vec<(usize, u32, u32)> =
            groups.iter().map(|g| (g.elements.len(), g.acc.valid, g.acc.lost)).collect();
        // In key order: h0 -> h1 over s0 both ways (RNICs, ToRs, 2 links, 1 spine) for labels
        // 0-2; label 3, out over s1 and back over s0 (4 links, 2 spines); h0 -> h2 within t0.
        assert_eq!(summary, [(7, 3, 0), (10, 1, 1), (3, 4, 0)], "{summary:?}");
    }
}
