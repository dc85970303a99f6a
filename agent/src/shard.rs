//! A shard: prober and responder for one RNIC (or one UDP address), on one core.
//!
//! [`Shard::step`] does one round of work without blocking: collect send timestamps, handle
//! arrived packets (answer probes, match ACKs), send due probes, expire timed-out ones, flush the
//! segment writer on its timer. The runtime calls it in a loop, either spinning (busy-poll) or
//! waiting between rounds for the socket or the next deadline (event mode).
//!
//! Every table is sized when a pinglist is loaded: the in-flight table (a slab indexed by the
//! sequence counter, so timeouts are found by walking from the oldest counter), the schedule
//! heap, and the responder's pending-ACK2 table. Steady-state probing does not allocate.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use rocemesh_formats::pinglist::Pinglist;
use rocemesh_formats::pinglist::ProbeKind;
use rocemesh_formats::record::{
    Arrived, EndpointRole, Outcome, ProbeRecord, ServiceConn, TsSource, six_timestamp_delays,
};
use rocemesh_formats::segment::{SegmentError, SegmentWriter};
use rocemesh_formats::window::LATE_SEND_NS;

use crate::auth::{Auth, AuthParams};
use crate::clock::now_ns;
use crate::errlog::ErrorLog;
use crate::live::{Class, LiveShard};
use crate::pathtrace::{PathTracer, Traced, is_trace_payload};
use crate::protocol::{Kind, PACKET_BYTES, Packet};
use crate::service::{NewService, Refused, SERVICE_BIT, ServiceStats, ServiceTable, endpoint_name};
use crate::stats::ShardStats;
use crate::transport::{DropReason, Fate, RxBatch, SEND_BATCH, Transport, TxBatch, TxNews};

/// Probes sent per step at most, so that a burst of due probes cannot starve the receive path.
const MAX_SENDS_PER_STEP: usize = 256;
/// How late a send may be and still keep its target's cadence (the slots it missed go out at
/// once). CFS lets a runnable thread wait up to its targeted latency behind the other runnable
/// threads of its core (`sched_latency_ns`: 6 ms x (1 + log2 CPUs), at most 24 ms), and a
/// hypervisor's steal comes in slices of that order: a shard that lost its core for that long
/// must still send the rate it was asked, or a busy training host silently probes less (a
/// 2-core host losing 4 ms in every 20 ms sent 81% of its rate when any slip past one interval
/// restarted the cadence). Later than this (a frozen host, a stopped process) the cadence
/// restarts from now and the slots are counted given up, so a resumed host never fires its
/// backlog: a catch-up is at most this long's worth of the shard's rate, within the in-flight
/// table's headroom (twice rate x timeout) and under `window::STALL_NS`.
const CATCH_UP_NS: u64 = 24_000_000;
const PENDING_ACK2_SLOTS: usize = 4096;
/// Receive batches per step at most (the send side's bound is [`MAX_SENDS_PER_STEP`]).
const MAX_RECV_BATCHES_PER_STEP: usize = 16;
const NOT_A_PROBE: u32 = u32::MAX;

/// Kinds of error a shard survives, for its [`ErrorLog`].
const ERR_RECV: usize = 0;
const ERR_TX_STAMPS: usize = 1;
const ERR_WRITE: usize = 2;
const ERR_ACK_DROPPED: usize = 3;
const ERROR_NAMES: [&str; 4] = ["recv", "tx_timestamps", "segment_write", "ack_not_sent"];

/// What the shard is told at start.
#[derive(Clone, Debug)]
pub struct ShardParams {
    /// Host name (inventory name).
    pub host: String,
    /// Device / endpoint name: the pinglist's `from`.
    pub device: String,
    /// ToR of this RNIC.
    pub tor: String,
    /// This RNIC's address (GID; UDP: IPv4-mapped address) in its dictionary entry, so that
    /// `analyze` can name a peer that knows only the address (an answer path's trace).
    pub addr: [u8; 16],
    /// Random per-start epoch: high bits of every sequence number, and sent in ACKs.
    pub epoch: u32,
    /// Port of a target when its pinglist entry gives none (UDP).
    pub default_port: u16,
    /// How often buffered records are written out (bounds what a crash loses).
    pub flush_interval_ns: u64,
    /// Testing only: ignore this fraction of received probes (a lossy peer), deterministic.
    pub ignore_probe_fraction: f64,
    /// Probes due within this much of now are sent together, in one flush. Event mode uses it so
    /// that a burst of probes costs one wake-up and one send call, here and at the responders;
    /// T1 is still taken per probe, so only the schedule's jitter grows. 0 in busy-poll.
    pub send_ahead_ns: u64,
    /// Traced service connections probed at once (the table is sized at start).
    pub service_max_targets: usize,
    /// New service targets admitted per second.
    pub service_new_per_s: f64,
    /// Probe interval of each service target.
    pub service_interval_ns: u64,
    /// Probe authentication's window and replay table (used once keys are loaded).
    pub auth: AuthParams,
}

#[derive(Clone, Copy, Debug, Default)]
struct InFlight {
    /// 0 = free.
    seq: u64,
    target_id: u32,
    flow_label: u32,
    kind: u8,
    arrived: u8,
    responder_epoch: u32,
    t1: u64,
    t2: u64,
    t3: u64,
    t4: u64,
    t5: u64,
    t6: u64,
    deadline: u64,
    /// The schedule's key of its target: an index into the targets, or a service's
    /// (`SERVICE_BIT` set).
    ti: u32,
    refused: bool,
    /// The target refused it, or answered it, for its keying alone ([`crate::auth`]): unless an
    /// admitted ACK1 comes before the deadline, it is recorded `auth_refused`.
    auth_refused: bool,
    /// Never sent: the target could not be resolved over the network (loss, not local).
    unreachable: bool,
    /// Never left this host, and why.
    local_drop: Option<DropReason>,
    /// The target's ToR slot in the live metrics.
    tor_slot: u16,
    /// T5 came from the application's clock because the kernel had not stamped the datagram
    /// (it enables receive stamping lazily, system-wide): the record then says `HostPoll`.
    host_fallback: bool,
}

#[derive(Clone, Copy, Debug)]
struct PendingAck2<A> {
    /// The responder's own token, carried in ACK1 (in its otherwise unused T4 field) and so
    /// echoed back with ACK1's send timestamp. Sequence numbers alone are not unique across
    /// probers (two agents' epochs may collide); the token is, within this responder.
    token: u64,
    seq: u64,
    to: A,
    flow_label: u32,
    t3: u64,
}

struct Target {
    id: u32,
    kind: u8,
    interval_ns: u64,
    /// Its flow labels (at least one: the pinglist refuses none), `Shard::labels[labels_at..
    /// labels_at + labels_len]`: one table for every target rather than a heap block each.
    labels_at: u32,
    labels_len: u32,
    cursor: usize,
    tor_slot: u16,
    /// When an admitted ACK1 from it last arrived (0: never): a target answering us is not
    /// keyed otherwise, whatever a REFUSAL says ([`Shard::refused_by_peer`]).
    heard_ns: u64,
}

impl Target {
    fn labels_in<'a>(&self, labels: &'a [u32]) -> &'a [u32] {
        let at = self.labels_at as usize;
        &labels[at..at + self.labels_len as usize]
    }
}

/// One shard's state.
pub struct Shard<T: Transport> {
    params: ShardParams,
    transport: T,
    writer: SegmentWriter,
    self_id: u32,
    ts_source: TsSource,
    targets: Vec<Target>,
    target_addr: Vec<T::Addr>,
    labels: Vec<u32>,
    schedule: BinaryHeap<Reverse<(u64, u32)>>,
    inflight: Vec<InFlight>,
    inflight_addr: Vec<T::Addr>,
    next_counter: u32,
    oldest_counter: u32,
    timeout_ns: u64,
    pending: Vec<Option<PendingAck2<T::Addr>>>,
    next_token: u64,
    /// In-flight slot of each queued packet (`NOT_A_PROBE` for ACKs), until the next flush.
    queued_slot: [u32; SEND_BATCH],
    queued: usize,
    fates: [Fate; SEND_BATCH],
    /// Send timestamps asked for and not yet read: the error queue is read again only then.
    tx_pending: u64,
    rx: RxBatch<T::Addr>,
    tx: TxBatch,
    next_flush_ns: u64,
    ignore_state: u64,
    stats: ShardStats,
    errors: ErrorLog<4>,
    drops: ErrorLog<{ DropReason::COUNT }>,
    generation: u64,
    null_addr: T::Addr,
    draining: bool,
    services: ServiceTable<T::Addr>,
    paths: Option<PathTracer>,
    live: std::sync::Arc<LiveShard>,
    auth: Auth,
    /// Live pushes of the closed window summaries (`[live]`).
    pusher: Option<crate::push::Pusher>,
    /// CLOCK_REALTIME - CLOCK_MONOTONIC at the last step; `None` before the first.
    clock_offset_ns: Option<i64>,
}

/// A change of CLOCK_REALTIME against CLOCK_MONOTONIC larger than this between two rounds is a
/// step, not the two reads being apart (a preempted thread) or a slew (NTP's at most 500 ppm).
const CLOCK_STEP_NS: u64 = 50_000_000;

/// What a window's summary waits beyond the probe timeout and a flush interval: a loss is
/// recorded at the first round after its deadline, and a busy round can run late.
const SUMMARY_MARGIN_NS: u64 = 1_000_000_000;

impl<T: Transport> std::fmt::Debug for Shard<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shard").field("device", &self.params.device).field("stats", &self.stats).finish_non_exhaustive()
    }
}

/// How a pinglist target becomes a transport address.
pub trait Resolve<A> {
    /// The address of `target`, or why it has none.
    fn resolve(&self, target: &rocemesh_formats::pinglist::Target, default_port: u16) -> Result<A, String>;

    /// The address of the agent on the RNIC with `gid` (a traced connection's remote end),
    /// listening on `port` (agents of one fleet share their port).
    fn resolve_gid(&self, gid: [u8; 16], port: u16) -> Result<A, String>;
}

/// Why a traced connection did not become a service target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AddError {
    /// Table full, admission rate, or already a target.
    Refused(Refused),
    /// The remote GID gives no address this transport can probe.
    Address(String),
}

/// UDP: the target's address and port.
#[derive(Debug, Clone, Copy)]
pub struct UdpResolver;

impl Resolve<std::net::SocketAddr> for UdpResolver {
    fn resolve(
        &self,
        target: &rocemesh_formats::pinglist::Target,
        default_port: u16,
    ) -> Result<std::net::SocketAddr, String> {
        Ok(std::net::SocketAddr::new(target.addr, target.port.unwrap_or(default_port)))
    }

    fn resolve_gid(&self, gid: [u8; 16], port: u16) -> Result<std::net::SocketAddr, String> {
        Ok(std::net::SocketAddr::new(rocemesh_formats::gid::ip_of(&gid), port))
    }
}

impl<T: Transport> Shard<T> {
    /// A shard over `transport`, writing into `writer` and publishing into `live` (shared with
    /// the metrics exporter; its ToR slots are taken at pinglist load). `null_addr` fills unused
    /// address slots.
    pub fn new(
        params: ShardParams,
        transport: T,
        mut writer: SegmentWriter,
        null_addr: T::Addr,
        live: std::sync::Arc<LiveShard>,
    ) -> Self {
        let self_name = format!("{}/{}", params.host, params.device);
        let self_id = writer.endpoint(EndpointRole::Rnic, &self_name, &params.tor, params.addr);
        let ts_source = transport.ts_source();
        let errors = ErrorLog::new(params.device.clone(), ERROR_NAMES);
        let drops = ErrorLog::new(params.device.clone(), DropReason::NAMES);
        let mut pending = Vec::with_capacity(PENDING_ACK2_SLOTS);
        pending.resize(PENDING_ACK2_SLOTS, None);
        let services = ServiceTable::new(
            params.service_max_targets,
            params.service_new_per_s,
            params.service_interval_ns.max(1),
            null_addr,
            now_ns(),
        );
        Self {
            live,
            auth: Auth::new(params.auth),
            pusher: None,
            clock_offset_ns: None,
            services,
            ignore_state: u64::from(params.epoch) | 1,
            next_flush_ns: now_ns() + params.flush_interval_ns,
            params,
            transport,
            writer,
            self_id,
            ts_source,
            targets: Vec::new(),
            target_addr: Vec::new(),
            labels: Vec::new(),
            schedule: BinaryHeap::new(),
            inflight: vec![InFlight::default(); 1024],
            inflight_addr: vec![null_addr; 1024],
            next_counter: 1,
            oldest_counter: 1,
            timeout_ns: 500_000_000,
            pending,
            next_token: 1,
            queued_slot: [NOT_A_PROBE; SEND_BATCH],
            queued: 0,
            fates: [Fate::Sent; SEND_BATCH],
            tx_pending: 0,
            rx: RxBatch::new(null_addr),
            tx: TxBatch::default(),
            stats: ShardStats::default(),
            errors,
            drops,
            generation: 0,
            null_addr,
            draining: false,
            paths: None,
        }
    }

    /// Seal and check packets with the keys of `file` from now on (a reload replaces them).
    pub fn set_keys(&mut self, file: &rocemesh_formats::keys::FleetKeys) {
        self.auth.set_keys(file, now_ns());
    }

    /// The id of the key packets are sealed with now; `None`: unauthenticated.
    pub fn send_key_id(&self) -> Option<u8> {
        self.auth.send_key_id()
    }

    /// Push each window summary the writer closes from now on (the writer keeps them:
    /// `WriterConfig::keep_summaries`).
    pub fn set_pusher(&mut self, pusher: crate::push::Pusher) {
        self.pusher = Some(pusher);
    }

    /// Trace the paths of this shard's inter-ToR probes and answers from now on.
    pub fn set_path_tracer(&mut self, tracer: PathTracer) {
        self.paths = Some(tracer);
        self.load_traces();
    }

    fn load_traces(&mut self) {
        if let Some(p) = &mut self.paths {
            let inter = ProbeKind::InterTor.as_u8();
            let labels = &self.labels;
            p.load(self.targets.iter().map(|t| (t.id, t.kind == inter, t.labels_in(labels))));
        }
    }

    /// Counters.
    pub fn stats(&self) -> ShardStats {
        let mut s = self.stats;
        let w = self.writer.stats();
        (s.records_dropped, s.summaries_written, s.summaries_dropped, s.summary_late_parts) =
            (w.records_dropped, w.summaries_written, w.summaries_dropped, w.summary_late_parts);
        s.recv_errors = self.errors.count(ERR_RECV);
        s.tx_stamp_errors = self.errors.count(ERR_TX_STAMPS);
        s.write_errors = self.errors.count(ERR_WRITE);
        s.acks_not_sent = self.errors.count(ERR_ACK_DROPPED);
        s.services = self.services.stats();
        if let Some(p) = &self.paths {
            s.paths = p.stats();
        }
        s.transport_errors = self.transport.error_counts();
        s.auth_refused = self.auth.refused;
        (s.refusals_sent, s.refusals_held) = (self.auth.refusals_sent, self.auth.refusals_held);
        s.send_key_id = self.auth.send_key_id();
        if let Some(p) = &self.pusher {
            s.live = p.stats();
        }
        s.device_up = self.transport.device_up();
        s
    }

    /// Copy the counters into the live state (a few times per second: the runtime's timer);
    /// returns them, for the view.
    pub fn publish(&self) -> ShardStats {
        let s = self.stats();
        self.live.set_device_up(s.device_up);
        self.live.publish_stats(&s);
        s
    }

    /// The transport (for the runtime's readiness wait).
    pub fn transport(&self) -> &T {
        &self.transport
    }

    /// The transport, mutably (event mode arms it before sleeping).
    pub fn transport_mut(&mut self) -> &mut T {
        &mut self.transport
    }

    /// Generation of the pinglist in force.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Stop sending probes; keep answering, collecting ACKs and expiring. A stopping agent drains
    /// for one timeout so that neither its own probes nor its peers' probes to it are recorded
    /// as losses that the network did not cause.
    pub fn begin_drain(&mut self) {
        self.draining = true;
    }

    /// The pinglist's probe timeout.
    pub fn timeout_ns(&self) -> u64 {
        self.timeout_ns
    }

    /// Number of targets probed.
    pub fn target_count(&self) -> usize {
        self.targets.len()
    }

    /// Take the pinglist's targets for this shard's device. In-flight probes are kept: they carry
    /// their own target identity and address.
    pub fn load(&mut self, pinglist: &Pinglist, resolver: &impl Resolve<T::Addr>) -> Vec<String> {
        let mut problems = Vec::new();
        let now = now_ns();
        self.targets.clear();
        self.target_addr.clear();
        self.labels.clear();
        // Every table sized to the pinglist (grown by doubling, each would end at the next
        // power of two: a third of it never filled at 10,000 targets).
        let mine = || pinglist.targets.iter().filter(|t| t.from == self.params.device);
        let n = mine().count();
        self.targets.reserve_exact(n);
        self.target_addr.reserve_exact(n);
        self.labels.reserve_exact(mine().map(|t| t.flow_labels.len()).sum());
        self.writer.reserve_endpoints(mine().map(|t| t.to.as_str()));
        for (i, t) in pinglist.targets.iter().enumerate().filter(|(_, t)| t.from == self.params.device) {
            let addr = match resolver.resolve(t, self.params.default_port) {
                Ok(a) => a,
                Err(e) => {
                    problems.push(format!("target[{i}] ({}): {e}", t.to));
                    continue;
                }
            };
            let id = self.writer.endpoint(EndpointRole::Rnic, &t.to, "", rocemesh_formats::gid::gid_bytes(t.addr));
            self.targets.push(Target {
                id,
                kind: t.kind.as_u8(),
                interval_ns: (1e9 / t.rate_pps) as u64,
                labels_at: self.labels.len() as u32,
                labels_len: t.flow_labels.len() as u32,
                cursor: 0,
                tor_slot: self.live.tor_slot(&t.tor),
                heard_ns: 0,
            });
            self.target_addr.push(addr);
            self.labels.extend_from_slice(&t.flow_labels);
        }
        self.plan_labels();
        self.load_traces();
        self.timeout_ns = u64::from(pinglist.timeout_ms) * 1_000_000;
        // Pushed live, a window's summary closes once its probes can have completed and been
        // written: this pinglist's timeout, not the largest any pinglist may set, so the push
        // leaves seconds sooner. A probe the next pinglist lets run longer lands in a late part
        // (additive). Without [live] the writer keeps the configured grace.
        self.writer.set_summary_grace(self.timeout_ns + self.params.flush_interval_ns + SUMMARY_MARGIN_NS);
        self.generation = pinglist.generation;
        self.live.pinglist_loaded(pinglist.generation, pinglist.generated_unix_ns, self.targets.len());
        // Spread first probes evenly over each target's interval (not all at t = 0).
        self.schedule = BinaryHeap::with_capacity(self.targets.len());
        let n = self.targets.len().max(1) as u64;
        for (i, t) in self.targets.iter().enumerate() {
            let phase = t.interval_ns * i as u64 / n;
            self.schedule.push(Reverse((now + phase, i as u32)));
        }
        // Service targets outlive pinglists: they end with their connection.
        for (key, _) in self.services.live() {
            self.schedule.push(Reverse((now, key)));
        }
        // In flight at most rate × timeout; twice that, and a power of two for the mask.
        let cap = self.inflight_needed();
        if cap > self.inflight.len() {
            self.grow_inflight(cap);
        }
        problems
    }

    fn plan_labels(&mut self) {
        let services: Vec<u32> = self.services.live().map(|(_, s)| s.flow_label).collect();
        let pinglist = self.targets.iter().map(|t| t.labels_in(&self.labels));
        self.transport.plan_labels(pinglist.chain(services.chunks(1)));
    }

    /// Probe a traced connection of this host along its path, from now until
    /// [`Shard::remove_service`]. Returns the dictionary name it is recorded under.
    pub fn add_service(&mut self, s: &NewService, resolver: &impl Resolve<T::Addr>) -> Result<String, AddError> {
        let now = now_ns();
        self.services.admit(s.local_qpn, now).map_err(AddError::Refused)?;
        let addr = resolver.resolve_gid(s.remote_gid, self.params.default_port).map_err(AddError::Address)?;
        // A remote the pinglist probes is recorded under its inventory name (a scan of the
        // dictionary, once per connection; a map kept for it cost 3 MiB at 10k targets).
        let (remote, tor) = match self.writer.endpoint_by_addr(EndpointRole::Rnic, &s.remote_gid) {
            Some(e) => (e.name.clone(), e.tor.clone()),
            None => (String::new(), String::new()),
        };
        let shown =
            if remote.is_empty() { rocemesh_formats::gid::ip_of(&s.remote_gid).to_string() } else { remote.clone() };
        let prober = format!("{}/{}", self.params.host, self.params.device);
        let name = endpoint_name(&prober, s, &shown);
        let conn = ServiceConn {
            pid: s.pid,
            local_qpn: s.local_qpn,
            remote_qpn: s.remote_qpn,
            flow_label: s.flow_label,
            traffic_class: s.traffic_class,
            comm: s.comm.clone(),
            remote,
        };
        let id = self.writer.service_endpoint(&name, &tor, s.remote_gid, &conn);
        let key = self.services.insert(s.local_qpn, id, addr, s.flow_label);
        self.services.set_tor_slot(key, self.live.tor_slot(&tor));
        self.plan_labels();
        // First probe at once: the connection is news.
        self.schedule.push(Reverse((now, key)));
        let need = self.inflight_needed();
        if need > self.inflight.len() {
            self.grow_inflight(need);
        }
        Ok(name)
    }

    /// Stop probing the traced connection with `local_qpn`; false if it was not a target.
    /// Its schedule entry goes stale and is dropped when due; probes in flight complete.
    pub fn remove_service(&mut self, local_qpn: u32) -> bool {
        self.services.remove(local_qpn)
    }

    /// Service target counters.
    pub fn service_stats(&self) -> ServiceStats {
        self.services.stats()
    }

    /// In-flight slots the current rates need: twice rate × timeout, a power of two.
    fn inflight_needed(&self) -> usize {
        let pinglist: f64 = self.targets.iter().map(|t| 1e9 / t.interval_ns as f64).sum();
        let services = self.services.stats().active as f64 * 1e9 / self.services.interval_ns as f64;
        let need = (((pinglist + services) * self.timeout_ns as f64 / 1e9) * 2.0) as usize + 64;
        need.next_power_of_two().max(1024)
    }

    fn grow_inflight(&mut self, cap: usize) {
        let mut table = vec![InFlight::default(); cap];
        let mut addrs = vec![self.null_addr; cap];
        for (e, a) in self.inflight.iter().zip(&self.inflight_addr) {
            if e.seq != 0 {
                let slot = (e.seq as u32 as usize) & (cap - 1);
                table[slot] = *e;
                addrs[slot] = *a;
            }
        }
        self.inflight = table;
        self.inflight_addr = addrs;
    }

    /// The next instant the shard has something to do without input: a due probe, a timeout, or
    /// the flush timer. Event mode sleeps until then (or until a packet arrives).
    pub fn next_deadline_ns(&self) -> u64 {
        let mut t = self.next_flush_ns;
        if let Some(Reverse((due, _))) = self.schedule.peek() {
            t = t.min(*due);
        }
        if self.oldest_counter != self.next_counter {
            let slot = self.oldest_counter as usize & (self.inflight.len() - 1);
            let e = &self.inflight[slot];
            if e.seq != 0 {
                t = t.min(e.deadline);
            }
        }
        if let Some(p) = &self.paths {
            t = t.min(p.next_deadline_ns());
        }
        t
    }

    /// One round of work.
    pub fn step(&mut self) -> Result<(), SegmentError> {
        let start = self.clock_ns();
        self.transport.housekeeping(start);
        self.auth.refresh(start);
        self.collect_tx_timestamps(true)?;
        // Drain the socket (bounded): one batch per round would let a busy responder fall behind
        // its peers' send rate until its receive buffer overflows.
        for _ in 0..MAX_RECV_BATCHES_PER_STEP {
            if !self.receive()? {
                break;
            }
        }
        self.flush_sends()?;
        let now = self.clock_ns();
        self.send_due(now)?;
        self.flush_sends()?;
        // Send stamps of what just left (software stamps are ready at once), and the ACK2s
        // that ACK1's stamps release.
        self.collect_tx_timestamps(false)?;
        self.flush_sends()?;
        let now = self.clock_ns();
        self.expire(now)?;
        self.trace_paths(now);
        if now >= self.next_flush_ns {
            self.next_flush_ns = now + self.params.flush_interval_ns;
            if let Err(e) = self.writer.flush().and_then(|()| self.writer.rotate_if_older(now).map(drop)) {
                self.write_failed(now, &e);
            }
            if let Some(p) = &mut self.pusher {
                p.push(&mut self.writer, self.auth.send_seal().as_ref(), now, false);
            }
        }
        Ok(())
    }

    /// CLOCK_REALTIME for the shard's timers: every reading a timer is set or compared from goes
    /// through here, so a step is always seen before a timer set on one side of it meets a
    /// reading from the other (a step between two plain readings in one round once recorded a
    /// probe in flight lost, its deadline not yet moved).
    fn clock_ns(&mut self) -> u64 {
        let now = now_ns();
        self.follow_clock_steps(now);
        now
    }

    /// The shard's timers (probe schedule, in-flight deadlines, flush) are CLOCK_REALTIME, the
    /// clock its records and the kernel's timestamps use. A step of that clock would otherwise
    /// stop probing until the clock caught up again (a step back) or time out every probe in
    /// flight (a step forward): when one is seen, every timer moves with it. A probe in flight
    /// across the step gets an absurd delay and is recorded invalid, never lost.
    fn follow_clock_steps(&mut self, now: u64) {
        let offset = now.wrapping_sub(crate::clock::monotonic_ns()) as i64;
        let Some(before) = self.clock_offset_ns.replace(offset) else { return };
        let delta = offset.wrapping_sub(before);
        // The reference follows every round, so a slew never adds up to a false step.
        if delta.unsigned_abs() <= CLOCK_STEP_NS {
            return;
        }
        self.stats.clock_steps += 1;
        let shift = |t: u64| t.saturating_add_signed(delta);
        // Rebuilt in place: into_vec and from reuse the heap's buffer.
        let mut due = std::mem::take(&mut self.schedule).into_vec();
        for Reverse((t, _)) in &mut due {
            *t = shift(*t);
        }
        self.schedule = BinaryHeap::from(due);
        for e in self.inflight.iter_mut().filter(|e| e.seq != 0) {
            e.deadline = shift(e.deadline);
        }
        self.next_flush_ns = shift(self.next_flush_ns);
        if let Some(p) = &mut self.paths {
            p.shift_clock(delta);
        }
        tracing::warn!(
            device = %self.params.device,
            step_ms = delta / 1_000_000,
            "CLOCK_REALTIME stepped: probe timers moved with it; probes in flight across the step are recorded invalid"
        );
    }

    /// Path tracing's round, and the path records of the traces it finished.
    fn trace_paths(&mut self, now: u64) {
        let Some(p) = &mut self.paths else { return };
        let (transport, addrs) = (&self.transport, &self.target_addr);
        p.poll(now, |t, label| transport.wire_tuple(addrs.get(t)?, label, false));
        for d in p.take_done() {
            if let Err(e) = write_trace(&mut self.writer, self.self_id, &d) {
                self.errors.record(ERR_WRITE, now, format_args!("segment write failed, path trace dropped: {e}"));
            }
        }
    }

    fn enqueue(
        &mut self,
        to: &T::Addr,
        label: u32,
        packet: &[u8; PACKET_BYTES],
        want_tx: bool,
        slot: u32,
    ) -> Result<(), SegmentError> {
        if !self.transport.queue(to, label, packet, want_tx) {
            self.flush_sends()?;
            let taken = self.transport.queue(to, label, packet, want_tx);
            debug_assert!(taken, "an empty queue always takes a packet");
        }
        self.queued_slot[self.queued] = slot;
        self.queued += 1;
        if want_tx {
            self.tx_pending += 1;
        }
        Ok(())
    }

    fn flush_sends(&mut self) -> Result<(), SegmentError> {
        if self.queued == 0 {
            return Ok(());
        }
        let n = self.transport.flush(&mut self.fates);
        debug_assert_eq!(n, self.queued);
        self.queued = 0;
        for i in 0..n {
            let fate = self.fates[i];
            if fate == Fate::Sent {
                continue;
            }
            let slot = self.queued_slot[i];
            if slot == NOT_A_PROBE {
                self.not_sent(None, fate)?;
            } else if self.inflight[slot as usize].seq != 0 {
                // No send stamp will come for a probe that did not leave.
                self.tx_pending = self.tx_pending.saturating_sub(1);
                self.not_sent(Some(slot as usize), fate)?;
            }
        }
        Ok(())
    }

    /// A packet that did not leave after all, `slot` being its probe's in-flight slot (`None`
    /// for an answer to someone else's probe): the probe ends with that fate. For an answer, a
    /// refused or unreachable peer is its prober gone; a local failure is ours, and that prober
    /// will record a loss the network did not cause: say so in our log.
    fn not_sent(&mut self, slot: Option<usize>, fate: Fate) -> Result<(), SegmentError> {
        let Some(slot) = slot else {
            if let Fate::Dropped(reason) = fate {
                self.errors.record(ERR_ACK_DROPPED, now_ns(), format_args!("an ACK was not sent: {reason}"));
            }
            return Ok(());
        };
        let e = &mut self.inflight[slot];
        e.arrived &= !Arrived::PROBE_SENT;
        match fate {
            Fate::Sent => {}
            Fate::Refused => e.refused = true,
            Fate::Unreachable => e.unreachable = true,
            Fate::Dropped(reason) => {
                e.local_drop = Some(reason);
                self.drops.record(reason.index(), now_ns(), format_args!("probes stay local: {reason}"));
            }
        }
        self.finalize(slot)
    }

    /// The writer could not store records: it counted them (records_dropped) and starts a
    /// fresh file on the next chunk. Its error names the file, the reserve size and what to do:
    /// it must reach the log.
    fn write_failed(&mut self, now: u64, e: &SegmentError) {
        self.errors.record(ERR_WRITE, now, format_args!("segment write failed, records dropped: {e}"));
    }

    /// Close the segment writer; returns the closed segments (for sealing). The windows its
    /// last segment closes are pushed first.
    pub fn finish(mut self) -> Result<Vec<std::path::PathBuf>, SegmentError> {
        if let Some(p) = &mut self.pusher {
            let rotated = self.writer.rotate();
            p.push(&mut self.writer, self.auth.send_seal().as_ref(), now_ns(), true);
            rotated?;
        }
        self.writer.finish()
    }

    /// Segments closed by rotation since the last call.
    pub fn take_closed(&mut self) -> Vec<std::path::PathBuf> {
        self.writer.take_closed()
    }

    /// Read send timestamps and refusals. `always`: even with no stamp outstanding (refusals of
    /// probes whose stamps were read long ago arrive whenever the peer's host answers).
    fn collect_tx_timestamps(&mut self, always: bool) -> Result<(), SegmentError> {
        if !always && self.tx_pending == 0 {
            return Ok(());
        }
        // Drain (bounded) like the receive path: error-queue entries are charged to the socket's
        // receive buffer, so a backlog of unread stamps would make the kernel drop probes.
        for _ in 0..MAX_RECV_BATCHES_PER_STEP {
            if !self.collect_tx_batch()? {
                break;
            }
        }
        Ok(())
    }

    /// One batch of send stamps; returns whether the batch was full (more may be waiting).
    fn collect_tx_batch(&mut self) -> Result<bool, SegmentError> {
        let n = match self.transport.tx_timestamps(&mut self.tx) {
            Ok(n) => n,
            Err(e) => {
                // Probes whose stamps were lost end invalid (T2 missing) at their deadline and
                // are counted there; the error itself is counted and logged here.
                self.errors.record(ERR_TX_STAMPS, now_ns(), format_args!("reading send timestamps failed: {e}"));
                return Ok(false);
            }
        };
        // The time ACK2s of this batch are sealed with: one clock read per batch, not per ACK.
        let now = if n > 0 { now_ns() } else { 0 };
        for i in 0..n {
            let Ok(p) = Packet::decode(&self.tx.payload[i]) else { continue };
            let ts = self.tx.tx_ns[i];
            match self.tx.news[i] {
                TxNews::Stamp => self.tx_pending = self.tx_pending.saturating_sub(1),
                TxNews::Refused => {
                    // Only our probes matter: an ACK refused means its prober died, nothing to
                    // record.
                    if p.kind == Kind::Probe
                        && let Some(slot) = self.slot_of(p.seq)
                    {
                        self.inflight[slot].refused = true;
                        self.finalize(slot)?;
                    }
                    continue;
                }
                TxNews::Failed(reason) => {
                    if p.kind != Kind::Probe {
                        self.not_sent(None, Fate::Dropped(reason))?;
                    } else if let Some(slot) = self.slot_of(p.seq) {
                        self.not_sent(Some(slot), Fate::Dropped(reason))?;
                    }
                    continue;
                }
            }
            match p.kind {
                Kind::Probe => {
                    if let Some(slot) = self.slot_of(p.seq) {
                        self.inflight[slot].t2 = ts;
                        self.try_complete(slot)?;
                    }
                }
                Kind::Ack1 => {
                    let idx = p.t4_ns as usize & (PENDING_ACK2_SLOTS - 1);
                    if let Some(pa) = self.pending[idx]
                        && pa.seq == p.seq
                        && pa.token == p.t4_ns
                    {
                        self.pending[idx] = None;
                        let ack2 = Packet {
                            kind: Kind::Ack2,
                            seq: p.seq,
                            flow_label: pa.flow_label,
                            responder_epoch: self.params.epoch,
                            t3_ns: pa.t3,
                            t4_ns: ts,
                        };
                        let mut b = [0u8; PACKET_BYTES];
                        self.auth.encode(&ack2, &mut b, now, &self.transport.binding_to(&pa.to));
                        self.enqueue(&pa.to, pa.flow_label, &b, false, NOT_A_PROBE)?;
                    }
                }
                Kind::Ack2 | Kind::Refusal => {}
            }
        }
        Ok(n == crate::transport::BATCH)
    }

    /// One receive batch; returns whether it was full (more may be waiting).
    fn receive(&mut self) -> Result<bool, SegmentError> {
        let n = match self.transport.recv(&mut self.rx) {
            Ok(n) => n,
            Err(e) => {
                self.errors.record(ERR_RECV, now_ns(), format_args!("receiving failed: {e}"));
                return Ok(false);
            }
        };
        let t6 = now_ns();
        for i in 0..n {
            let from = self.rx.from[i];
            let stamped = self.rx.rx_ns[i] != 0;
            let rx_ns = if stamped { self.rx.rx_ns[i] } else { t6 };
            let bytes = &self.rx.buf[i][..self.rx.len[i]];
            let p = match Packet::parse(bytes) {
                Ok((p, _)) if p.kind == Kind::Refusal => {
                    self.refused_by_peer(&p, &from, t6);
                    continue;
                }
                Ok((p, seal)) => {
                    let me = self.transport.binding_at(self.rx.at[i]);
                    match self.auth.admit(bytes, seal, t6, &me) {
                        Ok(()) => p,
                        Err(why) => {
                            if Auth::keyed_differently(why) {
                                self.keyed_differently(&p, &from, t6)?;
                            }
                            continue;
                        }
                    }
                }
                Err(_) => {
                    if is_trace_payload(&self.rx.buf[i][..self.rx.len[i]]) {
                        self.stats.trace_arrivals += 1;
                    } else {
                        self.stats.malformed += 1;
                    }
                    continue;
                }
            };
            match p.kind {
                // Taken before admission.
                Kind::Refusal => {}
                Kind::Probe => self.answer(p, from, rx_ns, t6)?,
                Kind::Ack1 | Kind::Ack2 => {
                    let Some(slot) = self.slot_of(p.seq) else {
                        if (p.seq >> 32) as u32 == self.params.epoch {
                            self.stats.late += 1;
                        } else {
                            self.stats.unknown += 1;
                        }
                        continue;
                    };
                    if !self.transport.answers_from(&self.inflight_addr[slot], &from) {
                        // Our sequence number from someone we did not probe: forged or confused.
                        self.stats.unknown += 1;
                        continue;
                    }
                    let e = &mut self.inflight[slot];
                    let bit = if p.kind == Kind::Ack1 { Arrived::ACK1 } else { Arrived::ACK2 };
                    if e.arrived & bit != 0 {
                        // The first one counts; a second must not move T5 or T4 after the fact.
                        self.stats.duplicate_acks += 1;
                        continue;
                    }
                    e.responder_epoch = p.responder_epoch;
                    if p.kind == Kind::Ack1 {
                        e.arrived |= Arrived::ACK1;
                        e.t3 = p.t3_ns;
                        e.t5 = rx_ns;
                        e.t6 = t6;
                        e.host_fallback = !stamped;
                        let ti = e.ti;
                        if ti & SERVICE_BIT == 0
                            && let Some(t) = self.targets.get_mut(ti as usize)
                        {
                            t.heard_ns = t6;
                        }
                    } else {
                        e.arrived |= Arrived::ACK2;
                        e.t4 = p.t4_ns;
                        if e.t3 == 0 {
                            e.t3 = p.t3_ns;
                        }
                    }
                    self.try_complete(slot)?;
                }
            }
        }
        Ok(n == crate::transport::BATCH)
    }

    /// A packet from `from` refused for its keying alone ([`crate::auth`]): a probe gets a
    /// REFUSAL (rate-limited), an ACK marks its probe refused.
    fn keyed_differently(&mut self, p: &Packet, from: &T::Addr, now: u64) -> Result<(), SegmentError> {
        if p.kind != Kind::Probe {
            self.refused_by_peer(p, from, now);
            return Ok(());
        }
        // The sender names the flow label: answering a new (address, label) on verbs would
        // create an address handle for whoever sprays them, so only where one exists.
        if !self.transport.reaches_without_state(from, p.flow_label) {
            self.auth.refusals_held += 1;
            return Ok(());
        }
        if !self.auth.take_refusal(now) {
            return Ok(());
        }
        let refusal = Packet {
            kind: Kind::Refusal,
            seq: p.seq,
            flow_label: p.flow_label,
            responder_epoch: self.params.epoch,
            t3_ns: 0,
            t4_ns: 0,
        };
        let mut b = [0u8; PACKET_BYTES];
        refusal.encode(&mut b);
        self.enqueue(from, p.flow_label, &b, false, NOT_A_PROBE)
    }

    /// The target of probe `p.seq` refused it, or answered it, for its keying alone: recorded
    /// `auth_refused` at its deadline unless an admitted ACK1 comes first (never finalised
    /// early: a forged REFUSAL must not cut off a real answer). Taken only from a target that
    /// has not answered us within a probe timeout: a keying difference refuses every probe of
    /// the pair, so a REFUSAL beside admitted answers is forged (or a roll-out's edge) and the
    /// probe's fate is the network's.
    fn refused_by_peer(&mut self, p: &Packet, from: &T::Addr, now: u64) {
        match self.slot_of(p.seq) {
            Some(slot) if self.transport.answers_from(&self.inflight_addr[slot], from) => {
                let ti = self.inflight[slot].ti;
                let heard_ns =
                    if ti & SERVICE_BIT == 0 { self.targets.get(ti as usize).map_or(0, |t| t.heard_ns) } else { 0 };
                if heard_ns.saturating_add(self.timeout_ns) < now {
                    self.inflight[slot].auth_refused = true;
                } else {
                    self.stats.auth_refusals_ignored += 1;
                }
            }
            _ => self.stats.unknown += 1,
        }
    }

    /// Answer a probe received at `t3`; `now` is the receive batch's clock, ACK1's seal time.
    fn answer(&mut self, p: Packet, from: T::Addr, t3: u64, now: u64) -> Result<(), SegmentError> {
        if self.params.ignore_probe_fraction > 0.0 {
            // xorshift: a deterministic "lossy peer" for tests of loss accounting.
            self.ignore_state ^= self.ignore_state << 13;
            self.ignore_state ^= self.ignore_state >> 7;
            self.ignore_state ^= self.ignore_state << 17;
            if (self.ignore_state >> 11) as f64 / (1u64 << 53) as f64 <= self.params.ignore_probe_fraction {
                return Ok(());
            }
        }
        let token = self.next_token;
        self.next_token = self.next_token.wrapping_add(1).max(1);
        let ack1 = Packet {
            kind: Kind::Ack1,
            seq: p.seq,
            flow_label: p.flow_label,
            responder_epoch: self.params.epoch,
            t3_ns: t3,
            t4_ns: token,
        };
        let mut b = [0u8; PACKET_BYTES];
        self.auth.encode(&ack1, &mut b, now, &self.transport.binding_to(&from));
        self.enqueue(&from, p.flow_label, &b, true, NOT_A_PROBE)?;
        self.stats.answered += 1;
        if let Some(paths) = &mut self.paths
            && let Some(tuple) = self.transport.wire_tuple(&from, p.flow_label, true)
        {
            paths.on_answer(tuple, p.flow_label, t3);
        }
        // A slot still pending here is an ACK1 whose send timestamp never came back within
        // 4096 answers: its ACK2 is given up, and the prober records what it got.
        self.pending[token as usize & (PENDING_ACK2_SLOTS - 1)] =
            Some(PendingAck2 { token, seq: p.seq, to: from, flow_label: p.flow_label, t3 });
        Ok(())
    }

    fn send_due(&mut self, now: u64) -> Result<(), SegmentError> {
        if self.draining {
            return Ok(());
        }
        let horizon = now + self.params.send_ahead_ns;
        let mut sent = 0;
        while sent < MAX_SENDS_PER_STEP {
            let Some(&Reverse((due, ti))) = self.schedule.peek() else { break };
            if due > horizon {
                break;
            }
            self.schedule.pop();
            let (id, kind, interval, label, addr, tor_slot) = if ti & SERVICE_BIT != 0 {
                // A removed connection's entry is dropped here, not rescheduled.
                let Some(s) = self.services.get(ti) else { continue };
                (s.id, ProbeKind::Service.as_u8(), self.services.interval_ns, s.flow_label, s.addr, s.tor_slot)
            } else {
                let t = &mut self.targets[ti as usize];
                let label_index = t.cursor % t.labels_len as usize;
                let label = t.labels_in(&self.labels)[label_index];
                t.cursor = t.cursor.wrapping_add(1);
                if let Some(p) = &mut self.paths {
                    p.on_probe(ti as usize, label_index, now);
                }
                (t.id, t.kind, t.interval_ns, label, self.target_addr[ti as usize], t.tor_slot)
            };
            let late_ns = now.saturating_sub(due);
            if late_ns > LATE_SEND_NS {
                // The schedule slipped (a frozen host, a busy core): the window's summary says so.
                self.writer.note_late(due, late_ns);
            }
            let (next, skipped) = next_slot(due, interval, now);
            self.stats.slots_skipped += skipped;
            self.schedule.push(Reverse((next, ti)));

            let counter = self.next_counter;
            self.next_counter = self.next_counter.wrapping_add(1).max(1);
            let seq = (u64::from(self.params.epoch) << 32) | u64::from(counter);
            let slot = counter as usize & (self.inflight.len() - 1);
            if self.inflight[slot].seq != 0 {
                self.stats.inflight_overflow += 1;
                self.finalize(slot)?;
            }
            let mut b = [0u8; PACKET_BYTES];
            let probe = Packet { kind: Kind::Probe, seq, flow_label: label, responder_epoch: 0, t3_ns: 0, t4_ns: 0 };
            self.auth.encode(&probe, &mut b, now, &self.transport.binding_to(&addr));
            let t1 = now_ns();
            self.stats.probes_sent += 1;
            // Marked sent now; a flush that could not send it takes the mark back and records
            // what became of it (local drop, refusal, unreachable target).
            self.inflight[slot] = InFlight {
                seq,
                target_id: id,
                flow_label: label,
                kind,
                arrived: Arrived::PROBE_SENT,
                t1,
                // From the round's reading, which the step check has seen: t1 is read later,
                // and a step in between would leave this deadline on the wrong side of it.
                deadline: now + self.timeout_ns,
                ti,
                tor_slot,
                ..InFlight::default()
            };
            self.inflight_addr[slot] = addr;
            self.enqueue(&addr, label, &b, true, slot as u32)?;
            sent += 1;
        }
        Ok(())
    }

    fn expire(&mut self, now: u64) -> Result<(), SegmentError> {
        let mask = self.inflight.len() - 1;
        while self.oldest_counter != self.next_counter {
            let slot = self.oldest_counter as usize & mask;
            let e = self.inflight[slot];
            if e.seq != 0 && (e.seq as u32) == self.oldest_counter {
                if e.deadline > now {
                    break;
                }
                self.finalize(slot)?;
            }
            self.oldest_counter = self.oldest_counter.wrapping_add(1).max(1);
        }
        Ok(())
    }

    fn slot_of(&self, seq: u64) -> Option<usize> {
        if (seq >> 32) as u32 != self.params.epoch {
            return None;
        }
        let slot = seq as u32 as usize & (self.inflight.len() - 1);
        (self.inflight[slot].seq == seq).then_some(slot)
    }

    fn try_complete(&mut self, slot: usize) -> Result<(), SegmentError> {
        let e = &self.inflight[slot];
        if e.arrived & (Arrived::ACK1 | Arrived::ACK2) == Arrived::ACK1 | Arrived::ACK2 && e.t2 != 0 {
            self.finalize(slot)?;
        }
        Ok(())
    }

    /// Turn an in-flight entry into a record, whatever state it is in, and free its slot.
    fn finalize(&mut self, slot: usize) -> Result<(), SegmentError> {
        let e = self.inflight[slot];
        self.inflight[slot].seq = 0;
        if e.arrived & Arrived::PROBE_SENT != 0 && !e.refused {
            // A peer keyed otherwise is alive where it was: nothing to resolve again.
            self.transport.observe(&self.inflight_addr[slot], e.arrived & Arrived::ACK1 != 0 || e.auth_refused);
        }
        let complete = e.arrived & (Arrived::ACK1 | Arrived::ACK2) == Arrived::ACK1 | Arrived::ACK2;
        let mut r = ProbeRecord {
            t1_unix_ns: e.t1,
            seq: e.seq,
            prober: self.self_id,
            target: e.target_id,
            flow_label: e.flow_label,
            responder_epoch: e.responder_epoch,
            kind: e.kind,
            arrived: e.arrived,
            ts_source: if e.host_fallback { TsSource::HostPoll as u8 } else { self.ts_source as u8 },
            ..ProbeRecord::default()
        };
        let mut sample = None;
        if let Some(reason) = e.local_drop {
            r.outcome = Outcome::LocalDrop as u8;
            self.stats.local_drops[reason.index()] += 1;
        } else if e.refused {
            r.outcome = Outcome::Refused as u8;
            self.stats.peer_down += 1;
        } else if e.unreachable {
            r.outcome = Outcome::Lost as u8;
            self.stats.lost += 1;
            self.stats.unreachable += 1;
        } else if e.auth_refused && e.arrived & Arrived::ACK1 == 0 {
            r.outcome = Outcome::AuthRefused as u8;
            self.stats.probes_auth_refused += 1;
        } else if !complete {
            r.outcome = Outcome::Lost as u8;
            self.stats.lost += 1;
            if let Some(p) = &mut self.paths
                && e.kind == ProbeKind::InterTor.as_u8()
            {
                p.on_loss(e.target_id, e.flow_label, now_ns());
            }
        } else {
            match delays(&e) {
                Some((rtt, pd, rd)) => {
                    r.network_rtt_ns = rtt;
                    r.prober_delay_ns = pd;
                    r.responder_delay_ns = rd;
                    r.outcome = Outcome::Ok as u8;
                    self.stats.ok += 1;
                    // Plausible delays are non-negative (six_timestamp_delays).
                    sample = Some((rtt.max(0) as u64, pd.max(0) as u64, rd.max(0) as u64));
                }
                None => {
                    r.outcome = Outcome::Invalid as u8;
                    self.stats.invalid += 1;
                }
            }
        }
        self.live.probe(e.tor_slot, Class::of(r.outcome, r.arrived), sample);
        if let Err(e) = self.writer.append(&r) {
            self.write_failed(now_ns(), &e);
        }
        Ok(())
    }
}

/// Writes one finished trace: its hops, and an answer path's prober, become dictionary entries
/// named by their addresses (`analyze` maps them to switches and RNICs).
fn write_trace(writer: &mut SegmentWriter, self_id: u32, d: &Traced) -> Result<(), SegmentError> {
    let mapped = |ip: std::net::Ipv4Addr| rocemesh_formats::gid::gid_bytes(std::net::IpAddr::V4(ip));
    let dst = match d.target_id {
        Some(id) => id,
        None => {
            let gid = mapped(d.peer);
            match writer.endpoint_by_addr(EndpointRole::Rnic, &gid) {
                Some(e) => e.id,
                None => writer.endpoint(EndpointRole::Peer, &d.peer.to_string(), "", gid),
            }
        }
    };
    let mut hops = [0u32; rocemesh_formats::record::MAX_HOPS];
    for (h, ip) in hops.iter_mut().zip(&d.hops[..d.hop_count]) {
        *h = writer.endpoint(EndpointRole::Switch, &ip.to_string(), "", mapped(*ip));
    }
    writer.append_path(&rocemesh_formats::record::PathRecord {
        t_unix_ns: d.started_ns,
        src: self_id,
        dst,
        flow_label: d.flow_label,
        hop_count: d.hop_count as u32,
        hops,
    })
}

/// The three delays (see [`six_timestamp_delays`]); `None` makes the probe invalid.
fn delays(e: &InFlight) -> Option<(i32, i32, i32)> {
    six_timestamp_delays([e.t1, e.t2, e.t3, e.t4, e.t5, e.t6])
}

/// When a target's next probe is due after one due at `due_ns` is sent at `now_ns`, and how
/// many slots were given up: the cadence holds through a slip of up to [`CATCH_UP_NS`] (or one
/// interval, if longer), and restarts from now after a longer one.
fn next_slot(due_ns: u64, interval_ns: u64, now_ns: u64) -> (u64, u64) {
    let late_ns = now_ns.saturating_sub(due_ns);
    if late_ns <= CATCH_UP_NS.max(interval_ns) {
        (due_ns + interval_ns, 0)
    } else {
        (now_ns + interval_ns, late_ns / interval_ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_slip_keeps_the_cadence_and_a_long_one_restarts_it() {
        const MS: u64 = 1_000_000;
        // 1.2 ms interval (833 probes/s to one target), sent 4 ms late: the missed slots follow at
        // once, so the target still gets its rate.
        assert_eq!(next_slot(100 * MS, 1_200_000, 104 * MS), (101 * MS + 200_000, 0));
        let (mut due, mut sent, now) = (100 * MS, 0, 104 * MS);
        while due <= now {
            sent += 1;
            due = next_slot(due, 1_200_000, now).0;
        }
        assert_eq!((sent, due), (4, 104 * MS + 800_000), "the 4 slots due by then, then the cadence");
        // Exactly at the catch-up bound: still kept.
        assert_eq!(next_slot(0, MS, CATCH_UP_NS), (MS, 0));
        // Frozen for 2 s: restart from now, the 2000 slots missed given up rather than fired at once.
        assert_eq!(next_slot(MS, MS, 2001 * MS), (2002 * MS, 2000));
        // A target probed once a minute that slips a second keeps its cadence (one interval).
        assert_eq!(next_slot(0, 60_000 * MS, 1_000 * MS), (60_000 * MS, 0));
        // On time.
        assert_eq!(next_slot(5 * MS, MS, 5 * MS), (6 * MS, 0));
    }

    fn e(t: [u64; 6]) -> InFlight {
        InFlight { t1: t[0], t2: t[1], t3: t[2], t4: t[3], t5: t[4], t6: t[5], ..InFlight::default() }
    }

    #[test]
    fn delays_follow_the_six_timestamp_formulas() {
        // Prober: posted 100, sent 110, ACK1 in 150, seen 160. Responder: in 1000, ACK1 out 1012.
        assert_eq!(delays(&e([100, 110, 1_000, 1_012, 150, 160])), Some((40 - 12, 60 - 40, 12)));
    }

    #[test]
    fn negative_absurd_or_missing_timestamps_are_invalid() {
        assert_eq!(delays(&e([100, 110, 1_000, 990, 150, 160])), None, "T4 before T3");
        assert_eq!(delays(&e([200, 110, 1_000, 1_012, 150, 160])), None, "T1 after T6: a clock step");
        assert_eq!(delays(&e([100, 110, 1_000, 1_012, 150, 0])), None, "T6 missing");
        assert_eq!(delays(&e([1, 2, 1_000, 1_001, 2 + 11_000_000_000, 3 + 11_000_000_000])), None, "RTT > 10 s");
    }
}
