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
    /// Say which RNIC, ToR, link or spine is at fault, window by window, and which hosts were too
    /// noisy to count as evidence (the method: docs/design/localisation.md, and the module
    /// documentation of analyze/src/localize/mod.rs). Probes dropped on the prober's own host are
    /// never evidence; RTTs are judged against the fleet baseline of their own timestamp source.
    /// Traced service connections (jobs' RDMA QPs) are then ranked by how the findings on their
    /// path and their own probes say they were hurt.
    Localize(rocemesh_analyze::cli::LocalizeArgs),
    /// SLA report per window and scope (cluster, ToR, RNIC, ToR pair, pair, traced service
    /// connection): probe counts, loss ratio and delay quantiles; rows breaking the SLA first.
    ///
    /// Every row counts probes, ok, lost, partial, invalid, refused, local_drop and unreachable,
    /// and a loss ratio; what each record counts as:
    /// docs/design/analysis.md#what-a-probe-counts-as. Its ts_source column names the timestamp
    /// sources of its delay quantiles: nic, host_poll, kernel_software or kernel_hardware, or
    /// mixed(a+b) when samples of several sources were pooled (their delays are not comparable).
    Report(rocemesh_analyze::cli::ReportArgs),
    /// Report continuously over a collection directory: each window's report rows as JSON
    /// lines, once the window is complete (the fleet's time, the newest record more than a quarter
    /// of the live hosts wrote, is --grace-s past it); late and damaged files are said; the
    /// position survives restarts (--state). The rows are `report`'s, number for number.
    Watch(rocemesh_analyze::cli::WatchArgs),
    /// Write the raw probe table (with names, ToRs and windows) as Parquet for DuckDB or Spark.
    Export(rocemesh_analyze::cli::ExportArgs),
    /// Write one self-contained HTML page: ToR and RNIC heatmaps, SLA violations, findings.
    Html(rocemesh_analyze::cli::HtmlArgs),
    /// Validate segments and list what each holds and what a reader has to skip in it.
    Inspect {
        /// Segment files, or directories searched recursively for *.rseg and *.rseg.zst.
        #[arg(required = true)]
        inputs: Vec<PathBuf>,
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

/// polars allocates and frees column-sized buffers at every step of a query. glibc hands them
/// back to the kernel and faults them in again page by page (page faults took 38% of `analyze
/// report`'s time on 10^7 records); mimalloc, set up by [`keep_freed_memory`], reuses them.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc.h's `mi_option_purge_delay` (libmimalloc-sys names only some options).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Freed memory stays with the process (a batch tool's peak is its footprint anyway), and
/// large allocations may use transparent huge pages: 2 MiB per fault instead of 4 KiB.
fn keep_freed_memory() {
    // An operator's MIMALLOC_* setting wins: mimalloc reads its environment for an option not
    // set here.
    let unset = |name: &str| std::env::var_os(name).is_none();
    // SAFETY: called first thing in main, before any other thread exists (mi_option_set is not
    // thread-safe); both options only change when memory returns to the OS and its page size.
    unsafe {
        if unset("MIMALLOC_PURGE_DELAY") {
            libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, -1);
        }
        if unset("MIMALLOC_LARGE_OS_PAGES") {
            libmimalloc_sys::mi_option_set(libmimalloc_sys::mi_option_large_os_pages, 1);
        }
    }
}

/// `analyze generate WHAT`: the man page or a shell's completions, on standard output.
fn generate(what: &str, name: &str) -> std::io::Result<()> {
    rocemesh_formats::docs::generate(<Cli as clap::CommandFactory>::command(), what, name)
}

fn main() {
    keep_freed_memory();
    let cli = Cli::parse();
    let code = match cli.what {
        What::Localize(args) => rocemesh_analyze::cli::localize(&args),
        What::Report(args) => rocemesh_analyze::cli::report(&args),
        What::Export(args) => rocemesh_analyze::cli::export(&args),
        What::Watch(args) => rocemesh_analyze::cli::watch(&args),
        What::Html(args) => rocemesh_analyze::cli::html(&args),
        What::Generate { what, name } => match generate(&what, &name) {
            Ok(()) => exit::OK,
            Err(e) => {
                eprintln!("analyze: {e}");
                exit::USAGE
            }
        },
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
