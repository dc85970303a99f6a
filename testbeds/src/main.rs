//! `testbeds`: run a fault scenario through the simulator, and score findings against it.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use clap::{Parser, Subcommand};
use rocemesh_formats::scenario::Scenario;

/// Simulate fault scenarios and score fault localisation.
///
/// Exit codes: 0 done; 1 `score` ran but the findings fall below --min-precision/--min-recall;
/// 2 could not run (bad scenario, unwritable output).
#[derive(Parser, Debug)]
#[command(version, about, long_about)]
struct Cli {
    #[command(subcommand)]
    what: What,
}

#[derive(Subcommand, Debug)]
enum What {
    /// Write the segments (and inventory.toml) every agent of the scenario's fabric would write.
    Simulate {
        /// Scenario file, format v1 (../shared/scenarios/README.md).
        scenario: PathBuf,
        /// Output directory: gets inventory.toml and segments/.
        #[arg(long)]
        out: PathBuf,
        /// Worker threads; 0 = one per core. The output does not depend on it.
        #[arg(long, default_value_t = 0)]
        threads: usize,
    },
    /// Score `analyze localize --format json` output against the scenario's faults.
    Score {
        /// Scenario file the segments were simulated from.
        scenario: PathBuf,
        /// Findings JSON file.
        findings: PathBuf,
        /// Exit 1 below this precision.
        #[arg(long, default_value_t = 0.0)]
        min_precision: f64,
        /// Exit 1 below this recall.
        #[arg(long, default_value_t = 0.0)]
        min_recall: f64,
    },
    /// Write suite scenario files (random topologies and faults) for a seed.
    GenSuite {
        /// Seed of the suite.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Scenarios to write.
        #[arg(long, default_value_t = 13)]
        count: u64,
        /// Directory to write scenario-NNN.toml into.
        #[arg(long)]
        out: PathBuf,
    },
}

fn main() {
    let code = match run(Cli::parse()) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("testbeds: {e:#}");
            2
        }
    };
    std::process::exit(code);
}

fn run(cli: Cli) -> anyhow::Result<i32> {
    match cli.what {
        What::Simulate { scenario, out, threads } => {
            let s = Scenario::load(&scenario)?;
            let started = Instant::now();
            let sum = rocemesh_testbeds::simulate(&s, &out, threads)?;
            let secs = started.elapsed().as_secs_f64();
            println!(
                "simulated {:?}: {} RNICs, {} probe records, {} path records, {} segments, {:.1} MiB in {:.2} s ({:.1} M records/s) -> {}",
                s.name,
                sum.rnics,
                sum.records,
                sum.paths,
                sum.segments,
                sum.bytes as f64 / (1 << 20) as f64,
                secs,
                sum.records as f64 / secs / 1e6,
                out.display()
            );
            Ok(0)
        }
        What::Score { scenario, findings, min_precision, min_recall } => {
            let s = Scenario::load(&scenario)?;
            let text = std::fs::read_to_string(&findings).with_context(|| format!("reading {}", findings.display()))?;
            let f = rocemesh_testbeds::parse_findings(&text).with_context(|| findings.display().to_string())?;
            let score = rocemesh_testbeds::score(&s, &f);
            print!("{}", score.render());
            Ok(if score.precision() < min_precision || score.recall() < min_recall { 1 } else { 0 })
        }
        What::GenSuite { seed, count, out } => {
            std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
            for i in 0..count {
                let s = rocemesh_testbeds::suite::generate(seed, i);
                let path = out.join(format!("scenario-{i:03}.toml"));
                std::fs::write(&path, s.to_toml_string()?).with_context(|| format!("writing {}", path.display()))?;
            }
            println!("wrote {count} scenarios to {}", out.display());
            Ok(0)
        }
    }
}
