//! `bench live`: the live analyzer (`analyze live`, the real binary) fed a simulated fleet's
//! window summaries over loopback UDP, in real time, and whether it keeps up.
//!
//! The fleet: `rnics` one-RNIC hosts, `rnics_per_tor` under each ToR. Each RNIC probes every
//! ToR-mesh peer and [`INTER_TORS`] RNICs in other ToRs over [`LABELS`] flow labels, `pps`
//! probes per second in all, a third of them inter-ToR. Each window, every RNIC's summary (the
//! agent's `WindowSummary`, built here from drawn probes rather than by a shard) is encoded as
//! the agent pushes it (`formats::live::encode`) and sent as agents send theirs: spread over
//! `spread_s` from 1.5 s after the window's end (an agent's grace: probe timeout, flush, a
//! second). One RNIC's link goes down at `fault_window`: from then on every probe it sends or
//! answers is lost (its host, and so its agent, stays up and pushes). A generator thread
//! encodes up to two windows ahead.
//!
//! It keeps up when every window after the analyzer's warm-up goes out complete within the
//! deadline, no push is refused for overload, the dead RNIC is opened and nothing else is.

use std::io::BufRead;
use std::net::UdpSocket;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use rocemesh_formats::inventory::{self, Inventory};
use rocemesh_formats::live::{Name, Sender, encode};
use rocemesh_formats::record::{EndpointRole, TsSource};
use rocemesh_formats::window::{ALL_LABELS, Cell, KeySummary, Measure, WindowSummary, bucket_of};

/// Other ToRs each RNIC probes one RNIC of.
pub const INTER_TORS: u32 = 8;
/// Flow labels an inter-ToR target is probed over, in turn.
pub const LABELS: u32 = 16;

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    pub rnics: u32,
    pub rnics_per_tor: u32,
    pub pps: f64,
    pub windows: u32,
    pub window_s: u64,
    pub deadline_s: f64,
    pub fault_window: u32,
    pub spread_s: f64,
    pub port: u16,
    pub dir: PathBuf,
    pub analyze_bin: PathBuf,
    /// Passed to the analyzer as --http (watch its page during the run).
    pub http: Option<std::net::SocketAddr>,
}

pub use crate::agent::Figure;

/// The fleet's shape, from the options.
#[derive(Clone)]
struct Fleet {
    rnics: u32,
    per_tor: u32,
    mesh_pps: f64,
    inter_pps: f64,
    dead: u32,
}

impl Fleet {
    fn tor(&self, r: u32) -> u32 {
        r / self.per_tor
    }

    fn name(&self, r: u32) -> String {
        format!("{}/rnic0", self.host(r))
    }

    fn host(&self, r: u32) -> String {
        format!("tor{}-h{}", self.tor(r), r % self.per_tor)
    }

    fn ip(r: u32) -> std::net::Ipv4Addr {
        std::net::Ipv4Addr::new(10, (r >> 16) as u8, (r >> 8) as u8, r as u8)
    }

    /// The RNICs `r` probes: its ToR-mesh peers, then one RNIC in each of [`INTER_TORS`] ToRs.
    fn targets(&self, r: u32) -> impl Iterator<Item = (u32, bool)> + '_ {
        let tors = self.rnics / self.per_tor;
        let t = self.tor(r);
        let mesh = (t * self.per_tor..(t + 1) * self.per_tor).filter(move |&p| p != r).map(|p| (p, false));
        let inter = (1..=INTER_TORS.min(tors.saturating_sub(1)))
            .map(move |k| ((t + k * (tors / (INTER_TORS + 1)).max(1)) % tors) * self.per_tor + r % self.per_tor)
            .filter(move |&p| self.tor(p) != t)
            .map(|p| (p, true));
        mesh.chain(inter)
    }

    fn inventory(&self) -> Inventory {
        let tors = self.rnics / self.per_tor;
        let hosts = (0..self.rnics)
            .map(|r| inventory::Host {
                name: self.host(r),
                rnics: vec![inventory::Rnic {
                    device: "rnic0".into(),
                    tor: format!("tor{}", self.tor(r)),
                    ip: Self::ip(r).into(),
                    gid: None,
                    port: 1,
                    gid_index: None,
                    tor_port: None,
                    netdev: None,
                }],
            })
            .collect();
        Inventory {
            version: inventory::VERSION,
            tors: (0..tors)
                .map(|t| inventory::Tor { name: format!("tor{t}"), rail: None, addrs: Vec::new() })
                .collect(),
            spines: Vec::new(),
            links: Vec::new(),
            hosts,
        }
    }
}

/// xorshift64*: fast, and the same fleet on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn uniform(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Probes in a window at `rate`: its integer part, one more with the fraction's chance.
    fn count(&mut self, rate: f64) -> u32 {
        let whole = rate.floor();
        whole as u32 + u32::from(self.uniform() < rate - whole)
    }

    /// A log-normal delay with median `p50_ns` and a sigma of 0.3.
    fn delay(&mut self, p50_ns: f64) -> u64 {
        let (u1, u2) = (self.uniform().max(1e-12), self.uniform());
        let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
        (p50_ns * (0.3 * z).exp()) as u64
    }
}

/// RNIC `r`'s summary of window `w` (its dictionary: 0 itself, 1.. its targets in order).
fn summary(f: &Fleet, r: u32, start_ns: u64, window_ns: u64, dead: bool, rng: &mut Rng) -> WindowSummary {
    let mut s = WindowSummary { start_unix_ns: start_ns, window_ns, ..WindowSummary::default() };
    let secs = window_ns as f64 / 1e9;
    let mut cells: Vec<Cell> = Vec::new();
    for (i, (t, inter)) in f.targets(r).enumerate() {
        let probes = rng.count(if inter { f.inter_pps } else { f.mesh_pps } * secs);
        let labels = if inter { LABELS.min(probes) } else { 1 };
        // Keys go in (target, label) order, their cells after one another: the order a
        // summary keeps and a push's decoder checks.
        let mut flow_labels: Vec<u32> =
            (0..labels).map(|l| if inter { 1000 + (r + l) % LABELS } else { ALL_LABELS }).collect();
        flow_labels.sort_unstable();
        for (l, &flow_label) in (0..labels).zip(&flow_labels) {
            let n = probes / labels + u32::from(l < probes % labels);
            let lost = dead && (t == f.dead || r == f.dead);
            let t1 = |rng: &mut Rng| start_ns + (rng.uniform() * (window_ns - 1) as f64) as u64;
            let (a, b) = (t1(rng), t1(rng));
            let mut k = KeySummary {
                first_t1_ns: a.min(b),
                last_t1_ns: a.max(b),
                first_ok_t1_ns: if lost { u64::MAX } else { a.min(b) },
                prober: 0,
                target: i as u32 + 1,
                flow_label,
                kind: u8::from(inter),
                cells_start: s.cells.len() as u32,
                ..KeySummary::default()
            };
            k.counts[usize::from(lost)] = n;
            cells.clear();
            for _ in 0..if lost { 0 } else { n } {
                let rtt = if inter { 6_000.0 } else { 4_000.0 };
                for (m, v) in
                    [(Measure::NetworkRtt, rtt), (Measure::ProberDelay, 2_000.0), (Measure::ResponderDelay, 1_000.0)]
                {
                    let bucket = bucket_of(rng.delay(v));
                    cells.push(Cell { count: 1, bucket, measure: m as u8, ts_source: TsSource::Nic as u8 });
                }
            }
            cells.sort_unstable_by_key(|c| (c.measure, c.ts_source, c.bucket));
            for c in &cells {
                let mine = s.cells.len() > k.cells_start as usize;
                match s.cells.last_mut() {
                    Some(last)
                        if mine
                            && (last.measure, last.ts_source, last.bucket) == (c.measure, c.ts_source, c.bucket) =>
                    {
                        last.count += 1;
                    }
                    _ => s.cells.push(*c),
                }
            }
            k.cells_len = s.cells.len() as u32 - k.cells_start;
            s.keys.push(k);
        }
    }
    s
}

/// Every push of window `w`, with its planned send time.
fn encode_window(f: &Fleet, o: &Options, w: u32, start_ns: u64) -> Result<Vec<(u64, Vec<u8>)>> {
    let window_ns = o.window_s * 1_000_000_000;
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ (u64::from(w) << 32));
    let dead = w >= o.fault_window;
    let send_from = start_ns + window_ns + 1_500_000_000;
    let spread_ns = (o.spread_s * 1e9) as u64;
    let mut out = Vec::new();
    let mut parts = Vec::new();
    for r in 0..f.rnics {
        let s = summary(f, r, start_ns, window_ns, dead, &mut rng);
        let targets: Vec<u32> = f.targets(r).map(|t| t.0).collect();
        let name_of = |id: u32| {
            let rnic = if id == 0 { r } else { *targets.get(id as usize - 1)? };
            Some(Name {
                id,
                role: EndpointRole::Rnic as u8,
                name: f.name(rnic),
                tor: format!("tor{}", f.tor(rnic)),
                addr: rocemesh_formats::gid::gid_bytes(Fleet::ip(rnic).into()),
            })
        };
        let sender = Sender { host: f.host(r), rnic: f.name(r), tor: format!("tor{}", f.tor(r)), agent_epoch: 1 };
        let at = send_from + (u64::from(r) * spread_ns) / u64::from(f.rnics);
        let mut seq = u64::from(w) * 1_000;
        parts.clear();
        encode(&sender, &mut seq, at, true, &s, &[], &name_of, None, &mut parts)
            .with_context(|| format!("encoding {}'s window {w}", f.name(r)))?;
        out.extend(parts.drain(..).map(|p| (at, p)));
    }
    Ok(out)
}

fn wall_ns() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

/// Runs the bench; returns its figures.
pub fn run(o: &Options) -> Result<Vec<Figure>> {
    ensure!(
        o.rnics_per_tor >= 2 && o.rnics.is_multiple_of(o.rnics_per_tor),
        "--rnics must be a multiple of --rnics-per-tor (at least 2)"
    );
    ensure!(o.rnics / o.rnics_per_tor > INTER_TORS, "the fleet needs more than {INTER_TORS} ToRs");
    let mesh_peers = f64::from(o.rnics_per_tor - 1);
    let f = Fleet {
        rnics: o.rnics,
        per_tor: o.rnics_per_tor,
        mesh_pps: o.pps * 2.0 / 3.0 / mesh_peers,
        inter_pps: o.pps / 3.0 / f64::from(INTER_TORS),
        dead: o.rnics / 2 + 3,
    };
    std::fs::create_dir_all(&o.dir)?;
    let inv_path = o.dir.join("inventory.toml");
    std::fs::write(&inv_path, f.inventory().to_toml_string()?)?;
    let out_path = o.dir.join("live.jsonl");
    let _ = std::fs::remove_file(&out_path);
    let window_ns = o.window_s * 1_000_000_000;
    // The first window starts on a boundary at least 3 s away: the analyzer is up by then.
    let first_ns = (wall_ns() + 3_000_000_000).div_ceil(window_ns) * window_ns;
    let last_send_ns = first_ns + u64::from(o.windows) * window_ns + 1_500_000_000 + (o.spread_s * 1e9) as u64;
    let run_for_s = (last_send_ns - wall_ns()) as f64 / 1e9 + o.deadline_s + 3.0;
    let mut cmd = Command::new(&o.analyze_bin);
    cmd.args(["live", "--listen", &format!("127.0.0.1:{}", o.port), "--window-s", &o.window_s.to_string()])
        .args(["--deadline-s", &o.deadline_s.to_string(), "--for-s", &format!("{run_for_s:.1}")])
        .arg("--inventory")
        .arg(&inv_path)
        .arg("--output")
        .arg(&out_path);
    if let Some(http) = o.http {
        cmd.args(["--http", &http.to_string()]);
    }
    let analyzer = std::thread::spawn(move || crate::analyze::run_timed(&mut cmd, "analyze live"));
    let (tx, rx) = std::sync::mpsc::sync_channel::<Result<(u32, Vec<(u64, Vec<u8>)>)>>(2);
    let generator = {
        let o = o.clone();
        let f = f.clone();
        std::thread::spawn(move || {
            let mut busy = Duration::ZERO;
            for w in 0..o.windows {
                let t = Instant::now();
                let pushes = encode_window(&f, &o, w, first_ns + u64::from(w) * window_ns).map(|p| (w, p));
                busy += t.elapsed();
                if tx.send(pushes).is_err() {
                    break;
                }
            }
            busy
        })
    };
    let sock = UdpSocket::bind("127.0.0.1:0")?;
    let to = format!("127.0.0.1:{}", o.port);
    let (mut sent, mut bytes, mut failed) = (0u64, 0u64, 0u64);
    for batch in rx {
        let (_, pushes) = batch?;
        for (at, p) in &pushes {
            let now = wall_ns();
            if *at > now {
                std::thread::sleep(Duration::from_nanos(at - now));
            }
            match sock.send_to(p, &to) {
                Ok(_) => (sent, bytes) = (sent + 1, bytes + p.len() as u64),
                Err(_) => failed += 1,
            }
        }
    }
    let gen_time = generator.join().map_err(|_| anyhow::anyhow!("generator thread"))?;
    let timed = analyzer.join().map_err(|_| anyhow::anyhow!("analyzer thread"))??;
    report(o, &f, &out_path, &timed, (sent, bytes, failed), gen_time)
}

/// The window, open and problem lines of the analyzer's output.
fn report(
    o: &Options,
    f: &Fleet,
    out: &Path,
    timed: &crate::analyze::Timed,
    (sent, bytes, failed): (u64, u64, u64),
    gen_time: Duration,
) -> Result<Vec<Figure>> {
    let file = std::fs::File::open(out).with_context(|| format!("reading {}", out.display()))?;
    let (mut lags, mut localise, mut incomplete, mut opened, mut problems) = (vec![], vec![], 0, vec![], vec![]);
    for line in std::io::BufReader::new(file).lines() {
        let v: serde_json::Value = serde_json::from_str(&line?)?;
        match v["event"].as_str() {
            Some("window") => {
                lags.push(v["after_end_ms"].as_u64().unwrap_or(0));
                localise.push(v["localise_ms"].as_u64().unwrap_or(0));
                incomplete += u32::from(v["complete"] != true);
            }
            Some("open") => {
                opened.push(format!("{} {}", v["kind"].as_str().unwrap_or(""), v["entity"].as_str().unwrap_or("")))
            }
            Some("problem") => problems.push(format!("{}: {}", v["reason"], v["detail"])),
            _ => {}
        }
    }
    let windows = lags.len();
    // The first three windows wait for the deadline (the analyzer does not know whom to expect).
    let steady: Vec<u64> = lags.iter().skip(3).copied().collect();
    let median = |v: &[u64]| {
        let mut v = v.to_vec();
        v.sort_unstable();
        v.get(v.len() / 2).copied().unwrap_or(0)
    };
    let expect = format!("rnic {}", f.name(f.dead));
    let fig =
        |what: &str, value: f64, unit: &'static str, note: String| Figure { what: what.into(), value, unit, note };
    let keys_guess = f64::from(f.rnics) * (f64::from(f.per_tor - 1) + f64::from(INTER_TORS * LABELS));
    Ok(vec![
        fig("windows localised", windows as f64, "windows", format!("of {}; {incomplete} incomplete", o.windows)),
        fig(
            "lag after window end, median (after warm-up)",
            median(&steady) as f64 / 1e3,
            "s",
            format!("deadline {} s", o.deadline_s),
        ),
        fig(
            "lag after window end, max (after warm-up)",
            steady.iter().max().copied().unwrap_or(0) as f64 / 1e3,
            "s",
            String::new(),
        ),
        fig(
            "localisation per window, median",
            median(&localise) as f64 / 1e3,
            "s",
            format!("max {:.2} s", localise.iter().max().copied().unwrap_or(0) as f64 / 1e3),
        ),
        fig(
            "analyzer CPU per window",
            timed.cpu_s / (timed.wall_s / o.window_s as f64),
            "s",
            format!("{:.2} cores of {} s windows", timed.cpu_s / timed.wall_s, o.window_s),
        ),
        fig("analyzer peak RSS", timed.max_rss_kib as f64 / 1024.0, "MiB", String::new()),
        fig("pushes sent per window", sent as f64 / f64::from(o.windows), "pushes", format!("{failed} sends failed")),
        fig(
            "bytes pushed per window",
            bytes as f64 / f64::from(o.windows) / 1e6,
            "MB",
            format!("about {keys_guess:.0} keys per window"),
        ),
        fig(
            "generator time (encoding, not the analyzer)",
            gen_time.as_secs_f64(),
            "s",
            format!("for {} windows", o.windows),
        ),
        fig("dead RNIC opened", f64::from(u8::from(opened.contains(&expect))), "yes", expect.clone()),
        fig(
            "other findings opened",
            opened.iter().filter(|o| **o != expect).count() as f64,
            "findings",
            opened.iter().filter(|o| **o != expect).cloned().collect::<Vec<_>>().join(", "),
        ),
        fig("problems said", problems.len() as f64, "lines", problems.join("; ")),
    ])
}
