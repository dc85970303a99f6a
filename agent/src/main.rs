//! `agent`: the rocemesh probing daemon.

use std::time::Duration;

use anyhow::Result;
use clap::Parser;
use rocemesh_agent::cli::{Cli, DoctorFormat, What};
use rocemesh_agent::config::AgentConfig;
use rocemesh_formats::pinglist::Pinglist;

/// `agent generate WHAT`: the man page or a shell's completions, on standard output.
fn generate(what: &str, name: &str) -> std::io::Result<()> {
    rocemesh_formats::docs::generate(<Cli as clap::CommandFactory>::command(), what, name)
}

fn main() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    tracing_subscriber::fmt().with_env_filter(filter).with_ansi(ansi).with_writer(std::io::stderr).init();
    let code = match run(Cli::parse()) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("agent: {e:#}");
            2
        }
    };
    std::process::exit(code);
}

fn run(cli: Cli) -> Result<i32> {
    match cli.what {
        What::Run { config, duration_s } => {
            run_agent(&AgentConfig::load(&config)?, duration_s.map(Duration::from_secs))
        }
        What::CheckConfig { config } => check_config(&config),
        What::Describe { config } => {
            let cfg = AgentConfig::load(&config)?;
            print!("{}", rocemesh_agent::describe::describe(&cfg, std::path::Path::new("/sys")).to_toml_string()?);
            Ok(0)
        }
        What::Doctor { config, format } => {
            let report = rocemesh_agent::doctor::run(config.as_deref(), &rocemesh_agent::doctor::Host::this());
            match format {
                DoctorFormat::Table => print!("{}", report.render_table()),
                DoctorFormat::Json => println!("{}", serde_json::to_string_pretty(&report)?),
            }
            Ok(report.exit_code())
        }
        What::Demo { dir, shards, port, duration_s, busy_poll, inject_loss } => {
            let path = rocemesh_agent::demo::write(&dir, shards, port, busy_poll)?;
            eprintln!("agent demo: {shards} loopback shards for {duration_s} s; config {}", path.display());
            let mut cfg = AgentConfig::load(&path)?;
            match rocemesh_agent::demo::inject_loss(&mut cfg, inject_loss)? {
                Some(rnic) => eprintln!(
                    "agent demo: INJECTED FAULT: {rnic} silently ignores {:.0}% of the probes it receives \
                     (--inject-loss 0 for none)",
                    inject_loss * 100.0
                ),
                None => eprintln!("agent demo: no fault injected"),
            }
            run_agent(&cfg, Some(Duration::from_secs(duration_s)))
        }
        What::Generate { what, name } => {
            generate(&what, &name)?;
            Ok(0)
        }
    }
}

/// `agent check-config`: the config and its pinglist load, the limits allow a start; what would run.
fn check_config(config: &std::path::Path) -> Result<i32> {
    let cfg = AgentConfig::load(config)?;
    let pl = Pinglist::load(&cfg.pinglist)?;
    rocemesh_agent::runtime::check_limits()?;
    println!("{}: ok: host {}, {} shards, mode {:?}", config.display(), cfg.host, cfg.shards.len(), cfg.mode);
    for s in &cfg.shards {
        let n = pl.targets.iter().filter(|t| t.from == s.device).count();
        println!(
            "  shard {} on core {} bound to {}: {n} targets, {:.1} probes/s",
            s.device,
            s.core,
            s.bind,
            pl.total_rate_pps(&s.device)
        );
    }
    println!("{}: ok: generation {}, {} targets", cfg.pinglist.display(), pl.generation, pl.targets.len());
    match cfg.metrics.listen {
        Some(l) => println!("metrics: served at http://{l}/metrics"),
        None => println!("metrics: off (no [metrics] listen)"),
    }
    Ok(0)
}

/// Run `cfg`'s shards; 0 when every shard stopped cleanly, 1 when one failed.
fn run_agent(cfg: &AgentConfig, duration: Option<Duration>) -> Result<i32> {
    let reports = rocemesh_agent::runtime::run(cfg, duration)?;
    Ok(if reports.len() == cfg.shards.len() { 0 } else { 1 })
}
