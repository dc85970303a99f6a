//! The `testbeds` command line: its subcommands and their arguments, in the library so that a
//! test can parse the docs' command lines with the binary's own parser.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

/// Simulate fault scenarios and score fault localisation; run real verbs in a soft-RoCE VM.
///
/// Exit codes: 0 done; 1 ran and found a problem: `score`'s findings fall below
/// --min-precision/--min-recall, an `rxe-fabric smoke`, `rxe-lab run` or `clos` check failed, or the
/// command `rxe-vm` ran exited nonzero; 2 could not run (bad scenario, unwritable output, or the
/// VM could not be prepared, did not boot, died, or was killed by its timeout).
#[derive(Parser, Debug)]
#[command(version, about, long_about)]
pub struct Cli {
    #[command(subcommand)]
    pub what: What,
}

#[derive(Subcommand, Debug)]
pub enum What {
    /// Write the segments (and inventory.toml) every agent of the scenario's fabric would write.
    Simulate {
        /// Scenario file, format v1 (testbeds/scenarios/README.md).
        scenario: PathBuf,
        /// Output directory: gets inventory.toml and segments/.
        #[arg(long)]
        out: PathBuf,
        /// Worker threads; 0 = one per core. The output does not depend on it.
        #[arg(long, default_value_t = 0)]
        threads: usize,
        /// Window summaries beside the records, as the agent's `summary_window_s`: a divisor
        /// of 3600 seconds, or 0 for none.
        #[arg(long, default_value_t = rocemesh_formats::window::DEFAULT_WINDOW_S)]
        summary_window_s: u64,
    },
    /// Score `analyze localize --format json` output against the scenario's faults.
    Score {
        /// Scenario file the segments were simulated from.
        scenario: PathBuf,
        /// Findings JSON file.
        findings: PathBuf,
        /// Exit 1 below this precision (0 to 1). A simulated scenario's truth is exact, so
        /// every network finding should match a fault; lower it only to tolerate known misses.
        #[arg(long, default_value_t = 1.0)]
        min_precision: f64,
        /// Exit 1 below this recall (0 to 1); as --min-precision, 1 by default.
        #[arg(long, default_value_t = 1.0)]
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
    /// Run a command as root in a qemu (TCG) VM whose kernel has soft-RoCE (rdma_rxe).
    ///
    /// The guest's root is this machine's root, read-only; the lab directory is shared
    /// read-write at the same path, and gets console.log. The first run installs packages and
    /// downloads a kernel into the cache (--cache, $ROCEMESH_RXE_VM_CACHE, default
    /// ~/.cache/rocemesh/rxe-vm). Exits 0 if the command exited 0, 1 if it exited nonzero (its
    /// status is printed), 2 if the VM could not be prepared, did not boot, died, or was killed
    /// by the timeout.
    #[command(name = "rxe-vm")]
    RxeVm {
        /// Directory shared read-write with the guest at the same path [default: <cache>/lab].
        #[arg(long)]
        lab: Option<PathBuf>,
        /// Cache of the kernel and initramfs.
        #[arg(long)]
        cache: Option<PathBuf>,
        /// Kill the VM after this long (boot, command and shutdown).
        #[arg(long, default_value_t = 900)]
        timeout_s: u64,
        /// Guest memory.
        #[arg(long, default_value_t = 2048)]
        mem_mb: u32,
        /// Guest CPUs.
        #[arg(long, default_value_t = 2)]
        cpus: u32,
        /// Resolve and download the newest trixie-backports kernel instead of the cached one.
        #[arg(long)]
        update_kernel: bool,
        /// Extra guest kernel argument, e.g. loglevel=7 to see the boot on the console; repeatable.
        #[arg(long = "kernel-arg", value_name = "ARG")]
        kernel_args: Vec<String>,
        /// Extra environment for the command: KEY=VALUE, or KEY to pass this process's value.
        /// PATH (with this executable's directory first), HOME, LANG, RUST_LOG, RUST_BACKTRACE and
        /// CARGO_TARGET_DIR are passed already.
        #[arg(long = "env", value_name = "KEY[=VALUE]")]
        env: Vec<String>,
        /// The command and its arguments.
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// Print the body of `GET http://ADDR/PATH`; fails unless the answer is 200.
    ///
    /// The lab scrapes agents' /metrics with it from inside their network namespaces.
    HttpGet {
        /// Address and port, e.g. 127.0.0.1:9745.
        addr: std::net::SocketAddr,
        /// Path, e.g. /metrics.
        path: String,
    },
    /// Build and fault the soft-RoCE test fabric; run as root inside the `rxe-vm` guest.
    #[command(name = "rxe-fabric", subcommand)]
    RxeFabric(Fabric),
    /// The soft-RoCE lab's checks with real verbs agents; as root inside the `rxe-vm` guest.
    ///
    /// `run`: a 3-ToR rxe fabric, one verbs agent per host, pinglists from ctl, an RNIC killed,
    /// an uplink made lossy, a device deleted and re-added, then `analyze localize` must name
    /// each fault and nothing else (exit 1 if a check fails). `bench`: the agent beside perftest
    /// on one rxe path.
    #[command(name = "rxe-lab")]
    RxeLab {
        /// `run`, `bench`, `view` (one-sided collection alone) or `clock-step`.
        what: String,
        /// Results, segments, logs (result.json, bench.json).
        #[arg(long)]
        lab: PathBuf,
        /// Directory holding the agent, ctl and analyze binaries.
        #[arg(long)]
        bin: PathBuf,
        /// Analysis window (s); each fault lasts 3 windows.
        #[arg(long, default_value_t = 10)]
        window_s: u64,
        /// bench: seconds per agent run.
        #[arg(long, default_value_t = 15)]
        bench_s: u64,
        /// bench: probes per second offered in the rate run.
        #[arg(long, default_value_t = 20_000.0)]
        flood_pps: f64,
    },
    /// Real UDP agents in a routed Clos fabric of network namespaces, faults on a timeline.
    ///
    /// As root on this host's kernel (no RDMA, no VM): a two-tier Clos fabric of
    /// network namespaces (2 spines, 4 ToRs, 3 hosts each; routed, ECMP over the spines), one
    /// UDP agent per host, pinglists from ctl, faults on a timeline (a host port down, a lossy
    /// link, a lossy spine, an agent killed and restarted, a stalling host), `analyze localize`
    /// scored against the run's scenario, and with path tracing the traces checked against the
    /// kernel's ECMP choice. Exit 1 if a check fails. Everything it made is removed on exit.
    Clos {
        /// Configs, logs, segments, inventory, scenario, findings and result.json.
        #[arg(long, default_value = "out/clos")]
        out: PathBuf,
        /// Directory holding the agent, ctl and analyze binaries [default: this executable's].
        #[arg(long)]
        bin: Option<PathBuf>,
        /// Analysis window (s); each fault lasts 3 windows.
        #[arg(long, default_value_t = 10)]
        window_s: u64,
        /// Whether the agents trace paths (`auto`: when the agent accepts [path_tracing]).
        #[arg(long, value_enum, default_value_t = crate::clos::PathTracing::Auto)]
        path_tracing: crate::clos::PathTracing,
        /// Only the fabric, the agents with path tracing for 6 windows, and the check of the
        /// traces against the kernel's routes; no faults, no analyze.
        #[arg(long)]
        check_traces: bool,
        /// Remove the namespaces of earlier runs whose testbeds is gone, and exit.
        #[arg(long)]
        cleanup: bool,
    },
}

#[derive(Subcommand, Debug)]
pub enum Fabric {
    /// Create the ToRs, spine, hosts and their rxe devices (replacing a fabric that is up).
    Up {
        #[command(flatten)]
        layout: LayoutArgs,
        /// Also write the fabric's inventory.toml here.
        #[arg(long)]
        inventory: Option<PathBuf>,
    },
    /// Remove the fabric.
    Down,
    /// Bring a fabric up, prove UD verbs across and within ToRs, and every fault helper.
    ///
    /// Each fault helper must break what it should and heal. Exit 1 if a check fails. The fabric
    /// is left up.
    Smoke {
        #[command(flatten)]
        layout: LayoutArgs,
        /// Also write the fabric's inventory.toml here.
        #[arg(long)]
        inventory: Option<PathBuf>,
        /// Only the traffic checks, no faults.
        #[arg(long)]
        no_faults: bool,
    },
    /// Drop RoCEv2 (UDP 4791) arriving at HOST's eth0: its RNIC is dead, the host alive.
    RnicKill {
        host: String,
        /// Also drop what HOST's RNIC sends (its sends then complete in error).
        #[arg(long)]
        egress: bool,
    },
    /// Undo rnic-kill.
    RnicHeal { host: String },
    /// Random loss on TOR's uplink, both directions (tc netem).
    UplinkLoss {
        tor: String,
        /// Loss in percent, 0-100.
        percent: f64,
    },
    /// Undo uplink-loss.
    UplinkHeal { tor: String },
    /// Delete HOST's rxe device (`rdma link delete`).
    RdmaDelete { host: String },
    /// Recreate HOST's rxe device.
    RdmaAdd { host: String },
    /// Run a command in HOST's network namespace; exits with its status.
    Exec {
        host: String,
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// UD ping-pong (ibv_ud_pingpong) from CLIENT to SERVER.
    Pingpong {
        #[arg(long)]
        server: String,
        #[arg(long)]
        client: String,
        #[arg(long, default_value_t = 500)]
        iters: u32,
        /// Kill both ends after this long: UD has no retransmission, so one lost packet stalls it.
        #[arg(long, default_value_t = 60)]
        timeout_s: u64,
    },
    /// A connection storm in HOST's namespace: RC QPs created and destroyed, one after another.
    ///
    /// Each QP on HOST's RNIC is brought to RTR towards PEER's GID and destroyed. Prints what it
    /// did as JSON.
    Storm {
        host: String,
        peer: String,
        /// QPs to create and destroy.
        #[arg(long, default_value_t = 1000)]
        qps: u32,
    },
    /// UD latency (ib_send_lat -c UD) and message rate (ib_send_bw -c UD) from CLIENT to SERVER.
    Perftest {
        #[arg(long)]
        server: String,
        #[arg(long)]
        client: String,
        /// Iterations of each test (TCG is slow: keep it modest).
        #[arg(long, default_value_t = 1000)]
        iters: u32,
        /// Message size in bytes (at most the rxe MTU, 1024).
        #[arg(long, default_value_t = 64)]
        size: u32,
        /// Also write the result as JSON here.
        #[arg(long)]
        json: Option<PathBuf>,
    },
}

#[derive(clap::Args, Debug)]
pub struct LayoutArgs {
    /// ToRs.
    #[arg(long, default_value_t = 2)]
    pub tors: u32,
    /// Hosts per ToR.
    #[arg(long, default_value_t = 3)]
    pub hosts: u32,
}
