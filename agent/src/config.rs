//! The agent's configuration file (TOML). Every key is documented where it is defined.
//!
//! ```toml
//! host = "tor0-h0"                 # this host's inventory name
//! pinglist = "pinglist.toml"       # relative paths are relative to this file's directory
//! segment_dir = "segments"
//! mode = "event"                   # "event" (wait for packets/deadlines) or "busy_poll" (spin)
//! event_coalesce_us = 0            # event mode: wake at most once per this many us (0 = at once)
//!
//! [[shard]]
//! device = "mlx5_0"                # the pinglist's `from`; also names the segment files
//! tor = "tor0"
//! bind = "10.0.0.1:18515"          # UDP transport: the address this shard probes from and answers on
//! source_ports = 32                # UDP: a target's flow labels leave from up to 32 ports (ECMP)
//! core = 2                         # CPU core the shard is pinned to
//!
//! [[shard]]
//! device = "mlx5_1"                # verbs: the RDMA device (`rdma link` / `ibv_devices` name)
//! transport = "verbs"
//! tor = "tor1"
//! bind = "10.0.1.1:18515"          # verbs: the RNIC's address (selects its RoCEv2 GID) and the
//!                                  # RDMA CM port peers resolve this shard's QPN on
//! core = 3
//! ib_port = 1                      # verbs: device port (default 1)
//! # gid_index = 3                  # verbs: override the GID found from `bind`'s address
//! traffic_class = 106              # verbs: GRH traffic class, DSCP << 2 | ECN (default 106)
//!
//! [service_tracing]                # probe the paths this host's RDMA jobs use (eBPF; root or
//! enabled = true                   # CAP_BPF + CAP_PERFMON). Off by default.
//! probe_pps = 5.0                  # per traced connection
//! max_targets_per_shard = 64       # connections probed at once per RNIC; more are counted, not probed
//! max_new_targets_per_s = 20       # per RNIC: a connection storm is admitted at this rate
//! max_events_per_s = 5000          # tracer intake; a storm beyond it is counted and dropped
//!
//! [metrics]                        # Prometheus: GET /metrics (off unless `listen` is set)
//! listen = "0.0.0.0:9745"
//! infiniband_prefix = "node_infiniband"  # RNIC counters under node_exporter's names
//!
//! [path_tracing]                   # which switches each inter-ToR (target, label) crosses
//! enabled = true                   # (TTL-limited packets, ICMP answers; CAP_NET_RAW). On by default.
//! refresh_s = 300                  # trace every (target, label) again this often
//! min_retrace_interval_s = 10      # after a lost probe, trace that (target, label) again, at most this often
//! traces_per_s = 2.0               # per shard; a trace is max_ttl packets the first time, switches + 1 after
//! max_ttl = 6                      # switches on the longest path + 1 (3-tier Clos: 5 + 1)
//!
//! [live]                           # push each closed window summary to `analyze live` (UDP;
//! collectors = ["10.0.0.100:18620"] # needs summary_window_s > 0). Off unless set.
//!
//! [auth]                           # authenticated probes: the fleet key file ctl pushes
//! keys = "fleet-keys.toml"         # (`ctl keys rotate`); off unless set
//! window_ms = 2000                 # packets stamped further than this from our clock are refused
//! replay_slots = 131072            # replay table per shard: >= 2 x packets received/s x window
//! ```

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// Busy-poll or event-driven shards.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Sleep until a packet arrives or the next probe, timeout or flush is due. Costs almost
    /// nothing when idle; the default, and what a 2-core box or a soft-RoCE testbed wants.
    #[default]
    Event,
    /// Spin on the socket: lowest and steadiest prober delay, one full core per shard.
    BusyPoll,
}

/// The transport a shard probes over.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum TransportKind {
    /// Kernel UDP with SO_TIMESTAMPING software timestamps (hosts and CI without RNICs).
    #[default]
    Udp,
    /// RDMA verbs: one UD queue pair on the RNIC, peers' QPNs resolved through RDMA CM.
    Verbs,
}

/// The whole file.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentConfig {
    /// This host's name in the inventory; with a shard's `device` it names the shard's RNIC
    /// (`host/device`) in every record.
    pub host: String,
    /// The pinglist `ctl` pushes to this host. Reloaded when it changes (inotify); a bad file is
    /// reported and the previous pinglist stays in force. Relative to the config file.
    pub pinglist: PathBuf,
    /// Where each shard writes its segments (one sub-directory per shard). Relative to the config
    /// file.
    pub segment_dir: PathBuf,
    /// Event-driven or busy-poll shards.
    #[serde(default)]
    pub mode: Mode,
    /// Event mode: a shard wakes for packets at most once per this many microseconds and then
    /// handles all that arrived, as a NIC's interrupt moderation does (`rx-usecs`). Network
    /// RTTs do not change (their timestamps are the kernel's or the NIC's, taken on arrival);
    /// the prober and responder delays grow by up to this much. Probes still go out on time.
    /// 0 wakes at once.
    #[serde(default)]
    pub event_coalesce_us: u64,
    /// How often buffered records are written to the segment (ms): the most a crash can lose.
    #[serde(default = "default_flush_interval_ms")]
    pub flush_interval_ms: u64,
    /// Size of each open segment file (MiB).
    #[serde(default = "default_segment_mib")]
    pub segment_mib: u64,
    /// A segment is closed and sealed once its records span this long (s); at most a day
    /// (`ctl collect` dates segments by their first record, and `analyze watch` relies on it).
    #[serde(default = "default_segment_max_age_s")]
    pub segment_max_age_s: u64,
    /// Each shard writes a summary of every window of this many seconds beside its records
    /// (probes by class and RTT histograms per target and flow label, its own schedule slips);
    /// 0 = none, the default: where a key holds about one probe per window (a wide fleet's
    /// inter-ToR labels) they cost more bytes than the records. `analyze localize` reads them
    /// where they are (one read instead of four passes over the records). 5 is
    /// the length they are designed for. The windows start at multiples of it since the Unix
    /// epoch, and it divides an hour, so every agent's windows line up and every hour starts
    /// one.
    #[serde(default)]
    pub summary_window_s: u64,
    /// Disk budget for all of this agent's sealed segments (MiB); the oldest are evicted. Each
    /// shard's open segment (`segment_mib`) comes on top of it.
    #[serde(default = "default_segment_quota_mib")]
    pub segment_quota_mib: u64,
    /// zstd level of sealed segments.
    #[serde(default = "default_zstd_level")]
    pub zstd_level: i32,
    /// How often each shard logs its counters (s); 0 = only at shutdown.
    #[serde(default = "default_stats_interval_s")]
    pub stats_interval_s: u64,
    /// The shards, one per RNIC (UDP: per local address).
    #[serde(rename = "shard")]
    pub shards: Vec<ShardConfig>,
    /// Service tracing: discover this host's RDMA connections and probe their paths.
    #[serde(default)]
    pub service_tracing: ServiceTracing,
    /// Path tracing: the switches each inter-ToR (target, flow label) and each answer crosses.
    #[serde(default)]
    pub path_tracing: PathTracing,
    /// The Prometheus endpoint. Off unless `listen` is set.
    #[serde(default)]
    pub metrics: Metrics,
    /// Live pushes of the window summaries. Off unless `collectors` names one.
    #[serde(default)]
    pub live: LiveConfig,
    /// Probe authentication. Off unless `keys` is set.
    #[serde(default)]
    pub auth: AuthConfig,
    /// One-sided collection: the shards' live view, read by collectors with RDMA READ. Off
    /// unless `allow` names a collector.
    #[serde(default)]
    pub view: ViewConfig,
}

/// `[view]`: every verbs shard keeps its live state (counters, per target ToR the window in
/// progress and the last, host delays, pinglist and health) in a fixed memory region
/// (`rocemesh_formats::view`) and lets the collectors named here read it with RDMA READ over RC
/// queue pairs (`ctl scrape`), so that being observed costs the training node's CPU nothing.
/// UDP shards have no view.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ViewConfig {
    /// Collectors allowed to connect: addresses or prefixes, e.g. ["10.0.9.5", "10.0.9.0/24"].
    /// Empty: no view (the default).
    #[serde(default)]
    pub allow: Vec<String>,
    /// The RDMA CM port (RC) collectors connect to, on each verbs shard's bind address.
    #[serde(default = "default_view_port")]
    pub port: u16,
    /// Length of the view's windows (s), wall-clock aligned as `analyze`'s.
    #[serde(default = "default_view_window_s")]
    pub window_s: u64,
    /// Collectors connected to one shard at once; more are refused.
    #[serde(default = "default_view_max_readers")]
    pub max_readers: usize,
}

impl Default for ViewConfig {
    fn default() -> Self {
        Self {
            allow: Vec::new(),
            port: default_view_port(),
            window_s: default_view_window_s(),
            max_readers: default_view_max_readers(),
        }
    }
}

impl ViewConfig {
    /// Whether any collector may read.
    pub fn enabled(&self) -> bool {
        !self.allow.is_empty()
    }

    /// The allow list as prefixes; the first entry that does not parse is the error.
    pub fn prefixes(&self) -> Result<Vec<Prefix>, String> {
        self.allow.iter().map(|a| Prefix::parse(a)).collect()
    }
}

fn default_view_port() -> u16 {
    18_601
}
fn default_view_window_s() -> u64 {
    10
}
fn default_view_max_readers() -> usize {
    4
}

/// An address prefix of the view's allow list (an address alone is a full-length prefix).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Prefix {
    addr: std::net::IpAddr,
    len: u8,
}

impl Prefix {
    /// "10.0.9.5", "10.0.9.0/24", "fd00::/8".
    pub fn parse(s: &str) -> Result<Self, String> {
        let (a, len) = match s.split_once('/') {
            Some((a, l)) => (a, Some(l)),
            None => (s, None),
        };
        let addr: std::net::IpAddr = a
            .trim()
            .parse()
            .map_err(|_| format!("view.allow entry {s:?} is not an address or prefix (e.g. \"10.0.9.0/24\")"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let len = match len {
            None => max,
            Some(l) => l
                .trim()
                .parse::<u8>()
                .ok()
                .filter(|l| *l <= max)
                .ok_or_else(|| format!("view.allow entry {s:?}: the prefix length must be 0 to {max}"))?,
        };
        Ok(Self { addr, len })
    }

    /// Whether `ip` is inside (an IPv4-mapped IPv6 address counts as its IPv4 address).
    pub fn contains(&self, ip: std::net::IpAddr) -> bool {
        let ip = match ip {
            std::net::IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, std::net::IpAddr::V4),
            v4 => v4,
        };
        let (a, b, bits) = match (self.addr, ip) {
            (std::net::IpAddr::V4(a), std::net::IpAddr::V4(b)) => {
                (u128::from(u32::from(a)), u128::from(u32::from(b)), 32)
            }
            (std::net::IpAddr::V6(a), std::net::IpAddr::V6(b)) => (u128::from(a), u128::from(b), 128),
            _ => return false,
        };
        // A /0 shifts everything out: every address of the family.
        let shift = bits - u32::from(self.len);
        a.checked_shr(shift).unwrap_or(0) == b.checked_shr(shift).unwrap_or(0)
    }
}

/// `[live]`: every shard pushes each window summary its writer closes to these collectors
/// (`analyze live`) as one or more UDP datagrams ([`crate::push`]), sealed with the fleet key
/// when `[auth]` has one. A collector that is down costs a counter (`live_push_failed`).
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct LiveConfig {
    /// Address and port of each collector (`analyze live --listen`; port 18620 by default
    /// there). At most [`MAX_COLLECTORS`]; every push goes to each.
    #[serde(default)]
    pub collectors: Vec<SocketAddr>,
}

/// Collectors a shard pushes to at most: each costs a send per datagram on the shard's core.
pub const MAX_COLLECTORS: usize = 4;

/// `[auth]`: seal every probe and ACK with the fleet key and refuse packets that are not sealed
/// with an accepted key, are forged, replayed, or stamped outside the window
/// ([`crate::auth`]). Every agent of the fleet needs the same key file; `ctl keys rotate`
/// writes it and `ctl push-pinglist` copies it beside each pinglist.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AuthConfig {
    /// The key file (mode 0600; relative to this config). Reloaded when it changes, as the
    /// pinglist is; a bad file is reported and the keys in force stay. Absent: no
    /// authentication (packets are neither sealed nor checked).
    #[serde(default)]
    pub keys: Option<PathBuf>,
    /// A packet whose sender's clock (sealed into it) is further than this from ours is refused
    /// as stale: it bounds how long a captured packet can be replayed, and how far the fleet's
    /// clocks may drift apart (ms). The replay table remembers packets this long.
    #[serde(default = "default_auth_window_ms")]
    pub window_ms: u64,
    /// Slots of each shard's replay table (16 bytes each, allocated when keys are loaded).
    /// Give it at least 2 x the packets a shard receives per second x the window: a probe
    /// received is 1 packet, a probe sent 2 (its ACKs).
    #[serde(default = "default_auth_replay_slots")]
    pub replay_slots: usize,
}

impl Default for AuthConfig {
    fn default() -> Self {
        Self { keys: None, window_ms: default_auth_window_ms(), replay_slots: default_auth_replay_slots() }
    }
}

impl AuthConfig {
    /// What shards run on.
    pub fn params(&self) -> crate::auth::AuthParams {
        crate::auth::AuthParams { window_ns: self.window_ms * 1_000_000, replay_slots: self.replay_slots }
    }
}

fn default_auth_window_ms() -> u64 {
    2_000
}
fn default_auth_replay_slots() -> usize {
    131_072
}

/// `[metrics]`: `GET /metrics` in the OpenMetrics text format, served by a thread of its own:
/// probes by target ToR and outcome, RTT and host-delay histograms, the agent's health, and the
/// RNICs' hardware and PFC counters. Metric names: `deploy/README.md`.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Metrics {
    /// Address and port to serve on, e.g. "0.0.0.0:9745" (or the management network's
    /// address only). Absent: no endpoint.
    #[serde(default)]
    pub listen: Option<SocketAddr>,
    /// Prefix of the RNIC counters' names. The default gives node_exporter's infiniband
    /// collector's names, so dashboards built on them keep working; where node_exporter's own
    /// collector runs too, set "rocemesh_infiniband" (or disable that collector) so that sums
    /// do not count a port twice.
    #[serde(default = "default_infiniband_prefix")]
    pub infiniband_prefix: String,
    /// Where sysfs is mounted (`/sys`; another root for a container that bind-mounts it).
    #[serde(default = "default_sysfs")]
    pub sysfs: PathBuf,
}

impl Default for Metrics {
    fn default() -> Self {
        Self { listen: None, infiniband_prefix: default_infiniband_prefix(), sysfs: default_sysfs() }
    }
}

fn default_infiniband_prefix() -> String {
    "node_infiniband".into()
}
fn default_sysfs() -> PathBuf {
    PathBuf::from("/sys")
}

/// `[path_tracing]`: each shard traces, with its probes' own 5-tuple, the path of every inter-ToR
/// (target, flow label) it probes and of its answers to each (prober, label), and writes what it
/// finds into its segments, so that `analyze localize` can vote on the links and spines lost
/// probes really crossed (see `pathtrace`). Needs CAP_NET_RAW; without it the agent says so once
/// and probes without tracing.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PathTracing {
    /// Trace. On by default: without traces, a fabric with more than one spine per ToR pair
    /// cannot have a lossy link named.
    #[serde(default = "default_true")]
    pub enabled: bool,
    /// Every (target, label) is traced again this often (s), ±12.5%: ECMP paths change when
    /// links come and go.
    #[serde(default = "default_path_refresh_s")]
    pub refresh_s: u64,
    /// A lost probe asks for a fresh trace of its (target, label) at once, but no sooner than
    /// this long (s) after the last one: a lossy path must not turn into a trace storm.
    #[serde(default = "default_path_min_retrace_s")]
    pub min_retrace_interval_s: u64,
    /// Traces a shard starts per second at most (token bucket, burst max(1, rate)). A trace is
    /// max_ttl packets on first use, the path's switches + 1 after.
    #[serde(default = "default_path_traces_per_s")]
    pub traces_per_s: f64,
    /// Highest TTL sent: the longest path's switch count + 1.
    #[serde(default = "default_path_max_ttl")]
    pub max_ttl: u8,
}

impl Default for PathTracing {
    fn default() -> Self {
        Self {
            enabled: true,
            refresh_s: default_path_refresh_s(),
            min_retrace_interval_s: default_path_min_retrace_s(),
            traces_per_s: default_path_traces_per_s(),
            max_ttl: default_path_max_ttl(),
        }
    }
}

impl PathTracing {
    /// The values the tracer runs on.
    pub fn params(&self) -> crate::pathtrace::TraceParams {
        crate::pathtrace::TraceParams {
            refresh_ns: self.refresh_s * 1_000_000_000,
            min_retrace_ns: self.min_retrace_interval_s * 1_000_000_000,
            traces_per_s: self.traces_per_s,
            max_ttl: self.max_ttl,
        }
    }
}

fn default_true() -> bool {
    true
}
fn default_path_refresh_s() -> u64 {
    300
}
fn default_path_min_retrace_s() -> u64 {
    10
}
fn default_path_traces_per_s() -> f64 {
    2.0
}
fn default_path_max_ttl() -> u8 {
    6
}

/// `[service_tracing]`: the eBPF tracer (`rocemesh-bpf`) reports every RDMA QP of this host that
/// reaches RTR; the shard whose RNIC owns the QP's local GID probes the remote GID with the
/// connection's flow label, so along the path its traffic takes, until the QP is destroyed or its
/// process exits. Without the needed capability or kernel support the agent says why and goes on
/// probing its pinglist.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ServiceTracing {
    /// Load the tracer. Needs root, or CAP_BPF and CAP_PERFMON (kernel >= 5.8), and a kernel with
    /// BTF for the RDMA modules.
    #[serde(default)]
    pub enabled: bool,
    /// Probes per second to each traced connection's remote RNIC.
    #[serde(default = "default_service_probe_pps")]
    pub probe_pps: f64,
    /// Traced connections a shard probes at once; a full table refuses (and counts) new ones.
    #[serde(default = "default_service_max_targets")]
    pub max_targets_per_shard: usize,
    /// New service targets a shard takes per second (a token bucket with this burst): thousands
    /// of short-lived QPs must not turn into thousands of dictionary entries and probes.
    #[serde(default = "default_service_new_per_s")]
    pub max_new_targets_per_s: f64,
    /// Tracer events the agent reads per second at most; the rest are counted as dropped.
    #[serde(default = "default_service_events_per_s")]
    pub max_events_per_s: f64,
}

impl Default for ServiceTracing {
    fn default() -> Self {
        Self {
            enabled: false,
            probe_pps: default_service_probe_pps(),
            max_targets_per_shard: default_service_max_targets(),
            max_new_targets_per_s: default_service_new_per_s(),
            max_events_per_s: default_service_events_per_s(),
        }
    }
}

fn default_service_probe_pps() -> f64 {
    5.0
}
fn default_service_max_targets() -> usize {
    64
}
fn default_service_new_per_s() -> f64 {
    20.0
}
fn default_service_events_per_s() -> f64 {
    5_000.0
}

/// Most service targets per shard: a schedule entry packs the slot into 12 bits.
pub const MAX_SERVICE_TARGETS: usize = 4096;

/// One shard.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShardConfig {
    /// The device name the pinglist's `from` refers to; also names this shard's segments.
    pub device: String,
    /// ToR of this RNIC (recorded in the segment header).
    #[serde(default)]
    pub tor: String,
    /// Transport.
    #[serde(default)]
    pub transport: TransportKind,
    /// UDP: address and port this shard probes from and answers on. Targets without a `port` in
    /// the pinglist are probed on this port.
    pub bind: SocketAddr,
    /// CPU core to pin the shard to.
    pub core: usize,
    /// UDP: probes leave from this many extra sockets on `bind`'s address, one per flow label
    /// of a target, so that its labels take different ECMP paths (a switch hashes the UDP
    /// ports; IPv4 has no flow label). A target with more labels than this reuses ports, and
    /// covers fewer paths than `ctl` planned. 0: everything leaves from `bind`. At most 255;
    /// each is a file descriptor.
    #[serde(default = "default_source_ports")]
    pub source_ports: usize,
    /// Test hook, refused unless the environment sets `ROCEMESH_TEST_HOOKS=1`: ignore this
    /// fraction of received probes, as a lossy peer would. An agent that drops probes on purpose
    /// makes its peers report a fault that is not there, so a production config cannot turn it on.
    #[serde(default)]
    pub ignore_probe_fraction: f64,
    /// Verbs: the device port (1-based).
    #[serde(default = "default_ib_port")]
    pub ib_port: u8,
    /// Verbs: GID index to use instead of the RoCEv2 GID of `bind`'s address.
    #[serde(default)]
    pub gid_index: Option<u8>,
    /// Verbs: traffic class of probes and answers (DSCP << 2 | ECN). The default, 106 (DSCP 26,
    /// ECT), is the lossless class most RoCE fabrics and NCCL (`NCCL_IB_TC=106`) use: probes
    /// should queue where the training traffic queues. Set it to your fabric's RDMA class.
    #[serde(default = "default_traffic_class")]
    pub traffic_class: u8,
}

fn default_ib_port() -> u8 {
    1
}
fn default_traffic_class() -> u8 {
    106
}

/// Highest `event_coalesce_us`: analyze treats host delays above 1 ms (at least) as noise.
pub const MAX_EVENT_COALESCE_US: u64 = 1_000;

fn default_source_ports() -> usize {
    32
}

fn default_flush_interval_ms() -> u64 {
    1_000
}
fn default_segment_mib() -> u64 {
    64
}
fn default_segment_max_age_s() -> u64 {
    600
}
fn default_segment_quota_mib() -> u64 {
    4_096
}
fn default_zstd_level() -> i32 {
    3
}
fn default_stats_interval_s() -> u64 {
    60
}

/// A configuration file that cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("{file}: {problem}")]
pub struct ConfigError {
    /// The file.
    pub file: PathBuf,
    /// What is wrong and how to fix it.
    pub problem: String,
}

impl AgentConfig {
    /// Read and validate `path`; relative paths inside are resolved against its directory.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let err = |problem: String| ConfigError { file: path.to_path_buf(), problem };
        let text = std::fs::read_to_string(path).map_err(|e| err(format!("cannot read: {e}")))?;
        Self::parse(&text, path)
    }

    /// Parse and validate `text` as if read from `path`.
    pub fn parse(text: &str, path: &Path) -> Result<Self, ConfigError> {
        let err = |problem: String| ConfigError { file: path.to_path_buf(), problem };
        let mut cfg: AgentConfig = toml::from_str(text).map_err(|e| err(e.to_string()))?;
        // `agent.toml`'s parent is the empty path, which names no directory to watch or list.
        let base = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        cfg.pinglist = base.join(&cfg.pinglist);
        cfg.segment_dir = base.join(&cfg.segment_dir);
        if let Some(k) = &mut cfg.auth.keys {
            *k = base.join(&*k);
        }
        cfg.validate().map_err(err)?;
        Ok(cfg)
    }

    fn validate(&self) -> Result<(), String> {
        self.validate_host_and_shard_count()?;
        self.validate_metrics()?;
        self.validate_auth()?;
        self.validate_view()?;
        self.validate_shards()?;
        self.validate_path_tracing()?;
        self.validate_service_tracing()?;
        self.validate_timing_and_segments()?;
        self.validate_live()
    }

    /// Pushes are the window summaries: without them there is nothing to push.
    fn validate_live(&self) -> Result<(), String> {
        let n = self.live.collectors.len();
        if n > MAX_COLLECTORS {
            return Err(format!("live.collectors names {n} collectors: name at most {MAX_COLLECTORS}"));
        }
        if self.live.collectors.iter().any(|c| c.is_ipv4() != self.live.collectors[0].is_ipv4()) {
            return Err("live.collectors mixes IPv4 and IPv6 addresses: a shard pushes from one socket; \
                        name collectors of one family"
                .into());
        }
        if n > 0 && self.summary_window_s == 0 {
            return Err("live.collectors is set but summary_window_s = 0: the pushes are the window summaries; set summary_window_s = 5"
                .into());
        }
        Ok(())
    }

    /// The two things without which nothing else means anything: a host name and a shard.
    fn validate_host_and_shard_count(&self) -> Result<(), String> {
        if self.host.is_empty() {
            return Err("`host` is empty: set it to this host's inventory name".into());
        }
        if self.shards.is_empty() {
            return Err("no [[shard]]: add one per RNIC (UDP: per local address)".into());
        }
        Ok(())
    }

    /// `[metrics]`: the RNIC counters' prefix must itself be a metric name.
    fn validate_metrics(&self) -> Result<(), String> {
        let p = &self.metrics.infiniband_prefix;
        let metric_char = |(i, c): (usize, char)| c == '_' || c.is_ascii_alphabetic() || (i > 0 && c.is_ascii_digit());
        if p.is_empty() || !p.chars().enumerate().all(metric_char) {
            return Err(format!(
                "[metrics] infiniband_prefix = {p:?} is not a metric name: use letters, digits and '_' \
                 (e.g. \"node_infiniband\" or \"rocemesh_infiniband\")"
            ));
        }
        Ok(())
    }

    /// `[auth]`: the clock window and the replay table's size.
    fn validate_auth(&self) -> Result<(), String> {
        let a = &self.auth;
        if !(10..=600_000).contains(&a.window_ms) {
            return Err(format!(
                "auth.window_ms = {}: use 10 to 600000 (the fleet's clocks must agree to within it)",
                a.window_ms
            ));
        }
        if !(1024..=1 << 26).contains(&a.replay_slots) {
            return Err(format!(
                "auth.replay_slots = {}: use 1024 to 67108864 (2 x packets received per second x window)",
                a.replay_slots
            ));
        }
        Ok(())
    }

    /// `[view]`: the allow list, the window, the readers and the port.
    fn validate_view(&self) -> Result<(), String> {
        let v = &self.view;
        v.prefixes()?;
        if !(1..=3600).contains(&v.window_s) {
            return Err(format!("view.window_s = {}: use 1 to 3600", v.window_s));
        }
        if !(1..=64).contains(&v.max_readers) {
            return Err(format!("view.max_readers = {}: use 1 to 64", v.max_readers));
        }
        if v.port == 0 {
            return Err("view.port = 0: name the port collectors connect to (default 18601)".into());
        }
        Ok(())
    }

    /// Every `[[shard]]`, in order: the first shard with a problem is the one reported.
    fn validate_shards(&self) -> Result<(), String> {
        let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
        for (i, s) in self.shards.iter().enumerate() {
            self.validate_shard(i, s, cores)?;
        }
        Ok(())
    }

    /// Shard `i` alone and against the shards before it (unique devices and addresses).
    fn validate_shard(&self, i: usize, s: &ShardConfig, cores: usize) -> Result<(), String> {
        if s.device.is_empty() || s.device.contains('/') {
            return Err(format!("shard[{i}].device {:?}: must be a non-empty name without '/'", s.device));
        }
        if let Some(j) = self.shards[..i].iter().position(|o| o.device == s.device) {
            return Err(format!("shard[{i}].device {:?} is also shard[{j}]'s: devices must be unique", s.device));
        }
        if let Some(j) = self.shards[..i].iter().position(|o| o.bind == s.bind) {
            return Err(format!("shard[{i}].bind {} is also shard[{j}]'s: give each shard its own address", s.bind));
        }
        if s.core >= cores {
            return Err(format!(
                "shard[{i}].core = {} but this host has {cores} cores (0..{}): pick an existing core",
                s.core,
                cores - 1
            ));
        }
        if s.transport == TransportKind::Verbs && s.ib_port == 0 {
            return Err(format!("shard[{i}].ib_port = 0: device ports are numbered from 1"));
        }
        if s.transport == TransportKind::Verbs && s.bind.port() == 0 {
            return Err(format!(
                "shard[{i}].bind {}: a verbs shard needs a fixed port (peers resolve its QPN there)",
                s.bind
            ));
        }
        if self.auth.keys.is_some() && s.bind.ip().is_unspecified() {
            return Err(format!(
                "shard[{i}].bind {}: with [auth] keys, bind the address peers probe this shard at (every \
                 sealed packet binds its receiver's address, and an unspecified one names none)",
                s.bind
            ));
        }
        if s.source_ports > crate::udp::MAX_SOURCE_PORTS {
            return Err(format!(
                "shard[{i}].source_ports = {}: use 0 to {}",
                s.source_ports,
                crate::udp::MAX_SOURCE_PORTS
            ));
        }
        if s.ignore_probe_fraction != 0.0 && !test_hooks_allowed() {
            return Err(format!(
                "shard[{i}].ignore_probe_fraction = {}: a test hook that drops probes on purpose (its peers \
                 would report a fault that is not there); remove it from this config (tests set {TEST_HOOKS_ENV}=1)",
                s.ignore_probe_fraction
            ));
        }
        if !(0.0..1.0).contains(&s.ignore_probe_fraction) {
            return Err(format!("shard[{i}].ignore_probe_fraction must be in [0, 1)"));
        }
        Ok(())
    }

    /// `[path_tracing]`: the refresh and retrace intervals, the trace rate and the TTL range.
    fn validate_path_tracing(&self) -> Result<(), String> {
        let pt = &self.path_tracing;
        if !(1..=86_400).contains(&pt.refresh_s) {
            return Err(format!("path_tracing.refresh_s = {}: use 1 to 86400 (a day)", pt.refresh_s));
        }
        if !(1..=86_400).contains(&pt.min_retrace_interval_s) {
            return Err(format!("path_tracing.min_retrace_interval_s = {}: use 1 to 86400", pt.min_retrace_interval_s));
        }
        if !(pt.traces_per_s > 0.0 && pt.traces_per_s <= 1_000.0) {
            return Err(format!("path_tracing.traces_per_s = {}: use a rate in (0, 1000]", pt.traces_per_s));
        }
        if !(2..=crate::pathtrace::MAX_TTL).contains(&pt.max_ttl) {
            return Err(format!(
                "path_tracing.max_ttl = {}: use 2 to {} (a record holds {} switches)",
                pt.max_ttl,
                crate::pathtrace::MAX_TTL,
                rocemesh_formats::record::MAX_HOPS
            ));
        }
        Ok(())
    }

    /// `[service_tracing]`: the probe rate, the targets per shard and the intake rates.
    fn validate_service_tracing(&self) -> Result<(), String> {
        let st = &self.service_tracing;
        if !(st.probe_pps > 0.0 && st.probe_pps <= 1_000.0) {
            return Err(format!("service_tracing.probe_pps = {}: use a rate in (0, 1000]", st.probe_pps));
        }
        if !(1..=MAX_SERVICE_TARGETS).contains(&st.max_targets_per_shard) {
            return Err(format!(
                "service_tracing.max_targets_per_shard = {}: use 1 to {MAX_SERVICE_TARGETS}",
                st.max_targets_per_shard
            ));
        }
        if !(st.max_new_targets_per_s > 0.0 && st.max_new_targets_per_s <= 10_000.0) {
            return Err(format!(
                "service_tracing.max_new_targets_per_s = {}: use a rate in (0, 10000]",
                st.max_new_targets_per_s
            ));
        }
        if !(st.max_events_per_s >= 1.0 && st.max_events_per_s <= 1_000_000.0) {
            return Err(format!("service_tracing.max_events_per_s = {}: use 1 to 1000000", st.max_events_per_s));
        }
        Ok(())
    }

    /// The top-level knobs: event coalescing, flushing, and the segments' size, age, level and quota.
    fn validate_timing_and_segments(&self) -> Result<(), String> {
        if self.event_coalesce_us > MAX_EVENT_COALESCE_US {
            return Err(format!(
                "event_coalesce_us = {}: use 0 to {MAX_EVENT_COALESCE_US} (it adds up to that much to host delays)",
                self.event_coalesce_us
            ));
        }
        if !(10..=60_000).contains(&self.flush_interval_ms) {
            return Err(format!("flush_interval_ms = {}: use 10 to 60000", self.flush_interval_ms));
        }
        if !(2..=4096).contains(&self.segment_mib) {
            return Err(format!("segment_mib = {}: use 2 to 4096", self.segment_mib));
        }
        if !(1..=86_400).contains(&self.segment_max_age_s) {
            // `ctl collect` dates a segment by its first record and `analyze watch` stops listing
            // a date a day after it can hold anything new: a segment must span less than a day.
            return Err(format!("segment_max_age_s = {}: use 1 to 86400 (a day)", self.segment_max_age_s));
        }
        rocemesh_formats::window::check_window_s(self.summary_window_s)
            .map_err(|e| format!("summary_window_s = {e}"))?;
        if !(1..=19).contains(&self.zstd_level) {
            return Err(format!("zstd_level = {}: use 1 to 19", self.zstd_level));
        }
        if self.segment_quota_mib < self.segment_mib * self.shards.len() as u64 * 2 {
            return Err(format!(
                "segment_quota_mib = {} is below two segments per shard ({}): raise it",
                self.segment_quota_mib,
                self.segment_mib * self.shards.len() as u64 * 2
            ));
        }
        Ok(())
    }
}

/// The environment variable that lets test hooks (`ignore_probe_fraction`) into a config.
pub const TEST_HOOKS_ENV: &str = "ROCEMESH_TEST_HOOKS";

fn test_hooks_allowed() -> bool {
    std::env::var_os(TEST_HOOKS_ENV).is_some_and(|v| v == "1")
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
host = "h0"
pinglist = "pl.toml"
segment_dir = "seg"
[[shard]]
device = "lo-a"
bind = "127.0.0.1:18515"
core = 0
"#;

    #[test]
    fn good_config_resolves_paths_against_its_directory() {
        let c = AgentConfig::parse(GOOD, Path::new("/etc/rocemesh/agent.toml")).expect("parses");
        assert_eq!(c.pinglist, Path::new("/etc/rocemesh/pl.toml"));
        assert_eq!(c.segment_dir, Path::new("/etc/rocemesh/seg"));
        assert_eq!((c.mode, c.flush_interval_ms), (Mode::Event, 1_000));
    }

    /// Pushes are the window summaries: collectors without them are refused with the fix.
    #[test]
    fn live_collectors_need_summaries() {
        let live = |extra: &str| format!("{extra}{GOOD}\n[live]\ncollectors = [\"10.0.9.5:18620\"]\n");
        let e = AgentConfig::parse(&live(""), Path::new("agent.toml")).unwrap_err();
        assert!(e.to_string().contains("set summary_window_s = 5"), "{e}");
        let c = AgentConfig::parse(&live("summary_window_s = 5\n"), Path::new("agent.toml")).expect("parses");
        assert_eq!(c.live.collectors, ["10.0.9.5:18620".parse::<SocketAddr>().unwrap()]);
        let many = GOOD.to_owned()
            + "\n[live]\ncollectors = [\"10.0.0.1:1\", \"10.0.0.2:1\", \"10.0.0.3:1\", \"10.0.0.4:1\", \"10.0.0.5:1\"]\n";
        let e = AgentConfig::parse(&format!("summary_window_s = 5\n{many}"), Path::new("agent.toml")).unwrap_err();
        assert!(e.to_string().contains("at most 4"), "{e}");
    }

    /// A config named without a directory (`agent.toml`, run from its own directory) resolves
    /// its paths against `.`, which can be watched and listed; the empty path cannot.
    #[test]
    fn a_config_named_without_a_directory_resolves_against_dot() {
        let c = AgentConfig::parse(GOOD, Path::new("agent.toml")).expect("parses");
        assert_eq!(c.pinglist, Path::new("./pl.toml"));
        assert_eq!(c.pinglist.parent(), Some(Path::new(".")));
        assert_eq!(c.segment_dir, Path::new("./seg"));
    }

    /// With [auth], sealed packets bind their receiver's address: a shard bound to an
    /// unspecified one is refused, with the fix; segments may span at most a day.
    #[test]
    fn auth_needs_a_named_bind_address_and_segments_span_at_most_a_day() {
        let p = Path::new("/x/agent.toml");
        let keyed =
            format!("{}\n[auth]\nkeys = \"fleet-keys.toml\"\n", GOOD.replace("127.0.0.1:18515", "0.0.0.0:18515"));
        let e = AgentConfig::parse(&keyed, p).expect_err("unspecified");
        assert!(e.to_string().contains("shard[0].bind 0.0.0.0:18515: with [auth] keys"), "{e}");
        AgentConfig::parse(&keyed.replace("0.0.0.0", "10.0.0.1"), p).expect("a named address");
        let day = |s: u64| GOOD.replace("host = \"h0\"", &format!("host = \"h0\"\nsegment_max_age_s = {s}"));
        AgentConfig::parse(&day(86_400), p).expect("a day");
        let e = AgentConfig::parse(&day(86_401), p).expect_err("more");
        assert!(e.to_string().contains("segment_max_age_s = 86401: use 1 to 86400"), "{e}");
    }

    /// Every key the parser reads, as `section.key` paths (`shard.device`): serde's derive hands
    /// each struct's field names to `deserialize_struct`, so a deserializer that answers every
    /// field with a plausible value walks the whole configuration type. It reads no file.
    mod keys {
        use serde::de::{self, IntoDeserializer, Visitor};
        use std::cell::RefCell;

        pub(super) fn of<T: serde::de::DeserializeOwned>() -> Vec<String> {
            let out = RefCell::new(Vec::new());
            T::deserialize(Walker { path: String::new(), out: &out }).expect("the walk answers every field");
            out.into_inner()
        }

        // serde's own error for deserializers of plain values.
        use serde::de::value::Error;

        /// Scalars: a value every field of that type takes.
        macro_rules! answer {
            ($($method:ident => $visit:ident($value:expr)),*) => {
                $(fn $method<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Error> {
                    v.$visit($value)
                })*
            };
        }

        struct Walker<'a> {
            path: String,
            out: &'a RefCell<Vec<String>>,
        }

        impl Walker<'_> {
            fn at(&self, field: &str) -> Walker<'_> {
                let path = if self.path.is_empty() { field.to_owned() } else { format!("{}.{field}", self.path) };
                Walker { path, out: self.out }
            }
        }

        impl<'de> de::Deserializer<'de> for Walker<'_> {
            type Error = Error;
            // A string any string-like field (addresses, paths, names) parses.
            fn deserialize_any<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Error> {
                v.visit_str("127.0.0.1:1")
            }
            answer! {
                deserialize_bool => visit_bool(false),
                deserialize_u8 => visit_u64(1),
                deserialize_u16 => visit_u64(1),
                deserialize_u32 => visit_u64(1),
                deserialize_u64 => visit_u64(1),
                deserialize_i32 => visit_i64(1),
                deserialize_i64 => visit_i64(1),
                deserialize_f64 => visit_f64(1.0)
            }
            fn deserialize_option<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Error> {
                v.visit_some(self)
            }
            fn deserialize_seq<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Error> {
                v.visit_seq(One(Some(self)))
            }
            fn deserialize_enum<V: Visitor<'de>>(
                self,
                _: &'static str,
                variants: &'static [&'static str],
                v: V,
            ) -> Result<V::Value, Error> {
                v.visit_enum(variants[0].into_deserializer())
            }
            fn deserialize_struct<V: Visitor<'de>>(
                self,
                _: &'static str,
                fields: &'static [&'static str],
                v: V,
            ) -> Result<V::Value, Error> {
                // A section, not a key: its fields are.
                self.out.borrow_mut().retain(|p| *p != self.path);
                v.visit_map(Fields { walker: self, fields: fields.iter() })
            }
            serde::forward_to_deserialize_any! {
                i8 i16 i128 u128 f32 char str string bytes byte_buf unit unit_struct newtype_struct
                tuple tuple_struct map identifier ignored_any
            }
        }

        /// A sequence of one element, walked.
        struct One<'a>(Option<Walker<'a>>);
        impl<'de> de::SeqAccess<'de> for One<'_> {
            type Error = Error;
            fn next_element_seed<S: de::DeserializeSeed<'de>>(&mut self, seed: S) -> Result<Option<S::Value>, Error> {
                self.0.take().map(|w| seed.deserialize(w)).transpose()
            }
        }

        /// Every field of a struct, each recorded and walked.
        struct Fields<'a> {
            walker: Walker<'a>,
            fields: std::slice::Iter<'static, &'static str>,
        }
        impl<'de> de::MapAccess<'de> for Fields<'_> {
            type Error = Error;
            fn next_key_seed<K: de::DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>, Error> {
                let Some(&f) = self.fields.clone().next() else { return Ok(None) };
                seed.deserialize(f.into_deserializer()).map(Some)
            }
            fn next_value_seed<S: de::DeserializeSeed<'de>>(&mut self, seed: S) -> Result<S::Value, Error> {
                let f = self.fields.next().expect("a key came first");
                let w = self.walker.at(f);
                w.out.borrow_mut().push(w.path.clone());
                seed.deserialize(w)
            }
        }
    }

    /// The `section.key` paths a TOML document sets (arrays of tables as their table's name).
    fn toml_keys(v: &toml::Table, prefix: &str, out: &mut Vec<String>) {
        for (k, v) in v {
            let path = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
            match v {
                toml::Value::Table(t) => toml_keys(t, &path, out),
                toml::Value::Array(a) if a.iter().all(toml::Value::is_table) && !a.is_empty() => {
                    a.iter().filter_map(toml::Value::as_table).for_each(|t| toml_keys(t, &path, out))
                }
                _ => out.push(path),
            }
        }
    }

    /// The packaged example configuration: its path and text.
    fn example() -> (PathBuf, String) {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/agent.example.toml");
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        (path, text)
    }

    /// The packaged example shows every key the parser reads, set or as a commented default,
    /// and nothing it does not: uncommented, it must parse and set exactly the parser's keys.
    #[test]
    fn the_packaged_example_config_shows_every_key() {
        let (path, text) = example();
        // `# key = value`, `# [section]` and `# [[shard]]` lines, uncommented; prose stays.
        let uncommented: String = text
            .lines()
            .map(|l| match l.strip_prefix("# ") {
                Some(rest) if rest.starts_with('[') || rest.split_once(" = ").is_some_and(|(k, _)| is_key(k)) => rest,
                _ => l,
            })
            .map(|l| format!("{l}\n"))
            .collect();
        let all = AgentConfig::parse(&uncommented, Path::new("/etc/rocemesh/agent.toml"))
            .unwrap_or_else(|e| panic!("{}, every commented key set: {e}", path.display()));
        assert!(
            all.view.enabled() && all.auth.keys.is_some() && !all.live.collectors.is_empty(),
            "the commented sections' keys were read"
        );
        let table: toml::Table = uncommented.parse().expect("parsed above");
        let mut shown = Vec::new();
        toml_keys(&table, "", &mut shown);
        let mut parsed = keys::of::<AgentConfig>();
        // A test hook that makes peers report a fault that is not there: kept out of what an
        // operator copies (the agent refuses it unless ROCEMESH_TEST_HOOKS=1).
        parsed.retain(|k| k != "shard.ignore_probe_fraction");
        for list in [&mut shown, &mut parsed] {
            list.sort();
            list.dedup();
        }
        let missing: Vec<&String> = parsed.iter().filter(|k| !shown.contains(k)).collect();
        let unknown: Vec<&String> = shown.iter().filter(|k| !parsed.contains(k)).collect();
        assert!(missing.is_empty(), "{}: keys the agent reads that it does not show: {missing:?}", path.display());
        assert!(unknown.is_empty(), "{}: keys it shows that the agent does not read: {unknown:?}", path.display());
        for section in ["shard", "metrics", "path_tracing", "service_tracing", "auth", "view", "live"] {
            assert!(
                parsed.iter().any(|k| k.starts_with(&format!("{section}."))),
                "the walk missed [{section}]: {parsed:?}"
            );
        }
    }

    fn is_key(k: &str) -> bool {
        !k.is_empty() && k.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
    }

    #[test]
    fn the_packaged_example_config_is_valid() {
        let (path, text) = example();
        let c = AgentConfig::parse(&text, Path::new("/etc/rocemesh/agent.toml"))
            .unwrap_or_else(|e| panic!("{}: the example does not parse: {e}", path.display()));
        assert_eq!(c.segment_dir, Path::new("/var/lib/rocemesh/segments"), "what the systemd unit may write");
        assert_eq!(c.shards.len(), 2);
        assert!(c.metrics.listen.is_some());
    }

    #[test]
    fn view_allow_list_prefixes() {
        let ip = |s: &str| s.parse::<std::net::IpAddr>().unwrap();
        let p = Prefix::parse("10.0.9.0/24").unwrap();
        assert!(p.contains(ip("10.0.9.77")) && p.contains(ip("::ffff:10.0.9.1")));
        assert!(!p.contains(ip("10.0.8.1")) && !p.contains(ip("fd00::1")));
        assert!(Prefix::parse("10.0.9.5").unwrap().contains(ip("10.0.9.5")));
        assert!(!Prefix::parse("10.0.9.5").unwrap().contains(ip("10.0.9.6")));
        assert!(Prefix::parse("0.0.0.0/0").unwrap().contains(ip("192.168.1.1")));
        assert!(Prefix::parse("fd00::/8").unwrap().contains(ip("fd12::1")));
        let e = AgentConfig::parse(&format!("{GOOD}\n[view]\nallow = [\"10.0.9.0/33\"]\n"), Path::new("/x/a.toml"))
            .expect_err("bad prefix");
        assert!(e.to_string().contains("view.allow entry \"10.0.9.0/33\": the prefix length must be 0 to 32"), "{e}");
        let c = AgentConfig::parse(&format!("{GOOD}\n[view]\nallow = [\"10.0.9.5\"]\n"), Path::new("/x/a.toml"))
            .expect("a view");
        assert!(c.view.enabled() && !ViewConfig::default().enabled());
        assert_eq!((c.view.port, c.view.window_s, c.view.max_readers), (18_601, 10, 4));
    }

    #[test]
    fn errors_name_the_file_and_the_field() {
        let p = Path::new("/x/agent.toml");
        let e = AgentConfig::parse(&GOOD.replace("core = 0", "core = 4096"), p).expect_err("core");
        assert!(e.to_string().starts_with("/x/agent.toml: shard[0].core = 4096"), "{e}");
        let e = AgentConfig::parse(&GOOD.replace("device", "devcie"), p).expect_err("typo");
        assert!(e.to_string().contains("devcie") && e.to_string().contains("line"), "{e}");
        let dup = format!("{GOOD}\n[[shard]]\ndevice = \"lo-b\"\nbind = \"127.0.0.1:18515\"\ncore = 0\n");
        let e = AgentConfig::parse(&dup, p).expect_err("dup bind");
        assert!(e.to_string().contains("shard[1].bind"), "{e}");
        let e = AgentConfig::parse(
            &GOOD.replace("\"event\"", "x").replace("host = \"h0\"", "host = \"h0\"\nmode = \"spin\""),
            p,
        )
        .expect_err("mode");
        assert!(e.to_string().contains("spin"), "{e}");
        let coalesce = |us: u64| GOOD.replace("host = \"h0\"", &format!("host = \"h0\"\nevent_coalesce_us = {us}"));
        assert_eq!(AgentConfig::parse(&coalesce(1000), p).expect("1 ms").event_coalesce_us, 1000);
        let e = AgentConfig::parse(&coalesce(1001), p).expect_err("coalesce");
        assert!(e.to_string().contains("event_coalesce_us = 1001: use 0 to 1000"), "{e}");
    }

    #[test]
    fn a_verbs_shard_gets_its_defaults_and_needs_a_fixed_port() {
        let p = Path::new("/x/agent.toml");
        let verbs = GOOD.replace("core = 0", "core = 0\ntransport = \"verbs\"");
        let c = AgentConfig::parse(&verbs, p).expect("parses");
        let s = &c.shards[0];
        assert_eq!((s.transport, s.ib_port, s.gid_index, s.traffic_class), (TransportKind::Verbs, 1, None, 106));
        let e = AgentConfig::parse(&verbs.replace(":18515", ":0"), p).expect_err("port 0");
        assert!(e.to_string().contains("shard[0].bind 127.0.0.1:0: a verbs shard needs a fixed port"), "{e}");
        let e = AgentConfig::parse(&verbs.replace("core = 0", "core = 0\nib_port = 0"), p).expect_err("port");
        assert!(e.to_string().contains("shard[0].ib_port = 0"), "{e}");
    }

    #[test]
    fn the_probe_dropping_test_hook_is_refused_in_a_production_config() {
        let p = Path::new("/x/agent.toml");
        let hooked = GOOD.replace("core = 0", "core = 0\nignore_probe_fraction = 0.2");
        // The unit tests never set the variable (the loopback tests set it for their children).
        assert!(!test_hooks_allowed());
        let e = AgentConfig::parse(&hooked, p).expect_err("refused");
        assert!(e.to_string().contains("shard[0].ignore_probe_fraction = 0.2: a test hook"), "{e}");
        assert!(e.to_string().contains("ROCEMESH_TEST_HOOKS=1"), "{e}");
    }
}
