//! The `analyze` command line ([`Cli`], in the library so that a test can parse the docs' command
//! lines with the binary's own parser), and the `report`, `export`, `html` and `localize`
//! subcommands: their arguments, and the path from segment files to output with the exit codes
//! of [`crate::exit`]. Input problems (damaged or unreadable files) are listed on stderr and make
//! the exit code 1; the output is still written from what could be read.

use std::path::{Path, PathBuf};
use std::time::Instant;

use clap::{Parser, Subcommand};

use crate::export::{self, Compression};
use crate::html::{self, HtmlReport};
use rocemesh_formats::inventory::Inventory;

use crate::ingest::{self, Dataset, Fields};
use crate::report::{self, DEFAULT_SCOPES, Format, Meta, Scope, Sla, Span};
use crate::{exit, inspect};

/// Analyse rocemesh segment files (open *.rseg and sealed *.rseg.zst).
///
/// Exit codes: 0 all input read cleanly; 1 ran, but some input was damaged or unreadable
/// (reported, and skipped); 2 could not run (bad arguments, no input).
#[derive(Parser, Debug)]
#[command(version, about, long_about)]
pub struct Cli {
    #[command(subcommand)]
    pub what: What,
}

#[derive(Subcommand, Debug)]
pub enum What {
    /// Say which RNIC, ToR, link or spine is at fault, window by window.
    ///
    /// Also which hosts were too noisy to count as evidence. Probes dropped on the prober's own
    /// host are never evidence; RTTs are judged against the fleet baseline of their own timestamp
    /// source. Traced service connections (jobs' RDMA QPs) are then ranked by how the findings on
    /// their path and their own probes say they were hurt. The method and where it fails: the
    /// operator's guide (docs/GUIDE.md) and docs/design/localisation.md.
    Localize(LocalizeArgs),
    /// SLA report per window and scope: probe counts, loss ratio and delay quantiles.
    ///
    /// The scopes are cluster, ToR, RNIC, ToR pair, pair and traced service connection; rows
    /// breaking the SLA come first.
    ///
    /// Every row counts probes, ok, lost, partial, invalid, refused, local_drop and unreachable,
    /// and a loss ratio; what each record counts as:
    /// docs/design/analysis.md#what-a-probe-counts-as. Its ts_source column names the timestamp
    /// sources of its delay quantiles: nic, host_poll, kernel_software or kernel_hardware, or
    /// mixed(a+b) when samples of several sources were pooled (their delays are not comparable).
    Report(ReportArgs),
    /// Report continuously over a collection directory, window by window, as JSON lines.
    ///
    /// A window's rows are written once it is complete (the fleet's time, the newest record more
    /// than a quarter of the live hosts wrote, is --grace-s past it); late and damaged files are
    /// said; the position survives restarts (--state). The rows are `report`'s, number for number.
    Watch(WatchArgs),
    /// Localise each window seconds after it closes, from the summaries agents push (`[live]`).
    ///
    /// Receives the agents' live pushes on a UDP port and writes JSON lines: `open` and `close`
    /// for findings, `window` for each window localised (when it was, and which RNICs it waited
    /// for in vain), `problem` for the first push refused for each reason. A window is localised
    /// once every RNIC heard recently has pushed it, or --deadline-s after its end; baselines
    /// come from the last --history-windows, so a fresh start needs no stored data.
    Live(LiveArgs),
    /// Write the raw probe table (with names, ToRs and windows) as Parquet for DuckDB or Spark.
    Export(ExportArgs),
    /// Write one self-contained HTML page: time charts, heatmaps, SLA violations, findings.
    Html(HtmlArgs),
    /// Validate segments and list what each holds and what a reader has to skip in it.
    ///
    /// The totals also say what the window summaries hold (keys, and histogram cells per probe
    /// counted: what `localize` reads instead of the records) and, for sealed files, the zstd
    /// bytes of their frames beside the records' (the summaries' cost on disk).
    Inspect {
        /// Segment files, or directories searched recursively for *.rseg and *.rseg.zst.
        #[arg(required = true)]
        inputs: Vec<PathBuf>,
        /// Also print each file's window summaries, a line per window: its probes by class,
        /// RTT p50 and p99 from its histograms (within 1.6%), and how late the shard's own
        /// schedule ran.
        #[arg(long)]
        windows: bool,
    },
    /// Print the man page (`man`) or shell completions (`bash`, `zsh`, `fish`, `elvish`,
    /// `powershell`) generated from these definitions; packages install them.
    #[command(hide = true)]
    Generate {
        /// `man`, or a shell.
        what: String,
        /// The command's name as installed (packages install `rocemesh-analyze`).
        #[arg(long, default_value = "analyze")]
        name: String,
    },
}

/// SLA thresholds: flags, or a file, not both.
#[derive(clap::Args, Debug, Clone)]
pub struct SlaArgs {
    /// Loss-ratio threshold; a row above it violates the SLA [default: 0.001, Pingmesh's 0.1%].
    #[arg(long, conflicts_with = "sla_config")]
    pub sla_loss: Option<f64>,
    /// Network RTT p99 threshold, µs [default: 500, rpingmesh's phase-1 bound].
    #[arg(long, conflicts_with = "sla_config")]
    pub sla_rtt_p99_us: Option<f64>,
    /// TOML file with the thresholds: `loss_ratio = 0.001` and `rtt_p99_us = 500` (both
    /// optional, defaults as above; other keys are refused).
    #[arg(long)]
    pub sla_config: Option<PathBuf>,
}

impl SlaArgs {
    /// The thresholds, or the exit code after saying why they are not valid.
    fn resolve_for(&self, command: &str) -> Result<Sla, i32> {
        self.resolve().map_err(|e| {
            eprintln!("analyze {command}: SLA: {e}");
            exit::USAGE
        })
    }

    fn resolve(&self) -> Result<Sla, String> {
        if let Some(p) = &self.sla_config {
            return Sla::from_file(p).map_err(|e| e.to_string());
        }
        let d = Sla::default();
        let sla = Sla {
            loss_ratio: self.sla_loss.unwrap_or(d.loss_ratio),
            rtt_p99_us: self.sla_rtt_p99_us.unwrap_or(d.rtt_p99_us),
        };
        sla.check().map(|()| sla)
    }
}

/// `analyze report`.
#[derive(clap::Args, Debug, Clone)]
pub struct ReportArgs {
    /// Scopes to report, comma-separated: cluster, tor_pair, tor, rnic (records where the RNIC
    /// is prober or target), pair (one row per probed pair and window: large), service (one row
    /// per traced job connection and window, over its own probes; adds the connection's columns).
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = DEFAULT_SCOPES)]
    pub scope: Vec<Scope>,
    /// Window length, seconds; windows are aligned on the wall clock (floor(t1 / window)).
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=86_400 * 366))]
    pub window_s: u64,
    #[command(flatten)]
    pub sla: SlaArgs,
    /// Output format: table (µs, for a terminal), json, csv, parquet (ns).
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
    /// Write here instead of standard output (required for parquet).
    #[arg(long)]
    pub output: Option<PathBuf>,
    /// The fabric's inventory (ctl's file): names the remote RNIC of traced connections whose
    /// agent did not know it, from the remote GID.
    #[arg(long)]
    pub inventory: Option<PathBuf>,
    #[command(flatten)]
    pub ranges: RangeArgs,
    /// Segment files, or directories searched recursively for *.rseg and *.rseg.zst.
    #[arg(required = true)]
    pub inputs: Vec<PathBuf>,
}

/// How much of the input `report`, `export`, `localize`, `html` and `watch` hold at once.
#[derive(clap::Args, Debug, Clone)]
pub struct RangeArgs {
    /// Records held in memory at once, at most: the input is read in ranges of whole windows
    /// that hold this many (a window is never split, however many records it holds; localize
    /// reads the next range while it counts one, in ranges of half this). Lower it
    /// on a smaller machine: peak memory follows this, not the input's length (measured figures:
    /// docs/PERFORMANCE.md#bench-analyze).
    #[arg(long, default_value_t = 16 << 20, value_parser = clap::value_parser!(u64).range(1..))]
    pub range_records: u64,
}

/// `analyze export`.
#[derive(clap::Args, Debug, Clone)]
pub struct ExportArgs {
    /// The Parquet file to write (one row per probe).
    #[arg(long, required_unless_present = "partitioned", conflicts_with = "partitioned")]
    pub parquet: Option<PathBuf>,
    /// Write a Hive-partitioned dataset into this new (or empty) directory instead:
    /// `date=YYYY-MM-DD/hour=HH/tor=NAME/part-NNNNN.parquet` by the UTC hour of T1 and the
    /// prober's ToR, for Spark and other engines that prune partitions (see analyze/spark/).
    #[arg(long)]
    pub partitioned: Option<PathBuf>,
    /// Window length for the `window_start_ns` column, seconds.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=86_400 * 366))]
    pub window_s: u64,
    /// Page compression.
    #[arg(long, value_enum, default_value_t = Compression::Zstd)]
    pub compression: Compression,
    #[command(flatten)]
    pub ranges: RangeArgs,
    /// Segment files, or directories searched recursively for *.rseg and *.rseg.zst.
    #[arg(required = true)]
    pub inputs: Vec<PathBuf>,
}

/// `analyze html`.
#[derive(clap::Args, Debug, Clone)]
pub struct HtmlArgs {
    /// The HTML file to write.
    #[arg(long)]
    pub output: PathBuf,
    /// Window length for the SLA violations, seconds.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=86_400 * 366))]
    pub window_s: u64,
    #[command(flatten)]
    pub sla: SlaArgs,
    /// The fabric's inventory (ctl's file): single-spine paths for localisation, the switches
    /// the agents' path-trace hops (known by address) stand for, and the remote RNIC of traced
    /// connections whose agent did not know it.
    #[arg(long)]
    pub inventory: Option<PathBuf>,
    /// The page's figures read these ranges (`html::HtmlReport::build_ranges`), four times
    /// each; so does localisation from records (`localize::localize_ranges`).
    #[command(flatten)]
    pub ranges: RangeArgs,
    /// Localise from the agents' window summaries or the records, as `localize --evidence`.
    /// The page's figures (counts, loss ratios, exact RTT quantiles) are the records' either way.
    #[arg(long, value_enum, default_value_t = crate::localize::EvidenceFrom::Auto)]
    pub evidence: crate::localize::EvidenceFrom,
    /// The switches' counters beside the findings, as `localize` shows them.
    #[command(flatten)]
    pub switches: SwitchArgs,
    /// Segment files, or directories searched recursively for *.rseg and *.rseg.zst.
    #[arg(required = true)]
    pub inputs: Vec<PathBuf>,
}

/// `analyze watch`.
#[derive(clap::Args, Debug, Clone)]
pub struct WatchArgs {
    /// State file: the files seen and the windows emitted, so a restarted watch goes on where
    /// it stopped (created on first run; one per output).
    #[arg(long)]
    pub state: PathBuf,
    /// Append the JSON lines to this file (kept consistent with the state across crashes);
    /// without it they go to standard output.
    #[arg(long)]
    pub output: Option<PathBuf>,
    /// Also write the lines to standard output when --output is given.
    #[arg(long)]
    pub stdout: bool,
    /// Scopes of the rows, as `report --scope`.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = DEFAULT_SCOPES)]
    pub scope: Vec<Scope>,
    /// Window length, seconds (fixed for a state file).
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=86_400 * 366))]
    pub window_s: u64,
    /// Data time, seconds, the fleet's time (the newest record more than a quarter of the live
    /// hosts have written) must be past a window's end before the window is emitted; also how
    /// long (by this machine's clock) a host may deliver nothing before it stops voting. Files
    /// arriving later than this are late (said, not reported). Default: two of an agent's
    /// 10-minute segments.
    #[arg(long, default_value_t = 1200)]
    pub grace_s: u64,
    /// Seconds between passes over the directory.
    #[arg(long, default_value_t = 10.0)]
    pub poll_s: f64,
    /// One pass, then exit (for cron or a systemd timer).
    #[arg(long)]
    pub once: bool,
    /// The collection has ended: emit every window of the files present, complete or not, then
    /// exit.
    #[arg(long)]
    pub flush: bool,
    #[command(flatten)]
    pub sla: SlaArgs,
    /// The fabric's inventory (as `report --inventory`).
    #[arg(long)]
    pub inventory: Option<PathBuf>,
    #[command(flatten)]
    pub ranges: RangeArgs,
    /// Windows localised together for the `finding` lines: each block is read with one window
    /// of context either side and goes out once the window after it is emitted, so a larger
    /// block reads less twice and waits longer.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub findings_block_windows: u64,
    /// Rows only: no `finding` lines (localisation reads each block four times).
    #[arg(long)]
    pub no_findings: bool,
    /// The collection directory (`ctl collect`'s), searched recursively for *.rseg.zst.
    pub dir: PathBuf,
}

/// `analyze live`.
#[derive(clap::Args, Debug, Clone)]
pub struct LiveArgs {
    /// Address and UDP port the agents push to (their `[live] collectors`).
    #[arg(long, default_value = "0.0.0.0:18620")]
    pub listen: std::net::SocketAddr,
    /// The agents' summary window, seconds (`summary_window_s`); also the analysis window.
    #[arg(long, default_value_t = rocemesh_formats::window::DEFAULT_WINDOW_S,
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub window_s: u64,
    /// Seconds after a window's end at which it is localised with what arrived, if some RNIC
    /// heard recently has not pushed it all by then. An agent closes a window its probe timeout
    /// plus a flush interval and a second after the window's end, and pushes it at its next
    /// flush: keep this above that.
    #[arg(long, default_value_t = 6.0)]
    pub deadline_s: f64,
    /// Windows localised together (the window and those before it): the baselines' sample.
    #[arg(long, default_value_t = 24, value_parser = clap::value_parser!(u64).range(4..=720))]
    pub history_windows: u64,
    /// Pushes whose window starts further than this from this machine's clock are refused
    /// (a host whose clock is far off), seconds.
    #[arg(long, default_value_t = 120)]
    pub max_skew_s: u64,
    /// Quiet windows after which a finding closes.
    #[arg(long, default_value_t = 3)]
    pub close_after_quiet_windows: u64,
    /// The fleet key file (`ctl keys rotate`): every push must be sealed with one of its
    /// accepted keys. Without it seals are not checked.
    #[arg(long)]
    pub keys: Option<PathBuf>,
    /// The fabric's inventory: its RNICs and their ToRs known from the start, the traced hops
    /// named by its switch addresses, and the path of two ToRs that share one spine.
    #[arg(long)]
    pub inventory: Option<PathBuf>,
    /// Append the JSON lines to this file; without it they go to standard output.
    #[arg(long)]
    pub output: Option<PathBuf>,
    /// Stop after this many seconds (tests, benches); without it, run until stopped.
    #[arg(long)]
    pub for_s: Option<f64>,
    /// Serve `/metrics` (Prometheus), the page of open findings and the ToR heatmap (`/`) and
    /// `/findings.json` on this TCP address. No TLS, no authentication: bind it to the
    /// management network or firewall it.
    #[arg(long)]
    pub http: Option<std::net::SocketAddr>,
    /// Keep the open findings in this file, rewritten as they change and taken back at start,
    /// so that a restart neither opens a finding twice nor forgets one to close.
    #[arg(long)]
    pub state: Option<PathBuf>,
    /// The switches' counters beside each finding: asked --counters-lookback-s after its first
    /// window (the `open` line does not wait for them) and again after it closes, each answer a
    /// `switches` line.
    #[command(flatten)]
    pub switches: SwitchArgs,
}

/// How `analyze localize` prints its findings.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum FindingsFormat {
    /// Findings with their evidence, then the traced services they touch.
    Table,
    /// The findings shape `testbeds score` reads (testbeds/scenarios/README.md), plus `services`.
    Json,
}

/// `analyze localize`.
#[derive(clap::Args, Debug, Clone)]
pub struct LocalizeArgs {
    /// Segment files, or directories searched recursively for *.rseg and *.rseg.zst.
    #[arg(required = true)]
    pub inputs: Vec<PathBuf>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = FindingsFormat::Table)]
    pub format: FindingsFormat,
    /// Write here instead of standard output.
    #[arg(long)]
    pub output: Option<PathBuf>,
    /// Also write the JSON document to this file, whatever --format prints (earlier releases'
    /// spelling of `--format json --output FILE` beside the table; kept for one release).
    #[arg(long, hide = true)]
    pub json: Option<PathBuf>,
    /// Window length in seconds; windows are wall-clock aligned so all agents' coincide.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=86_400 * 366))]
    pub window_s: u64,
    /// Quiet windows after which a finding closes (hysteresis: a flap stays one finding).
    #[arg(long, default_value_t = 3)]
    pub close_after_quiet_windows: u64,
    /// False-discovery rate the loss and slowness candidates are held to over every (element,
    /// window) tested (Benjamini-Hochberg): lower it to name fewer, surer elements.
    #[arg(long, default_value_t = 0.01, value_parser = parse_fdr)]
    pub fdr: f64,
    /// The fabric's inventory (ctl's file). Probes between ToRs that share exactly one spine
    /// then vote on that path's links and spine even without path traces, traced connections
    /// whose agent did not know the remote RNIC get it from the remote GID, and the hops of the
    /// agents' path traces (known by address) are named by the switches' `addrs`: without it
    /// such traces are left out and their addresses listed.
    #[arg(long)]
    pub inventory: Option<PathBuf>,
    /// SLA a traced service's own probes are judged by (its loss ratio marks a bad window).
    #[command(flatten)]
    pub sla: SlaArgs,
    /// Gather the counters from the agents' window summaries (`summary_window_s`) or the
    /// records. Summaries are read once and held whole (their keys, not the records:
    /// --range-records does not apply); a summary window must divide --window-s, else that
    /// file's records are folded.
    #[arg(long, value_enum, default_value_t = crate::localize::EvidenceFrom::Auto)]
    pub evidence: crate::localize::EvidenceFrom,
    /// Localisation from records reads these ranges four times (see `localize::localize_ranges`).
    #[command(flatten)]
    pub ranges: RangeArgs,
    /// The switches' counters beside the findings.
    #[command(flatten)]
    pub switches: SwitchArgs,
}

/// Switch counters from Prometheus beside the findings (`analyze::switches`).
#[derive(clap::Args, Debug, Clone)]
pub struct SwitchArgs {
    /// The Prometheus that scrapes the switches (http://host:port[/prefix]): each rnic, link,
    /// ToR and spine finding then says whether the error, discard, pause and ECN counters of
    /// its ports moved with it (corroborated), stayed flat (silent: loss only probing sees), or
    /// have no series. The ports are the inventory's (`ctl inventory lldp` learns them), so it
    /// needs --inventory. The counter map's address series (if_mib: IP-MIB's ipAdEntIfIndex,
    /// ipAddressIfIndex) add the switches' addresses to the inventory's first, naming the
    /// path-trace hops LLDP did not. Unreachable or refusing: said once, and the findings stand.
    #[arg(long, requires = "inventory")]
    pub prometheus: Option<String>,
    /// Which series hold a port's counters: a preset (if_mib: snmp_exporter's; gnmic: gnmic's
    /// OpenConfig interface counters; sonic: sonic-exporter's) or a TOML file naming the switch
    /// label, the port label and a selector per counter (docs/GUIDE.md shows one).
    #[arg(long, default_value = "if_mib")]
    pub counter_map: String,
    /// Seconds before a finding whose counters give their usual rate.
    #[arg(long, default_value_t = 600, value_parser = clap::value_parser!(u64).range(1..=86_400 * 30))]
    pub counters_before_s: u64,
    /// Seconds past each end of a span a sample bounding it is looked for: at least the
    /// switches' scrape interval.
    #[arg(long, default_value_t = 120, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub counters_lookback_s: u64,
    /// The false-positive rate a finding's counters are held to together (a counter moved when
    /// its increase is this improbable at its earlier rate, Bonferroni over the finding's).
    #[arg(long, default_value_t = 0.001, value_parser = parse_fdr)]
    pub counters_alpha: f64,
}

impl SwitchArgs {
    /// The options, when --prometheus is given; `Err(code)` when they cannot be used (said).
    fn options(&self, command: &str, window_s: u64) -> Result<Option<crate::switches::Options>, i32> {
        let Some(url) = &self.prometheus else { return Ok(None) };
        let said = |e: &dyn std::fmt::Display| {
            eprintln!("analyze {command}: {e}");
            exit::USAGE
        };
        let prometheus = crate::switches::prom::Prometheus::new(url).map_err(|e| said(&e))?;
        let map = crate::switches::map::CounterMap::resolve(&self.counter_map).map_err(|e| said(&e))?;
        Ok(Some(crate::switches::Options {
            prometheus,
            map,
            before_s: self.counters_before_s,
            lookback_s: self.counters_lookback_s,
            alpha: self.counters_alpha,
            window_ns: window_s.max(1) * 1_000_000_000,
        }))
    }
}

/// With `--prometheus`, the switches' addresses it holds (the counter map's address series)
/// added to the inventory before any trace is read, and said. Returns why Prometheus could not
/// be reached, said here once: the counters are then not asked either (another failure, such as
/// a listing too large, is said and the counters still asked).
fn learn_switch_addrs(
    command: &str,
    inv: &mut Option<Inventory>,
    opts: Option<&crate::switches::Options>,
) -> Option<String> {
    let (Some(inv), Some(opts)) = (inv.as_mut(), opts) else { return None };
    if opts.map.addresses.is_empty() {
        return None;
    }
    match crate::switches::learn_addresses(inv, opts) {
        Ok(l) => {
            if l.added > 0 || !l.conflicting.is_empty() {
                eprintln!(
                    "analyze {command}: {} switch addresses from {} added to the inventory's{}",
                    l.added,
                    opts.prometheus.url(),
                    match l.conflicting.len() {
                        0 => String::new(),
                        n => format!(
                            "; {n} not taken, claimed by two switches or listed under another: {}",
                            l.conflicting.iter().take(10).cloned().collect::<Vec<_>>().join(", ")
                        ),
                    }
                );
            }
        }
        Err(e @ crate::switches::prom::PromError::Connect { .. }) => {
            eprintln!(
                "analyze {command}: switch counters: {e}; the findings stand without them, their trace hops named \
                 from the inventory alone"
            );
            return Some(e.to_string());
        }
        Err(e) => eprintln!("analyze {command}: switch addresses: {e}; trace hops are named from the inventory alone"),
    }
    None
}

/// The switches' evidence beside `l`'s findings: asked of Prometheus unless it could not be
/// asked already (`failed`, said), else said here when it fails.
fn switch_evidence(
    command: &str,
    l: &crate::localize::Localization,
    inv: Option<&Inventory>,
    opts: Option<&crate::switches::Options>,
    failed: Option<String>,
) -> Option<crate::switches::SwitchCounters> {
    let (opts, inv) = (opts?, inv?);
    if let Some(e) = failed {
        return Some(crate::switches::unasked(l, opts, e));
    }
    let s = crate::switches::enrich(l, inv, opts);
    if let Some(e) = &s.error {
        eprintln!("analyze {command}: switch counters: {e}; the findings stand without them");
    }
    Some(s)
}

/// `--fdr`: a rate strictly between 0 and 1.
fn parse_fdr(v: &str) -> Result<f64, String> {
    match v.parse::<f64>() {
        Ok(x) if x > 0.0 && x < 1.0 => Ok(x),
        _ => Err(format!("{v:?} is not a rate between 0 and 1 (exclusive); e.g. 0.01")),
    }
}

/// Reads `--inventory` if given; `Err(code)` when it cannot be used (already said why).
fn load_inventory(command: &str, path: Option<&Path>) -> Result<Option<Inventory>, i32> {
    path.map(Inventory::load).transpose().map_err(|e| {
        eprintln!("analyze {command}: {e}");
        exit::USAGE
    })
}

/// The segment files under `inputs`; none is a usage error.
fn find(command: &str, inputs: &[PathBuf]) -> Result<Vec<PathBuf>, i32> {
    match inspect::find_segments(inputs) {
        Err(e) => {
            eprintln!("analyze {command}: cannot list {inputs:?}: {e}");
            Err(exit::USAGE)
        }
        Ok(f) if f.is_empty() => {
            eprintln!(
                "analyze {command}: no segment files (*.rseg, *.rseg.zst) under {inputs:?}; point it at an agent's segment directory"
            );
            Err(exit::USAGE)
        }
        Ok(f) => Ok(f),
    }
}

/// Says on stderr what was wrong with the input: damaged or skipped files, unmapped hops,
/// unresolved services.
fn say_problems(command: &str, ds: &Dataset, inventory: Option<&Inventory>) {
    for p in &ds.problems {
        let what = if p.skipped { "skipped" } else { "damaged, read in part" };
        eprintln!("analyze {command}: {}: {what}: {}", p.path.display(), p.problem);
    }
    if !ds.unmapped_hops.is_empty() {
        let shown: Vec<String> =
            ds.unmapped_hops.iter().take(10).map(|h| format!("{} ({} traces)", h.addr, h.traces)).collect();
        let more = ds.unmapped_hops.len().saturating_sub(shown.len());
        let fix = if inventory.is_none() {
            "name the switches' addresses in the inventory (`ctl inventory switch-addrs`) and pass --inventory"
        } else {
            "add them to the inventory with `ctl inventory switch-addrs`"
        };
        eprintln!(
            "analyze {command}: {} path-trace hop addresses no inventory switch lists, their traces left out: {}{} (fix: {fix})",
            ds.unmapped_hops.len(),
            shown.join(", "),
            if more > 0 { format!(" and {more} more") } else { String::new() }
        );
    }
    let unresolved: Vec<String> =
        ds.unresolved_services().map(|s| format!("{} (remote {})", s.name, ds.rnics[s.remote as usize].name)).collect();
    if !unresolved.is_empty() {
        let hint = if inventory.is_none() { "; --inventory may name them" } else { "" };
        eprintln!(
            "analyze {command}: {} of {} traced services have a remote GID no agent, inventory or dictionary names, counted under an RNIC named after it{hint}: {}",
            unresolved.len(),
            ds.services.len(),
            unresolved.join(", ")
        );
    }
}

fn problems(ds: &Dataset) -> Vec<String> {
    ds.problems
        .iter()
        .map(|p| format!("{}: {}: {}", p.path.display(), if p.skipped { "skipped" } else { "damaged" }, p.problem))
        .collect()
}

fn outcome(ds_problems: bool) -> i32 {
    if ds_problems { exit::PROBLEMS } else { exit::OK }
}

/// Runs `analyze report`; returns the exit code.
pub fn report(args: &ReportArgs) -> i32 {
    let sla = match args.sla.resolve_for("report") {
        Ok(s) => s,
        Err(code) => return code,
    };
    if args.format == Format::Parquet && args.output.is_none() {
        eprintln!("analyze report: --format parquet needs --output FILE");
        return exit::USAGE;
    }
    let inv = match load_inventory("report", args.inventory.as_deref()) {
        Ok(inv) => inv,
        Err(code) => return code,
    };
    let start = Instant::now();
    let files = match find("report", &args.inputs) {
        Ok(f) => f,
        Err(code) => return code,
    };
    // Windows are independent: the input is read a range of whole windows at a time, so
    // memory follows `--range-records`, not the hours read.
    let window_ns = args.window_s * 1_000_000_000;
    let mut plan = ingest::plan(&files, Fields::Report, inv.as_ref(), window_ns);
    let ranges = plan.ranges(args.ranges.range_records as usize);
    let plan_s = start.elapsed().as_secs_f64();
    let mut run = || -> Result<Meta, report::ReportError> {
        let (mut read_s, mut prepare_s, mut rows_s, mut unknown_outcomes) = (0.0, 0.0, 0.0, 0);
        let mut rows = Vec::new();
        for &(from, to) in &ranges {
            let t = Instant::now();
            let probes = plan.read(from, to);
            read_s += t.elapsed().as_secs_f64();
            let t = Instant::now();
            let prepared = report::prepare_with(probes, &plan.ds.rnics, &plan.ds.services, window_ns)?;
            prepare_s += t.elapsed().as_secs_f64();
            unknown_outcomes += prepared.unknown_outcomes;
            let t = Instant::now();
            rows.extend(prepared.rows(&args.scope, Span::PerWindow, &sla)?);
            rows_s += t.elapsed().as_secs_f64();
        }
        report::sort_rows(&mut rows);
        let records = plan.records_read();
        let ds = plan.finish();
        say_problems("report", &ds, inv.as_ref());
        say_unknown_outcomes("report", unknown_outcomes);
        let meta = Meta {
            window_s: args.window_s,
            sla,
            files: ds.files,
            records,
            problems: problems(&ds),
            scopes: args.scope.clone(),
        };
        let t = Instant::now();
        report::write(&rows, &meta, args.format, args.output.as_deref())?;
        // Where the time went, for an operator deciding whether to narrow the input.
        eprintln!(
            "analyze report: {} records from {} files in {:.2} s (plan {plan_s:.2} s, read {read_s:.2} s, prepare {prepare_s:.2} s, scopes {rows_s:.2} s, write {:.2} s; {} ranges)",
            meta.records,
            meta.files,
            start.elapsed().as_secs_f64(),
            t.elapsed().as_secs_f64(),
            ranges.len()
        );
        Ok(meta)
    };
    match run() {
        Ok(meta) => outcome(!meta.problems.is_empty()),
        Err(e) => {
            eprintln!("analyze report: {e}");
            exit::USAGE
        }
    }
}

/// `analyze watch`: passes over the directory until stopped (or one, with --once or --flush).
/// Exit code 1 when a pass said a problem or a late file, for the one-pass modes.
pub fn watch(args: &WatchArgs) -> i32 {
    let sla = match args.sla.resolve_for("watch") {
        Ok(s) => s,
        Err(code) => return code,
    };
    if !args.dir.is_dir() {
        eprintln!("analyze watch: {} is not a directory: pass the directory `ctl collect` fills", args.dir.display());
        return exit::USAGE;
    }
    if !(args.poll_s.is_finite() && args.poll_s > 0.0) {
        eprintln!("analyze watch: --poll-s must be a positive number of seconds");
        return exit::USAGE;
    }
    let inv = match load_inventory("watch", args.inventory.as_deref()) {
        Ok(inv) => inv,
        Err(code) => return code,
    };
    let cfg = crate::watch::Config {
        dir: args.dir.clone(),
        state: args.state.clone(),
        output: args.output.clone(),
        stdout: args.stdout,
        window_ns: args.window_s * 1_000_000_000,
        grace_ns: args.grace_s.saturating_mul(1_000_000_000),
        scopes: args.scope.clone(),
        sla,
        range_records: args.ranges.range_records as usize,
        flush: args.flush,
        findings: (!args.no_findings).then(|| crate::watch::Findings {
            options: crate::localize::Options { sla, ..crate::localize::Options::default() },
            block_windows: args.findings_block_windows,
        }),
    };
    let mut watch = match crate::watch::Watch::open(&cfg, inv.as_ref()) {
        Ok(w) => w,
        Err(e) => {
            eprintln!("analyze watch: {e}");
            return exit::USAGE;
        }
    };
    let mut said = 0;
    loop {
        match watch.pass() {
            Ok(p) => {
                said += p.said;
                if p.new_files + p.windows > 0 {
                    eprintln!(
                        "analyze watch: {} new files, {} windows ({} rows, {} findings) emitted, complete to {}; {} of {} files listed kept",
                        p.new_files,
                        p.windows,
                        p.rows,
                        p.findings,
                        inspect::utc(watch.emitted_to_ns()),
                        p.files_kept,
                        p.files_listed
                    );
                }
            }
            Err(e) => {
                eprintln!("analyze watch: {e}");
                return exit::USAGE;
            }
        }
        if args.once || args.flush {
            return outcome(said > 0);
        }
        std::thread::sleep(std::time::Duration::from_secs_f64(args.poll_s));
    }
}

/// `analyze live`: runs until stopped (or --for-s); prints what it counted when it stops.
pub fn live(args: &LiveArgs) -> i32 {
    let mut inv = match load_inventory("live", args.inventory.as_deref()) {
        Ok(inv) => inv,
        Err(code) => return code,
    };
    let seconds = |s: f64| s.is_finite() && s >= 0.0;
    if !seconds(args.deadline_s) || args.for_s.is_some_and(|f| !seconds(f)) {
        eprintln!("analyze live: --deadline-s and --for-s take a number of seconds, 0 or more");
        return exit::USAGE;
    }
    let keys = match args.keys.as_deref().map(rocemesh_formats::keys::FleetKeys::load).transpose() {
        Ok(k) => k,
        Err(e) => {
            eprintln!("analyze live: {e}");
            return exit::USAGE;
        }
    };
    let cfg = crate::live::Config {
        window_ns: args.window_s * 1_000_000_000,
        deadline_ns: (args.deadline_s * 1e9) as u64,
        history_windows: args.history_windows,
        max_skew_ns: args.max_skew_s.saturating_mul(1_000_000_000),
        opts: crate::localize::Options {
            close_after_quiet_windows: args.close_after_quiet_windows,
            ..crate::localize::Options::default()
        },
    };
    let switches = match args.switches.options("live", args.window_s) {
        Ok(opts) => {
            // A failure is said; the asker tries again as findings open, and says its own.
            let _ = learn_switch_addrs("live", &mut inv, opts.as_ref());
            opts.zip(inv.clone()).map(|(opts, inv)| crate::switches::Judge::new(inv, opts))
        }
        Err(code) => return code,
    };
    let listen = crate::live::Listen {
        addr: args.listen,
        keys,
        for_ns: args.for_s.map(|s| (s * 1e9) as u64),
        output: args.output.clone(),
        http: args.http,
        state: args.state.clone(),
        switches,
    };
    match crate::live::run(cfg, inv.as_ref(), &listen) {
        Ok(c) => {
            eprintln!(
                "analyze live: {} pushes received, {} taken, refused by reason {:?}, {} traced-service keys not localised",
                c.received, c.taken, c.refused, c.service_keys
            );
            exit::OK
        }
        Err(e) => {
            eprintln!("analyze live: {e}");
            exit::USAGE
        }
    }
}

/// Outcome bytes this build does not know come from a newer agent: counted in `probes` only,
/// and said once, so that a row's probes exceeding its classes is explained.
fn say_unknown_outcomes(command: &str, unknown_outcomes: u64) {
    if unknown_outcomes > 0 {
        eprintln!(
            "analyze {command}: {unknown_outcomes} records carry an outcome byte this build does not know (a newer agent?): counted in probes only"
        );
    }
}

/// Runs `analyze export`; returns the exit code.
pub fn export(args: &ExportArgs) -> i32 {
    let files = match find("export", &args.inputs) {
        Ok(f) => f,
        Err(code) => return code,
    };
    let window_ns = args.window_s * 1_000_000_000;
    let mut plan = ingest::plan(&files, Fields::All, None, window_ns);
    let mut ranges = plan.ranges(args.ranges.range_records as usize).into_iter();
    let (rnics, services) = (plan.ds.rnics.clone(), plan.ds.services.clone());
    let next = || ranges.next().map(|(from, to)| plan.read(from, to));
    let written = match (&args.parquet, &args.partitioned) {
        (_, Some(dir)) => export::write_partitioned_parts(&rnics, &services, dir, window_ns, args.compression, next)
            .map(|d| {
                format!(
                    "{} probes written to {} ({} files in {} partitions)",
                    d.rows,
                    dir.display(),
                    d.files,
                    d.partitions
                )
            }),
        (Some(path), None) => export::write_parquet_parts(&rnics, &services, path, window_ns, args.compression, next)
            .map(|rows| format!("{rows} probes written to {}", path.display())),
        (None, None) => Err(export::ExportError::Usage("pass --parquet FILE or --partitioned DIR".into())),
    };
    let ds = plan.finish();
    say_problems("export", &ds, None);
    match written {
        Ok(said) => {
            eprintln!("analyze export: {said}");
            outcome(!ds.problems.is_empty())
        }
        Err(e) => {
            eprintln!("analyze export: {e}");
            exit::USAGE
        }
    }
}

/// Runs `analyze html`; returns the exit code. It runs localisation itself, for the findings
/// and the traced services they touch, from summaries as `localize` chooses; the page's figures
/// read the records a range of whole windows at a time.
pub fn html(args: &HtmlArgs) -> i32 {
    let sla = match args.sla.resolve_for("html") {
        Ok(s) => s,
        Err(code) => return code,
    };
    let mut inv = match load_inventory("html", args.inventory.as_deref()) {
        Ok(inv) => inv,
        Err(code) => return code,
    };
    let files = match find("html", &args.inputs) {
        Ok(f) => f,
        Err(code) => return code,
    };
    let switch_opts = match args.switches.options("html", args.window_s) {
        Ok(o) => o,
        Err(code) => return code,
    };
    let prom_failed = learn_switch_addrs("html", &mut inv, switch_opts.as_ref());
    // From summaries, localisation reads each file once more on its own (its dataset's problems
    // joined to the page's below), and the page's own reads need a report's columns only; from
    // records, localisation reads the page's plan, every column.
    let from_summaries = args.evidence.reads_summaries(&files);
    let fields = if from_summaries { Fields::Report } else { Fields::All };
    let mut plan = ingest::plan(&files, fields, inv.as_ref(), args.window_s * 1_000_000_000);
    if let Some(inv) = &inv {
        plan.ds.add_single_paths(inv);
    }
    let ranges = plan.ranges(args.ranges.range_records as usize);
    let opts = crate::localize::Options { window_s: args.window_s, sla, ..crate::localize::Options::default() };
    let (localization, summaries_ds) = if from_summaries {
        let (l, ds, _) = crate::localize::localize_files(
            &files,
            inv.as_ref(),
            &opts,
            crate::localize::EvidenceFrom::Summaries,
            0,
            (0, u64::MAX),
        );
        (l, Some(ds))
    } else {
        let ranges = crate::localize::ranges(&plan, args.ranges.range_records as usize);
        (crate::localize::localize_ranges(&mut plan, ranges, &opts), None)
    };
    let switches = switch_evidence("html", &localization, inv.as_ref(), switch_opts.as_ref(), prom_failed);
    let mut notes = switches.map(|s| s.per_finding).unwrap_or_default().into_iter();
    let services = localization.services;
    let counted_from = crate::localize::counted_from(&localization.evidence);
    let rows: Vec<html::FindingRow> = localization
        .findings
        .into_iter()
        .map(|f| html::FindingRow {
            kind: f.kind,
            entity: f.entity,
            start_ns: f.start_ns,
            end_ns: f.end_ns,
            evidence: f.evidence,
            switches: notes.next().flatten().map(|n| n.line()),
        })
        .collect();
    let findings = html::Findings { rows, counted_from };
    let meta = Meta {
        window_s: args.window_s,
        sla,
        files: plan.ds.files,
        records: 0,
        problems: Vec::new(),
        scopes: vec![Scope::Cluster, Scope::TorPair, Scope::Tor, Scope::Rnic, Scope::Pair],
    };
    let built = HtmlReport::build_ranges(&mut plan, &ranges, meta);
    let records = plan.records_read();
    let mut ds = plan.finish();
    if let Some(s) = summaries_ds {
        join_problems(&mut ds, s.problems);
    }
    // Said whether or not the page could be built: a file left out may be why it could not.
    say_problems("html", &ds, inv.as_ref());
    let run = || -> Result<bool, report::ReportError> {
        let (mut page, unknown_outcomes) = built?;
        page.meta.records = records;
        say_unknown_outcomes("html", unknown_outcomes);
        page.meta.problems = problems(&ds);
        let text = html::render(&page, Some(&findings), Some(&services))?;
        write_file(&args.output, text.as_bytes())?;
        Ok(!page.meta.problems.is_empty())
    };
    match run() {
        Ok(has_problems) => outcome(has_problems),
        Err(e) => {
            eprintln!("analyze html: {e}");
            exit::USAGE
        }
    }
}

/// Adds the `more` problems `ds` does not have yet (two reads of one file find its damage twice).
fn join_problems(ds: &mut Dataset, more: Vec<crate::ingest::FileProblem>) {
    for p in more {
        if !ds.problems.iter().any(|q| q.path == p.path && q.problem == p.problem) {
            ds.problems.push(p);
        }
    }
}

fn write_file(path: &Path, bytes: &[u8]) -> Result<(), report::ReportError> {
    std::fs::write(path, bytes).map_err(|source| report::ReportError::Io {
        path: path.to_owned(),
        what: "write the HTML report",
        source,
    })
}

/// The findings document, with each finding's switch counters under `switch` and the run's
/// under `switch_counters` when Prometheus was asked.
fn findings_json(
    l: &crate::localize::Localization,
    switches: Option<&crate::switches::SwitchCounters>,
) -> serde_json::Result<String> {
    let Some(sc) = switches else { return serde_json::to_string_pretty(l) };
    let mut v = serde_json::to_value(l)?;
    for (i, fc) in sc.per_finding.iter().enumerate() {
        if let (Some(fc), Some(f)) = (fc, v.pointer_mut(&format!("/findings/{i}"))) {
            f["switch"] = serde_json::to_value(fc)?;
        }
    }
    v["switch_counters"] = serde_json::to_value(sc)?;
    serde_json::to_string_pretty(&v)
}

/// Runs `analyze localize`; returns the exit code.
pub fn localize(args: &LocalizeArgs) -> i32 {
    let sla = match args.sla.resolve_for("localize") {
        Ok(s) => s,
        Err(code) => return code,
    };
    let mut inv = match load_inventory("localize", args.inventory.as_deref()) {
        Ok(inv) => inv,
        Err(code) => return code,
    };
    let files = match find("localize", &args.inputs) {
        Ok(f) => f,
        Err(code) => return code,
    };
    let switch_opts = match args.switches.options("localize", args.window_s) {
        Ok(o) => o,
        Err(code) => return code,
    };
    let prom_failed = learn_switch_addrs("localize", &mut inv, switch_opts.as_ref());
    let opts = crate::localize::Options {
        window_s: args.window_s,
        close_after_quiet_windows: args.close_after_quiet_windows,
        fdr: args.fdr,
        sla,
        ..crate::localize::Options::default()
    };
    let (result, ds, _) = crate::localize::localize_files(
        &files,
        inv.as_ref(),
        &opts,
        args.evidence,
        args.ranges.range_records as usize,
        (0, u64::MAX),
    );
    say_problems("localize", &ds, inv.as_ref());
    let switches = switch_evidence("localize", &result, inv.as_ref(), switch_opts.as_ref(), prom_failed);
    // Encoded only when something takes it: a wide fleet's findings and services are large.
    let json = match (args.format == FindingsFormat::Json || args.json.is_some())
        .then(|| findings_json(&result, switches.as_ref()))
        .transpose()
    {
        Ok(json) => json.map(|s| format!("{s}\n")),
        Err(e) => {
            eprintln!("analyze localize: cannot encode findings: {e}");
            return exit::USAGE;
        }
    };
    if let (Some(path), Some(json)) = (&args.json, &json)
        && let Err(e) = std::fs::write(path, json)
    {
        eprintln!("analyze localize: {}: write the JSON findings: {e}", path.display());
        return exit::USAGE;
    }
    let text = match json {
        Some(json) if args.format == FindingsFormat::Json => json,
        _ => {
            let notes: Vec<Option<String>> = switches
                .as_ref()
                .map(|s| s.per_finding.iter().map(|f| f.as_ref().map(|f| f.line())).collect())
                .unwrap_or_default();
            crate::localize::render_table_with(&result, &notes)
        }
    };
    match &args.output {
        Some(path) => {
            if let Err(e) = std::fs::write(path, text) {
                eprintln!("analyze localize: {}: write the findings: {e}", path.display());
                return exit::USAGE;
            }
        }
        None => print!("{text}"),
    }
    outcome(!ds.problems.is_empty())
}
