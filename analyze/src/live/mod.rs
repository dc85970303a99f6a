//! `analyze live`: findings seconds after a window closes, from the window summaries the agents
//! push as their windows close (`formats::live`; the agent's `[live]`).
//!
//! This module owns the live state: the summary windows of the last `history_windows`, the
//! fleet's RNICs as the pushes name them, the findings open now, and the rule that says a window
//! is ready ([`run`] receives and writes; [`view`] is what `/metrics` and the page show). It
//! localises with [`crate::localize::localize_live`], the stages `analyze localize --evidence
//! summaries` runs, and what the window blames is what it says:
//!
//! - the baselines are those of the window and the history before it (a fresh start needs no
//!   stored data), summed from each window's [`BaselineCounts`], taken once when the window is
//!   localised: the same baselines as `localize` over those windows' keys, without keeping them;
//! - the counters and the evidence are the window's; a pick at its edge is judged against what
//!   the window before it picked and blamed when it was localised ([`localize::Before`]), as
//!   `localize` judges a window against its neighbour's;
//! - the false-discovery cut is over the history's tests: each earlier window's as they were
//!   taken when it was localised (against the baselines of its time), and the window's own.
//!
//! So a window costs its own keys, not the history's: keys are kept for the windows not yet
//! localised, and of the others their counts.
//!
//! - A window is ready once every RNIC heard in it or in the [`EXPECT_WINDOWS`] before it has
//!   pushed all parts of its last summary of it (`formats::live::Header::last`: one its writer
//!   closed a grace after the window's end, not one a segment's rotation cut short), or once
//!   `deadline` has passed since its end, whichever comes first. The first [`EXPECT_WINDOWS`]
//!   windows after the analyzer starts wait for the deadline: it does not know yet whom to
//!   expect. Windows are localised in time order, each once; its `window` line names the RNICs
//!   it waited for in vain.
//! - A push is refused (counted by reason, the first of each reason said in a `problem` line)
//!   when it does not decode ([`rocemesh_formats::live::decode`]: damaged, forged, unsealed where
//!   keys are checked), when it repeats one already taken (same RNIC, agent epoch and sequence
//!   number: a replay, which summed in would double its counts), when it was sent more than
//!   `max_skew` from this machine's clock or its window starts that far ahead of it (a host
//!   whose clock is far off), when an RNIC sends more than [`MAX_PUSHES_PER_WINDOW`] for one
//!   window, or when its window was already localised (late: its counts still serve as history
//!   for later windows).
//! - Bounded: windows older than the history are dropped, and an RNIC's pushes per window are
//!   capped. Names are kept once per RNIC and traced path; without `--keys`, anyone who can
//!   reach the port can add names.
//! - Findings open when a window blames an entity no open finding holds, and close after
//!   `close_after_quiet_windows` windows that do not blame it (as `localize`'s hysteresis).
//!
//! Paths: each push carries the path traces its shard took since its previous push; the latest
//! trace of each (prober, target, label) is its path, its hops named by the inventory's switch
//! addresses (a simulated trace names its switches itself), else, for its first and last hop,
//! by the endpoints' ToRs where every trace so far agrees ([`crate::hops::EndHops`]). A hop
//! nobody can name is said once (`unmapped_hop`); its trace is left out. Where no trace
//! came, the inventory gives the path of two ToRs that share one spine
//! (`Dataset::add_single_paths`). An answer path's trace names its far end by the address that
//! probed: the RNIC the inventory or a push gives that address. Traced services' probes are not
//! localised live.

use std::collections::{BTreeMap, HashMap, HashSet};

use rocemesh_formats::inventory::Inventory;
use rocemesh_formats::live::Received;
use rocemesh_formats::record::{EndpointRole, MAX_HOPS};
use rocemesh_formats::segment::{LONG_GAP_FACTOR, LONG_GAP_MIN_NS};
use rocemesh_formats::window::STALL_NS;
use serde::Serialize;

use crate::ingest::{AgentFile, Dataset, KeyCell, NO_SERVICE, Rnic, WindowKey, Windows};
use crate::localize::{self, BaselineCounts, Options, Tests};
use rocemesh_formats::record::Class;

pub mod ask;
pub mod metrics;
pub mod page;
mod run;
pub mod serve;
pub mod view;
pub use run::{Listen, LiveError, receive, run};

/// A window waits for the RNICs heard in it or in this many windows before it.
pub const EXPECT_WINDOWS: u64 = 3;
/// Pushes one RNIC may send for one window (a wide window's parts, a rotation's split).
pub const MAX_PUSHES_PER_WINDOW: u16 = 256;

/// What the live analyzer is told.
#[derive(Debug, Clone)]
pub struct Config {
    /// The summary window the agents push (`summary_window_s`), ns; also the analysis window.
    pub window_ns: u64,
    /// A window is localised at the latest this long after its end, ns.
    pub deadline_ns: u64,
    /// Windows kept and localised together (the window and those before it).
    pub history_windows: u64,
    /// A push whose window starts further than this from our clock is refused, ns.
    pub max_skew_ns: u64,
    /// Localisation's tunables (`window_s` is set from `window_ns`).
    pub opts: Options,
}

/// One JSON line.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    /// A window was localised.
    Window {
        window_start_ns: u64,
        /// Every RNIC expected pushed all of it.
        complete: bool,
        /// Localised this long after the window's end, ms (by this machine's clock).
        after_end_ms: u64,
        /// Its localisation took this long, ms.
        localise_ms: u64,
        rnics_heard: usize,
        /// RNICs the inventory names or a push named: those not heard are silent.
        rnics_known: usize,
        /// RNICs expected (heard in the windows before) that pushed none or part of it; the
        /// first [`MISSING_NAMED`] named.
        rnics_missing: usize,
        missing: Vec<String>,
        probes: u64,
        /// Findings open after it.
        open: usize,
    },
    /// An entity is blamed where no open finding held it.
    Open { kind: String, entity: String, window_start_ns: u64, score: f64, evidence: String },
    /// A finding's entity was not blamed for `close_after_quiet_windows` windows.
    Close { kind: String, entity: String, start_ns: u64, end_ns: u64, windows: u64 },
    /// The first push refused for a reason (later ones are counted); also the first failure to
    /// ask Prometheus (`reason: prometheus`).
    Problem { reason: String, from: String, detail: String },
    /// What the switches' counters did over a finding's span (`--prometheus`, [`ask`]): its first
    /// window (`at: open`) or all of it (`at: close`), asked a lookback after the span's end.
    Switches {
        kind: String,
        entity: String,
        at: &'static str,
        from_ns: u64,
        to_ns: u64,
        summary: String,
        counters: crate::switches::FindingCounters,
    },
}

/// RNICs a `window` line names at most.
pub const MISSING_NAMED: usize = 16;

/// Pushes refused or not used, by reason.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Counts {
    pub received: u64,
    pub taken: u64,
    pub refused: BTreeMap<&'static str, u64>,
    /// Keys of traced services' probes (not localised live).
    pub service_keys: u64,
    /// Path traces taken, and left out: through a hop no inventory switch lists, or toward an
    /// end that is not an RNIC.
    pub traces: u64,
    pub traces_unmapped: u64,
    pub traces_unplaced: u64,
}

/// One RNIC's pushes of one window.
#[derive(Debug, Default)]
struct Heard {
    /// Per summary (agent epoch, sequence number of its part 0): parts taken, of how many, and
    /// whether it is the last of the window ([`rocemesh_formats::live::Header::last`]).
    parts: HashMap<(u32, u64), (u16, u16, bool)>,
    pushes: u16,
    probes: u64,
    stalls: Vec<(u64, u64)>,
    /// Earliest and latest send its keys cover.
    first_ns: u64,
    last_ns: u64,
}

#[derive(Debug, Default)]
struct Win {
    /// Its keys and their cells, until it is localised.
    keys: Vec<WindowKey>,
    cells: Vec<KeyCell>,
    heard: HashMap<u32, Heard>,
    seqs: HashSet<(u32, u32, u64)>,
    /// Once localised: its baselines' counts (late pushes added) and its tests.
    counts: Option<BaselineCounts>,
    tests: Option<Tests>,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct OpenFinding {
    start_ns: u64,
    last_blamed: u64,
    windows: u64,
    score: f64,
    evidence: String,
}

/// A localised window as the view shows it, its heatmap by ToR id.
#[derive(Debug, Clone)]
struct Shown {
    window: view::WindowView,
    /// ToR id -> (probes toward it, lost).
    heat: BTreeMap<u32, (u64, u64)>,
}

/// A traced hop: its switch id, or the address no inventory switch lists.
type Hop = Result<u32, [u8; 16]>;

/// The live state (see the module documentation). Driven by the caller's clock, so that a test
/// or a replay runs it at any speed.
#[derive(Debug)]
pub struct Live {
    cfg: Config,
    base: Dataset,
    by_name: HashMap<String, u32>,
    /// The inventory's switch addresses.
    switch_by_addr: HashMap<[u8; 16], String>,
    /// Hop addresses the inventory does not list, learned from where they stand in traces.
    ends: crate::hops::EndHops,
    /// RNICs by address (GID and IPv4-mapped), from the inventory and the pushes' own names:
    /// an answer path's trace names its far end by the address that probed.
    rnic_by_addr: HashMap<[u8; 16], u32>,
    /// The latest trace of each (prober, target, label): when, and its hops' switch ids.
    /// A hop named by where it stands in traces ([`crate::hops::EndHops`]) keeps its address,
    /// resolved as each window is localised: a later trace may unlearn it.
    paths: HashMap<(u32, u32, u32), (u64, Vec<Hop>)>,
    windows: BTreeMap<u64, Win>,
    /// Windows starting before this are localised.
    done_to_ns: u64,
    /// The first window a push was taken for: the windows of [`EXPECT_WINDOWS`] from it wait
    /// for their deadline.
    first_window_ns: Option<u64>,
    open: BTreeMap<(String, String), OpenFinding>,
    said: HashSet<&'static str>,
    pub counts: Counts,
    /// ToR ids by name, and each RNIC's (`u32::MAX`: none known): an id is never reused, so
    /// that a window's counts keep their meaning as RNICs are learnt.
    tor_ids: HashMap<String, u32>,
    tor_of: Vec<u32>,
    /// The last [`view::VIEW_WINDOWS`] windows localised.
    shown: std::collections::VecDeque<Shown>,
    /// What the window localised last picked and blamed (the next one's edges).
    before: Option<localize::Before>,
}

impl Live {
    /// A live analyzer; with an inventory, its RNICs and ToRs and the paths it fixes are known
    /// before any push names them.
    pub fn new(cfg: Config, inventory: Option<&Inventory>) -> Live {
        let mut base = Dataset::default();
        let mut by_name = HashMap::new();
        let mut rnic_by_addr = HashMap::new();
        for h in inventory.iter().flat_map(|inv| &inv.hosts) {
            for r in &h.rnics {
                let name = Inventory::rnic_name(&h.name, &r.device);
                let id = base.rnics.len() as u32;
                by_name.insert(name.clone(), id);
                for addr in [r.gid_or_mapped().octets(), rocemesh_formats::gid::gid_bytes(r.ip)] {
                    rnic_by_addr.entry(addr).or_insert(id);
                }
                base.rnics.push(Rnic { name, tor: r.tor.clone(), host: h.name.clone() });
            }
        }
        if let Some(inv) = inventory {
            base.add_single_paths(inv);
        }
        let switch_by_addr = inventory
            .map(|inv| inv.switch_addrs().into_iter().map(|(a, n)| (a, n.to_owned())).collect())
            .unwrap_or_default();
        let mut live = Live {
            cfg,
            base,
            by_name,
            switch_by_addr,
            ends: crate::hops::EndHops::default(),
            rnic_by_addr,
            paths: HashMap::new(),
            windows: BTreeMap::new(),
            done_to_ns: 0,
            first_window_ns: None,
            open: BTreeMap::new(),
            said: HashSet::new(),
            counts: Counts::default(),
            tor_ids: HashMap::new(),
            tor_of: Vec::new(),
            shown: std::collections::VecDeque::new(),
            before: None,
        };
        for id in 0..live.base.rnics.len() {
            let tor = live.base.rnics[id].tor.clone();
            live.tor_of.push(u32::MAX);
            live.set_tor(id, &tor);
        }
        live
    }

    fn set_tor(&mut self, rnic: usize, tor: &str) {
        if tor.is_empty() {
            return;
        }
        let next = self.tor_ids.len() as u32;
        self.tor_of[rnic] = *self.tor_ids.entry(tor.to_owned()).or_insert(next);
    }

    fn rnic_id(&mut self, name: &str, tor: &str, host: &str) -> u32 {
        if let Some(&id) = self.by_name.get(name) {
            // A pinglist target's entry names no ToR; its own push does.
            if self.base.rnics[id as usize].tor.is_empty() && !tor.is_empty() {
                tor.clone_into(&mut self.base.rnics[id as usize].tor);
                self.set_tor(id as usize, tor);
            }
            return id;
        }
        let id = self.base.rnics.len() as u32;
        self.base.rnics.push(Rnic { name: name.to_owned(), tor: tor.to_owned(), host: host.to_owned() });
        self.by_name.insert(name.to_owned(), id);
        self.tor_of.push(u32::MAX);
        self.set_tor(id as usize, tor);
        id
    }

    /// Counts a refusal; the first of its reason becomes a `problem` line.
    pub fn refuse(&mut self, reason: &'static str, from: &str, detail: String, out: &mut Vec<Event>) {
        self.refuse_many(reason, 1, from, detail, out);
    }

    /// Counts `n` refusals of one reason ([`Live::refuse`]).
    pub fn refuse_many(&mut self, reason: &'static str, n: u64, from: &str, detail: String, out: &mut Vec<Event>) {
        *self.counts.refused.entry(reason).or_default() += n;
        if self.said.insert(reason) {
            out.push(Event::Problem { reason: reason.to_owned(), from: from.to_owned(), detail });
        }
    }

    /// Takes one decoded push, received at `now_ns` from `from`.
    pub fn add(&mut self, r: Received, from: &str, now_ns: u64, out: &mut Vec<Event>) {
        self.counts.received += 1;
        let s = &r.push.summary;
        let start = s.start_unix_ns;
        if s.window_ns != self.cfg.window_ns {
            let detail = format!(
                "{} pushes {} s windows; this analyzer takes {} s (--window-s, the agents' summary_window_s)",
                r.push.rnic,
                s.window_ns as f64 / 1e9,
                self.cfg.window_ns as f64 / 1e9
            );
            return self.refuse("window_length", from, detail, out);
        }
        let sent = r.header.sent_unix_ns;
        if sent.abs_diff(now_ns) > self.cfg.max_skew_ns || start > now_ns.saturating_add(self.cfg.max_skew_ns) {
            let detail = format!(
                "{} sent a push {:.1} s from this machine's clock, for a window starting {:.1} s from it \
                 (more than --max-skew-s): check its clock (chrony)",
                r.push.rnic,
                (sent as f64 - now_ns as f64) / 1e9,
                (start as f64 - now_ns as f64) / 1e9
            );
            return self.refuse("clock_skew", from, detail, out);
        }
        let history_start = self.history_start();
        if start < history_start {
            let detail = format!("{} pushed a window older than the history kept", r.push.rnic);
            return self.refuse("too_old", from, detail, out);
        }
        let host = r.push.rnic.split('/').next().unwrap_or_default().to_owned();
        let me = self.rnic_id(&r.push.rnic, &r.push.tor, &host);
        let seq = (me, r.header.agent_epoch, r.header.seq);
        let w = self.windows.get(&start);
        if w.is_some_and(|w| w.seqs.contains(&seq)) {
            let detail = format!("{} sequence {} again", r.push.rnic, r.header.seq);
            return self.refuse("replayed", from, detail, out);
        }
        if w.and_then(|w| w.heard.get(&me)).is_some_and(|h| h.pushes >= MAX_PUSHES_PER_WINDOW) {
            let detail = format!("{} sent more than {MAX_PUSHES_PER_WINDOW} pushes for one window", r.push.rnic);
            return self.refuse("too_many", from, detail, out);
        }
        if start < self.done_to_ns {
            // Its counts serve as history; the window's own lines went out without them.
            self.refuse("late", from, format!("{} pushed a window already localised", r.push.rnic), out);
        }
        self.take(r, me, seq, from, out);
    }

    /// The switch id of a traced hop: the inventory switch at its address, or its own name
    /// where it has no address (the simulator names its switches); else the address.
    fn hop_id(&mut self, n: &rocemesh_formats::live::Name) -> Hop {
        if n.addr == [0; 16] {
            return Ok(self.base.switch_id(&n.name));
        }
        match self.switch_by_addr.get(&n.addr).cloned() {
            Some(name) => Ok(self.base.switch_id(&name)),
            None => Err(n.addr),
        }
    }

    /// A trace's hops, its unlisted addresses named by the endpoints' ToRs where the traces
    /// agree (told to [`crate::hops::EndHops`] first); `None`, said once, when one stays
    /// unnamed.
    fn trace_hops(&mut self, hops: &[Hop], ends: (u32, u32), from: &str, out: &mut Vec<Event>) -> Option<Vec<Hop>> {
        if hops.iter().all(Result::is_ok) {
            return Some(hops.to_vec());
        }
        let addrs: Vec<Option<[u8; 16]>> = hops.iter().map(|h| h.err()).collect();
        self.ends.see(&addrs, self.base.tor_of_rnic(ends.0), self.base.tor_of_rnic(ends.1));
        for h in hops {
            if let Err(addr) = h {
                match self.ends.tor_of(addr).map(str::to_owned) {
                    // An id for the ToR, for [`Live::dataset`] to find.
                    Some(name) => _ = self.base.switch_id(&name),
                    None => {
                        let detail = format!(
                            "a path trace crosses {}, which no inventory switch lists and is not a trace's \
                             end ToR: its traces are left out (fix: `ctl inventory lldp` with the switches' \
                             interface addresses, or `ctl inventory switch-addrs`, then --inventory)",
                            rocemesh_formats::gid::ip_of(addr)
                        );
                        self.refuse("unmapped_hop", from, detail, out);
                        return None;
                    }
                }
            }
        }
        Some(hops.to_vec())
    }

    fn take(&mut self, r: Received, me: u32, seq: (u32, u32, u64), from: &str, out: &mut Vec<Event>) {
        let Received { header, push } = r;
        let mut ids: HashMap<u32, (u32, bool)> = HashMap::with_capacity(push.names.len());
        let mut hops: HashMap<u32, Hop> = HashMap::new();
        for n in &push.names {
            if n.role == EndpointRole::Switch as u8 {
                let id = self.hop_id(n);
                hops.insert(n.id, id);
                continue;
            }
            let service = n.role == EndpointRole::Service as u8;
            let id = if n.role == EndpointRole::Rnic as u8 {
                let host = n.name.split('/').next().unwrap_or_default().to_owned();
                let id = self.rnic_id(&n.name, &n.tor, &host);
                if n.addr != [0; 16] {
                    self.rnic_by_addr.entry(n.addr).or_insert(id);
                }
                id
            } else if n.role == EndpointRole::Peer as u8 {
                // An answer path's far end: the RNIC that probed from that address.
                self.rnic_by_addr.get(&n.addr).copied().unwrap_or(u32::MAX)
            } else {
                u32::MAX
            };
            ids.insert(n.id, (id, service));
        }
        for p in &push.paths {
            self.counts.traces += 1;
            let end = |v: u32| ids.get(&v).map_or(u32::MAX, |e| e.0);
            let (src, dst) = (end(p.src), end(p.dst));
            let named: Option<Vec<Hop>> =
                p.hops[..(p.hop_count as usize).min(MAX_HOPS)].iter().map(|h| hops.get(h).copied()).collect();
            let path = match named {
                _ if src == u32::MAX || dst == u32::MAX => {
                    self.counts.traces_unplaced += 1;
                    continue;
                }
                // `decode` refuses a push naming an id it does not define.
                None => None,
                Some(named) => self.trace_hops(&named, (src, dst), from, out),
            };
            match path {
                None => self.counts.traces_unmapped += 1,
                Some(path) => {
                    let slot = self.paths.entry((src, dst, p.flow_label)).or_insert((0, Vec::new()));
                    if p.t_unix_ns >= slot.0 {
                        *slot = (p.t_unix_ns, path);
                    }
                }
            }
        }
        let s = push.summary;
        let start = s.start_unix_ns;
        self.first_window_ns.get_or_insert(start);
        // A window localised keeps no keys: a late push adds to its counts alone (a window no
        // push had reached when it was passed gets counts of its own).
        let keep_keys = start >= self.done_to_ns;
        let (window_ns, tor_of) = (self.cfg.window_ns, &self.tor_of);
        let w = self.windows.entry(start).or_default();
        if !keep_keys && w.counts.is_none() {
            w.counts = Some(BaselineCounts::default());
        }
        w.seqs.insert(seq);
        let heard = w.heard.entry(me).or_insert_with(|| Heard { first_ns: u64::MAX, ..Heard::default() });
        let summary = (header.agent_epoch, header.seq.wrapping_sub(u64::from(header.part)));
        let parts = heard.parts.entry(summary).or_insert((0, header.parts, header.last));
        parts.0 = parts.0.saturating_add(1);
        heard.pushes = heard.pushes.saturating_add(1);
        heard.probes += s.probes();
        heard.stalls.extend(s.stalls.iter().copied().filter(|st| st.1 > STALL_NS));
        for k in &s.keys {
            heard.first_ns = heard.first_ns.min(k.first_t1_ns);
            heard.last_ns = heard.last_ns.max(k.last_t1_ns);
        }
        let mut scratch = Vec::new();
        for k in &s.keys {
            let (prober, _) = ids.get(&k.prober).copied().unwrap_or((u32::MAX, false));
            let (target, service) = ids.get(&k.target).copied().unwrap_or((u32::MAX, false));
            if service {
                self.counts.service_keys += 1;
                continue;
            }
            let cells = &s.cells[k.cells_start as usize..(k.cells_start + k.cells_len) as usize];
            // The window's own table when its keys are kept, else a scratch one for the counts.
            let table = if keep_keys { &mut w.cells } else { &mut scratch };
            let from = table.len();
            for c in cells {
                KeyCell::push(table, c.count, c.bucket, c.measure, c.ts_source);
            }
            let key = WindowKey {
                start_ns: start,
                prober,
                target,
                service: NO_SERVICE,
                flow_label: k.flow_label,
                kind: k.kind,
                counts: k.counts,
                first_ns: k.first_t1_ns,
                last_ns: k.last_t1_ns,
                first_ok_ns: k.first_ok_t1_ns,
                epoch_changes: k.epoch_changes,
                cells: (from as u32, table.len() as u32),
            };
            if let Some(c) = &mut w.counts {
                c.add(&key, &table[from..], tor_of, window_ns);
                c.probes += key.probes();
            }
            if keep_keys {
                w.keys.push(key);
            } else {
                scratch.clear();
            }
        }
        self.counts.taken += 1;
    }

    fn history_start(&self) -> u64 {
        let newest_done = self.done_to_ns.saturating_sub(self.cfg.window_ns);
        newest_done.saturating_sub(self.cfg.history_windows.saturating_sub(1) * self.cfg.window_ns)
    }

    /// RNICs window `start` waits for: heard in it or in the [`EXPECT_WINDOWS`] before it.
    fn expected(&self, start: u64) -> HashSet<u32> {
        let from = start.saturating_sub(EXPECT_WINDOWS * self.cfg.window_ns);
        self.windows.range(from..=start).flat_map(|(_, w)| w.heard.keys().copied()).collect()
    }

    fn complete_for(w: &Win, rnic: u32) -> bool {
        w.heard.get(&rnic).is_some_and(|h| h.parts.values().any(|&(got, of, last)| last && got >= of))
    }

    /// Localises every window that is ready at `now_ns`, in time order.
    pub fn tick(&mut self, now_ns: u64, out: &mut Vec<Event>) {
        loop {
            let Some((&start, _)) = self.windows.range(self.done_to_ns..).next() else { return };
            let end = start + self.cfg.window_ns;
            let expected = self.expected(start);
            let w = &self.windows[&start];
            let missing: Vec<u32> = expected.iter().copied().filter(|&r| !Self::complete_for(w, r)).collect();
            let due = now_ns >= end.saturating_add(self.cfg.deadline_ns);
            let warming = self.first_window_ns.is_some_and(|f| start < f + EXPECT_WINDOWS * self.cfg.window_ns);
            if (!missing.is_empty() || warming) && !due || now_ns < end {
                return;
            }
            self.localise(start, now_ns, missing, expected.len(), out);
            self.done_to_ns = end;
            let keep_from = self.history_start();
            self.windows = self.windows.split_off(&keep_from);
        }
    }

    fn localise(&mut self, start: u64, now_ns: u64, mut missing: Vec<u32>, expected: usize, out: &mut Vec<Event>) {
        let clock = std::time::Instant::now();
        let window_ns = self.cfg.window_ns;
        let history_from = start.saturating_sub(self.cfg.history_windows.saturating_sub(1) * window_ns);
        self.count_window(start);
        let mut sum = BaselineCounts::default();
        for c in self.windows.range(history_from..=start).filter_map(|(_, w)| w.counts.as_ref()) {
            sum.merge(c);
        }
        let opts = Options { window_s: window_ns / 1_000_000_000, ..self.cfg.opts.clone() };
        let base = sum.baselines(&opts);
        let ds = self.dataset(history_from, start);
        let heat = self.heat(start);
        let w = self.windows.get_mut(&start).expect("listed");
        // Its keys are needed no more: a late push adds to its counts.
        let windows = Windows::from_parts(vec![(std::mem::take(&mut w.keys), std::mem::take(&mut w.cells))]);
        let earlier: Vec<&Tests> =
            self.windows.range(history_from..start).filter_map(|(_, w)| w.tests.as_ref()).collect();
        let before = self.before.as_ref().filter(|b| b.window_start_ns + window_ns == start);
        let (l, tests, before) = localize::localize_live(&ds, &windows, start, base, &earlier, before, &opts);
        self.before = Some(before);
        if let Some(w) = self.windows.get_mut(&start) {
            w.tests = tests;
        }
        let blamed: Vec<&localize::Blamed> = l.blamed.iter().filter(|b| b.window_start_ns == start).collect();
        self.hold(&blamed, start, out);
        missing.sort_unstable();
        let w = &self.windows[&start];
        let window = view::WindowView {
            start_ns: start,
            complete: missing.is_empty(),
            after_end_ms: now_ns.saturating_sub(start + window_ns) / 1_000_000,
            localise_ms: clock.elapsed().as_millis() as u64,
            rnics_heard: w.heard.len(),
            rnics_missing: missing.len(),
            missing: missing.iter().take(MISSING_NAMED).map(|&r| self.base.rnics[r as usize].name.clone()).collect(),
            probes: w.heard.values().map(|h| h.probes).sum(),
            tor_probes: Vec::new(),
            tor_lost: Vec::new(),
            open: self.open.len(),
        };
        out.push(Event::Window {
            window_start_ns: start,
            complete: window.complete,
            after_end_ms: window.after_end_ms,
            localise_ms: window.localise_ms,
            rnics_heard: window.rnics_heard,
            rnics_known: self.base.rnics.len(),
            rnics_missing: window.rnics_missing,
            missing: window.missing.clone(),
            probes: window.probes,
            open: window.open,
        });
        if self.shown.len() >= view::VIEW_WINDOWS {
            self.shown.pop_front();
        }
        self.shown.push_back(Shown { window, heat });
        debug_assert!(expected >= missing.len());
    }

    /// Takes window `start`'s baseline counts from its keys (once: later pushes add to them).
    fn count_window(&mut self, start: u64) {
        let Some(w) = self.windows.get_mut(&start) else { return };
        let mut counts = BaselineCounts::default();
        for k in &w.keys {
            counts.add(k, &w.cells[k.cells.0 as usize..k.cells.1 as usize], &self.tor_of, self.cfg.window_ns);
            counts.probes += k.probes();
        }
        w.counts = Some(counts);
    }

    /// Opens what `blamed` (window `start`'s) names and no open finding holds; closes what has
    /// been quiet long enough.
    fn hold(&mut self, blamed: &[&localize::Blamed], start: u64, out: &mut Vec<Event>) {
        for b in blamed {
            let key = (b.kind.clone(), b.entity.clone());
            match self.open.get_mut(&key) {
                Some(f) => {
                    f.last_blamed = start;
                    f.windows += 1;
                    (f.score, f.evidence) = (b.score, b.evidence.clone());
                }
                None => {
                    let f = OpenFinding {
                        start_ns: start,
                        last_blamed: start,
                        windows: 1,
                        score: b.score,
                        evidence: b.evidence.clone(),
                    };
                    self.open.insert(key, f);
                    out.push(Event::Open {
                        kind: b.kind.clone(),
                        entity: b.entity.clone(),
                        window_start_ns: start,
                        score: b.score,
                        evidence: b.evidence.clone(),
                    });
                }
            }
        }
        let quiet_ns = self.cfg.opts.close_after_quiet_windows.max(1) * self.cfg.window_ns;
        let closing: Vec<(String, String)> = self
            .open
            .iter()
            .filter(|(_, f)| f.last_blamed.saturating_add(quiet_ns) <= start)
            .map(|(k, _)| k.clone())
            .collect();
        for key in closing {
            let f = self.open.remove(&key).expect("listed");
            out.push(Event::Close {
                kind: key.0,
                entity: key.1,
                start_ns: f.start_ns,
                end_ns: f.last_blamed.saturating_add(self.cfg.window_ns),
                windows: f.windows,
            });
        }
    }

    /// Window `start`'s probes toward each ToR, and of those lost (the page's heatmap).
    fn heat(&self, start: u64) -> BTreeMap<u32, (u64, u64)> {
        let mut heat = BTreeMap::new();
        for k in self.windows.get(&start).map_or(&[][..], |w| &w.keys[..]) {
            let Some(&tor) = self.tor_of.get(k.target as usize).filter(|&&t| t != u32::MAX) else { continue };
            let c = |class: Class| u64::from(k.counts[class as usize]);
            let e = heat.entry(tor).or_insert((0, 0));
            *e = (e.0 + c(Class::Ok) + c(Class::Lost) + c(Class::Partial), e.1 + c(Class::Lost));
        }
        heat
    }

    /// Every path whose hops are all named now: one through an address no longer learned as a
    /// ToR's is left out until a trace replaces it.
    fn named_paths(&self) -> HashMap<(u32, u32, u32), Vec<u32>> {
        let ids: HashMap<&str, u32> =
            self.base.switches.iter().enumerate().map(|(i, n)| (n.as_str(), i as u32)).collect();
        let name = |h: &Hop| match h {
            Ok(id) => Some(*id),
            Err(addr) => self.ends.tor_of(addr).and_then(|n| ids.get(n).copied()),
        };
        self.paths
            .iter()
            .filter_map(|(&k, (_, hops))| Some((k, hops.iter().map(name).collect::<Option<Vec<u32>>>()?)))
            .collect()
    }

    /// The dataset of windows `from..=to`: the fleet's RNICs and paths, and each (RNIC, agent
    /// epoch) heard in a window as the agent file of that window, so that localisation sees
    /// which agents ran when, which restarted, and which stalled.
    fn dataset(&self, from: u64, to: u64) -> Dataset {
        let mut ds = Dataset {
            rnics: self.base.rnics.clone(),
            switches: self.base.switches.clone(),
            tor_paths: self.base.tor_paths.clone(),
            paths: self.named_paths(),
            ..Dataset::default()
        };
        // One agent file per (RNIC, agent epoch) over the history, as a segment spans its
        // shard's sends: which agents ran when, and which restarted, read as from files.
        let mut files: BTreeMap<(u32, u32), AgentFile> = BTreeMap::new();
        for w in self.windows.range(from..=to).map(|(_, w)| w) {
            for (&rnic, h) in &w.heard {
                let mut epochs: Vec<u32> = h.parts.keys().map(|&(e, _)| e).collect();
                epochs.sort_unstable();
                epochs.dedup();
                for epoch in epochs {
                    let f = files.entry((rnic, epoch)).or_insert_with(|| AgentFile {
                        rnic,
                        agent_epoch: epoch,
                        first_ns: u64::MAX,
                        last_ns: 0,
                        records: 0,
                        long_gaps: Vec::new(),
                        median_gap_ns: 0,
                    });
                    (f.first_ns, f.last_ns) = (f.first_ns.min(h.first_ns), f.last_ns.max(h.last_ns));
                    f.records += h.probes;
                    f.long_gaps.extend(h.stalls.iter().copied());
                }
            }
        }
        for f in files.values_mut() {
            // The shard's sends are spread over its span: their spacing is the span over their
            // count, and a stall counts as a frozen host beyond the rule the records' send gaps
            // are held to.
            f.median_gap_ns = f.last_ns.saturating_sub(f.first_ns) / f.records.max(1);
            let limit = f.median_gap_ns.saturating_mul(LONG_GAP_FACTOR).saturating_add(LONG_GAP_MIN_NS);
            f.long_gaps.retain(|s| s.1 > limit);
            f.long_gaps.sort_unstable();
            f.long_gaps.dedup();
        }
        ds.agents = files.into_values().filter(|f| f.first_ns <= f.last_ns).collect();
        ds.agents.sort_by_key(|f| (f.rnic, f.first_ns, f.agent_epoch));
        ds.files = ds.agents.len();
        ds
    }

    /// Findings open now.
    pub fn open_findings(&self) -> usize {
        self.open.len()
    }

    /// The view of the state now (the caller fills in what its loop counts).
    pub fn view(&self, now_ns: u64) -> view::View {
        let mut tors: Vec<(&String, u32)> = self.tor_ids.iter().map(|(n, &id)| (n, id)).collect();
        tors.sort();
        let windows = self
            .shown
            .iter()
            .map(|s| {
                let cell = |id: u32| s.heat.get(&id).copied().unwrap_or_default();
                let mut w = s.window.clone();
                (w.tor_probes, w.tor_lost) = tors.iter().map(|&(_, id)| cell(id)).unzip();
                w
            })
            .collect();
        let mut open: Vec<view::OpenView> = self
            .open
            .iter()
            .map(|((kind, entity), f)| view::OpenView {
                kind: kind.clone(),
                entity: entity.clone(),
                since_ns: f.start_ns,
                last_blamed_ns: f.last_blamed,
                windows: f.windows,
                score: f.score,
                evidence: f.evidence.clone(),
                switches: None,
            })
            .collect();
        open.sort_by_key(|f| f.since_ns);
        view::View {
            now_unix_ns: now_ns,
            window_ns: self.cfg.window_ns,
            deadline_ns: self.cfg.deadline_ns,
            open,
            windows,
            tors: tors.into_iter().map(|(n, _)| n.clone()).collect(),
            rnics_known: self.base.rnics.len(),
            received: self.counts.received,
            taken: self.counts.taken,
            refused: self.counts.refused.iter().map(|(&r, &n)| (r.to_owned(), n)).collect(),
            ..view::View::default()
        }
    }

    /// The findings open now, as [`Live::restore`] takes them back (JSON).
    pub fn open_state(&self) -> String {
        let open: Vec<(&(String, String), &OpenFinding)> = self.open.iter().collect();
        serde_json::to_string(&open).unwrap_or_default()
    }

    /// Each open finding: kind, entity and the start of its first window, Unix ns.
    pub fn open_since(&self) -> impl Iterator<Item = (&str, &str, u64)> {
        self.open.iter().map(|((kind, entity), f)| (kind.as_str(), entity.as_str(), f.start_ns))
    }

    /// Takes back the findings a previous run held open ([`Live::open_state`]): one still
    /// blamed goes on without a second `open` line, one that is not closes after its quiet
    /// windows, as if the analyzer had not stopped.
    pub fn restore(&mut self, state: &str) -> Result<usize, serde_json::Error> {
        let open: Vec<((String, String), OpenFinding)> = serde_json::from_str(state)?;
        let n = open.len();
        self.open.extend(open);
        Ok(n)
    }
}
