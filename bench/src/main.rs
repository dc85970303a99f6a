//! `bench`: run a benchmark and print its report.

use anyhow::Result;
use clap::{Parser, Subcommand};

/// rocemesh benchmarks (run with --release; debug numbers are meaningless).
#[derive(Parser, Debug)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    what: What,
}

#[derive(Subcommand, Debug)]
enum What {
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
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.what {
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
    }
    Ok(())
}
