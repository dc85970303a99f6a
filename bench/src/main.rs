//! `bench`: run a benchmark and print its report.

use anyhow::Result;
use clap::{Parser, Subcommand};

/// ctl's and analyze's allocator, so that what the bench times in-process (inventory load,
/// pinglist generation) is what those binaries do.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// rocemesh benchmarks (run with --release; debug numbers are meaningless).
#[derive(Parser, Debug)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    what: What,
}

#[derive(Subcommand, Debug)]
enum What {
    /// Probe authentication's cost per packet (seal, parse, admit) against the unauthenticated
    /// packet path, in process.
    Auth {
        /// Packets timed each way (at most what the replay table holds in one 2 s window).
        #[arg(long, default_value_t = 60_000)]
        packets: u64,
    },
    /// Agent processes on loopback: CPU per probe (event mode, 10k/s), busy-poll ceiling, RSS
    /// with 10k targets. Needs the agent binary: `cargo build --release -p rocemesh-agent`.
    Agent {
        /// Seconds each of the three runs lasts (the first and last second are not measured).
        #[arg(long, default_value_t = 10)]
        seconds: u64,
        /// The agent binary (default: `agent` next to this binary).
        #[arg(long)]
        agent_bin: Option<std::path::PathBuf>,
    },
    /// `analyze report` end to end on a fleet's segments (default 10^8 records, ~4.8 GB) against
    /// DuckDB running the same aggregation on a Parquet export, with a row-by-row check that both
    /// agree; and `analyze localize`, in ranges and in one range, with the same output. Needs the analyze binary: `cargo build --release -p rocemesh-analyze`; installs
    /// DuckDB from PyPI into ~/.cache/rocemesh/venv on first use.
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
    },
    /// Segment store: append, seal, validated read, bytes per probe; row vs column layout.
    Formats {
        /// Records to write (realistic shard traffic, see bench/src/synth.rs).
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
    /// `ctl collect` from one host (a throwaway sshd on loopback) against `scp -r` of the same
    /// sealed segments. Needs `cargo build --release -p rocemesh-ctl` and openssh-server.
    Collect {
        /// MiB of sealed segments to move.
        #[arg(long, default_value_t = 256)]
        mib: u64,
        /// The ctl binary (default: `ctl` next to this binary).
        #[arg(long)]
        ctl_bin: Option<std::path::PathBuf>,
    },
    /// ctl gen-pinglists on a large fabric: in memory and to files, beside cloning and
    /// serialising the inventory.
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

fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.what {
        What::Agent { seconds, agent_bin } => {
            let agent = match agent_bin {
                Some(p) => p,
                None => std::env::current_exe()?.with_file_name("agent"),
            };
            anyhow::ensure!(
                agent.exists(),
                "{} not found: build it with `cargo build --release -p rocemesh-agent`, or pass --agent-bin",
                agent.display()
            );
            println!(
                "bench agent: prober and responder agents on loopback, {seconds} s per run, {} cores",
                std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
            );
            for f in rocemesh_bench::agent::run(&agent, seconds)? {
                println!("{:<56} {:>10.2} {:<9} {}", f.what, f.value, f.unit, f.note);
            }
        }
        What::Auth { packets } => {
            println!("bench auth: {packets} packets each way, one thread");
            for f in rocemesh_bench::auth::run(packets)? {
                println!("{:<56} {:>10.2} {:<9} {}", f.what, f.value, f.unit, f.note);
            }
        }
        What::Analyze { records, rnics, sealed, window_s, runs, dir, analyze_bin, scale_records, scale_dir } => {
            if cfg!(debug_assertions) {
                eprintln!(
                    "warning: debug build; run `cargo run --release -p rocemesh-bench -- analyze` for real numbers"
                );
            }
            let analyze_bin = match analyze_bin {
                Some(p) => p,
                None => std::env::current_exe()?.with_file_name("analyze"),
            };
            anyhow::ensure!(
                analyze_bin.exists(),
                "{} not found: build it with `cargo build --release -p rocemesh-analyze`, or pass --analyze-bin",
                analyze_bin.display()
            );
            let home = std::path::PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/tmp".into()));
            let dir = dir.unwrap_or_else(|| {
                std::env::var_os("CARGO_TARGET_DIR")
                    .map(std::path::PathBuf::from)
                    .unwrap_or_else(|| home.join(".cache/rocemesh/target"))
                    .join("bench-analyze")
            });
            std::fs::create_dir_all(&dir)?;
            let scale = scale_records.map(|n| {
                let d = scale_dir.unwrap_or_else(|| {
                    let mut name = dir.file_name().unwrap_or_default().to_os_string();
                    name.push("-scale");
                    dir.with_file_name(name)
                });
                (n, d)
            });
            let opt = rocemesh_bench::analyze::Options {
                records,
                rnics,
                dir,
                sealed,
                analyze_bin,
                venv: home.join(".cache/rocemesh/venv"),
                window_s,
                runs,
                scale,
            };
            let mut mem_kib = 0u64;
            if let Ok(m) = std::fs::read_to_string("/proc/meminfo") {
                mem_kib = m
                    .lines()
                    .find_map(|l| l.strip_prefix("MemTotal:"))
                    .and_then(|v| v.trim().trim_end_matches(" kB").parse().ok())
                    .unwrap_or(0);
            }
            println!(
                "bench analyze: {records} records from {rnics} RNICs ({} segments), {window_s} s windows, {} cores, {:.1} GB RAM",
                if sealed { "sealed" } else { "open" },
                std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
                mem_kib as f64 / 1048576.0
            );
            for f in rocemesh_bench::analyze::run(&opt)? {
                let v = if f.unit == "records/s" {
                    format!("{:>8.2} M", f.value / 1e6)
                } else {
                    format!("{:>10.2}", f.value)
                };
                println!("{:<56} {v} {:<9} {}", f.what, f.unit, f.note);
            }
        }
        What::Formats { records, chunk_records, segment_mib, zstd_level, keep } => {
            if cfg!(debug_assertions) {
                eprintln!(
                    "warning: debug build; run `cargo run --release -p rocemesh-bench -- formats` for real numbers"
                );
            }
            let opt = rocemesh_bench::formats::Options {
                records,
                chunk_records,
                segment_bytes: segment_mib << 20,
                zstd_level,
                keep,
            };
            println!(
                "bench formats: {records} records of one shard (31 ToR-mesh targets at 10/s, 5 inter-ToR at 1/s), chunk {chunk_records}, segments {segment_mib} MiB, zstd-{zstd_level}, one core"
            );
            let report = rocemesh_bench::formats::run(&opt)?;
            print!("{report}");
            if let Some(p) = &report.kept {
                println!("{}", rocemesh_bench::formats::describe_kept(p));
            }
        }
        What::Collect { mib, ctl_bin } => {
            let ctl = match ctl_bin {
                Some(p) => p,
                None => rocemesh_bench::collect::default_ctl()?,
            };
            anyhow::ensure!(
                ctl.exists(),
                "{} not found: build it with `cargo build --release -p rocemesh-ctl`, or pass --ctl-bin",
                ctl.display()
            );
            println!("bench collect: one host over ssh on loopback, {mib} MiB of sealed segments");
            for l in rocemesh_bench::collect::run_bench(&ctl, mib)? {
                println!("{:<60} {:>8.1} MiB/s  {}", l.what, l.mib_per_s, l.note);
            }
        }
        What::GenPinglists { tors, hosts_per_tor, spines, inter_tor_peers, dir } => {
            if cfg!(debug_assertions) {
                eprintln!(
                    "warning: debug build; run `cargo run --release -p rocemesh-bench -- gen-pinglists` for real numbers"
                );
            }
            let opt = rocemesh_bench::pinglists::Options { tors, hosts_per_tor, spines, inter_tor_peers, dir };
            println!(
                "bench gen-pinglists: {tors} ToRs x {hosts_per_tor} one-RNIC hosts = {} RNICs, {spines} spines, {inter_tor_peers} peer ToRs per RNIC",
                tors * hosts_per_tor
            );
            print!("{}", rocemesh_bench::pinglists::run(&opt)?);
        }
    }
    Ok(())
}
