//! `testbeds`: run a fault scenario through the simulator, and score findings against it; boot
//! the soft-RoCE VM and build its fabric.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;
use rocemesh_formats::scenario::Scenario;
use rocemesh_testbeds::cli::{Cli, Fabric, What};
use rocemesh_testbeds::rxefabric::{self, Layout, PerftestOptions};
use rocemesh_testbeds::rxevm::{self, PhaseTimes, VmError, VmOptions};

fn main() {
    let code = match run(Cli::parse()) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("testbeds: {e:#}");
            if let Some(console) = e.downcast_ref::<VmError>().and_then(VmError::console) {
                eprintln!("--- last lines of {} ---\n{}", console.display(), rxevm::boot::tail(console, 40));
            }
            2
        }
    };
    std::process::exit(code);
}

fn run(cli: Cli) -> anyhow::Result<i32> {
    match cli.what {
        What::Simulate { scenario, out, threads, summary_window_s } => {
            simulate(&scenario, &out, threads, summary_window_s)
        }
        What::Score { scenario, findings, min_precision, min_recall } => {
            score_findings(&scenario, &findings, min_precision, min_recall)
        }
        What::GenSuite { seed, count, out } => gen_suite(seed, count, &out),
        What::RxeVm { lab, cache, timeout_s, mem_mb, cpus, update_kernel, kernel_args, env, command } => {
            let cache = cache.unwrap_or_else(rxevm::default_cache_dir);
            let opts = VmOptions {
                lab: lab.unwrap_or_else(|| cache.join("lab")),
                cache,
                timeout: Duration::from_secs(timeout_s),
                mem_mb,
                cpus,
                kernel_args,
                update_kernel,
                env: rxevm::guest_env(&env).map_err(VmError::Setup)?,
                cwd: std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/")),
                command,
            };
            rxe_vm(&opts)
        }
        What::RxeFabric(f) => fabric(f),
        What::HttpGet { addr, path } => {
            print!("{}", rocemesh_testbeds::rxemetrics::http_get(addr, &path)?);
            Ok(0)
        }
        What::Clos { out, bin, window_s, path_tracing, check_traces, cleanup } => {
            clos_testbed(out, bin, window_s, path_tracing, check_traces, cleanup)
        }
        What::RxeLab { what, lab, bin, window_s, bench_s, flood_pps } => {
            rxe_lab(&what, lab, bin, window_s, bench_s, flood_pps)
        }
    }
}

/// `simulate`: the scenario's segments written, and a line on what and how fast.
fn simulate(scenario: &Path, out: &Path, threads: usize, summary_window_s: u64) -> anyhow::Result<i32> {
    rocemesh_formats::window::check_window_s(summary_window_s)
        .map_err(|e| anyhow::anyhow!("--summary-window-s {e}"))?;
    let s = Scenario::load(scenario)?;
    let started = Instant::now();
    let sum = rocemesh_testbeds::simulate_summarised(&s, out, threads, summary_window_s * 1_000_000_000)?;
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

/// `score`: the findings scored against the scenario, exit 1 below either minimum.
fn score_findings(scenario: &Path, findings: &Path, min_precision: f64, min_recall: f64) -> anyhow::Result<i32> {
    for (flag, v) in [("--min-precision", min_precision), ("--min-recall", min_recall)] {
        anyhow::ensure!((0.0..=1.0).contains(&v), "{flag} {v} is not a ratio (fix: give a value from 0 to 1)");
    }
    let s = Scenario::load(scenario)?;
    let text = std::fs::read_to_string(findings).with_context(|| format!("reading {}", findings.display()))?;
    let f = rocemesh_testbeds::parse_findings(&text).with_context(|| findings.display().to_string())?;
    let score = rocemesh_testbeds::score(&s, &f);
    print!("{}", score.render());
    Ok(if score.precision() < min_precision || score.recall() < min_recall { 1 } else { 0 })
}

/// `gen-suite`: the suite's scenario files for `seed` written into `out`.
fn gen_suite(seed: u64, count: u64, out: &Path) -> anyhow::Result<i32> {
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    for i in 0..count {
        let s = rocemesh_testbeds::suite::generate(seed, i);
        let path = out.join(format!("scenario-{i:03}.toml"));
        std::fs::write(&path, s.to_toml_string()?).with_context(|| format!("writing {}", path.display()))?;
    }
    println!("wrote {count} scenarios to {}", out.display());
    Ok(0)
}

/// `rxe-vm`: the VM run with `opts`, its phase times, and the command's status as the exit code.
fn rxe_vm(opts: &VmOptions) -> anyhow::Result<i32> {
    let mut times = PhaseTimes::default();
    let result = rxevm::run(opts, &mut times);
    eprintln!("rxe-vm: {times}");
    let status = result?;
    if status != 0 {
        eprintln!("rxe-vm: the command exited with {status} (console: {}/console.log)", opts.lab.display());
    }
    Ok(rxevm::exit_code(status))
}

/// `clos`: the Clos testbed, its trace check or the cleanup of stale namespaces.
fn clos_testbed(
    out: PathBuf,
    bin: Option<PathBuf>,
    window_s: u64,
    path_tracing: rocemesh_testbeds::clos::PathTracing,
    check_traces: bool,
    cleanup: bool,
) -> anyhow::Result<i32> {
    use rocemesh_testbeds::clos;
    if cleanup {
        let removed = clos::cleanup()?;
        println!(
            "clos: removed {} stale namespaces{}",
            removed.len(),
            if removed.is_empty() { String::new() } else { format!(": {}", removed.join(" ")) }
        );
        return Ok(0);
    }
    let bin = match bin {
        Some(b) => b,
        None => std::env::current_exe()
            .context("locating this executable")?
            .parent()
            .context("this executable has no directory")?
            .to_path_buf(),
    };
    let mut opts = clos::ClosOptions::new(out, bin);
    opts.window_s = window_s;
    opts.path_tracing = path_tracing;
    let r = if check_traces { clos::check_traces(&opts)? } else { clos::run(&opts)? };
    print!("{}", r.render());
    Ok(if r.passed() { 0 } else { 1 })
}

/// `rxe-lab`: the lab run, bench, view or clock step named by `what`, and its result.
fn rxe_lab(what: &str, lab: PathBuf, bin: PathBuf, window_s: u64, bench_s: u64, flood_pps: f64) -> anyhow::Result<i32> {
    let mut opts = rocemesh_testbeds::rxelab::LabOptions::new(lab, bin);
    opts.window_s = window_s;
    match what {
        "run" => {
            let r = rocemesh_testbeds::rxelab::run(&opts)?;
            print!("{}", r.render());
            Ok(if r.passed() { 0 } else { 1 })
        }
        "bench" => rxe_lab_bench(&opts, bench_s, flood_pps),
        // One-sided collection alone (`rxe-lab run` includes it).
        "view" => {
            let (checks, bench) = rocemesh_testbeds::rxeview::run(&opts.bin, &opts.lab.join("view"))?;
            for c in &checks {
                println!("{}  {}  {}", if c.ok { "ok  " } else { "FAIL" }, c.name, c.detail);
            }
            print!("{}", bench.render());
            Ok(if checks.iter().all(|c| c.ok) { 0 } else { 1 })
        }
        // Steps the machine's clock: only inside the VM (`rxe-lab run` ends with it).
        "clock-step" => {
            let checks = rocemesh_testbeds::clockstep::run(&opts.bin.join("agent"), &opts.lab.join("clockstep"))?;
            for c in &checks {
                println!("{}  {}  {}", if c.ok { "ok  " } else { "FAIL" }, c.name, c.detail);
            }
            Ok(if checks.iter().all(|c| c.ok) { 0 } else { 1 })
        }
        other => anyhow::bail!("rxe-lab {other}: use `run`, `bench`, `view` or `clock-step`"),
    }
}

/// `rxe-lab bench`: the agent beside perftest, as JSON and as ratios.
fn rxe_lab_bench(opts: &rocemesh_testbeds::rxelab::LabOptions, bench_s: u64, flood_pps: f64) -> anyhow::Result<i32> {
    let b = rocemesh_testbeds::rxelab::bench(opts, 20.0, flood_pps, bench_s)?;
    println!("{}", serde_json::to_string_pretty(&b)?);
    println!(
        "agent RTT p50 {:.1} us (event mode; busy-poll {:.1} us) vs ib_send_lat round trip {:.1} us: \
         ratio {:.2} (busy-poll {:.2}); \
         agent {:.0} probes/s ({:.0} packets/s) vs ib_send_bw {:.0} msg/s: ratio {:.3}",
        b.agent_rtt_us_p50,
        b.agent_busy_rtt_us_p50,
        b.perftest_rtt_us,
        b.rtt_ratio,
        b.busy_rtt_ratio,
        b.agent_probes_per_s,
        b.agent_packets_per_s,
        b.perftest_msgs_per_s,
        b.rate_ratio
    );
    println!(
        "service tracer loaded and idle: prober CPU {:.2}% vs {:.2}% without, at {} probes/s (event mode): ratio {:.2}",
        b.tracer_on_cpu_percent, b.tracer_off_cpu_percent, b.tracer_bench_pps, b.tracer_cpu_ratio
    );
    Ok(0)
}

fn fabric(f: Fabric) -> anyhow::Result<i32> {
    match f {
        Fabric::Up { layout, inventory } => {
            let started = Instant::now();
            let inv = rxefabric::up(Layout::new(layout.tors, layout.hosts)?)?;
            if let Some(path) = inventory {
                rxefabric::write_inventory(&inv, &path)?;
            }
            println!(
                "rxe-fabric: {} ToRs x {} hosts up in {:.1} s (inventory: {})",
                layout.tors,
                layout.hosts,
                started.elapsed().as_secs_f64(),
                rxefabric::STATE
            );
        }
        Fabric::Down => rxefabric::down()?,
        Fabric::Smoke { layout, inventory, no_faults } => {
            let ok = rxefabric::smoke(Layout::new(layout.tors, layout.hosts)?, !no_faults)?;
            if let Some(path) = inventory {
                rxefabric::write_inventory(&rxefabric::current()?, &path)?;
            }
            return Ok(if ok { 0 } else { 1 });
        }
        Fabric::RnicKill { host, egress } => rxefabric::rnic_kill_with(&host, egress)?,
        Fabric::RnicHeal { host } => rxefabric::rnic_heal(&host)?,
        Fabric::UplinkLoss { tor, percent } => rxefabric::uplink_loss(&tor, percent)?,
        Fabric::UplinkHeal { tor } => rxefabric::uplink_heal(&tor)?,
        Fabric::RdmaDelete { host } => rxefabric::rdma_delete(&host)?,
        Fabric::RdmaAdd { host } => rxefabric::rdma_add(&host)?,
        Fabric::Exec { host, command } => return rxefabric::exec(&host, &command),
        Fabric::Pingpong { server, client, iters, timeout_s } => {
            let p = rxefabric::pingpong(&server, &client, iters, Duration::from_secs(timeout_s))?;
            println!(
                "{client} -> {server}: {} UD round trips in {:.3} s, {:.1} usec each",
                p.iterations, p.seconds, p.usec_per_iter
            );
        }
        Fabric::Storm { host, peer, qps } => {
            let inv = rxefabric::current()?;
            let (h, p) = (rxefabric::host(&inv, &host)?, rxefabric::host(&inv, &peer)?);
            let gid_index = u8::try_from(h.gid_index).context("GID index above 255")?;
            let storm = rxefabric::storm::run(&h.device, gid_index, rocemesh_formats::gid::gid_bytes(p.ip), qps)?;
            println!("{}", serde_json::to_string(&storm)?);
        }
        Fabric::Perftest { server, client, iters, size, json } => {
            let opts = PerftestOptions { iters, size, ..PerftestOptions::default() };
            let r = rxefabric::perftest(&server, &client, opts)?;
            println!("{r}");
            if let Some(path) = json {
                let text = serde_json::to_string_pretty(&r)?;
                std::fs::write(&path, text + "\n").with_context(|| format!("writing {}", path.display()))?;
            }
        }
    }
    Ok(0)
}
