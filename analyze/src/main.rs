//! `analyze`: questions about shipped segments, answered from the files alone.

use clap::Parser;
use rocemesh_analyze::cli::{Cli, What};
use rocemesh_analyze::{exit, inspect};

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
        What::Live(args) => rocemesh_analyze::cli::live(&args),
        What::Html(args) => rocemesh_analyze::cli::html(&args),
        What::Generate { what, name } => match generate(&what, &name) {
            Ok(()) => exit::OK,
            Err(e) => {
                eprintln!("analyze: {e}");
                exit::USAGE
            }
        },
        What::Inspect { inputs, windows } => match inspect::find_segments(&inputs) {
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
                let reports: Vec<_> = files.iter().map(|f| inspect::inspect(f, windows)).collect();
                let (table, problems) = inspect::render(&reports);
                print!("{table}");
                if windows {
                    print!("{}", inspect::render_windows(&reports));
                }
                if problems { exit::PROBLEMS } else { exit::OK }
            }
        },
    };
    std::process::exit(code);
}
