//! The host side of a node: memlock, capabilities and kernel BTF, clock synchronisation, and the
//! cores the config pins shards to.

use super::{Check, Host, Level, read};
use crate::caps;
use crate::config::{AgentConfig, Mode};

pub(super) fn checks(host: &Host, cfg: Option<&AgentConfig>) -> Vec<Check> {
    let mut out = vec![memlock_check()];
    out.extend(capability_checks(cfg));
    out.extend(btf_checks(host, cfg));
    out.push(clock_sync_check(host, cfg));
    if let Some(cfg) = cfg {
        out.extend(core_checks(host, cfg));
    }
    out
}

fn memlock_check() -> Check {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes into the struct we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &raw mut lim) } != 0 {
        return Check::new("memlock", "RLIMIT_MEMLOCK", Level::Info, "unreadable");
    }
    let what = if lim.rlim_cur == libc::RLIM_INFINITY {
        "unlimited".to_owned()
    } else {
        format!("{} KiB", lim.rlim_cur / 1024)
    };
    let detail = format!("{what} in this shell (the packaged unit sets LimitMEMLOCK=infinity)");
    match crate::runtime::check_limits() {
        Ok(()) => Check::new("memlock", "RLIMIT_MEMLOCK", Level::Ok, detail),
        Err(e) => Check::new("memlock", "RLIMIT_MEMLOCK", Level::Fail, detail).fix(e.to_string()),
    }
}

/// What path tracing (CAP_NET_RAW) and the service tracer (CAP_BPF, CAP_PERFMON) need, against
/// what this process has and what the config turns on.
fn capability_checks(cfg: Option<&AgentConfig>) -> Vec<Check> {
    let permitted = match caps::current() {
        Ok((_, p)) => p,
        Err(e) => {
            return vec![Check::new(
                "caps",
                "-",
                Level::Info,
                format!("this process's capabilities are unreadable: {e}"),
            )];
        }
    };
    let has = |cap: u32| permitted & (1 << cap) != 0;
    let tracing = cfg.is_none_or(|c| c.path_tracing.enabled);
    let services = cfg.is_some_and(|c| c.service_tracing.enabled);
    let mut out = Vec::new();
    let as_service =
        "the packaged unit grants it (AmbientCapabilities); run the doctor with sudo to check as the service";
    out.push(match (has(caps::CAP_NET_RAW), tracing) {
        (true, _) => Check::new("caps", "CAP_NET_RAW", Level::Ok, "path tracing can open its raw sockets"),
        (false, true) => {
            Check::new("caps", "CAP_NET_RAW", Level::Warn, "missing: path tracing would be off").fix(as_service)
        }
        (false, false) => Check::new("caps", "CAP_NET_RAW", Level::Info, "missing; path tracing is off in the config"),
    });
    let bpf = has(caps::CAP_BPF) && has(caps::CAP_PERFMON);
    out.push(match (bpf, services) {
        (true, _) => Check::new("caps", "CAP_BPF,CAP_PERFMON", Level::Ok, "the service tracer can load its programs"),
        (false, true) => {
            Check::new("caps", "CAP_BPF,CAP_PERFMON", Level::Warn, "missing: the service tracer would not load")
                .fix(as_service)
        }
        (false, false) => {
            Check::new("caps", "CAP_BPF,CAP_PERFMON", Level::Info, "missing; service tracing is off in the config")
        }
    });
    out
}

/// The kernel and ib_core BTF the service tracer needs.
fn btf_checks(host: &Host, cfg: Option<&AgentConfig>) -> Vec<Check> {
    let services = cfg.is_some_and(|c| c.service_tracing.enabled);
    let mut out = Vec::new();
    for (btf, why) in [("vmlinux", "the kernel's types"), ("ib_core", "the RDMA core module's types (load ib_core)")] {
        let path = host.sys.join("kernel/btf").join(btf);
        out.push(if path.exists() {
            Check::new("btf", btf, Level::Ok, format!("{} present", path.display()))
        } else if services {
            Check::new("btf", btf, Level::Warn, format!("{} missing: the service tracer needs {why}", path.display()))
                .fix("a kernel built with CONFIG_DEBUG_INFO_BTF (and _MODULES), the module loaded")
        } else {
            Check::new(
                "btf",
                btf,
                Level::Info,
                format!("{} missing; service tracing is off in the config", path.display()),
            )
        });
    }
    out
}

/// A host shifts this share of its probes into the neighbouring window per unit of offset:
/// warn when more than 1% of a 30 s window (analyze's default) would move.
const OFFSET_WARN_S: f64 = 0.3;

/// The clock's offset from chrony (or whether timedatectl calls it synchronised). Probes'
/// delays never span two hosts' clocks, but their windows are wall-clock aligned across hosts,
/// and with `[auth]` a packet stamped more than `window_ms` off the receiver's clock is refused:
/// two hosts each half of that off the reference, on opposite sides, refuse each other, so half
/// of it is what one host may be off.
fn clock_sync_check(host: &Host, cfg: Option<&AgentConfig>) -> Check {
    let auth_s = cfg.filter(|c| c.auth.keys.is_some()).map(|c| c.auth.window_ms as f64 / 2000.0);
    if let Some(csv) = (host.run)("chronyc", &["-c", "tracking"]) {
        let f: Vec<&str> = csv.trim().split(',').collect();
        let offset = f.get(4).and_then(|s| s.parse::<f64>().ok());
        let leap = f.last().copied().unwrap_or_default();
        return match offset {
            None => {
                Check::new("time", "chrony", Level::Info, format!("unexpected `chronyc -c tracking`: {}", csv.trim()))
            }
            Some(_) if leap.contains("Not synchronised") => {
                Check::new("time", "chrony", Level::Warn, "chrony is not synchronised")
                    .fix("check its sources: chronyc sources")
            }
            Some(o) => offset_check(o.abs(), auth_s),
        };
    }
    match (host.run)("timedatectl", &["show", "-p", "NTPSynchronized", "--value"]) {
        Some(v) if v.trim() == "yes" => {
            Check::new("time", "timedatectl", Level::Ok, "NTP synchronised (no chrony to give the offset)")
        }
        Some(_) => Check::new("time", "timedatectl", Level::Warn, "the clock is not NTP synchronised")
            .fix("run chrony (or PTP's phc2sys) against the fleet's time source"),
        None => Check::new(
            "time",
            "-",
            Level::Info,
            "neither chronyc nor timedatectl could say whether the clock is synchronised",
        ),
    }
}

fn offset_check(offset_s: f64, auth_s: Option<f64>) -> Check {
    let detail = format!("offset {:.3} ms from chrony's reference", offset_s * 1000.0);
    let fix = "check chrony's sources (chronyc sources); windows and auth need the fleet within a fraction of a second";
    match auth_s {
        Some(a) if offset_s > a => Check::new(
            "time",
            "chrony",
            Level::Fail,
            format!("{detail}: beyond half of [auth] window_ms, peers off the other way refuse its packets"),
        )
        .fix(fix),
        _ if offset_s > OFFSET_WARN_S => {
            Check::new("time", "chrony", Level::Warn, format!("{detail}: over 1% of a 30 s window lands in the next"))
                .fix(fix)
        }
        _ => Check::new("time", "chrony", Level::Ok, detail),
    }
}

/// A core's load above this share while the agent is not running is other work the shard would
/// share its core with.
const BUSY_WARN: f64 = 0.5;

/// Each shard's core: online, isolated from the scheduler, and how busy it is without the agent.
fn core_checks(host: &Host, cfg: &AgentConfig) -> Vec<Check> {
    let cpu = host.sys.join("devices/system/cpu");
    let online = read(&cpu.join("online")).map(|s| cpu_list(&s));
    let isolated = read(&cpu.join("isolated")).map(|s| cpu_list(&s)).unwrap_or_default();
    let before = proc_stat(host);
    std::thread::sleep(host.sample);
    let after = proc_stat(host);
    let running = agent_running(host);
    let mut cores: Vec<usize> = cfg.shards.iter().map(|s| s.core).collect();
    cores.sort_unstable();
    cores.dedup();
    let mut out = Vec::new();
    for core in cores {
        let subject = format!("cpu{core}");
        match &online {
            None => {
                out.push(Check::new("core", subject, Level::Info, "the online cores are unreadable (cpu/online)"));
                continue;
            }
            Some(o) if !o.contains(&core) => {
                let c = Check::new("core", subject, Level::Fail, "not online");
                out.push(c.fix("pin the shard to an online core (`core`)"));
                continue;
            }
            Some(_) => {}
        }
        let busy = match (before.get(&core), after.get(&core)) {
            (Some(a), Some(b)) => busy_share(*a, *b),
            _ => None,
        };
        let busy_text = busy.map_or_else(|| "load unknown".to_owned(), |b| format!("{:.0}% busy", b * 100.0));
        let iso = isolated.contains(&core);
        let detail = format!(
            "{}, {busy_text} over {} ms",
            if iso { "isolated" } else { "not isolated" },
            host.sample.as_millis()
        );
        out.push(if busy.is_some_and(|b| b > BUSY_WARN) && running {
            Check::new("core", subject, Level::Info, format!("{detail}, an agent running (its own load included)"))
        } else if busy.is_some_and(|b| b > BUSY_WARN) {
            Check::new("core", subject, Level::Warn, detail)
                .fix("other work runs there, which shows as host delay: pin the shard elsewhere, or move that work")
        } else if !iso && cfg.mode == Mode::BusyPoll {
            Check::new("core", subject, Level::Warn, detail).fix(
                "a busy-poll shard spins on its core: isolate it (isolcpus= or a cpuset) so nothing else runs there",
            )
        } else {
            Check::new("core", subject, Level::Ok, detail)
        });
    }
    out
}

/// Whether an agent other than this process runs (`rocemesh-agent`, or `agent` as built): its
/// own shards would be what makes their cores busy.
fn agent_running(host: &Host) -> bool {
    let me = std::process::id().to_string();
    std::fs::read_dir(&host.proc).into_iter().flatten().flatten().any(|e| {
        let pid = e.file_name().to_string_lossy().into_owned();
        pid.bytes().all(|b| b.is_ascii_digit())
            && pid != me
            && read(&e.path().join("comm")).is_some_and(|c| c == "rocemesh-agent" || c == "agent")
    })
}

/// Busy and total jiffies per core, from /proc/stat.
fn proc_stat(host: &Host) -> std::collections::BTreeMap<usize, (u64, u64)> {
    let text = std::fs::read_to_string(host.proc.join("stat")).unwrap_or_default();
    let mut out = std::collections::BTreeMap::new();
    for line in text.lines() {
        let mut f = line.split_whitespace();
        let Some(core) = f.next().and_then(|c| c.strip_prefix("cpu")).and_then(|c| c.parse::<usize>().ok()) else {
            continue;
        };
        let v: Vec<u64> = f.filter_map(|x| x.parse().ok()).collect();
        // user nice system idle iowait irq softirq steal
        let total = v.iter().take(8).fold(0u64, |t, x| t.saturating_add(*x));
        let idle = v.get(3).copied().unwrap_or(0).saturating_add(v.get(4).copied().unwrap_or(0));
        out.insert(core, (total - idle.min(total), total));
    }
    out
}

/// The busy share of a core between two (busy, total) readings; None when no time passed.
pub(super) fn busy_share(a: (u64, u64), b: (u64, u64)) -> Option<f64> {
    let total = b.1.checked_sub(a.1).filter(|t| *t > 0)?;
    Some(b.0.saturating_sub(a.0) as f64 / total as f64)
}

/// A kernel CPU list (`0-3,8,10-11`).
pub(super) fn cpu_list(s: &str) -> Vec<usize> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                if let (Ok(a), Ok(b)) = (a.parse::<usize>(), b.parse::<usize>()) {
                    out.extend(a..=b.min(a.saturating_add(65_536)));
                }
            }
            None => out.extend(part.parse::<usize>().ok()),
        }
    }
    out
}
