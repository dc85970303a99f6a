//! Fault localisation: which RNIC, ToR, link or spine is at fault, window by window, and which
//! hosts were too noisy to be evidence. The method, its stages and where it fails are in
//! docs/design/localisation.md; the fault scenarios it is scored on are `formats::scenario`
//! files (testbeds/scenarios/README.md), and its JSON output is the findings shape
//! `testbeds score` reads.
//!
//! The evidence is counts tested against the fleet's own, not quantiles, so it is gathered from
//! the probe columns into per (window, prober, target, label) counters; everything after that
//! works on those counters (thousands of entries per window, not millions of records). What a
//! probe counts as is [`crate::probe`]'s: ok and lost (no ACK1) are evidence, partial (only ACK2
//! missing) is neither loss nor a sample, and invalid, refused, local drops (the probe never left
//! its prober's host) and unknown outcome bytes are no evidence at all.
//!
//! The input is one table ([`localize`]) or a plan's ranges of whole windows ([`localize_ranges`],
//! what `analyze localize --evidence records` runs), read in four passes (`run`): both give the
//! same output, exactly. Or the agents' window summaries ([`localize_windows`]): stages 1 to 3
//! from counts and histograms (`windows`), the rest the same.
//! Each stage keeps across ranges only what the whole input decides, and says where that grows
//! with the input.
//!
//! The stages, each its own function:
//! 1. `Sampler` (pass 1): the fleet's usual RTT and host delays, one baseline per timestamp
//!    source and scope (ToR-mesh, inter-ToR), from a strided sample by position in the whole
//!    input, and from them when a probe is slow (above a robust p99) and when a host delay is a
//!    stall; per window, how far the fleet's ToR-mesh RTT rose, which scales that window's slow
//!    thresholds (`Baselines::measure_shifts`).
//! 2. `Noise` (pass 2): when each host was noise, as spans of time: its own send gaps (a frozen
//!    host's timers fire late) and host delays above the stall threshold. Noisy hosts become
//!    `host` findings. A cluster of late host delays is a stall when the fleet's own rate of
//!    them makes it unlikely ([`stall`]). Short of a stall, a host may be busy in a window
//!    ([`busy_host`]): its host-stamped RTTs there are loss evidence but no slowness evidence,
//!    unless they are slower than its busyness explains (a slow RNIC on a busy host).
//! 3. `tally_range` (passes 3 and 4): counters per (window, prober, target, label) of one
//!    range, leaving out probes that met a stall, and when each prober first heard a restarted
//!    target.
//! 4. `excluded`: probes to an RNIC whose agent was not running, and to a restarted agent
//!    until that prober hears the new instance. `evidence`: the elements each counter's probes
//!    cross: both RNICs and their ToRs (ToR-mesh and inter-ToR probes alike), and for inter-ToR
//!    probes the links and spines of the traced (or inventory-determined) forward and ACK paths.
//! 5. `Llrs` (pass 3) and `BlameStream` (pass 4): per window a greedy cover (`cover`) over the
//!    elements whose bad share is in significant excess over the fleet's own in the window (a
//!    log-likelihood ratio held to a false-discovery rate over every element and window: pass 3
//!    gathers the ratios, pass 4 covers against the cut), taking the one that explains the
//!    most at the highest share, then specialising to a contained element clearly worse than
//!    the rest (two dead RNICs of a ToR) or generalising to a containing one where the pick is
//!    not (a faint ToR- or spine-wide loss). Once for loss, once for slowness; slowness
//!    evidence names the timestamp source(s) whose baseline its probes were judged against.
//!    A window is settled once its next window is covered (`neighbours_tails`).
//! 6. `hysteresis`: a finding holds from its first bad window until
//!    `close_after_quiet_windows` quiet windows pass, so a flap is one finding with a flap count.
//! 7. `service_impacts`: which traced service connections (RDMA QPs of jobs, probed along their
//!    own GIDs and flow label; [`crate::ingest::Service`]) the findings touch, ranked by impact.
//!
//! [`smallest_detectable`] says what a window of a given number of probes can show under these
//! rules (the table in docs/design/localisation.md#the-smallest-fault-a-window-can-show).
//!
//! Service probes are evidence like any other: they count at the connection's remote RNIC, and
//! between two ToRs they vote on the links and spine of the path (traced, or the one the
//! inventory allows) like inter-ToR probes. Per connection, localisation then reports:
//!
//! - its own figures: windows probed, probes (every record), lost (no ACK1; no unreachable rule
//!   here: a connection whose peer vanished is hurt), loss ratio over ok + partial + lost, RTT
//!   p99 (nearest rank over its ok probes) and how far that p99 lies above the slow threshold of
//!   its timestamp source's baseline (`rtt_ns_p99_excess`, 0 when below).
//! - its *bad windows*: windows in which its own probes lost more than the SLA's loss ratio
//!   ([`Options::sla`], strictly above, as the report), or were slow as localisation judges
//!   elements (at least [`Options::lost_min`] probes and [`Options::slow_ratio_min`] of its ok
//!   probes above its source's slow threshold).
//! - its *path*: the prober RNIC, its host and ToR; the links and spines between the two ToRs
//!   (the traced forward and reverse paths of (prober, remote, flow label) when traced, else the
//!   inventory's single path between the ToRs; unknown otherwise, `fabric_path_known` says so);
//!   the remote's ToR, host and RNIC.
//! - `affected_by`: every finding whose (kind, entity) is on that path and whose time overlaps a
//!   window the connection was probed in; `confirmed` when it overlaps one of its bad windows.
//!
//! Impact grade and rank (rank 1 = worst):
//! - `high`: its own probes were bad in at least one window. Confirmed impact when a finding on
//!   its path overlaps a bad window; otherwise the note says that no finding on its path explains
//!   it (or that those on its path do not overlap its bad windows).
//! - `medium`: a finding on its path overlapped its probed time, but its own probes stayed
//!   within the SLA and the baseline (exposure).
//! - `low`: no finding on its path, and some of its probes were lost or slow, below the bad-window
//!   thresholds.
//! - `none`: clean, and no finding on its path.
//!
//! Within a grade: more lost probes first, then more bad windows, then a larger RTT p99 excess,
//! then by name.

mod baseline;
mod blame;
mod evidence;
mod noise;
mod render;
mod services;
mod statistics;
mod tally;
#[cfg(test)]
mod testkit;
mod windows;

use crate::ingest::{Dataset, Plan, Probes, Resolution, UnmappedHop, Windows};
use crate::probe::Sla;
pub use baseline::{Baselines, SHIFT_MIN_SAMPLES};
use baseline::{Sampler, shift_min_samples, tor_ids};
use blame::{BlameStream, Blamer, Held, Llrs, absorb_edges, hysteresis};
use evidence::{Elements, Evidence, evidence};
use noise::{Agents, Hosts, Noise, NoiseScan};
pub use noise::{busy_host, slowed_beyond_busy, stall};
pub use render::{counted_from, render_table, render_table_with};
use serde::Serialize;
use services::service_impacts;
use statistics::Z99;
pub use statistics::{Signal, smallest_detectable};
use std::collections::BTreeMap;
use tally::{Tally, TallyContext, tally_range};
pub use windows::BaselineCounts;

/// Tunables. The defaults are starting points, checked against the generated scenario suite
/// (`analyze/tests/accuracy.rs`), not fitted to the public examples.
#[derive(Debug, Clone)]
pub struct Options {
    /// Window length, seconds.
    pub window_s: u64,
    /// Quiet windows after which a finding closes.
    pub close_after_quiet_windows: u64,
    /// An element is blamed for loss or slowness with at least this many bad probes crossing it
    /// (a count, so that one unlucky probe on a rarely probed element is never a finding)...
    pub lost_min: u32,
    /// ...at least this share of the probes crossing it lost (the effect an operator cares
    /// about: half of Pingmesh's 0.1% alert, because a link losing 0.1% of its packets loses
    /// about 0.1% of the probes that cross it, and the bar must sit below what it should catch)...
    pub loss_ratio_min: f64,
    /// ...or this share of its ok probes slow (of those the window's null leaves fast, when
    /// the fleet is slow as a whole: `ratio_bar`)...
    pub slow_ratio_min: f64,
    /// ...and at least this many times the fleet's own bad share in the same window (the null:
    /// the lower quartile over RNICs), so that a fabric-wide slowdown is not pinned on one
    /// element.
    pub excess_over_null_min: f64,
    /// The null loss share per probe is at least this: a healthy fabric's background loss. Below
    /// it a handful of lost probes would be "significant" against a measured null of zero.
    pub loss_null_floor: f64,
    /// The null slow share is at least this: a probe is slow above the fleet's (robust) p99, so
    /// 1% of healthy probes are.
    pub slow_null_floor: f64,
    /// The false-discovery rate the candidates of each mode (loss, slowness) are held to over
    /// every (element, window) tested (Benjamini-Hochberg).
    pub fdr: f64,
    /// A probe is slow above the larger of the fleet's robust p99 RTT (of its timestamp source
    /// and scope), `slow_p50_factor` x its median, and its median + `slow_margin_ns`: the last
    /// two keep a fleet whose RTTs barely vary (a coarse clock) from calling half its probes slow.
    pub slow_p50_factor: f64,
    /// See `slow_p50_factor`.
    pub slow_margin_ns: f64,
    /// A host delay above this is a stalled host, not a network delay (ns); raised to
    /// [`HOST_NOISE_OVER_FLEET_P99`] times the fleet's p99 host delay (of the same timestamp
    /// source) where that is higher.
    pub host_delay_noise_ns: i64,
    /// Probes sent this long before a host's stall began or after it ended are excluded with it
    /// (ns): a probe sent just before a freeze waits for it, up to the probe timeout.
    pub stall_pad_ns: u64,
    /// Lost probes (dated by their prober's clock alone) are left out this much further from a
    /// stall (ns): the clock offset between two hosts this allows for.
    pub clock_offset_max_ns: u64,
    /// The SLA a traced service's own probes are judged by (its loss ratio marks a bad window).
    pub sla: Sla,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            window_s: 30,
            close_after_quiet_windows: 3,
            lost_min: 3,
            loss_ratio_min: 0.0005,
            slow_ratio_min: 0.5,
            excess_over_null_min: 2.0,
            loss_null_floor: 1e-5,
            slow_null_floor: 0.01,
            fdr: 0.01,
            slow_p50_factor: 1.5,
            slow_margin_ns: 2_000.0,
            host_delay_noise_ns: 1_000_000,
            stall_pad_ns: 1_000_000_000,
            clock_offset_max_ns: 5_000_000_000,
            sla: Sla::default(),
        }
    }
}

/// A host delay this many times the fleet's p99 is a stall whatever the absolute threshold says.
pub const HOST_NOISE_OVER_FLEET_P99: i64 = 10;

/// One finding: the fields `testbeds score` reads (kind, entity, start_ns, end_ns; see
/// testbeds/scenarios/README.md) plus its evidence.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Finding {
    /// rnic, tor, link, spine, host, or ambiguous (two candidates nothing separates).
    pub kind: String,
    /// Entity name (inventory names; links `tor|spine`).
    pub entity: String,
    /// Wall-clock ns of the start of the first window in which it held.
    pub start_ns: u64,
    /// End of the last window in which it held; `None` = still holding at the end of the data.
    pub end_ns: Option<u64>,
    /// Windows in which it held.
    pub windows: u64,
    /// Separate bad spells inside the finding (1 = no flapping).
    pub flaps: u64,
    /// Strongest per-window score (share of the evidence that was bad), 0-1.
    pub score: f64,
    /// Why, from the worst window.
    pub evidence: String,
}

/// The fleet's usual delays under one timestamp source, for probes within a ToR or between ToRs.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Baseline {
    /// The timestamp source (`kernel_software`, `host_poll`, ...; [`crate::probe::ts_name`]).
    pub ts_source: &'static str,
    /// `tor_mesh` (both ends under one ToR) or `inter_tor`: an inter-ToR probe crosses two more
    /// switches, and judged against the ToR-mesh median every one of them read as slow.
    pub scope: &'static str,
    /// Ok probes the baseline was computed from.
    pub samples: u64,
    /// Median network RTT, ns.
    pub rtt_ns_p50: f64,
    /// Lower quartile of the network RTT, ns: what a window's ToR-mesh lower quartile is
    /// compared with ([`RttShift`]).
    pub rtt_ns_p25: f64,
    /// The p99 a log-normal through the median and the median absolute deviation of log RTT
    /// puts: a p99 that a minority of slow probes cannot move (a plain p99 is the slow
    /// element's own RTT as soon as it holds 1% of the probes), ns.
    pub rtt_ns_p99_robust: f64,
    /// A probe of this source and scope is slow above this RTT, ns.
    pub slow_threshold_ns: f64,
    /// p99 of the larger of the two host delays (both scopes), ns.
    pub host_delay_ns_p99: i64,
    /// A host delay of this source above this is a stall, ns.
    pub host_noise_threshold_ns: i64,
}

impl Baseline {
    /// Samples a ToR (or a window pooled) needs to measure an RTT shift against this ToR-mesh
    /// baseline ([`shift_min_samples`] of its log-RTT spread, which its robust p99 puts).
    fn shift_min_samples(&self) -> usize {
        shift_min_samples((self.rtt_ns_p99_robust / self.rtt_ns_p50).ln() / Z99)
    }
}

/// A window in which the fleet's ToR-mesh RTT rose, and its slow thresholds with it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RttShift {
    pub window_start_ns: u64,
    pub ts_source: &'static str,
    /// The window's ToR-mesh lower quartile over the baseline's (> 1): the factor its slow
    /// thresholds were scaled by.
    pub factor: f64,
}

/// Probe records that were no evidence, by why.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct NotEvidence {
    /// Dropped on the prober's own host (outcome local_drop), by prober: never network loss.
    pub local_drop_by_prober: BTreeMap<String, u64>,
    /// Timestamps implausible.
    pub invalid: u64,
    /// Refused by the target's host (its agent is down).
    pub refused: u64,
    /// Outcome bytes this build does not know.
    pub unknown_outcome: u64,
    /// An end that no dictionary defines as an RNIC.
    pub unknown_rnic: u64,
    /// Sent from or to a host while it stalled (or within the stall pad of it).
    pub host_noise: u64,
    /// Ok probes whose RTT was no slowness evidence (still loss evidence): stamped by the host
    /// (`kernel_software`, `host_poll`), so their RTT holds a host's own kernel or polling,
    /// and sent from or to a host that was busy in the window ([`busy_host`]), its slowness
    /// no more than its busyness explains.
    pub busy_host_rtt: u64,
    /// Busy hosts: windows busy, by host name.
    pub busy_host_windows: BTreeMap<String, u64>,
}

/// What localisation saw and concluded.
#[derive(Debug, Clone, Serialize)]
pub struct Localization {
    /// Findings, network first, then by start.
    pub findings: Vec<Finding>,
    /// Windows analysed.
    pub windows: u64,
    /// Probe records looked at.
    pub records: u64,
    /// The median network RTT, ns, and the per-probe slowness threshold derived from it, of
    /// the timestamp source with the most samples (every source's are in `baselines`).
    pub rtt_ns_p50: f64,
    /// See `rtt_ns_p50`.
    pub slow_threshold_ns: f64,
    /// One baseline per timestamp source seen in ok probes, most samples first.
    pub baselines: Vec<Baseline>,
    /// Windows whose slow thresholds were scaled up with the fleet's RTT
    /// ([`Baselines::measure_shifts`]).
    pub rtt_shifts: Vec<RttShift>,
    /// Inter-ToR probes that could not vote because no path trace covered them.
    pub inter_tor_without_path: u64,
    /// Path-trace hop addresses no inventory switch lists, most traces first: the traces through
    /// them were left out ([`Dataset::unmapped_hops`]).
    pub unmapped_hops: Vec<UnmappedHop>,
    /// Hop addresses no inventory switch lists, named as their traces' end ToRs
    /// ([`crate::hops::EndHops`]) in traces placed.
    pub hops_learned: usize,
    /// Records that were no evidence.
    pub not_evidence: NotEvidence,
    /// What the counters were gathered from.
    pub evidence: EvidenceUsed,
    /// Traced service connections, worst first (see the module documentation for the rule).
    pub services: Vec<ServiceImpact>,
    /// Names of the services whose remote RNIC nothing resolved (no agent name, no inventory or
    /// dictionary entry with its GID): their remote is an RNIC named after the GID.
    pub unresolved_services: Vec<String>,
    /// Every (window, entity) blamed, before hysteresis joins them into findings: what a
    /// consumer of single windows (`analyze watch`) emits. Not in the JSON (the findings say it).
    #[serde(skip)]
    pub blamed: Vec<Blamed>,
}

/// What localisation's counters were gathered from: the records, or the window summaries
/// (`formats::window`) of files that have them and the records of those that do not, folded
/// into summaries as an agent folds them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct EvidenceUsed {
    /// `records` or `window_summaries`.
    pub from: &'static str,
    /// Files read from their own summaries.
    pub files_summarised: u64,
    /// Files whose records were folded into summaries (none written, or not every record
    /// summarised: an open segment, a writer that died, summaries dropped or damaged).
    pub files_folded: u64,
}

/// One entity blamed in one window.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Blamed {
    /// Start of the window, Unix ns.
    pub window_start_ns: u64,
    /// As [`Finding::kind`].
    pub kind: String,
    /// As [`Finding::entity`].
    pub entity: String,
    /// Share of the evidence that was bad, 0-1 (1 for a noisy host).
    pub score: f64,
    /// Why.
    pub evidence: String,
}

/// How hard a finding hits a traced service (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Grade {
    /// Its own probes were bad.
    High,
    /// A finding lay on its path; its own probes stayed clean.
    Medium,
    /// No finding on its path; a few lost or slow probes below the thresholds.
    Low,
    /// Clean, nothing on its path.
    None,
}

impl Grade {
    /// The name used in every output.
    pub fn name(self) -> &'static str {
        match self {
            Grade::High => "high",
            Grade::Medium => "medium",
            Grade::Low => "low",
            Grade::None => "none",
        }
    }
}

/// A finding on a service's path while it was probed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AffectedBy {
    /// The finding's entity.
    pub entity: String,
    /// The finding's kind (rnic, tor, link, spine, host).
    pub kind: String,
    /// The finding's start, Unix ns.
    pub start_ns: u64,
    /// The finding's end; `None` = still holding at the end of the data.
    pub end_ns: Option<u64>,
    /// Whether it overlaps a window in which the service's own probes were bad.
    pub confirmed: bool,
    /// The finding's evidence.
    pub evidence: String,
}

/// A window in which a service's own probes were bad.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BadWindow {
    /// Start of the window, Unix ns.
    pub start_ns: u64,
    /// Its probes with a known fate in the network (ok + partial + lost).
    pub valid: u64,
    /// Lost (no ACK1).
    pub lost: u64,
    /// Ok probes above their timestamp source's slow threshold.
    pub slow: u64,
    /// Which threshold, in words.
    pub why: String,
}

/// One traced service connection and what the findings did to it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ServiceImpact {
    /// 1 = the worst.
    pub rank: u64,
    /// Impact grade.
    pub grade: Grade,
    /// The dictionary name (unique per connection).
    pub name: String,
    /// Readable: `comm[pid] qp local->remote prober->remote`.
    pub label: String,
    /// The RNIC that probes it.
    pub prober: String,
    /// The remote RNIC its probes reach.
    pub remote: String,
    /// How `remote` was found.
    pub remote_resolution: Resolution,
    /// Process that owns the QP.
    pub pid: u32,
    /// Its command.
    pub comm: String,
    /// Local QP number.
    pub local_qpn: u32,
    /// Remote QP number.
    pub remote_qpn: u32,
    /// The connection's flow label.
    pub flow_label: u32,
    /// The connection's traffic class.
    pub traffic_class: u8,
    /// First and last probe sent, Unix ns; `None` when never probed.
    pub first_ns: Option<u64>,
    /// See `first_ns`.
    pub last_ns: Option<u64>,
    /// Windows in which it was probed.
    pub windows: u64,
    /// Its probe records.
    pub probes: u64,
    /// Lost (no ACK1).
    pub lost: u64,
    /// lost / (ok + partial + lost); `None` when that is 0.
    pub loss_ratio: Option<f64>,
    /// Network RTT p99 of its ok probes, ns.
    pub rtt_ns_p99: Option<i64>,
    /// How far that p99 lies above its timestamp source's slow threshold, ns (0 when below).
    pub rtt_ns_p99_excess: Option<i64>,
    /// Windows in which its own probes were bad.
    pub bad_windows: Vec<BadWindow>,
    /// What its packets cross, `kind:name`, from the prober to the remote.
    pub path: Vec<String>,
    /// Whether the links and spines between its two ToRs are known (traced, or the inventory's
    /// single path; trivially when both ends share a ToR).
    pub fabric_path_known: bool,
    /// Findings on its path while it was probed.
    pub affected_by: Vec<AffectedBy>,
    /// Why the grade, where the figures alone do not say.
    pub note: Option<String>,
}

/// Runs localisation over a dataset (probe columns still in place).
///
/// # Panics
/// When the probe columns differ in length, which ingest never produces (a hand-built
/// [`Dataset`], or one ingested without every column).
pub fn localize(ds: &Dataset, opts: &Options) -> Localization {
    run(&mut Input::Whole(ds), opts)
}

/// Runs localisation over a plan's ranges of whole windows ([`ranges`]), reading them four
/// times (the next range while the stages count one), so that memory follows two ranges and the
/// fleet, not the hours read: the same [`Localization`] as [`localize`] over the same files,
/// exactly (`analyze/tests/localize_ranges.rs` holds the two to it). What grows with the input
/// is small and said where it is kept: each traced service's ok RTTs (for its exact p99), the
/// log-likelihood ratios that could pass the false-discovery cut, the windows held as findings,
/// host-noise spans. The plan's path traces
/// are placed by the first pass; after the last, [`Plan::records_read`] and the unknown-id
/// counts are that pass's (a file left out is said once, whichever pass found it).
pub fn localize_ranges(plan: &mut Plan, ranges: Vec<(u64, u64)>, opts: &Options) -> Localization {
    plan.with_index(true);
    plan.with_paths();
    let l = run(&mut Input::Ranges { plan: &mut *plan, ranges }, opts);
    // The plan may be read again (html's page after its findings), without positions.
    plan.with_index(false);
    l
}

/// Where localisation's records come from.
enum Input<'a> {
    /// One table holding every record.
    Whole(&'a Dataset),
    /// A plan's ranges, read again on each pass, in time order.
    Ranges { plan: &'a mut Plan, ranges: Vec<(u64, u64)> },
}

impl Input<'_> {
    /// Everything but the records.
    fn ds(&self) -> &Dataset {
        match self {
            Input::Whole(ds) => ds,
            Input::Ranges { plan, .. } => &plan.ds,
        }
    }

    /// Records in the input (a strided sample's stride follows it).
    fn records(&self) -> usize {
        match self {
            Input::Whole(ds) => ds.probes.len(),
            Input::Ranges { plan, .. } => plan.records(),
        }
    }

    /// One pass: `each` with every range's records, in time order (a window is never split).
    fn pass(&mut self, each: &mut dyn FnMut(&Dataset, &Probes)) {
        match self {
            Input::Whole(ds) => each(ds, &ds.probes),
            Input::Ranges { plan, ranges } => {
                plan.rewind();
                plan.each_range(ranges, each);
                plan.place_paths();
            }
        }
    }
}

/// Records (or window keys) per block of [`in_blocks`] at least: a block's table of keys stays
/// worth its setup (the unit tests' few thousand records are cut into many blocks too).
const BLOCK_MIN: usize = if cfg!(test) { 1 << 4 } else { 1 << 14 };

/// `each` over blocks of `0..n` on every core of rayon's pool, told how many blocks there are;
/// the results in block order, for a stage to merge as one pass in record order would have
/// counted. Four blocks a thread, so a slow block leaves the others little to wait for; one
/// block held to one thread.
pub(super) fn in_blocks<T: Send>(n: usize, each: impl Fn(usize, std::ops::Range<usize>) -> T + Sync) -> Vec<T> {
    use rayon::prelude::*;
    let threads = rayon::current_num_threads().max(1);
    let blocks = if threads == 1 { 1 } else { (4 * threads).min(n.div_ceil(BLOCK_MIN)).max(1) };
    let per = n.div_ceil(blocks).max(1);
    (0..blocks).into_par_iter().map(|b| each(blocks, (b * per).min(n)..((b + 1) * per).min(n))).collect()
}

/// The stages over an input, pass by pass:
/// 1. the baselines' and the windows' RTT-shift samples (strided by position in the input);
/// 2. host noise and busy hosts (judged against the baselines);
/// 3. the evidence's log-likelihood ratios, for the one false-discovery cut over every window;
/// 4. the evidence again, blamed window by window against that cut.
///
/// Over one table, pass 3's evidence is kept for pass 4 instead of being gathered again.
fn run(input: &mut Input, opts: &Options) -> Localization {
    let window_ns = opts.window_s.max(1) * 1_000_000_000;
    let tor_of = tor_ids(input.ds());
    let mut sampler = Sampler::new(input.records());
    input.pass(&mut |_, p| sampler.add(p, &tor_of, window_ns));
    let base = sampler.finish(opts);
    let hosts = Hosts::of(input.ds());
    let agents = Agents::of(input.ds(), window_ns);
    let mut scan = NoiseScan::default();
    input.pass(&mut |ds, p| scan.add(ds, p, &hosts, &tor_of, &base, opts, window_ns));
    let noise = Noise::new(input.ds(), &hosts, &base, opts, window_ns, scan);
    let cx = TallyContext { base: &base, tor_of: &tor_of, noise: &noise, hosts: &hosts, agents: &agents, window_ns };
    let blamer = Blamer::new(input.ds());
    // Pass 3 gathers the evidence as pass 4 does, in the same order, and keeps only what the
    // cut needs; over one table its evidence goes on to pass 4 as it is.
    let mut llrs = Llrs::new(opts.fdr);
    let (mut tally, mut el) = (Tally::new(input.ds()), Elements::new(input.ds()));
    let whole = matches!(input, Input::Whole(_));
    let mut kept: Option<Evidence> = None;
    input.pass(&mut |ds, p| {
        let range = tally_range(ds, p, &cx, &mut tally);
        let e = evidence(ds, &range, &tally, &cx, &mut el);
        llrs.add(&e, el.names.len(), &blamer, opts);
        if whole {
            kept = Some(e);
        }
    });
    let mut held = held_hosts(&noise, &hosts);
    let mut stream = BlameStream::new(llrs.cuts());
    if let Some(e) = kept {
        stream.add(e, &el, &blamer, &base, opts, &mut held);
    } else {
        (tally, el) = (Tally::new(input.ds()), Elements::new(input.ds()));
        input.pass(&mut |ds, p| {
            let range = tally_range(ds, p, &cx, &mut tally);
            let e = evidence(ds, &range, &tally, &cx, &mut el);
            stream.add(e, &el, &blamer, &base, opts, &mut held);
        });
    }
    stream.finish(&el, &base, &mut held);
    let mut l = conclude(input.ds(), opts, window_ns, &base, &noise, &hosts, tally, el, held);
    l.evidence.from = "records";
    l
}

/// What localisation gathers its counters from (`analyze localize --evidence`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum EvidenceFrom {
    /// The window summaries when the agents write them (as the first file in path order that
    /// holds records says; the records of files without complete ones folded alike), else the
    /// records.
    Auto,
    /// The records: exact send times and values, read in four passes over the ranges.
    Records,
    /// The window summaries (the records of files without complete ones folded alike): one
    /// read of each file, values within 1/64, send times within a summary window.
    Summaries,
}

impl EvidenceFrom {
    /// Whether localisation over `files` counts from their summaries ([`localize_files`]).
    pub fn reads_summaries(self, files: &[std::path::PathBuf]) -> bool {
        match self {
            EvidenceFrom::Summaries => true,
            EvidenceFrom::Records => false,
            EvidenceFrom::Auto => crate::ingest::writes_window_summaries(files),
        }
    }
}

/// Localises the windows of `files` in `[from_ns, to_ns)` (whole windows of `opts.window_s`)
/// from the evidence `from` chooses: [`localize_windows`] over their summaries, or
/// [`localize_ranges`] over ranges of at most `range_records` records. Returns the result,
/// the dataset (its problems to be said) and the probes counted.
pub fn localize_files(
    files: &[std::path::PathBuf],
    inventory: Option<&rocemesh_formats::inventory::Inventory>,
    opts: &Options,
    from: EvidenceFrom,
    range_records: usize,
    (from_ns, to_ns): (u64, u64),
) -> (Localization, Dataset, u64) {
    let window_ns = opts.window_s.max(1) * 1_000_000_000;
    if from.reads_summaries(files) {
        let (ds, mut w) = crate::ingest::ingest_windows(files, inventory, window_ns);
        w.retain_span(from_ns, to_ns);
        return (localize_windows(&ds, &w, opts), ds, w.probes);
    }
    // A range of whole windows at a time, pass by pass: memory follows `range_records` and the
    // fleet, not the hours read.
    let mut plan = crate::ingest::plan(files, crate::ingest::Fields::All, inventory, window_ns);
    if let Some(inv) = inventory {
        plan.ds.add_single_paths(inv);
    }
    let ranges: Vec<(u64, u64)> = ranges(&plan, range_records)
        .into_iter()
        .map(|(a, b)| (a.max(from_ns), b.min(to_ns)))
        .filter(|(a, b)| a < b)
        .collect();
    let l = localize_ranges(&mut plan, ranges, opts);
    let read = plan.records_read() as u64;
    (l, plan.finish(), read)
}

/// `plan`'s ranges as [`localize_ranges`] reads them under a budget of `range_records` held at
/// once: half of it each, since it holds two ranges at a time (it reads the next while its
/// stages count one, `Plan::each_range`).
pub fn ranges(plan: &Plan, range_records: usize) -> Vec<(u64, u64)> {
    plan.ranges((range_records / 2).max(1))
}

/// Runs localisation over window summaries ([`crate::ingest::ingest_windows`]) instead of
/// records: stages 1 to 3 from counts and histograms (`windows`, which says where that differs
/// from records), the stages after them as [`localize`] runs them. `opts.window_s` must be a
/// multiple of the summaries' windows (ingest folds the records of files whose are not).
pub fn localize_windows(ds: &Dataset, w: &Windows, opts: &Options) -> Localization {
    let window_ns = opts.window_s.max(1) * 1_000_000_000;
    let base = windows::baselines(w, &tor_ids(ds), opts, window_ns);
    from_windows(ds, w, base, Llrs::new(opts.fdr), None, opts).0
}

/// What a live window leaves the next one ([`localize_live`]): what its covers picked and what
/// it blamed, which the next window's edges are judged against, as `localize` judges a window
/// against its neighbour's picks and findings.
#[derive(Debug, Clone)]
pub struct Before {
    pub window_start_ns: u64,
    picks: [Vec<(&'static str, String)>; 2],
    blamed: Vec<Blamed>,
}

/// One window's false-discovery tests ([`localize_live`]): the live analyzer keeps the recent
/// windows' so that a window's cut is over them, as `localize`'s is over its whole input.
#[derive(Debug, Clone)]
pub struct Tests(Llrs);

impl Tests {
    /// Tests taken (loss, slowness).
    pub fn count(&self) -> [u64; 2] {
        self.0.tests
    }
}

/// [`localize_windows`] for the live analyzer, over the keys of one window (`w`, starting at
/// `start_ns`): against baselines it sums from the recent windows' [`BaselineCounts`], with a
/// false-discovery cut over `earlier` windows' tests and this window's own, its edges judged
/// against what the window `before` it picked and blamed. Returns the localisation, the
/// window's tests, and what it leaves the next window.
pub fn localize_live(
    ds: &Dataset,
    w: &Windows,
    start_ns: u64,
    base: Baselines,
    earlier: &[&Tests],
    before: Option<&Before>,
    opts: &Options,
) -> (Localization, Option<Tests>, Before) {
    let mut llrs = Llrs::new(opts.fdr);
    for t in earlier {
        llrs.merge(&t.0);
    }
    let window_ns = opts.window_s.max(1) * 1_000_000_000;
    let win = (start_ns / window_ns) as u32;
    let (l, mut tests, picks) = from_windows(ds, w, base, llrs, before, opts);
    let blamed = l.blamed.iter().filter(|b| b.window_start_ns == start_ns).cloned().collect();
    let picks = picks.filter(|p| p.0 == win).map_or_else(Default::default, |p| p.1);
    (l, tests.remove(&win).map(Tests), Before { window_start_ns: start_ns, picks, blamed })
}

/// The picks of a window by element name, as [`Before`] keeps them.
type NamedPicks = (u32, [Vec<(&'static str, String)>; 2]);

/// Stages 2 to 5 over window summaries against `base`, the cut over `llrs` (tests already
/// taken) and the windows' own tests, which it returns by window number with the last
/// window's picks; `before` is the window before the first's.
fn from_windows(
    ds: &Dataset,
    w: &Windows,
    base: Baselines,
    mut llrs: Llrs,
    before: Option<&Before>,
    opts: &Options,
) -> (Localization, BTreeMap<u32, Llrs>, Option<NamedPicks>) {
    let window_ns = opts.window_s.max(1) * 1_000_000_000;
    let tor_of = tor_ids(ds);
    let hosts = Hosts::of(ds);
    let agents = Agents::of(ds, window_ns);
    let scan = windows::noise_scan(ds, w, &hosts, &tor_of, &base, opts, window_ns);
    let noise = Noise::new(ds, &hosts, &base, opts, window_ns, scan);
    let cx = TallyContext { base: &base, tor_of: &tor_of, noise: &noise, hosts: &hosts, agents: &agents, window_ns };
    let blamer = Blamer::new(ds);
    let (mut tally, mut el) = (Tally::new(ds), Elements::new(ds));
    let range = windows::tally(ds, w, &cx, &mut tally);
    let e = evidence(ds, &range, &tally, &cx, &mut el);
    let mut tests = BTreeMap::new();
    for (&win, groups) in &e.by_window {
        let mut t = Llrs::new(opts.fdr);
        t.add_window(groups, el.names.len(), &blamer, opts);
        llrs.merge(&t);
        tests.insert(win, t);
    }
    let mut held = held_hosts(&noise, &hosts);
    let mut stream = BlameStream::new(llrs.cuts());
    if let Some(b) = before {
        let w = (b.window_start_ns / window_ns) as u32;
        let ids = |p: &[(&'static str, String)]| p.iter().filter_map(|k| el.ids.get(k).copied()).collect();
        stream.before_prev = Some((w, [ids(&b.picks[0]), ids(&b.picks[1])]));
        for x in &b.blamed {
            held.hold(&x.kind, &x.entity, w, x.score, x.evidence.clone());
        }
    }
    stream.add(e, &el, &blamer, &base, opts, &mut held);
    stream.finish(&el, &base, &mut held);
    let picks = stream.before_prev.take().map(|(w, p)| {
        let named = |v: &[u32]| v.iter().map(|&x| el.names[x as usize].clone()).collect();
        (w, [named(&p[0]), named(&p[1])])
    });
    let mut l = conclude(ds, opts, window_ns, &base, &noise, &hosts, tally, el, held);
    l.evidence = EvidenceUsed {
        from: "window_summaries",
        files_summarised: w.files_summarised as u64,
        files_folded: w.files_folded as u64,
    };
    (l, tests, picks)
}

/// The noisy hosts' windows, held as `host` findings.
fn held_hosts(noise: &Noise, hosts: &Hosts) -> Held {
    let mut held = Held::default();
    for ((host, w), why) in &noise.windows {
        held.hold("host", &hosts.names[*host as usize], *w, 1.0, why.clone());
    }
    held
}

/// The findings from what the evidence stages held: hysteresis, services, and the figures.
#[allow(clippy::too_many_arguments, reason = "the stages' products, named")]
fn conclude(
    ds: &Dataset,
    opts: &Options,
    window_ns: u64,
    base: &Baselines,
    noise: &Noise,
    hosts: &Hosts,
    mut tally: Tally,
    el: Elements,
    mut held: Held,
) -> Localization {
    tally.finish(ds, noise, hosts);
    absorb_edges(&el, &mut held);
    let last_window = tally.windows.iter().next_back().copied();
    let blamed = held
        .0
        .iter()
        .flat_map(|((kind, entity), ws)| {
            ws.iter().map(|(&w, (score, evidence))| Blamed {
                window_start_ns: u64::from(w) * window_ns,
                kind: kind.clone(),
                entity: entity.clone(),
                score: *score,
                evidence: evidence.clone(),
            })
        })
        .collect();
    let findings = hysteresis(held, window_ns, last_window, opts.close_after_quiet_windows);
    let services = service_impacts(ds, &tally.services, &findings, base, opts, window_ns);
    let mut baselines: Vec<Baseline> = base.all().cloned().collect();
    baselines.sort_by_key(|b| std::cmp::Reverse(b.samples));
    let (rtt_ns_p50, slow_threshold_ns) =
        baselines.first().map_or((0.0, opts.slow_margin_ns), |b| (b.rtt_ns_p50, b.slow_threshold_ns));
    Localization {
        findings,
        windows: tally.windows.len() as u64,
        records: tally.records,
        rtt_ns_p50,
        slow_threshold_ns,
        baselines,
        rtt_shifts: base.rtt_shifts(window_ns),
        inter_tor_without_path: el.without_path,
        unmapped_hops: ds.unmapped_hops.clone(),
        hops_learned: ds.hops_learned,
        not_evidence: tally.not_evidence,
        evidence: EvidenceUsed::default(),
        services,
        unresolved_services: ds.unresolved_services().map(|s| s.name.clone()).collect(),
        blamed,
    }
}
