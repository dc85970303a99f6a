//! `/metrics`: the agent's live view for Prometheus, on its own thread (never a shard's core).
//!
//! Every scrape reads what the shards publish ([`crate::live`]), the agent-wide counters of the
//! watcher and sealer threads, the segment directories' sizes, and the RNICs' hardware and PFC
//! counters ([`crate::hwcounters`]), and writes them in the OpenMetrics text format with the
//! `prometheus-client` crate. Metric names and label sets are listed in `deploy/README.md`; the
//! dashboard and alert rules in `deploy/` use only those.
//!
//! The HTTP side is deliberately small: one thread, one connection at a time, a request of at
//! most 8 KiB read within 2 s (the whole request, however it trickles in), `GET`/`HEAD` of
//! `/metrics` and nothing else, an answer taken within 5 s, `Connection: close`. A client that
//! sends garbage, stalls or trickles costs at most those 7 s and is counted in
//! `rocemesh_metrics_requests_total{code}`; it cannot make the agent allocate without bound or
//! start threads.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use crate::hwcounters::{HwCounters, PFC_PREFIX, PortSample};
use crate::live::{AgentCounters, BOUNDS_NS, CLASSES, HistogramSnapshot, LiveShard};
use crate::stats::ShardStats;
use crate::transport::{DropReason, TRANSPORT_ERROR_KINDS};

/// Longest a client may take to send its whole request (not each read: a client that trickles a
/// byte a second would otherwise hold the only serving thread for as long as it likes).
const READ_TIMEOUT: Duration = Duration::from_secs(2);
/// Longest a client may take to read the whole answer.
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest request head read.
const MAX_REQUEST_BYTES: usize = 8192;
/// The content type of the OpenMetrics text format (Prometheus asks for it and parses it).
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// What the exporter reads from.
#[derive(Debug, Clone)]
pub struct Sources {
    /// This host's inventory name.
    pub host: String,
    /// "event" or "busy_poll".
    pub mode: String,
    /// Each shard's live state and segment directory.
    pub shards: Vec<(Arc<LiveShard>, PathBuf)>,
    /// Watcher and sealer counters.
    pub agent: Arc<AgentCounters>,
    /// Root of sysfs (normally `/sys`).
    pub sysfs: PathBuf,
    /// Prefix of the RNIC counters' names (`node_infiniband`: node_exporter's).
    pub infiniband_prefix: String,
}

/// The collector behind `/metrics`.
#[derive(Debug)]
pub struct AgentCollector {
    src: Sources,
    started_unix_s: f64,
    hw: Mutex<HwCounters>,
    requests: Arc<[AtomicU64; 4]>,
}

/// `code` label values of `rocemesh_metrics_requests_total`, indexed as the request counters.
const CODES: [&str; 4] = ["200", "400", "404", "405"];

impl AgentCollector {
    /// A collector over `src`.
    pub fn new(src: Sources) -> Self {
        let devices = src.shards.iter().map(|(l, _)| l.device.clone()).collect();
        let hw = Mutex::new(HwCounters::new(&src.sysfs, devices));
        Self { src, started_unix_s: crate::clock::now_ns() as f64 / 1e9, hw, requests: Arc::new(Default::default()) }
    }
}

/// One metric family: its samples' label sets and values.
struct Family<V> {
    name: String,
    help: &'static str,
    kind: MetricType,
    samples: Vec<(Vec<(&'static str, String)>, V)>,
}

impl<V> Family<V> {
    fn new(name: impl Into<String>, help: &'static str, kind: MetricType) -> Self {
        Self { name: name.into(), help, kind, samples: Vec::new() }
    }

    fn add(&mut self, labels: Vec<(&'static str, String)>, v: V) {
        self.samples.push((labels, v));
    }
}

fn write_family(enc: &mut DescriptorEncoder, f: &Family<f64>) -> std::fmt::Result {
    if f.samples.is_empty() {
        return Ok(());
    }
    let mut me = enc.encode_descriptor(&f.name, f.help, None, f.kind)?;
    for (labels, v) in &f.samples {
        let mut m = me.encode_family(labels)?;
        // Counts are written as integers ("61", not "61.0"): a quarter shorter scrapes.
        let whole = v.fract() == 0.0 && v.abs() < 9.0e15;
        match (f.kind, whole) {
            (MetricType::Counter, true) => m.encode_counter::<NoLabelSet, _, f64>(&(*v as u64), None)?,
            (MetricType::Counter, false) => m.encode_counter::<NoLabelSet, _, f64>(v, None)?,
            (_, true) => m.encode_gauge(&(*v as i64))?,
            (_, false) => m.encode_gauge(v)?,
        }
    }
    Ok(())
}

fn write_histograms(enc: &mut DescriptorEncoder, f: &Family<HistogramSnapshot>) -> std::fmt::Result {
    if f.samples.is_empty() {
        return Ok(());
    }
    let mut me = enc.encode_descriptor(&f.name, f.help, None, MetricType::Histogram)?;
    for (labels, h) in &f.samples {
        let mut buckets = [(0.0, 0u64); crate::live::BUCKETS];
        for (i, b) in buckets.iter_mut().enumerate() {
            let bound = BOUNDS_NS.get(i).map_or(f64::INFINITY, |&ns| ns as f64 / 1e9);
            *b = (bound, h.buckets[i]);
        }
        // The count is the buckets' sum, so that +Inf and _count agree even if a probe landed
        // between the reads.
        me.encode_family(labels)?.encode_histogram::<NoLabelSet>(h.sum_ns as f64 / 1e9, h.count(), &buckets, None)?;
    }
    Ok(())
}

fn l(pairs: &[(&'static str, &str)]) -> Vec<(&'static str, String)> {
    pairs.iter().map(|(k, v)| (*k, (*v).to_owned())).collect()
}

/// A counter family named `rocemesh_{n}`.
fn counter_family(n: &str, help: &'static str) -> Family<f64> {
    Family::new(format!("rocemesh_{n}"), help, MetricType::Counter)
}

/// A gauge family named `rocemesh_{n}`.
fn gauge_family(n: &str, help: &'static str) -> Family<f64> {
    Family::new(format!("rocemesh_{n}"), help, MetricType::Gauge)
}

impl Collector for AgentCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> std::fmt::Result {
        let agent_families = self.agent_families();
        let shards = self.shard_families();
        for f in agent_families.iter().chain(shards.scalars()) {
            write_family(&mut enc, f)?;
        }
        write_histograms(&mut enc, &shards.rtt)?;
        write_histograms(&mut enc, &shards.delay)?;
        self.encode_hw_counters(&mut enc)?;
        write_family(&mut enc, &self.requests_family())
    }
}

impl AgentCollector {
    /// The agent-wide families (identity, start time, watcher and sealer counters), one sample each.
    fn agent_families(&self) -> [Family<f64>; 10] {
        let mut info = gauge_family("agent_info", "The agent's host, version and mode; always 1.");
        info.add(l(&[("host", &self.src.host), ("version", env!("CARGO_PKG_VERSION")), ("mode", &self.src.mode)]), 1.0);
        let mut start = gauge_family("agent_start_timestamp_seconds", "When the agent started, Unix seconds.");
        start.add(Vec::new(), self.started_unix_s);
        let a = &self.src.agent;
        let agent_counter = |n: &str, h: &'static str, v: &AtomicU64| {
            let mut f = counter_family(n, h);
            f.add(Vec::new(), v.load(Ordering::Relaxed) as f64);
            f
        };
        [
            info,
            start,
            agent_counter(
                "pinglist_reloads",
                "New pinglists taken (valid versions published to the shards).",
                &a.pinglist_reloads,
            ),
            agent_counter(
                "pinglist_reload_errors",
                "New pinglist versions refused as invalid; the previous one stays in force.",
                &a.pinglist_reload_errors,
            ),
            agent_counter(
                "auth_key_reloads",
                "New fleet key files taken (valid versions published to the shards).",
                &a.keys_reloads,
            ),
            agent_counter(
                "auth_key_reload_errors",
                "New fleet key files refused (invalid, or readable by others); the keys in force stay.",
                &a.keys_reload_errors,
            ),
            agent_counter("segments_sealed", "Segments sealed (zstd) for shipping.", &a.segments_sealed),
            agent_counter("segment_seal_errors", "Seals that failed; the open segment is kept.", &a.seal_errors),
            agent_counter("segment_evictions", "Sealed segments evicted by the disk quota.", &a.evictions),
            agent_counter(
                "segment_evicted_bytes",
                "Bytes of sealed segments evicted by the disk quota.",
                &a.evicted_bytes,
            ),
        ]
    }

    /// Every shard's samples, shard by shard in configuration order.
    fn shard_families(&self) -> ShardFamilies {
        let mut families = ShardFamilies::new();
        for (live, dir) in &self.src.shards {
            families.add_shard(live, dir);
        }
        families
    }

    /// The RNICs' hardware and PFC counters, read at this scrape.
    fn encode_hw_counters(&self, enc: &mut DescriptorEncoder) -> std::fmt::Result {
        let ports = self.hw.lock().unwrap_or_else(std::sync::PoisonError::into_inner).read();
        for f in hw_families(&ports, &self.src.infiniband_prefix) {
            write_family(enc, &f)?;
        }
        Ok(())
    }

    /// `rocemesh_metrics_requests_total`, read last of all: it counts the requests answered so far.
    fn requests_family(&self) -> Family<f64> {
        let mut req = counter_family(
            "metrics_requests",
            "Requests to this endpoint, by HTTP status (400: malformed or too slow).",
        );
        for (code, n) in CODES.iter().zip(self.requests.iter()) {
            req.add(l(&[("code", code)]), n.load(Ordering::Relaxed) as f64);
        }
        req
    }
}

/// The per-shard families: every shard adds its samples, then they are written in the order
/// [`ShardFamilies::scalars`] gives, the histograms after them.
struct ShardFamilies {
    probes: Family<f64>,
    rtt: Family<HistogramSnapshot>,
    delay: Family<HistogramSnapshot>,
    sent: Family<f64>,
    skipped: Family<f64>,
    answered: Family<f64>,
    ignored: Family<f64>,
    refused: Family<f64>,
    refusals: Family<f64>,
    auth_refused_probes: Family<f64>,
    send_key: Family<f64>,
    drops: Family<f64>,
    errors: Family<f64>,
    dropped: Family<f64>,
    generation: Family<f64>,
    generated: Family<f64>,
    loaded: Family<f64>,
    targets: Family<f64>,
    up: Family<f64>,
    store: Family<f64>,
    services: Family<f64>,
}

impl ShardFamilies {
    /// The families, still empty, with the names and help texts `deploy/README.md` lists.
    fn new() -> Self {
        let (c, g) = (counter_family, gauge_family);
        Self {
            probes: c("probes", "Probes by target ToR and outcome; loss ratio = lost / (ok + partial + lost)."),
            rtt: Family::new(
                "rocemesh_probe_rtt_seconds",
                "Network RTT of ok probes (six-timestamp: host delays removed), by target ToR.",
                MetricType::Histogram,
            ),
            delay: Family::new(
                "rocemesh_probe_host_delay_seconds",
                "Host delays of ok probes: this prober's, and its responders'.",
                MetricType::Histogram,
            ),
            sent: c("probes_sent", "Probes handed to the transport."),
            skipped: c(
                "probe_slots_skipped",
                "Probe slots given up because the shard fell over 24 ms behind its schedule (its host froze it, \
                 or its core was taken): the cadence restarted instead of firing the backlog.",
            ),
            answered: c("probes_answered", "Other agents' probes answered."),
            ignored: c("packets_ignored", "Received packets that were no answer to a probe in flight, by reason."),
            refused: c(
                "auth_refused",
                "Packets refused by probe authentication, by reason: never matched to a probe; a probe refused \
                 for its keying alone (unauthenticated, unknown_key) gets a REFUSAL.",
            ),
            refusals: c(
                "auth_refusals",
                "REFUSALs sent to probers keyed otherwise (result=sent), and those the rate limit held back (held).",
            ),
            auth_refused_probes: c(
                "probes_auth_refused",
                "This shard's probes recorded auth_refused: the target is alive but keyed otherwise (a key push \
                 missed one of the two hosts); never counted as loss.",
            ),
            send_key: g("auth_send_key_id", "Id of the fleet key this shard seals packets with; -1: unauthenticated."),
            drops: c("local_drops", "Probes that never left this host, by reason (never counted as loss)."),
            errors: c("errors", "Errors the shard survived, by kind (each also logged with its message)."),
            dropped: c("records_dropped", "Probe records the segment writer could not store (disk full, I/O error)."),
            generation: g("pinglist_generation", "Generation of the pinglist in force."),
            generated: g("pinglist_generated_timestamp_seconds", "When ctl generated the pinglist in force."),
            loaded: g("pinglist_loaded_timestamp_seconds", "When this shard loaded the pinglist in force."),
            targets: g("pinglist_targets", "Targets the pinglist in force gives this shard."),
            up: g("device_up", "1 while the shard's device is usable (verbs: present, QP working)."),
            store: g("segment_store_bytes", "Bytes of this shard's segment files on disk (open and sealed)."),
            services: g("service_targets", "Traced service connections probed now."),
        }
    }

    /// The non-histogram families in exposition order.
    fn scalars(&self) -> [&Family<f64>; 19] {
        [
            &self.probes,
            &self.sent,
            &self.skipped,
            &self.answered,
            &self.ignored,
            &self.refused,
            &self.refusals,
            &self.auth_refused_probes,
            &self.send_key,
            &self.drops,
            &self.errors,
            &self.dropped,
            &self.generation,
            &self.generated,
            &self.loaded,
            &self.targets,
            &self.up,
            &self.store,
            &self.services,
        ]
    }

    /// Adds one shard's samples to every family, reading its live state in a fixed order.
    fn add_shard(&mut self, live: &LiveShard, dir: &Path) {
        self.add_probe_figures(live);
        let s = live.stats();
        self.add_shard_counters(live, &s);
        self.add_pinglist_and_health(live, dir, &s);
    }

    /// Outcomes and RTTs per target ToR, and the host delay histograms.
    fn add_probe_figures(&mut self, live: &LiveShard) {
        for t in live.tors() {
            for (i, class) in CLASSES.iter().enumerate() {
                let mut lab = shard_labels_with(live, "target_tor", &t.name);
                lab.push(("outcome", class.name().to_owned()));
                self.probes.add(lab, t.outcomes[i] as f64);
            }
            self.rtt.add(shard_labels_with(live, "target_tor", &t.name), t.rtt);
        }
        let [pd, rd] = live.host_delays();
        self.delay.add(shard_labels_with(live, "side", "prober"), pd);
        self.delay.add(shard_labels_with(live, "side", "responder"), rd);
    }

    /// The counters the shard last published: traffic, refusals, drops and errors.
    fn add_shard_counters(&mut self, live: &LiveShard, s: &ShardStats) {
        let base = || shard_labels(live);
        let with = |k: &'static str, v: &str| shard_labels_with(live, k, v);
        self.sent.add(base(), s.probes_sent as f64);
        self.skipped.add(base(), s.slots_skipped as f64);
        self.answered.add(base(), s.answered as f64);
        for (reason, v) in [
            ("malformed", s.malformed),
            ("unknown", s.unknown),
            ("late", s.late),
            ("trace_arrival", s.trace_arrivals),
            ("duplicate_ack", s.duplicate_acks),
            ("refusal_ignored", s.auth_refusals_ignored),
        ] {
            self.ignored.add(with("reason", reason), v as f64);
        }
        for (reason, v) in crate::auth::AuthRefusal::NAMES.iter().zip(s.auth_refused) {
            self.refused.add(with("reason", reason), v as f64);
        }
        self.refusals.add(with("result", "sent"), s.refusals_sent as f64);
        self.refusals.add(with("result", "held"), s.refusals_held as f64);
        self.auth_refused_probes.add(base(), s.probes_auth_refused as f64);
        self.send_key.add(base(), s.send_key_id.map_or(-1.0, f64::from));
        for (reason, v) in DropReason::NAMES.iter().zip(s.local_drops) {
            self.drops.add(with("reason", reason), v as f64);
        }
        for (kind, v) in [
            ("recv", s.recv_errors),
            ("tx_timestamps", s.tx_stamp_errors),
            ("segment_write", s.write_errors),
            ("ack_not_sent", s.acks_not_sent),
        ] {
            self.errors.add(with("kind", kind), v as f64);
        }
        for (kind, v) in TRANSPORT_ERROR_KINDS.iter().zip(s.transport_errors) {
            self.errors.add(with("kind", kind), v as f64);
        }
        self.dropped.add(base(), s.records_dropped as f64);
    }

    /// The pinglist in force, the device's state, the segment store and the traced services.
    fn add_pinglist_and_health(&mut self, live: &LiveShard, dir: &Path, s: &ShardStats) {
        let base = || shard_labels(live);
        let p = live.pinglist();
        self.generation.add(base(), p.generation as f64);
        self.generated.add(base(), p.generated_unix_ns as f64 / 1e9);
        self.loaded.add(base(), p.loaded_unix_ns as f64 / 1e9);
        self.targets.add(base(), p.targets as f64);
        self.up.add(base(), if live.device_up() { 1.0 } else { 0.0 });
        self.store.add(base(), dir_bytes(dir) as f64);
        self.services.add(base(), s.services.active as f64);
    }
}

/// A shard's own labels: its device and ToR.
fn shard_labels(live: &LiveShard) -> Vec<(&'static str, String)> {
    l(&[("device", live.device.as_str()), ("tor", live.tor.as_str())])
}

/// A shard's own labels and one more after them.
fn shard_labels_with(live: &LiveShard, k: &'static str, v: &str) -> Vec<(&'static str, String)> {
    let mut b = shard_labels(live);
    b.push((k, v.to_owned()));
    b
}

/// The RNIC counters as families: one per name, every (device, port) in it.
fn hw_families(ports: &[PortSample], prefix: &str) -> Vec<Family<f64>> {
    let mut by_name: std::collections::BTreeMap<(String, bool), Family<f64>> = std::collections::BTreeMap::new();
    let mut add = |name: String, help: &'static str, kind: MetricType, labels: Vec<(&'static str, String)>, v: f64| {
        let gauge = !matches!(kind, MetricType::Counter);
        by_name.entry((name.clone(), gauge)).or_insert_with(|| Family::new(name, help, kind)).add(labels, v);
    };
    for p in ports {
        let base = || l(&[("device", &p.device), ("port", &p.port)]);
        for (name, v) in &p.gauges {
            add(format!("{prefix}_{name}"), "RDMA port state (sysfs).", MetricType::Gauge, base(), *v);
        }
        for cs in &p.counters {
            let help = "RDMA port counter (sysfs counters/ or hw_counters/).";
            add(format!("{prefix}_{}", cs.name), help, MetricType::Counter, base(), cs.value);
        }
        for cs in &p.pfc {
            let mut lab = base();
            lab.extend(cs.labels.iter().cloned());
            let help = "PFC / link pause from the port's netdev ethtool statistics.";
            add(format!("{PFC_PREFIX}_{}", cs.name), help, MetricType::Counter, lab, cs.value);
        }
        let help_r = "RNIC counters that went backwards (device reset); exported counters continue.";
        add("rocemesh_hw_counter_resets".into(), help_r, MetricType::Counter, base(), p.resets as f64);
        let help_e = "RNIC counter files that could not be read (device removed, garbage).";
        add("rocemesh_hw_counter_read_errors".into(), help_e, MetricType::Counter, base(), p.read_errors as f64);
    }
    by_name.into_values().collect()
}

/// Bytes of the files directly in `dir` (a shard's segment directory); 0 if it is not there.
fn dir_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    entries.flatten().filter_map(|e| e.metadata().ok()).filter(|m| m.is_file()).map(|m| m.len()).sum()
}

/// The exposition of `registry`, as served.
pub fn render(registry: &Registry) -> String {
    let mut out = String::with_capacity(64 * 1024);
    // Writing into a String cannot fail; a collector's own error ends the text early, and
    // Prometheus then refuses the scrape (no `# EOF`), which is what should happen.
    if prometheus_client::encoding::text::encode(&mut out, registry).is_err() {
        tracing::error!("encoding the metrics failed; this scrape is incomplete");
    }
    out
}

/// A running `/metrics` endpoint.
#[derive(Debug)]
pub struct Endpoint {
    /// The address it listens on (the configured one, with the port resolved).
    pub addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(200));
        if let Some(t) = self.thread.take()
            && t.join().is_err()
        {
            tracing::error!("the metrics thread panicked");
        }
    }
}

/// Bind `listen` and serve `/metrics` from `src` on a thread of its own.
pub fn spawn(listen: SocketAddr, src: Sources) -> anyhow::Result<Endpoint> {
    let listener = TcpListener::bind(listen).map_err(|e| {
        anyhow::anyhow!(
            "binding the metrics endpoint to {listen} failed: {e} (set `[metrics] listen` in the agent config to a free \
             address, or remove the section to run without /metrics)"
        )
    })?;
    let addr = listener.local_addr()?;
    let collector = AgentCollector::new(src);
    let requests = collector.requests.clone();
    let mut registry = Registry::default();
    registry.register_collector(Box::new(collector));
    let stop = Arc::new(AtomicBool::new(false));
    let thread = {
        let stop = stop.clone();
        std::thread::Builder::new()
            .name("metrics".into())
            .spawn(move || serve(&listener, &registry, &requests, &stop))?
    };
    tracing::info!(%addr, "serving /metrics");
    Ok(Endpoint { addr, stop, thread: Some(thread) })
}

fn serve(listener: &TcpListener, registry: &Registry, requests: &[AtomicU64; 4], stop: &AtomicBool) {
    let mut accept_errors = 0u64;
    for conn in listener.incoming() {
        if stop.load(Ordering::SeqCst) {
            return;
        }
        match conn {
            Ok(stream) => {
                let code = handle(stream, registry);
                if let Some(i) = CODES.iter().position(|c| *c == code) {
                    requests[i].fetch_add(1, Ordering::Relaxed);
                }
            }
            Err(e) => {
                accept_errors += 1;
                if accept_errors.is_power_of_two() {
                    tracing::warn!("accepting a metrics connection failed ({accept_errors} so far): {e}");
                }
                // EMFILE and friends: do not spin.
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

/// Answer one request; returns the status code sent ("" if the client was gone). The request
/// must arrive within [`READ_TIMEOUT`] and the answer leave within [`WRITE_TIMEOUT`], each as a
/// whole: the socket's timeout is set to what is left before every call.
fn handle(mut stream: TcpStream, registry: &Registry) -> &'static str {
    let deadline = Instant::now() + READ_TIMEOUT;
    let mut buf = [0u8; MAX_REQUEST_BYTES];
    let mut len = 0;
    let complete = loop {
        if buf[..len].windows(4).any(|w| w == b"\r\n\r\n") {
            break true;
        }
        if len == buf.len() || !time_left(&stream, deadline, TcpStream::set_read_timeout) {
            break false;
        }
        match stream.read(&mut buf[len..]) {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Ok(0) | Err(_) => break false,
            Ok(n) => len += n,
        }
    };
    let line = buf[..len].split(|&b| b == b'\r').next().unwrap_or_default();
    let mut parts = line.split(|&b| b == b' ');
    let (method, path, version) = (parts.next(), parts.next(), parts.next());
    let valid = complete && version.is_some_and(|v| v.starts_with(b"HTTP/1.")) && parts.next().is_none();
    let (code, reason, body, head_only) = match (valid, method, path) {
        (false, _, _) => ("400", "Bad Request", "bad request\n".to_owned(), false),
        (true, Some(m @ (b"GET" | b"HEAD")), Some(p)) if p == b"/metrics" || p.starts_with(b"/metrics?") => {
            ("200", "OK", render(registry), m == b"HEAD")
        }
        (true, Some(b"GET" | b"HEAD"), _) => {
            ("404", "Not Found", "not found: the agent serves /metrics\n".into(), false)
        }
        (true, _, _) => ("405", "Method Not Allowed", "use GET /metrics\n".into(), false),
    };
    let ctype = if code == "200" { CONTENT_TYPE } else { "text/plain; charset=utf-8" };
    let mut head = format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    if code == "405" {
        head.push_str("Allow: GET, HEAD\r\n");
    }
    head.push_str("\r\n");
    let deadline = Instant::now() + WRITE_TIMEOUT;
    let body = if head_only { "" } else { body.as_str() };
    if !write_by(&mut stream, head.as_bytes(), deadline) || !write_by(&mut stream, body.as_bytes(), deadline) {
        return "";
    }
    code
}

/// Sets the socket's timeout (`set`: read or write) to what is left before `deadline`; false
/// when nothing is.
fn time_left(
    stream: &TcpStream,
    deadline: Instant,
    set: fn(&TcpStream, Option<Duration>) -> std::io::Result<()>,
) -> bool {
    let left = deadline.saturating_duration_since(Instant::now());
    !left.is_zero() && set(stream, Some(left)).is_ok()
}

/// Writes all of `bytes` before `deadline`; false when the client did not take them in time or
/// is gone.
fn write_by(stream: &mut TcpStream, mut bytes: &[u8], deadline: Instant) -> bool {
    while !bytes.is_empty() {
        if !time_left(stream, deadline, TcpStream::set_write_timeout) {
            return false;
        }
        match stream.write(bytes) {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Ok(0) | Err(_) => return false,
            Ok(n) => bytes = &bytes[n..],
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::live::Class;

    fn sources(dir: &Path) -> Sources {
        let live = Arc::new(LiveShard::new("lo0", "tor0"));
        let slot = live.tor_slot("tor1");
        live.probe(slot, Class::Ok, Some((40_000, 3_000, 2_000)));
        live.probe(slot, Class::Ok, Some((600_000, 3_000, 2_000)));
        live.probe(slot, Class::Partial, None);
        live.pinglist_loaded(7, 1_700_000_000_000_000_000, 12);
        Sources {
            host: "h0".into(),
            mode: "event".into(),
            shards: vec![(live, dir.to_owned())],
            agent: Arc::new(AgentCounters::default()),
            sysfs: dir.join("sys"),
            infiniband_prefix: "node_infiniband".into(),
        }
    }

    fn get(addr: SocketAddr, request: &[u8]) -> String {
        let mut s = TcpStream::connect(addr).expect("connect");
        s.write_all(request).expect("send");
        let mut out = String::new();
        s.read_to_string(&mut out).expect("read");
        out
    }

    #[test]
    fn a_scrape_holds_the_probes_per_target_tor_and_ends_with_eof() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ep = spawn("127.0.0.1:0".parse().expect("addr"), sources(dir.path())).expect("spawn");
        let r = get(ep.addr, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(r.starts_with("HTTP/1.1 200 OK\r\n"), "{r}");
        assert!(r.contains(CONTENT_TYPE));
        let line = |prefix: &str| {
            r.lines().find(|l| l.starts_with(prefix)).unwrap_or_else(|| panic!("{prefix} in\n{r}")).to_owned()
        };
        assert!(
            line(r#"rocemesh_probes_total{device="lo0",tor="tor0",target_tor="tor1",outcome="ok"}"#).ends_with(" 2")
        );
        assert!(
            line(r#"rocemesh_probes_total{device="lo0",tor="tor0",target_tor="tor1",outcome="partial"}"#)
                .ends_with(" 1")
        );
        // 40 us is below 500 us, 600 us above: the SLA's bucket holds one of two.
        assert!(
            line(r#"rocemesh_probe_rtt_seconds_bucket{le="0.0005",device="lo0",tor="tor0",target_tor="tor1"}"#)
                .ends_with(" 1")
        );
        assert!(line(r#"rocemesh_probe_rtt_seconds_count{device="lo0",tor="tor0",target_tor="tor1"}"#).ends_with(" 2"));
        assert!(line(r#"rocemesh_pinglist_generation{device="lo0",tor="tor0"}"#).ends_with(" 7"));
        assert!(r.trim_end().ends_with("# EOF"));
        assert!(!r.contains("node_infiniband"), "no RDMA device: no RNIC counters, not zeros");
    }

    #[test]
    fn garbage_wrong_paths_and_methods_get_an_error_and_are_counted() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ep = spawn("127.0.0.1:0".parse().expect("addr"), sources(dir.path())).expect("spawn");
        assert!(get(ep.addr, b"\x00\xff garbage\r\n\r\n").starts_with("HTTP/1.1 400"));
        assert!(get(ep.addr, &[b'A'; MAX_REQUEST_BYTES]).starts_with("HTTP/1.1 400"), "a head that never ends");
        assert!(get(ep.addr, b"GET /secrets HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404"));
        assert!(get(ep.addr, b"POST /metrics HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 405"));
        let head = get(ep.addr, b"HEAD /metrics HTTP/1.0\r\n\r\n");
        assert!(head.starts_with("HTTP/1.1 200") && !head.contains("# EOF"), "HEAD has no body");
        // A client that connects and says nothing holds the thread for the read timeout only.
        let silent = TcpStream::connect(ep.addr).expect("connect");
        let r = get(ep.addr, b"GET /metrics HTTP/1.1\r\n\r\n");
        drop(silent);
        assert!(r.contains(r#"rocemesh_metrics_requests_total{code="400"} 3"#), "garbage, endless, silent: {r}");
        assert!(r.contains(r#"rocemesh_metrics_requests_total{code="404"} 1"#));
        assert!(r.contains(r#"rocemesh_metrics_requests_total{code="405"} 1"#));
    }

    /// Slowloris: a client that sends a byte of its request every 200 ms (well inside a per-read
    /// timeout) is cut off once the request's time is up, so a scrape behind it is answered
    /// while it still trickles; it had held the thread for as long as it kept trickling.
    #[test]
    fn a_trickling_client_cannot_hold_the_thread_past_the_request_deadline() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ep = spawn("127.0.0.1:0".parse().expect("addr"), sources(dir.path())).expect("spawn");
        let scraped = Arc::new(AtomicBool::new(false));
        let trickler = {
            let (addr, scraped) = (ep.addr, scraped.clone());
            std::thread::spawn(move || {
                let mut s = TcpStream::connect(addr).expect("connect");
                // 150 bytes at 200 ms: 30 s, far past the 2 s the whole request may take.
                // It goes on after the server gives up on it (the writes then fail): only the
                // scrape's end stops it.
                for &b in b"GET /metrics HTTP/1.1\r\nX-Slow: ".iter().chain([b'a'; 120].iter()) {
                    if scraped.load(Ordering::SeqCst) {
                        break;
                    }
                    let _ = s.write_all(&[b]);
                    std::thread::sleep(Duration::from_millis(200));
                }
                let mut answer = String::new();
                let _ = s.read_to_string(&mut answer);
                answer
            })
        };
        // The trickler is being served (it connected first) before the scrape connects.
        std::thread::sleep(Duration::from_millis(300));
        let r = get(ep.addr, b"GET /metrics HTTP/1.1\r\n\r\n");
        let done_while_trickling = !trickler.is_finished();
        scraped.store(true, Ordering::SeqCst);
        let cut = trickler.join().expect("trickler");
        assert!(r.starts_with("HTTP/1.1 200"), "{r}");
        assert!(done_while_trickling, "the scrape waited for the trickling client to give up");
        assert!(cut.starts_with("HTTP/1.1 400") || cut.is_empty(), "the trickler is cut off: {cut}");
    }

    #[test]
    fn binding_a_taken_address_names_it_and_the_fix() {
        let dir = tempfile::tempdir().expect("tempdir");
        let taken = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = taken.local_addr().expect("addr");
        let e = spawn(addr, sources(dir.path())).expect_err("in use").to_string();
        assert!(e.contains(&addr.to_string()) && e.contains("[metrics] listen"), "{e}");
    }
}
