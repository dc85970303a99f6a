//! `bench agent`: the agent's cost and ceiling, as real processes on loopback.
//!
//! - CPU per completed probe in event mode at 10k probes/s: user+sys of the prober and the
//!   responder together, from /proc, over a steady-state window, divided by the probes that
//!   completed in that window (from the prober's records).
//! - Max probes/s of one busy-polling prober core against one busy-polling responder.
//! - RSS of an agent probing 10k targets.
//! - The `/metrics` endpoint's cost: CPU per probe with both agents scraped every second
//!   against not scraped (the first event-mode row), and the size of one scrape of the
//!   10k-target agent (its targets under 32 ToRs: the 32-ToR-peer pinglist of the issue).
//! - Probe authentication's cost: CPU per probe with a fleet key (every probe and ACK sealed
//!   with keyed BLAKE3, checked, and entered in the replay table) against without (the first
//!   event-mode row).
//!
//! Baseline in the same run: a blocking std UDP ping-pong between two threads (2 packets per
//! round trip where a probe is 3 plus 3 timestamp reads), CPU per round trip.

use std::net::UdpSocket;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use rocemesh_formats::pinglist::{Pinglist, ProbeKind, Target};
use rocemesh_formats::record::Outcome;
use rocemesh_formats::segment::SegmentReader;

const PORT: u16 = 18700;

/// One measured figure.
#[derive(Debug, Clone)]
pub struct Figure {
    /// What.
    pub what: String,
    /// Value.
    pub value: f64,
    /// Unit.
    pub unit: &'static str,
    /// Comparison or context.
    pub note: String,
}

/// Run all three measurements and the baseline. `agent` is the agent binary.
pub fn run(agent: &Path, seconds: u64) -> Result<Vec<Figure>> {
    let mut out = Vec::new();
    let base_us = pingpong_cpu_us(200_000)?;
    out.push(Figure {
        what: "baseline: blocking std UDP ping-pong, CPU per round trip".into(),
        value: base_us,
        unit: "us",
        note: "2 threads, 2 packets per round trip".into(),
    });

    let root = tempfile::tempdir()?;
    // Event mode, 10k probes/s: 100 targets at 100/s, all answered by one responder; waking
    // at once, then with interrupt moderation (event_coalesce_us).
    // The default (32 source ports) first, then one bound socket for everything.
    let mut at_once_us = None;
    for (coalesce_us, source_ports, metrics, auth) in [
        (0, 32, false, false),
        (0, 32, true, false),
        (0, 0, false, false),
        (250, 32, false, false),
        (1000, 32, false, false),
    ] {
        let setup = Setup { coalesce_us, source_ports, metrics, auth, ..Setup::EVENT };
        let m = pair(
            agent,
            &root.path().join(format!("event{coalesce_us}-{source_ports}-{metrics}-{auth}")),
            setup,
            100,
            100.0,
            seconds,
        )?;
        let vs_at_once =
            at_once_us.map_or_else(String::new, |a: f64| format!("{:.2}x the first row; ", m.cpu_us_per_probe / a));
        at_once_us.get_or_insert(m.cpu_us_per_probe);
        out.push(Figure {
            what: format!(
                "event mode at 10k probes/s, event_coalesce_us = {coalesce_us}, source_ports = {source_ports}{}{}: CPU per completed probe",
                if metrics { ", both agents' /metrics scraped every 1 s" } else { "" },
                if auth { ", authenticated (fleet key)" } else { "" }
            ),
            value: m.cpu_us_per_probe,
            unit: "us",
            note: format!(
                "prober+responder; {vs_at_once}{:.0} probes/s completed, {} lost, {:.1}% of a core in all; \
                 {:.1}x the ping-pong baseline; network RTT p50 {:.1} us, responder delay p50 {:.1} us{}",
                m.probes_per_s,
                m.lost,
                m.cpu_share * 100.0,
                m.cpu_us_per_probe / base_us,
                m.rtt_ns_p50 as f64 / 1e3,
                m.responder_delay_ns_p50 as f64 / 1e3,
                m.scrapes.map_or_else(String::new, |s| format!(
                    "; {} scrapes, {:.0} bytes each, {:.2} ms each (mean), metrics threads {:.0} us of CPU per scrape",
                    s.count, s.bytes_mean, s.ms_mean, s.cpu_us_per_scrape
                )),
            ),
        });
    }
    // Authentication's and the window summaries' costs are a few percent, below one pair's
    // run-to-run noise on a shared machine: pairs without and with each, alternated, and the
    // medians compared.
    let keyed = Setup { auth: true, ..Setup::EVENT };
    out.push(alternated(
        agent,
        root.path(),
        "auth",
        Setup::EVENT,
        keyed,
        seconds,
        |p50_without, p50_with, without, with| {
            (
                "event mode at 10k probes/s, authenticated (fleet key): CPU per completed probe, median".into(),
                format!(
                    "x{:.3} the unauthenticated median ({p50_without:.2} us) of {ROUNDS} alternated pairs each; \
                 runs without {without:.2?}, with {with:.2?}",
                    p50_with / p50_without
                ),
            )
        },
    )?);
    let summarised = Setup { summaries: true, ..Setup::EVENT };
    out.push(alternated(agent, root.path(), "summaries", Setup::EVENT, summarised, seconds, |p50_without, p50_with, without, with| {
        (
            "event mode at 10k probes/s, window summaries on (summary_window_s = 5): CPU per completed probe, median".into(),
            format!(
                "x{:.3} the median without summaries ({p50_without:.2} us) of {ROUNDS} alternated pairs each; \
                 runs without {without:.2?}, with {with:.2?}",
                p50_with / p50_without
            ),
        )
    })?);
    out.push(busy_ceiling(agent, root.path(), seconds)?);
    // RSS with 10k targets at 1/s.
    let m = pair(agent, &root.path().join("rss"), Setup { metrics: true, ..Setup::EVENT }, 10_000, 1.0, seconds)?;
    if let Some(s) = m.scrapes {
        out.push(Figure {
            what: "one /metrics scrape of an agent probing 10k targets under 32 ToRs".into(),
            value: s.bytes_last as f64 / 1024.0,
            unit: "KiB",
            note: format!(
                "{} series (sample lines); {:.2} ms per scrape (mean of {}), {:.0} us of the metrics threads' CPU \
                 per scrape; series grow with target ToRs, not targets",
                s.series_last, s.ms_mean, s.count, s.cpu_us_per_scrape
            ),
        });
    }
    out.push(Figure {
        what: "RSS of an agent probing 10k targets".into(),
        value: m.prober_rss_kib as f64 / 1024.0,
        unit: "MiB",
        note: format!(
            "responder {:.1} MiB; {:.0} probes/s completed",
            m.responder_rss_kib as f64 / 1024.0,
            m.probes_per_s
        ),
    });
    Ok(out)
}

/// The busy-poll ceiling: the most probes/s one busy-polling prober completes with < 1% loss
/// against one busy-polling responder (beyond it the responder's socket overflows, and what
/// "completes" is not a rate anyone would run at). Offered rates double from 25k until one
/// fails, then the gap between the last that passed and the first that failed is halved down
/// to [`CEILING_STEP_K`], and the note names both ends. Why not fixed steps: they report the
/// highest step that passed, so a knee just below a step reads as the step before it, and a
/// knee that moves a few percent between runs reads as two figures far apart.
fn busy_ceiling(agent: &Path, root: &Path, seconds: u64) -> Result<Figure> {
    let mut sweep = Vec::new();
    let mut run = |offered_k: usize| -> Result<(bool, f64)> {
        let m = pair(agent, &root.join(format!("busy{offered_k}")), Setup::BUSY, offered_k, 1000.0, seconds)?;
        let loss = m.lost as f64 / (m.lost as f64 + m.probes_per_s * m.window_s).max(1.0);
        sweep.push(format!("{offered_k}k offered: {:.0}/s, {:.2}% lost", m.probes_per_s, loss * 100.0));
        Ok((loss < 0.01, m.probes_per_s))
    };
    // (offered k, completed/s) of the highest offer that passed; the lowest offer that failed.
    let mut passed: Option<(usize, f64)> = None;
    let mut failed = None;
    let mut offered_k = 25;
    while failed.is_none() && offered_k <= CEILING_MAX_K {
        match run(offered_k)? {
            (true, rate) => passed = Some((offered_k, rate)),
            (false, _) => failed = Some(offered_k),
        }
        offered_k *= 2;
    }
    if let (Some(mut hi), Some((mut lo, _))) = (failed, passed) {
        while hi - lo > CEILING_STEP_K {
            let mid = (lo + hi) / 2;
            match run(mid)? {
                (true, rate) => (lo, passed) = (mid, Some((mid, rate))),
                (false, _) => hi = mid,
            }
        }
        failed = Some(hi);
    }
    let bracket = match (passed, failed) {
        (Some((lo, _)), Some(hi)) => format!("the knee lies between {lo}k and {hi}k offered"),
        (Some(_), None) => format!("no offer up to {CEILING_MAX_K}k failed"),
        (None, _) => "even 25k offered failed".into(),
    };
    Ok(Figure {
        what: "busy-poll: max probes/s with < 1% loss, one prober core".into(),
        value: passed.map(|(_, r)| r).unwrap_or(0.0),
        unit: "probes/s",
        note: format!("{bracket}; {}", sweep.join("; ")),
    })
}

/// The busy-poll ceiling is searched to within this many thousand probes/s offered.
const CEILING_STEP_K: usize = 8;
/// And no higher than this (a ceiling above it is reported as such).
const CEILING_MAX_K: usize = 1600;

/// Pairs per side of an alternated comparison.
const ROUNDS: usize = 4;

/// `ROUNDS` pairs each of `without` and `with`, alternated in the order without, with, with,
/// without, ... so that drift on a shared machine, and any cost of running right after another
/// pair, falls on both sides alike; the figure is `with`'s median CPU per probe, named and
/// noted by `say` from both medians and both sides' runs (sorted).
fn alternated(
    agent: &Path,
    root: &Path,
    name: &str,
    without: Setup,
    with: Setup,
    seconds: u64,
    say: impl Fn(f64, f64, &[f64], &[f64]) -> (String, String),
) -> Result<Figure> {
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        let order = if round % 2 == 0 { [(0, without), (1, with)] } else { [(1, with), (0, without)] };
        for (side, setup) in order {
            let m = pair(agent, &root.join(format!("{name}{round}-{side}")), setup, 100, 100.0, seconds)?;
            if m.lost > 0 {
                bail!("{} probes lost in the {name} comparison ({})", m.lost, ["without", "with"][side]);
            }
            if side == 0 { &mut a } else { &mut b }.push(m.cpu_us_per_probe);
        }
    }
    let p50_without = median(&mut a);
    let p50_with = median(&mut b);
    let (what, note) = say(p50_without, p50_with, &a, &b);
    Ok(Figure { what, value: p50_with, unit: "us", note })
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n.is_multiple_of(2) { (v[n / 2 - 1] + v[n / 2]) / 2.0 } else { v[n / 2] }
}

/// How both agents of a pair run.
#[derive(Clone, Copy)]
struct Setup {
    mode: &'static str,
    coalesce_us: u64,
    source_ports: usize,
    /// Serve /metrics and scrape both agents every second.
    metrics: bool,
    /// Authenticated probes: both agents share a fleet key.
    auth: bool,
    /// Window summaries of 5 s (`summary_window_s`; the agent's default is none).
    summaries: bool,
}

impl Setup {
    const EVENT: Setup =
        Setup { mode: "event", coalesce_us: 0, source_ports: 32, metrics: false, auth: false, summaries: false };
    const BUSY: Setup = Setup { mode: "busy_poll", ..Setup::EVENT };
}

/// What the scraper saw.
#[derive(Clone, Copy, Debug)]
struct Scrapes {
    count: u64,
    bytes_mean: f64,
    ms_mean: f64,
    /// The prober's last scrape: its bytes and sample lines.
    bytes_last: usize,
    series_last: usize,
    /// CPU of the agents' metrics threads per scrape (schedstat).
    cpu_us_per_scrape: f64,
}

/// GET /metrics from `addrs` every second until `stop`.
fn scraper(addrs: Vec<String>, stop: std::sync::Arc<std::sync::atomic::AtomicBool>) -> Result<Scrapes> {
    use std::io::{Read, Write};
    let (mut count, mut bytes, mut secs, mut last) = (0u64, 0usize, 0f64, (0, 0));
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let next = Instant::now() + Duration::from_secs(1);
        for (i, a) in addrs.iter().enumerate() {
            let t = Instant::now();
            let mut s = std::net::TcpStream::connect(a.as_str()).with_context(|| format!("scraping {a}"))?;
            s.write_all(b"GET /metrics HTTP/1.1\r\n\r\n")?;
            let mut body = String::new();
            s.read_to_string(&mut body)?;
            secs += t.elapsed().as_secs_f64();
            if !body.starts_with("HTTP/1.1 200") {
                bail!("scraping {a}: {}", body.lines().next().unwrap_or_default());
            }
            count += 1;
            let exposition = body.split_once("\r\n\r\n").map_or("", |(_, b)| b);
            bytes += exposition.len();
            if i == 0 {
                last = (exposition.len(), exposition.lines().filter(|l| !l.starts_with('#')).count());
            }
        }
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
    }
    let n = count.max(1) as f64;
    Ok(Scrapes {
        count,
        bytes_mean: bytes as f64 / n,
        ms_mean: secs * 1e3 / n,
        bytes_last: last.0,
        series_last: last.1,
        cpu_us_per_scrape: 0.0,
    })
}

struct Measured {
    window_s: f64,
    cpu_us_per_probe: f64,
    cpu_share: f64,
    probes_per_s: f64,
    lost: u64,
    rtt_ns_p50: i64,
    responder_delay_ns_p50: i64,
    prober_rss_kib: u64,
    responder_rss_kib: u64,
    scrapes: Option<Scrapes>,
}

/// A prober agent (core 0) with `targets` targets at `rate_pps`, all answered by a responder
/// agent (core 1); measured over the middle of a `seconds`-long run.
fn pair(agent: &Path, dir: &Path, setup: Setup, targets: usize, rate_pps: f64, seconds: u64) -> Result<Measured> {
    let mode = setup.mode;
    let prober_ip = "127.0.50.1";
    let responder_ip = "127.0.50.2";
    let prober_cfg = write_agent(dir, "prober", prober_ip, 0, setup, targets, responder_ip, rate_pps)?;
    let responder_cfg = write_agent(dir, "responder", responder_ip, 1, setup, 0, prober_ip, rate_pps)?;
    let mut responder = spawn(agent, &responder_cfg, seconds + 2)?;
    std::thread::sleep(Duration::from_millis(300));
    let mut prober = spawn(agent, &prober_cfg, seconds)?;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let scraping = setup.metrics.then(|| {
        let addrs = vec![format!("{prober_ip}:{}", PORT + 1), format!("{responder_ip}:{}", PORT + 1)];
        let stop = stop.clone();
        // The prober's endpoint is up once its process has started (bound before the shards).
        std::thread::sleep(Duration::from_millis(200));
        std::thread::spawn(move || scraper(addrs, stop))
    });
    // Skip start-up (one second), measure until one second before the end.
    std::thread::sleep(Duration::from_secs(1));
    let t0 = Instant::now();
    let wall0 = now_unix_ns();
    let cpu0 = cpu_ticks(prober.id())? + cpu_ticks(responder.id())?;
    std::thread::sleep(Duration::from_secs(seconds.saturating_sub(2).max(1)));
    let cpu1 = cpu_ticks(prober.id())? + cpu_ticks(responder.id())?;
    let wall1 = now_unix_ns();
    let window_s = t0.elapsed().as_secs_f64();
    let prober_rss_kib = rss_kib(prober.id())?;
    let responder_rss_kib = rss_kib(responder.id())?;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let scrapes = match scraping {
        Some(t) => {
            let mut s = t.join().map_err(|_| anyhow::anyhow!("the scraper thread panicked"))??;
            let ns = thread_cpu_ns(prober.id(), "metrics")? + thread_cpu_ns(responder.id(), "metrics")?;
            s.cpu_us_per_scrape = ns as f64 / 1e3 / s.count.max(1) as f64;
            Some(s)
        }
        None => None,
    };
    wait_ok(&mut prober, "prober")?;
    wait_ok(&mut responder, "responder")?;

    let (ok, lost, rtt_ns_p50, responder_delay_ns_p50) =
        count_in_window(&dir.join("prober/segments/lo"), wall0, wall1)?;
    // SAFETY: sysconf has no preconditions.
    let ticks_per_s = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let cpu_s = (cpu1 - cpu0) as f64 / ticks_per_s;
    if ok == 0 {
        bail!("no probe completed in the measurement window ({mode}, {targets} targets)");
    }
    Ok(Measured {
        window_s,
        cpu_us_per_probe: cpu_s * 1e6 / ok as f64,
        cpu_share: cpu_s / window_s,
        probes_per_s: ok as f64 / window_s,
        lost,
        rtt_ns_p50,
        responder_delay_ns_p50,
        prober_rss_kib,
        responder_rss_kib,
        scrapes,
    })
}

#[allow(clippy::too_many_arguments)]
fn write_agent(
    dir: &Path,
    name: &str,
    ip: &str,
    core: usize,
    setup: Setup,
    targets: usize,
    target_ip: &str,
    rate_pps: f64,
) -> Result<PathBuf> {
    let d = dir.join(name);
    std::fs::create_dir_all(&d)?;
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let cfg = format!(
        "host = \"{name}\"\npinglist = \"pinglist.toml\"\nsegment_dir = \"segments\"\nmode = \"{}\"\n\
         event_coalesce_us = {}\nflush_interval_ms = 1000\nstats_interval_s = 0\nsummary_window_s = {}\n[[shard]]\ndevice = \"lo\"\nbind = \"{ip}:{PORT}\"\ncore = {}\nsource_ports = {}\n",
        setup.mode,
        setup.coalesce_us,
        if setup.summaries { rocemesh_formats::window::DEFAULT_WINDOW_S } else { 0 },
        core % cores,
        setup.source_ports
    );
    let cfg = if setup.metrics { format!("{cfg}[metrics]\nlisten = \"{ip}:{}\"\n", PORT + 1) } else { cfg };
    let cfg = if setup.auth {
        let mut keys = rocemesh_formats::keys::FleetKeys::new();
        keys.rotate(0, 0, [0x3c; 32]).map_err(|e| anyhow::anyhow!("{e}"))?;
        let path = d.join(rocemesh_formats::keys::FILE_NAME);
        std::fs::write(&path, keys.to_toml_string()?)?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
        format!("{cfg}[auth]\nkeys = \"{}\"\n", rocemesh_formats::keys::FILE_NAME)
    } else {
        cfg
    };
    let pl = Pinglist {
        version: 1,
        host: name.into(),
        generation: 1,
        generated_unix_ns: 0,
        timeout_ms: 500,
        targets: (0..targets)
            .map(|i| Target {
                from: "lo".into(),
                to: format!("t{i}/lo"),
                tor: format!("tor{}", i % 32),
                kind: ProbeKind::TorMesh,
                addr: target_ip.parse().expect("literal address"),
                port: Some(PORT),
                qpn: None,
                rate_pps,
                flow_labels: vec![1 + (i as u32 % 16)],
            })
            .collect(),
    };
    std::fs::write(d.join("pinglist.toml"), pl.to_toml_string()?)?;
    let path = d.join("agent.toml");
    std::fs::write(&path, cfg)?;
    Ok(path)
}

fn spawn(agent: &Path, cfg: &Path, seconds: u64) -> Result<Child> {
    Command::new(agent)
        .args(["run", "--config"])
        .arg(cfg)
        .args(["--duration-s", &seconds.to_string()])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {}", agent.display()))
}

fn wait_ok(child: &mut Child, what: &str) -> Result<()> {
    let status = child.wait()?;
    if !status.success() {
        let mut err = String::new();
        if let Some(mut e) = child.stderr.take() {
            std::io::Read::read_to_string(&mut e, &mut err)?;
        }
        bail!("{what} agent failed ({status}):\n{err}");
    }
    Ok(())
}

/// Ok and lost probes sent in the window, and the medians of the ok ones' network RTT and
/// responder delay (ns).
fn count_in_window(dir: &Path, from_ns: u64, to_ns: u64) -> Result<(u64, u64, i64, i64)> {
    let (mut ok, mut lost) = (0, 0);
    let (mut rtts, mut responder) = (Vec::new(), Vec::new());
    for e in std::fs::read_dir(dir).with_context(|| format!("list {}", dir.display()))? {
        let r = SegmentReader::open(e?.path())?;
        for c in r.probe_chunks() {
            for i in 0..c.len() {
                let t = c.t1_unix_ns[i].to_native();
                if t < from_ns || t >= to_ns {
                    continue;
                }
                match Outcome::from_u8(c.outcome[i]) {
                    Some(Outcome::Ok) => {
                        ok += 1;
                        rtts.push(i64::from(c.network_rtt_ns[i].to_native()));
                        responder.push(i64::from(c.responder_delay_ns[i].to_native()));
                    }
                    Some(Outcome::Lost) => lost += 1,
                    _ => {}
                }
            }
        }
    }
    let median = |v: &mut Vec<i64>| -> i64 {
        v.sort_unstable();
        v.get(v.len() / 2).copied().unwrap_or(0)
    };
    Ok((ok, lost, median(&mut rtts), median(&mut responder)))
}

/// utime + stime of a process, in clock ticks.
fn cpu_ticks(pid: u32) -> Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).context("/proc stat format")?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    Ok(f[11].parse::<u64>()? + f[12].parse::<u64>()?)
}

/// Nanoseconds on CPU of `pid`'s threads named `name` (schedstat: exact, not in ticks).
fn thread_cpu_ns(pid: u32, name: &str) -> Result<u64> {
    let mut ns = 0;
    for t in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        let dir = t?.path();
        if std::fs::read_to_string(dir.join("comm")).is_ok_and(|c| c.trim() == name) {
            let stat = std::fs::read_to_string(dir.join("schedstat"))?;
            ns += stat.split_whitespace().next().context("schedstat format")?.parse::<u64>()?;
        }
    }
    Ok(ns)
}

fn rss_kib(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).context("VmRSS")?;
    Ok(line.split_whitespace().nth(1).context("VmRSS value")?.parse()?)
}

fn now_unix_ns() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0)
}

/// CPU (user+sys of this process) per round trip of a blocking 64-byte UDP ping-pong.
fn pingpong_cpu_us(rounds: u64) -> Result<f64> {
    let a = UdpSocket::bind("127.0.0.1:0")?;
    let b = UdpSocket::bind("127.0.0.1:0")?;
    let (a_addr, b_addr) = (a.local_addr()?, b.local_addr()?);
    let echo = std::thread::spawn(move || -> std::io::Result<()> {
        let mut buf = [0u8; 64];
        for _ in 0..rounds {
            let (n, from) = b.recv_from(&mut buf)?;
            b.send_to(&buf[..n], from)?;
        }
        Ok(())
    });
    let before = self_cpu_s();
    let mut buf = [0u8; 64];
    for _ in 0..rounds {
        a.send_to(&[7u8; 64], b_addr)?;
        a.recv_from(&mut buf)?;
    }
    echo.join().map_err(|_| anyhow::anyhow!("echo thread panicked"))??;
    let _ = a_addr;
    Ok((self_cpu_s() - before) * 1e6 / rounds as f64)
}

fn self_cpu_s() -> f64 {
    // SAFETY: getrusage writes into the zeroed struct we own.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &raw mut u) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(u.ru_utime) + tv(u.ru_stime)
}
