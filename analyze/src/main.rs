//! `analyze`: questions about shipped segments, answered from the files alone.

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use rocemesh_analyze::{exit, inspect};

/// Analyse rocemesh segment files (open *.rseg and sealed *.rseg.zst).
///
/// Exit codes: 0 all input read cleanly; 1 ran, but some input was damaged or unreadable
/// (reported, and skipped); 2 could not run (bad arguments, no input).
#[derive(Parser, Debug)]
#[command(version, about, long_about)]
struct Cli {
    #[command(subcommand)]
    what: What,
}

#[derive(Subcommand, Debug)]
enum What {
    /// Validate segments and list what each holds and what a reader has to skip in it.
    Inspect {
        /// Segment files, or directories searched recursively for *.rseg and *.rseg.zst.
        #[arg(required = true)]
        inputs: Vec<PathBuf>,
    },
}

fn main() {
    let cli = Cli::parse();
    let code = match cli.what {
        What::Inspect { inputs } => match inspect::find_segments(&inputs) {
            Err(e) => {
                eprintln!("analyze inspect: cannot list {inputs:?}: {e}");
                exit::USAGE
            }
            Ok(files) if files.is_empty() => {
                eprintln!(
                    "analyze inspect: no segment files (*.rseg, *.rseg.zst) under {inputs:?}; point it at an agent's segment directory"
                );
                exit::USAGE
            }
            Ok(files) => {
                let reports: Vec<_> = files.iter().map(|f| inspect::inspect(f)).collect();
                let (table, problems) = inspect::render(&reports);
                print!("{table}");
                if problems { exit::PROBLEMS } else { exit::OK }
            }
        },
    };
    std::process::exit(code);
}
