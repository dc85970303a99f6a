//! `ctl`: the file-based controller, run by operators from a bastion host.

use std::io::IsTerminal;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use clap::Parser;
use indicatif::{ProgressBar, ProgressStyle};
use rocemesh_ctl::cli::{
    Cli, CollectArgs, DiffArgs, DoctorArgs, GenArgs, HostsArgs, ImportArgs, InventoryCmd, KeysCmd, LldpArgs, PushArgs,
    ScrapeArgs, StatusArgs, SwitchAddrsArgs, What,
};
use rocemesh_ctl::generation::{GenOptions, Generator};
use rocemesh_ctl::import::{self, ImportOptions, NameRule, TorMap, TorSource};
use rocemesh_ctl::lldp;
use rocemesh_ctl::pinglist_dir::{self, Manifest, PinglistDir};
use rocemesh_ctl::push::{self, Destination};
use rocemesh_ctl::remote::RemotePath;
use rocemesh_ctl::switch_addrs::{self, AddrList};
use rocemesh_ctl::{check, collect, diff, status};
use rocemesh_formats::inventory::Inventory;

/// gen-pinglists parses a 100,000-host inventory into millions of small TOML nodes and frees
/// them; with glibc's allocator, malloc, free and the page faults of heap growth were a third
/// of its load time.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

const OK: i32 = 0;
const PROBLEMS: i32 = 1;
const CANNOT_RUN: i32 = 2;

fn main() {
    let cli = Cli::parse();
    let code = match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("ctl: {e:#}");
            CANNOT_RUN
        }
    };
    std::process::exit(code);
}

fn run(cli: Cli) -> Result<i32> {
    match cli.what {
        What::Inventory(InventoryCmd::Check { inventory, inventory_positional }) => {
            // clap requires one of the two.
            let path = inventory.or(inventory_positional).context("no inventory (fix: --inventory FILE)")?;
            inventory_check(&path)
        }
        What::Inventory(InventoryCmd::Import(args)) => inventory_import(args),
        What::Inventory(InventoryCmd::SwitchAddrs(args)) => inventory_switch_addrs(args),
        What::Inventory(InventoryCmd::Lldp(args)) => inventory_lldp(args),
        What::GenPinglists(args) => gen_pinglists(args),
        What::PushPinglist(args) => push_pinglist(args),
        What::Keys(KeysCmd::Rotate { from: dir, grace_s }) => {
            if !dir.is_dir() {
                bail!(
                    "{} is not a directory (fix: pass the pinglist directory, --from of push-pinglist)",
                    dir.display()
                );
            }
            let now = unix_now_s();
            let r = rocemesh_ctl::keys::rotate(&dir, now, grace_s)?;
            println!("{}: key {} added; sent from {} s from now", r.path.display(), r.id, grace_s);
            print!("{}", rocemesh_ctl::keys::render(&r.keys, now));
            println!("push it within {grace_s} s: ctl push-pinglist --from {}", dir.display());
            Ok(OK)
        }
        What::Keys(KeysCmd::Show { from: dir }) => {
            let keys = rocemesh_formats::keys::FleetKeys::load(rocemesh_ctl::keys::path(&dir))?;
            print!("{}", rocemesh_ctl::keys::render(&keys, unix_now_s()));
            Ok(OK)
        }
        What::Diff(args) => diff_cmd(args),
        What::Status(args) => status_cmd(args),
        What::Collect(args) => collect_cmd(args),
        What::Scrape(args) => scrape_cmd(args),
        What::Doctor(args) => doctor_cmd(args),
        What::Generate { what, name } => {
            generate(&what, &name)?;
            Ok(OK)
        }
    }
}

fn unix_now_s() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// `ctl generate WHAT`: the man page or a shell's completions, on standard output.
fn generate(what: &str, name: &str) -> std::io::Result<()> {
    rocemesh_formats::docs::generate(<Cli as clap::CommandFactory>::command(), what, name)
}

fn collect_cmd(args: CollectArgs) -> Result<i32> {
    let remote_dir = RemotePath::dir(&args.remote_dir)?;
    if !(args.bwlimit_mib_s >= 0.0 && args.bwlimit_mib_s.is_finite()) {
        bail!("--bwlimit-mib-s {} is not a rate (fix: 0 for unlimited, or MiB/s per host)", args.bwlimit_mib_s);
    }
    let hosts = hosts_of(&args.hosts)?;
    std::fs::create_dir_all(&args.out).with_context(|| format!("creating {}", args.out.display()))?;
    let opts = collect::Options {
        ssh: args.ssh.ssh(),
        remote_dir,
        out: args.out.clone(),
        parallel: args.ssh.parallel,
        bwlimit_bytes_per_s: (args.bwlimit_mib_s * (1u64 << 20) as f64) as u64,
        remove: args.remove,
        stale_after: Duration::from_secs(args.stale_after_s),
    };
    let start = std::time::Instant::now();
    let bar = progress(hosts.len(), "collect");
    let reports = collect::collect(&hosts, &opts, |r| {
        bar.inc(1);
        if !r.error.is_empty() {
            bar.println(format!("{}: {}", r.host, r.error));
        }
    });
    bar.finish_and_clear();
    print!("{}", collect::render(&reports, start.elapsed()));
    Ok(if reports.iter().any(collect::HostReport::is_problem) { PROBLEMS } else { OK })
}

fn doctor_cmd(args: DoctorArgs) -> Result<i32> {
    let hosts = hosts_of(&args.hosts)?;
    let config = RemotePath::new(&args.config_path)?;
    let ssh = args.ssh.ssh();
    let bar = progress(hosts.len(), "doctor");
    let results =
        rocemesh_ctl::doctor::doctor(&hosts, &ssh, &args.agent_command, &config, args.ssh.parallel, |_| bar.inc(1));
    bar.finish_and_clear();
    print!("{}", rocemesh_ctl::doctor::render(&results));
    Ok(if results.iter().any(rocemesh_ctl::doctor::HostDoctor::is_problem) { PROBLEMS } else { OK })
}

/// The hosts to work on: `--hosts`, else every host of `--inventory`.
fn hosts_of(args: &HostsArgs) -> Result<Vec<String>> {
    let hosts: Vec<String> = match (&args.hosts, &args.inventory) {
        (Some(h), _) => h.iter().map(|h| h.trim().to_owned()).filter(|h| !h.is_empty()).collect(),
        (None, Some(inv)) => Inventory::load(inv)?.hosts.into_iter().map(|h| h.name).collect(),
        (None, None) => Vec::new(),
    };
    if hosts.is_empty() {
        bail!("no hosts (fix: --inventory FILE or --hosts h1,h2)");
    }
    Ok(hosts)
}

fn scrape_cmd(args: ScrapeArgs) -> Result<i32> {
    use rocemesh_ctl::scrape::{self, Forge, ScrapeOptions};
    let mut targets = args.targets.clone();
    if let Some(inv) = &args.inventory {
        for h in Inventory::load(inv)?.hosts {
            targets.extend(h.rnics.iter().map(|r| std::net::SocketAddr::new(r.ip, args.port)));
        }
    }
    if targets.is_empty() {
        bail!("no targets (fix: --targets ADDR:PORT,... or --inventory FILE)");
    }
    if !(args.rate_hz > 0.0 && args.rate_hz <= 10_000.0) {
        bail!("--rate-hz {} is not a rate (fix: 0 < rate <= 10000)", args.rate_hz);
    }
    let forge = match args.forge.as_deref() {
        None => None,
        Some("rkey") => Some(Forge::Rkey),
        Some("oob") => Some(Forge::OutOfBounds),
        Some(other) => bail!("--forge {other}: use rkey or oob"),
    };
    let opts = ScrapeOptions {
        targets,
        rate_hz: args.rate_hz,
        duration: (args.duration_s > 0).then(|| Duration::from_secs(args.duration_s)),
        json: !args.quiet,
        prom: args.prom.clone(),
        forge,
        read_timeout: Duration::from_secs(2),
    };
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the handler only stores to an atomic (async-signal-safe).
        unsafe { libc::signal(sig, on_stop_signal as *const () as libc::sighandler_t) };
    }
    STOP.set(stop.clone()).ok();
    let mut out = std::io::stdout().lock();
    let summary = scrape::run(&opts, &stop, &mut out)?;
    drop(out);
    let mut failed = false;
    for t in &summary.targets {
        eprintln!(
            "{}: {} snapshots of {} reads ({} torn, read again), {} failures; reads took {:.1} ms on average, \
             {:.1} ms at most; {} ticks found a read in flight{}",
            t.target,
            t.snapshots,
            t.reads,
            t.torn,
            t.failures,
            t.read_ns_sum as f64 / t.completed.max(1) as f64 / 1e6,
            t.read_ns_max as f64 / 1e6,
            t.late_ticks,
            t.last_failure.as_ref().map_or(String::new(), |f| format!(", last: {f}"))
        );
        failed |= t.snapshots == 0;
    }
    eprintln!(
        "scrape: {} targets, {:.1} snapshots/s over {:.1} s, collector CPU {:.2} s ({:.0} snapshots per CPU second), \
         {} ticks made, {} missed while the collector's loop was late",
        summary.targets.len(),
        summary.snapshots_per_s(),
        summary.seconds,
        summary.cpu_s,
        summary.targets.iter().map(|t| t.snapshots).sum::<u64>() as f64 / summary.cpu_s.max(1e-6),
        summary.ticks,
        summary.ticks_missed
    );
    Ok(if failed { PROBLEMS } else { OK })
}

static STOP: std::sync::OnceLock<std::sync::Arc<std::sync::atomic::AtomicBool>> = std::sync::OnceLock::new();

extern "C" fn on_stop_signal(_: libc::c_int) {
    if let Some(s) = STOP.get() {
        s.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

fn inventory_check(path: &Path) -> Result<i32> {
    let inventory = Inventory::load(path)?;
    let report = check::check(&inventory);
    println!("{}: valid inventory", path.display());
    print!("{}", report.summary);
    for f in &report.findings {
        println!("{f}");
    }
    Ok(if report.has_problems() { PROBLEMS } else { OK })
}

fn inventory_import(args: ImportArgs) -> Result<i32> {
    let same_as_base = args.base.as_ref().is_some_and(|b| b == &args.output);
    if args.output.exists() && !args.force && !same_as_base {
        bail!("{} exists (fix: pass --force to replace it, or --base {0} to extend it)", args.output.display());
    }
    let tors = match (&args.tor_map, &args.tor_name) {
        (Some(map), _) => TorSource::Map(TorMap::load(map)?),
        (None, Some(template)) => TorSource::Rule(NameRule::new(args.host_regex.as_deref(), template)?),
        (None, None) if args.rail_optimised => {
            TorSource::Rule(NameRule::new(args.host_regex.as_deref(), "rail{rail}")?)
        }
        (None, None) => bail!(
            "no ToR mapping (fix: give --tor-map FILE, --tor-name TEMPLATE [--host-regex RE], or --rail-optimised)"
        ),
    };
    let base = args.base.as_deref().map(Inventory::load).transpose()?;
    let described = import::load_descriptions(&args.descriptions)?;
    let opts = ImportOptions {
        tors,
        rail_optimised: args.rail_optimised,
        rail_devices: args.rail_devices,
        spines: args.spines,
        link_all: args.link_all,
        base,
    };
    let imported = import::import(&described, &opts, &args.output)?;
    let text = imported.inventory.to_toml_string().context("serialising the inventory")?;
    let header = "# written by ctl inventory import from `agent describe` output; check with `ctl inventory check`\n";
    rocemesh_ctl::write_file_atomically(&args.output, format!("{header}{text}").as_bytes())?;
    println!(
        "{}: {} hosts described ({} added, {} replaced)",
        args.output.display(),
        described.len(),
        imported.added,
        imported.replaced
    );
    for (rail, device) in imported.rail_devices.iter().enumerate() {
        println!("rail {rail}: {device}");
    }
    let report = check::check(&imported.inventory);
    print!("{}", report.summary);
    for f in &report.findings {
        println!("{f}");
    }
    for note in &imported.notes {
        println!("note: {note}");
    }
    // The inventory is written all the same: fixing the cabling or the descriptions and importing
    // again (--base) starts from it, and `ctl inventory check` shows the same problems.
    Ok(if report.has_problems() { PROBLEMS } else { OK })
}

/// Where an inventory rewrite goes: --output, else --inventory itself; either only with --force
/// when it would replace a file.
fn rewrite_target(inventory: &Path, output: Option<&Path>, force: bool) -> Result<std::path::PathBuf> {
    let out = output.unwrap_or(inventory).to_path_buf();
    if out == inventory && !force {
        bail!(
            "this rewrites {} in place (fix: pass --force to do so, or --output FILE to write elsewhere)",
            inventory.display()
        );
    }
    if out != inventory && out.exists() && !force {
        bail!("{} exists (fix: pass --force to replace it, or choose another --output)", out.display());
    }
    Ok(out)
}

fn inventory_lldp(args: LldpArgs) -> Result<i32> {
    let out = rewrite_target(&args.inventory, args.output.as_deref(), args.force)?;
    let inventory = Inventory::load(&args.inventory)?;
    let tables = lldp::load_tables(&args.tables)?;
    let learned = lldp::apply(&inventory, &args.inventory, &tables);
    let text = learned.inventory.to_toml_string().context("serialising the inventory")?;
    // Never replace a loadable inventory with one that is not.
    Inventory::parse(&text, &out).context("the inventory learned from LLDP does not load (nothing was written)")?;
    let header = format!(
        "# ports and switch addresses set by ctl inventory lldp from {} tables; check with `ctl inventory check`\n",
        tables.len()
    );
    rocemesh_ctl::write_file_atomically(&out, format!("{header}{text}").as_bytes())?;
    println!(
        "{}: {} link ends and {} RNIC ports set, {} switch addresses added, from {} LLDP tables; \
         still without ports: {} links, {} RNICs",
        out.display(),
        learned.link_ports,
        learned.rnic_ports,
        learned.addrs,
        tables.len(),
        learned.links_unported,
        learned.rnics_unported
    );
    if !learned.ignored.is_empty() {
        println!("neighbours not in the inventory (ignored): {}", learned.ignored.join(", "));
    }
    for p in &learned.problems {
        println!("{p}");
    }
    let report = check::check(&learned.inventory);
    print!("{}", report.summary);
    for f in &report.findings {
        println!("{f}");
    }
    Ok(if report.has_problems() || !learned.problems.is_empty() { PROBLEMS } else { OK })
}

fn inventory_switch_addrs(args: SwitchAddrsArgs) -> Result<i32> {
    let out = rewrite_target(&args.inventory, args.output.as_deref(), args.force)?;
    let inventory = Inventory::load(&args.inventory)?;
    let list = AddrList::load(&args.map)?;
    let applied = switch_addrs::apply(&inventory, &args.inventory, &list, &out)?;
    let text = applied.inventory.to_toml_string().context("serialising the inventory")?;
    let header = format!(
        "# switch addresses set by ctl inventory switch-addrs from {}; check with `ctl inventory check`\n",
        args.map.display()
    );
    // Comments of the input are lost in the rewrite: say so rather than let them vanish (the
    // header lines ctl itself writes excepted).
    let ours = |l: &str| l.starts_with("# written by ctl ") || l.starts_with("# switch addresses set by ctl ");
    let had_comments =
        std::fs::read_to_string(&args.inventory).is_ok_and(|t| t.lines().any(|l| l.contains('#') && !ours(l)));
    rocemesh_ctl::write_file_atomically(&out, format!("{header}{text}").as_bytes())?;
    println!(
        "{}: {} addresses of {} switches set from {}",
        out.display(),
        applied.addrs,
        applied.switches,
        args.map.display()
    );
    if !applied.removed.is_empty() {
        let removed: Vec<String> = applied.removed.iter().map(|(s, a)| format!("{s} {a}")).collect();
        println!("removed (not in the list): {}", removed.join(", "));
    }
    if had_comments {
        println!("note: the comments of {} are not in the rewritten file", args.inventory.display());
    }
    let report = check::check(&applied.inventory);
    print!("{}", report.summary);
    for f in &report.findings {
        println!("{f}");
    }
    Ok(if report.has_problems() { PROBLEMS } else { OK })
}

fn gen_pinglists(args: GenArgs) -> Result<i32> {
    let started = Instant::now();
    let inventory = Inventory::load(&args.inventory)?;
    let loaded_s = started.elapsed().as_secs_f64();
    let opts = GenOptions {
        seed: args.seed,
        inter_tor_peers: args.inter_tor_peers,
        ecmp_paths: args.ecmp_paths,
        coverage_probability: args.coverage_probability,
        tor_mesh_rate_pps: args.tor_mesh_rate_pps,
        inter_tor_rate_pps: args.inter_tor_rate_pps,
        tor_mesh_flow_labels: args.tor_mesh_flow_labels,
        probe_port: args.probe_port,
        timeout_ms: args.timeout_ms,
        cross_rail: args.cross_rail,
    };
    let generator = Generator::new(&inventory, &opts)?;
    let indexed_s = started.elapsed().as_secs_f64();
    let previous = pinglist_dir::read_manifest(&args.out)?;
    let generation = match (args.generation, &previous) {
        (Some(g), Some(m)) if g < m.generation => bail!(
            "--generation {g} is older than generation {} already in {} (fix: omit --generation, or pass at least {}; agents treat a lower generation as older)",
            m.generation,
            args.out.display(),
            m.generation
        ),
        (Some(g), _) => g,
        (None, _) => pinglist_dir::next_generation(&args.out)?,
    };
    let now_unix_ns = match args.now_unix_ns {
        Some(t) => t,
        None => SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64),
    };
    let coverage = generator.coverage();
    let manifest = Manifest {
        generation,
        generated_unix_ns: now_unix_ns,
        seed: args.seed,
        hosts: generator.hosts(),
        generations_to_cover: coverage.generations_to_cover,
    };
    let written = pinglist_dir::write_generated(
        &args.out,
        generator.hosts(),
        |i, text, host| generator.render_toml(i, generation, now_unix_ns, text, host),
        &manifest,
    )?;
    let written_s = started.elapsed().as_secs_f64();
    println!(
        "generation {generation}: {} pinglists, {} targets, {:.1} MiB in {} in {written_s:.2} s (inventory {loaded_s:.2} s, index {:.2} s, generate and write {:.2} s)",
        written.written,
        generator.targets(),
        written.bytes as f64 / (1 << 20) as f64,
        args.out.display(),
        indexed_s - loaded_s,
        written_s - indexed_s,
    );
    if !written.pruned.is_empty() {
        println!(
            "removed the pinglists of {} hosts no longer in the inventory: {}",
            written.pruned.len(),
            written.pruned.join(", ")
        );
    }
    println!(
        "flow labels per inter-ToR target: {} (m = {} ECMP paths{}, p = {})",
        coverage.inter_tor_flow_labels,
        coverage.ecmp_paths,
        if coverage.ecmp_paths_from_spines { ", the inventory's spines" } else { "" },
        coverage.coverage_probability
    );
    for plane in &coverage.planes {
        let name = plane.rail.map_or_else(|| "all ToRs".to_owned(), |r| format!("rail {r}"));
        println!(
            "  {name}: {} ToRs, {} peer ToRs per RNIC per generation, {} distance blocks, >= {} RNICs per ToR: all ToR pairs in {} generation(s)",
            plane.tors, plane.peers_per_rnic, plane.blocks, plane.min_rnics_per_tor, plane.generations
        );
    }
    println!(
        "every ToR pair{} is probed in any {} consecutive generation(s); highest rate of one RNIC {:.1} probes/s",
        if coverage.planes.iter().any(|p| p.rail.is_some()) { " within a rail" } else { "" },
        coverage.generations_to_cover,
        coverage.max_rnic_rate_pps
    );
    Ok(OK)
}

fn progress(n: usize, what: &str) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(n as u64);
    if let Ok(style) = ProgressStyle::with_template("{prefix} [{bar:40}] {pos}/{len} hosts, {elapsed} ({eta} left)") {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_prefix(what.to_owned());
    bar
}

fn push_pinglist(args: PushArgs) -> Result<i32> {
    let from = PinglistDir::open(&args.from)?;
    let hosts = match (&args.retry_failed, &args.hosts) {
        (Some(file), _) => {
            let failed = push::read_failed(file)?;
            if failed.is_empty() {
                println!("{}: no failed hosts to retry", file.display());
                return Ok(OK);
            }
            from.select(Some(&failed))?
        }
        (None, only) => from.select(only.as_deref())?,
    };
    let dest = args.reach.destination()?;
    let bar = progress(hosts.len(), "push");
    let results = push::push(&from, &hosts, &dest, &args.key_group, args.reach.ssh.parallel, |r| {
        bar.inc(1);
        if !r.ok {
            bar.println(format!("{}: {}", r.host, r.error));
        }
    });
    bar.finish_and_clear();
    print!("{}", push::render_table(&results));
    let results_file = args.results.unwrap_or_else(|| args.from.join("push-results.tsv"));
    push::write_results(&results_file, &results)?;
    let failed = results.iter().filter(|r| !r.ok).count();
    if failed > 0 {
        println!("results in {0}; retry the failed hosts with --retry-failed {0}", results_file.display());
        Ok(PROBLEMS)
    } else {
        println!("results in {}", results_file.display());
        Ok(OK)
    }
}

fn diff_cmd(args: DiffArgs) -> Result<i32> {
    let from = PinglistDir::open(&args.from)?;
    let against_dir = Path::new(&args.against);
    let (hosts, dest) = if against_dir.is_dir() {
        (from.select(None)?, Destination::Dir(against_dir.to_path_buf()))
    } else if args.reach.to_dir.is_some() {
        bail!("--against names hosts, but --to-dir is given (fix: pass the directory as --against DIR)");
    } else {
        let hosts = if args.against == "*" {
            from.select(None)?
        } else {
            let names: Vec<String> =
                args.against.split(',').map(str::trim).filter(|h| !h.is_empty()).map(str::to_owned).collect();
            from.select(Some(&names))?
        };
        (hosts, args.reach.destination()?)
    };
    let bar = progress(hosts.len(), "diff");
    let diffs = diff::diff(&from, &hosts, &dest, args.reach.ssh.parallel, |_| bar.inc(1));
    bar.finish_and_clear();
    print!("{}", diff::render(&diffs, args.verbose));
    Ok(if diffs.iter().any(|d| d.error.is_some()) { PROBLEMS } else { OK })
}

fn status_cmd(args: StatusArgs) -> Result<i32> {
    let from = PinglistDir::open(&args.from)?;
    let hosts = from.select(args.hosts.as_deref())?;
    let dest = args.reach.destination()?;
    let bar = progress(hosts.len(), "status");
    let statuses = status::status(&from, &hosts, &dest, args.reach.ssh.parallel, |_| bar.inc(1));
    bar.finish_and_clear();
    print!("{}", status::render(&statuses));
    Ok(if statuses.iter().any(status::HostStatus::is_problem) { PROBLEMS } else { OK })
}
