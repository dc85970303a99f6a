//! The `bench` command line: its subcommands and their arguments, in the library so that a test
//! can parse the docs' command lines with the binary's own parser.

use clap::{Parser, Subcommand};

/// rocemesh benchmarks (run with --release; debug numbers are meaningless).
#[derive(Parser, Debug)]
#[command(version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub what: What,
}

#[derive(Subcommand, Debug)]
pub enum What {
    /// Probe authentication's cost per packet against the unauthenticated packet path.
    ///
    /// Seal, parse and admit, timed in process.
    Auth {
        /// Packets timed each way (at most what the replay table holds in one 2 s window).
        #[arg(long, default_value_t = 60_000)]
        packets: u64,
    },
    /// Agent processes on loopback: CPU per probe, busy-poll ceiling, RSS with 10k targets.
    ///
    /// CPU per probe in event mode at 10k probes/s. Needs the agent binary (a release build of
    /// the package set scripts/test builds).
    Agent {
        /// Seconds each of the three runs lasts (the first and last second are not measured).
        #[arg(long, default_value_t = 10)]
        seconds: u64,
        /// The agent binary (default: `agent` next to this binary).
        #[arg(long)]
        agent_bin: Option<std::path::PathBuf>,
    },
    /// `analyze report` and `analyze localize` end to end on a fleet's segments, against DuckDB.
    ///
    /// The input is 10^8 records by default (~4.8 GB). DuckDB runs the same aggregation on a
    /// Parquet export, with a row-by-row check that both agree; `analyze localize` runs in ranges
    /// and in one range, with the same output. Needs the analyze binary (a release build of the
    /// package set scripts/test builds); installs DuckDB from PyPI into ~/.cache/rocemesh/venv on
    /// first use.
    Analyze {
        /// Probe records in all.
        #[arg(long, default_value_t = 100_000_000)]
        records: u64,
        /// RNICs, one segment writer each; a multiple of 32 (RNICs per ToR), at least 64.
        #[arg(long, default_value_t = 64)]
        rnics: usize,
        /// Seal the segments with zstd as agents ship them (default: open, uncompressed).
        #[arg(long)]
        sealed: bool,
        /// Report window, seconds.
        #[arg(long, default_value_t = 30)]
        window_s: u64,
        /// Timed runs of analyze and of DuckDB each; the medians are compared.
        #[arg(long, default_value_t = 3)]
        runs: usize,
        /// Where data and outputs go (default: bench-analyze under $CARGO_TARGET_DIR or
        /// ~/.cache/rocemesh/target); the generated segments are reused by later runs.
        #[arg(long)]
        dir: Option<std::path::PathBuf>,
        /// The analyze binary (default: `analyze` next to this binary).
        #[arg(long)]
        analyze_bin: Option<std::path::PathBuf>,
        /// Also run `analyze report` and `analyze localize` alone on this many records of the
        /// same fleet (a longer stretch of time), for their peak RSS against the first size's:
        /// memory should follow the fleet and window, not the hours read.
        #[arg(long)]
        scale_records: Option<u64>,
        /// Where the data of --scale-records goes (default: `DIR-scale`).
        #[arg(long)]
        scale_dir: Option<std::path::PathBuf>,
        /// Skip the DuckDB baseline (a machine without PyPI or python3-venv): analyze's own
        /// figures only, said in the output.
        #[arg(long)]
        no_duckdb: bool,
        /// Also run report, localize (from the records and from the summaries), export and html
        /// once under each of these thread counts, `all` for every core (`--threads 1,2,4,all`):
        /// how each step scales, in one run (every count must write the same page). Each
        /// process is held to N threads through RAYON_NUM_THREADS and POLARS_MAX_THREADS. A
        /// count above the machine's cores also gives the wall time projected on that many
        /// cores from the threads the process kept runnable (a model, not a measurement:
        /// docs/PERFORMANCE.md says what it leaves out).
        #[arg(long, value_delimiter = ',', value_parser = parse_threads)]
        threads: Vec<usize>,
    },
    /// Segment store: append, seal, validated read, bytes per probe; row vs column layout.
    Formats {
        /// Records to write (one shard's realistic traffic: ToR-mesh and inter-ToR targets).
        #[arg(long, default_value_t = 8_000_000)]
        records: usize,
        /// Records per chunk (the writer's default is 4096).
        #[arg(long, default_value_t = 4096)]
        chunk_records: usize,
        /// Size of each open segment in MiB (the writer's default is 64).
        #[arg(long, default_value_t = 64)]
        segment_mib: u64,
        /// zstd level used for sealing (the agent's default is 3).
        #[arg(long, default_value_t = 3)]
        zstd_level: i32,
        /// Keep the sealed segments in this directory (for `analyze inspect`).
        #[arg(long)]
        keep: Option<std::path::PathBuf>,
    },
    /// `analyze live` fed a simulated fleet's window summaries over loopback UDP in real time.
    ///
    /// Every RNIC pushes its window's summary as an agent does; one RNIC dies partway. Says
    /// whether the analyzer kept up (windows complete within the deadline, nothing dropped),
    /// its CPU and peak RSS, and what it opened. Needs the analyze binary (a release build of
    /// the package set scripts/test builds).
    Live {
        /// RNICs in the fleet (one per host).
        #[arg(long, default_value_t = 10_240)]
        rnics: u32,
        /// RNICs under each ToR (every one probes the others).
        #[arg(long, default_value_t = 64)]
        rnics_per_tor: u32,
        /// Probes per second each RNIC sends: two thirds to its ToR-mesh peers, a third to one
        /// RNIC in each of 8 other ToRs over 16 flow labels.
        #[arg(long, default_value_t = 100.0)]
        pps: f64,
        /// Windows pushed.
        #[arg(long, default_value_t = 16)]
        windows: u32,
        /// The summary window, seconds.
        #[arg(long, default_value_t = 5)]
        window_s: u64,
        /// The analyzer's --deadline-s.
        #[arg(long, default_value_t = 6.0)]
        deadline_s: f64,
        /// The window from which one RNIC is dead.
        #[arg(long, default_value_t = 10)]
        fault_window: u32,
        /// Seconds over which a window's pushes are spread (agents' flushes are not aligned).
        #[arg(long, default_value_t = 1.0)]
        spread_s: f64,
        /// The analyzer's UDP port on 127.0.0.1.
        #[arg(long, default_value_t = 18721)]
        port: u16,
        /// Where the inventory and the analyzer's output go (default: bench-live under
        /// $CARGO_TARGET_DIR or ~/.cache/rocemesh/target).
        #[arg(long)]
        dir: Option<std::path::PathBuf>,
        /// The analyze binary (default: `analyze` next to this binary).
        #[arg(long)]
        analyze_bin: Option<std::path::PathBuf>,
        /// Have the analyzer serve /metrics and its page here (`analyze live --http`).
        #[arg(long)]
        http: Option<std::net::SocketAddr>,
    },
    /// `ctl collect` from one host against `scp -r` of the same sealed segments.
    ///
    /// The host is a throwaway sshd on loopback. Needs the ctl binary (a release build of the
    /// package set scripts/test builds) and openssh-server.
    Collect {
        /// MiB of sealed segments to move.
        #[arg(long, default_value_t = 256)]
        mib: u64,
        /// The ctl binary (default: `ctl` next to this binary).
        #[arg(long)]
        ctl_bin: Option<std::path::PathBuf>,
    },
    /// ctl gen-pinglists on a large fabric: in memory and to files.
    ///
    /// Beside cloning and serialising the inventory, as baselines.
    GenPinglists {
        /// ToRs in the fabric.
        #[arg(long, default_value_t = 3125)]
        tors: usize,
        /// One-RNIC hosts under each ToR.
        #[arg(long, default_value_t = 32)]
        hosts_per_tor: usize,
        /// Spines (ECMP paths; the flow labels per inter-ToR target follow from it).
        #[arg(long, default_value_t = 4)]
        spines: usize,
        /// Other ToRs each RNIC probes per generation.
        #[arg(long, default_value_t = 5)]
        inter_tor_peers: usize,
        /// Write the files under this directory (default: the system's temporary directory;
        /// /dev/shm measures ctl rather than the disk).
        #[arg(long)]
        dir: Option<std::path::PathBuf>,
    },
}

/// A `--threads` entry: a count of at least 1, or `all` for the machine's cores.
fn parse_threads(s: &str) -> Result<usize, String> {
    if s == "all" {
        return Ok(std::thread::available_parallelism().map_or(1, |n| n.get()));
    }
    match s.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!("{s}: give a thread count of at least 1, or `all`")),
    }
}
