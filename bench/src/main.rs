//! `bench`: run a benchmark and print its report.

use anyhow::Result;
use clap::Parser;
use rocemesh_bench::cli::{Cli, What};

/// ctl's and analyze's allocator, so that what the bench times in-process (inventory load,
/// pinglist generation) is what those binaries do.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

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
        What::Analyze {
            records,
            rnics,
            sealed,
            window_s,
            runs,
            dir,
            analyze_bin,
            scale_records,
            scale_dir,
            no_duckdb,
            threads,
        } => {
            if cfg!(debug_assertions) {
                eprintln!(
                    "warning: debug build; run `cargo run --release -p rocemesh-bench -- analyze` for real numbers"
                );
            }
            let analyze_bin = sibling("analyze", analyze_bin)?;
            let home = std::path::PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/tmp".into()));
            let dir = dir.unwrap_or_else(|| target_dir().join("bench-analyze"));
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
                venv: (!no_duckdb).then(|| home.join(".cache/rocemesh/venv")),
                window_s,
                runs,
                scale,
                threads,
                pin_threads: None,
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
        What::Live {
            rnics,
            rnics_per_tor,
            pps,
            windows,
            window_s,
            deadline_s,
            fault_window,
            spread_s,
            port,
            dir,
            analyze_bin,
            http,
        } => {
            if cfg!(debug_assertions) {
                eprintln!("warning: debug build; run `cargo run --release -p rocemesh-bench -- live` for real numbers");
            }
            let analyze_bin = sibling("analyze", analyze_bin)?;
            let dir = dir.unwrap_or_else(|| target_dir().join("bench-live"));
            println!(
                "bench live: {rnics} RNICs ({rnics_per_tor} per ToR) at {pps} probes/s each, {windows} windows of {window_s} s, deadline {deadline_s} s, {} cores",
                std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
            );
            let o = rocemesh_bench::live::Options {
                rnics,
                rnics_per_tor,
                pps,
                windows,
                window_s,
                deadline_s,
                fault_window,
                spread_s,
                port,
                dir,
                analyze_bin,
                http,
            };
            for f in rocemesh_bench::live::run(&o)? {
                println!("{:<56} {:>10.2} {:<9} {}", f.what, f.value, f.unit, f.note);
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

/// The binary `name`: `given`, or the one next to this binary; an error saying how to build it
/// where it is not there.
fn sibling(name: &str, given: Option<std::path::PathBuf>) -> Result<std::path::PathBuf> {
    let path = match given {
        Some(p) => p,
        None => std::env::current_exe()?.with_file_name(name),
    };
    anyhow::ensure!(
        path.exists(),
        "{} not found: build it with the package set scripts/test builds (--release), or pass --{name}-bin",
        path.display()
    );
    Ok(path)
}

/// `$CARGO_TARGET_DIR`, or the shared target directory scripts/setup uses.
fn target_dir() -> std::path::PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map(std::path::PathBuf::from).unwrap_or_else(|| {
        std::path::PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/tmp".into()))
            .join(".cache/rocemesh/target")
    })
}
