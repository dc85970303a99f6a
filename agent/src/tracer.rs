//! The service tracer thread: loads the eBPF QP tracer (`rocemesh-bpf`), turns each connection
//! that reaches RTR on a GID one of this agent's shards owns into a service target of that
//! shard, and ends it when the QP is destroyed or its process is gone.
//!
//! It owns the agent-wide bounds of tracing: the event intake rate (a token bucket; a connection
//! storm beyond it is counted, not queued), the table of connections handed to shards (bounded;
//! needed to route destroy events, which carry no GID), and the per-shard queues (bounded;
//! a shard that falls behind loses events, counted). Shards bound their own tables
//! ([`crate::service::ServiceTable`]). Every refusal is counted and the first of each kind in a
//! while is logged with its reason ([`ErrorLog`]).
//!
//! The verbs data path bypasses the kernel, so the tracer cannot see whether a connection still
//! carries traffic: a connection ends with its QP (destroy event) or its process (a sweep of
//! `/proc` every few seconds catches destroy events lost to a full ring buffer).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{SyncSender, TrySendError};
use std::time::Duration;

use rocemesh_bpf::{QpEvent, QpEventKind, Tracer};

use crate::clock::now_ns;
use crate::config::ServiceTracing;
use crate::errlog::ErrorLog;
use crate::service::{NewService, RemoveReason, ServiceEvent, TokenBucket};

/// Events a shard's queue holds; beyond it the shard is behind and events are dropped, counted.
pub const SHARD_QUEUE: usize = 256;
const SWEEP_NS: u64 = 2_000_000_000;
const POLL: Duration = Duration::from_millis(100);

const ERR_DECODE: usize = 0;
const ERR_RATE: usize = 1;
const ERR_UNOWNED: usize = 2;
const ERR_FULL: usize = 3;
const ERR_QUEUE: usize = 4;
const ERR_KERNEL: usize = 5;
const ERR_NO_AV: usize = 6;
const ERR_SKIPPED: usize = 7;
const ERROR_NAMES: [&str; 8] = [
    "malformed_event",
    "event_rate",
    "unowned_gid",
    "connection_table_full",
    "shard_queue_full",
    "ring_buffer",
    "no_address_vector",
    "kernel_skipped",
];

/// A shard as the tracer sees it: the GID it owns and its queue.
#[derive(Debug, Clone)]
pub struct ShardLink {
    pub device: String,
    pub gid: [u8; 16],
    pub tx: SyncSender<ServiceEvent>,
}

/// Counters of the tracer thread.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TracerStats {
    /// Events read from the ring buffer (decoded or not).
    pub events: u64,
    /// RTR events of connections handed to a shard.
    pub handed: u64,
    /// Connections ended: destroy events, and processes found gone.
    pub ended: u64,
    pub process_gone: u64,
    /// Events that did not decode (truncated, foreign version, unknown kind).
    pub malformed: u64,
    /// Events beyond `max_events_per_s`.
    pub rate_dropped: u64,
    /// RTR events on a GID no shard owns (another RNIC, or a GID this agent does not probe from).
    pub unowned: u64,
    /// RTR events refused because the connection table was full.
    pub table_full: u64,
    /// Events a shard's full queue refused.
    pub queue_full: u64,
    /// RTR without an address vector (no GIDs to probe).
    pub no_av: u64,
    /// The kernel side's count of events lost to a full ring buffer.
    pub kernel_dropped: u64,
    /// RTRs of a connection already handed, towards the same peer: not handed again.
    pub repeated_rtr: u64,
    /// Hook calls the kernel skipped the programs for ([`rocemesh_bpf::KernelCounters::skipped_runs`]).
    pub kernel_skipped: u64,
}

struct Conn {
    shard: usize,
    pid: u32,
    /// Remote QPN, remote GID and requested flow label of the RTR handed.
    peer: (u32, [u8; 16], u32),
}

/// What the tracer thread keeps between events; pure apart from the queues, so it is tested
/// without a kernel.
pub struct Router {
    shards: Vec<ShardLink>,
    conns: HashMap<(String, u32), Conn>,
    max_conns: usize,
    bucket: TokenBucket,
    stats: TracerStats,
    errors: ErrorLog<8>,
}

impl std::fmt::Debug for Router {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Router").field("conns", &self.conns.len()).field("stats", &self.stats).finish_non_exhaustive()
    }
}

impl Router {
    /// Routes to `shards`. The connection table holds four times what the shards can probe
    /// (connections a shard refused still need their destroy event routed nowhere).
    pub fn new(cfg: &ServiceTracing, shards: Vec<ShardLink>, now_ns: u64) -> Self {
        let max_conns = cfg.max_targets_per_shard * shards.len() * 4;
        Self {
            conns: HashMap::with_capacity(max_conns),
            max_conns,
            bucket: TokenBucket::new(cfg.max_events_per_s, cfg.max_events_per_s, now_ns),
            shards,
            stats: TracerStats::default(),
            errors: ErrorLog::new("service-tracer", ERROR_NAMES),
        }
    }

    pub fn stats(&self) -> TracerStats {
        self.stats
    }

    /// One event from the ring buffer.
    pub fn event(&mut self, ev: Result<QpEvent, rocemesh_bpf::DecodeError>, now_ns: u64) {
        self.stats.events += 1;
        let ev = match ev {
            Ok(ev) => ev,
            Err(e) => {
                self.stats.malformed += 1;
                self.errors.record(ERR_DECODE, now_ns, format_args!("tracer event refused: {e}"));
                return;
            }
        };
        if !self.bucket.take(now_ns) {
            self.stats.rate_dropped += 1;
            self.errors.record(
                ERR_RATE,
                now_ns,
                format_args!("more than max_events_per_s QP events (a connection storm): the excess is dropped"),
            );
            return;
        }
        match ev.kind {
            QpEventKind::Rtr => self.rtr(&ev, now_ns),
            QpEventKind::Destroyed => {
                if let Some(c) = self.conns.remove(&(ev.device.clone(), ev.local_qpn)) {
                    self.stats.ended += 1;
                    let why = RemoveReason::Destroyed;
                    self.send(c.shard, ServiceEvent::Remove { local_qpn: ev.local_qpn, why }, now_ns);
                }
            }
        }
    }

    fn rtr(&mut self, ev: &QpEvent, now_ns: u64) {
        if !ev.has_av {
            self.stats.no_av += 1;
            let msg = format_args!(
                "QP {} on {} reached RTR without an address vector: no path to probe",
                ev.local_qpn, ev.device
            );
            self.errors.record(ERR_NO_AV, now_ns, msg);
            return;
        }
        let Some(shard) = self.shards.iter().position(|s| s.gid == ev.local_gid) else {
            self.stats.unowned += 1;
            let gid = std::net::Ipv6Addr::from(ev.local_gid);
            let msg = format_args!("QP {} on {} uses GID {gid}, which no shard probes from", ev.local_qpn, ev.device);
            self.errors.record(ERR_UNOWNED, now_ns, msg);
            return;
        };
        let key = (ev.device.clone(), ev.local_qpn);
        let peer = (ev.remote_qpn, ev.remote_gid, ev.flow_label);
        if self.conns.get(&key).is_some_and(|c| c.pid == ev.pid && c.peer == peer) {
            // The same connection again: a copy of the record the tracer let through (it
            // arrived after its window), or a re-RTR towards the same peer. Nothing is new.
            self.stats.repeated_rtr += 1;
            return;
        }
        if !self.conns.contains_key(&key) && self.conns.len() >= self.max_conns {
            self.stats.table_full += 1;
            let msg =
                format_args!("{} connections traced: raise service_tracing.max_targets_per_shard", self.max_conns);
            self.errors.record(ERR_FULL, now_ns, msg);
            return;
        }
        self.conns.insert(key, Conn { shard, pid: ev.pid, peer });
        self.stats.handed += 1;
        let s = NewService {
            local_qpn: ev.local_qpn,
            remote_qpn: ev.remote_qpn,
            pid: ev.pid,
            comm: ev.comm.clone(),
            remote_gid: ev.remote_gid,
            flow_label: rocemesh_bpf::effective_flow_label(ev),
            traffic_class: ev.traffic_class,
            rtr_mono_ns: ev.time_mono_ns,
        };
        self.send(shard, ServiceEvent::Add(s), now_ns);
    }

    fn send(&mut self, shard: usize, ev: ServiceEvent, now_ns: u64) {
        match self.shards[shard].tx.try_send(ev) {
            Ok(()) | Err(TrySendError::Disconnected(_)) => {}
            Err(TrySendError::Full(_)) => {
                self.stats.queue_full += 1;
                let msg = format_args!("shard {} is behind on service events: dropped", self.shards[shard].device);
                self.errors.record(ERR_QUEUE, now_ns, msg);
            }
        }
    }

    /// End connections whose process is gone (`alive` answers for a pid): their destroy event
    /// was lost (a full ring buffer) or never came.
    pub fn sweep(&mut self, now_ns: u64, alive: impl Fn(u32) -> bool) {
        let gone: Vec<(String, u32)> =
            self.conns.iter().filter(|(_, c)| !alive(c.pid)).map(|(k, _)| k.clone()).collect();
        for k in gone {
            if let Some(c) = self.conns.remove(&k) {
                self.stats.ended += 1;
                self.stats.process_gone += 1;
                let why = RemoveReason::ProcessGone;
                self.send(c.shard, ServiceEvent::Remove { local_qpn: k.1, why }, now_ns);
            }
        }
    }

    /// Fold in the kernel's count of hook calls it ran the programs for not at all.
    pub fn kernel_skipped(&mut self, total: u64, now_ns: u64) {
        if total > self.stats.kernel_skipped {
            let msg = format_args!(
                "the kernel skipped the QP tracer's programs {total} times (a run preempted on a CPU while \
                 another process hit the same hook): connections set up at those moments were not seen"
            );
            self.errors.record(ERR_SKIPPED, now_ns, msg);
        }
        self.stats.kernel_skipped = total;
    }

    /// Fold in the kernel side's count of events lost to a full ring buffer.
    pub fn kernel_dropped(&mut self, total: u64, now_ns: u64) {
        if total > self.stats.kernel_dropped {
            let msg = format_args!("{} QP events lost in the kernel: the ring buffer was full", total);
            self.errors.record(ERR_KERNEL, now_ns, msg);
        }
        self.stats.kernel_dropped = total;
    }
}

fn pid_alive(pid: u32) -> bool {
    std::path::Path::new("/proc").join(pid.to_string()).exists()
}

/// Run the tracer until `stop` or `signal` (the process-wide SIGINT or SIGTERM). Without the tracer (no capability, no kernel support) it logs
/// why, once, and returns: the agent goes on probing its pinglist.
pub fn run(
    cfg: &ServiceTracing,
    shards: Vec<ShardLink>,
    stop: &AtomicBool,
    signal: &AtomicBool,
    stats_interval_s: u64,
) {
    let loaded = Tracer::load();
    // Loading needed CAP_BPF and CAP_PERFMON; reading the ring buffer and maps needs only the
    // descriptors.
    crate::caps::drop_or_say("service-tracer", 0);
    let mut tracer = match loaded {
        Ok(t) => t,
        Err(e) => {
            tracing::error!("service tracing is off: {e}. The agent goes on probing its pinglist.");
            return;
        }
    };
    tracing::info!(hooks = ?rocemesh_bpf::HOOKS, shards = shards.len(), "service tracing on");
    let mut router = Router::new(cfg, shards, now_ns());
    let mut next_sweep = now_ns() + SWEEP_NS;
    let stats_every_ns = stats_interval_s * 1_000_000_000;
    let mut next_stats = now_ns() + stats_every_ns;
    let mut poll_errors = ErrorLog::new("service-tracer", ["ring_buffer_poll"]);
    while !stop.load(Ordering::Relaxed) && !signal.load(Ordering::Relaxed) {
        if let Err(e) = tracer.poll(POLL, &mut |ev| router.event(ev, now_ns())) {
            poll_errors.record(0, now_ns(), format_args!("polling the tracer's ring buffer failed: {e}"));
            std::thread::sleep(POLL);
        }
        let now = now_ns();
        if now >= next_sweep {
            next_sweep = now + SWEEP_NS;
            router.sweep(now, pid_alive);
            match tracer.kernel_counters() {
                Ok(k) => {
                    router.kernel_dropped(k.ringbuf_full, now);
                    router.kernel_skipped(k.skipped_runs, now);
                }
                Err(e) => {
                    poll_errors.record(0, now, format_args!("reading the tracer's counters failed: {e}"));
                }
            }
        }
        if stats_every_ns > 0 && now >= next_stats {
            next_stats = now + stats_every_ns;
            log_stats(&router.stats(), false);
        }
    }
    log_stats(&router.stats(), true);
}

fn log_stats(s: &TracerStats, last: bool) {
    tracing::info!(
        final_ = last,
        events = s.events,
        handed = s.handed,
        ended = s.ended,
        process_gone = s.process_gone,
        malformed = s.malformed,
        rate_dropped = s.rate_dropped,
        unowned = s.unowned,
        table_full = s.table_full,
        queue_full = s.queue_full,
        no_av = s.no_av,
        kernel_dropped = s.kernel_dropped,
        kernel_skipped = s.kernel_skipped,
        repeated_rtr = s.repeated_rtr,
        "service tracer stats"
    );
}

/// Spawn [`run`] on its own thread (it blocks in the ring buffer's epoll, never on a shard core).
pub fn spawn(
    cfg: ServiceTracing,
    shards: Vec<ShardLink>,
    stop: Arc<AtomicBool>,
    signal: &'static AtomicBool,
    stats_interval_s: u64,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("service-tracer".into())
        .spawn(move || run(&cfg, shards, &stop, signal, stats_interval_s))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::{Receiver, sync_channel};

    fn ev(kind: QpEventKind, lqpn: u32, gid: u8, pid: u32) -> QpEvent {
        QpEvent {
            kind,
            time_mono_ns: 1,
            pid,
            comm: "ib_write_bw".into(),
            device: "rxe0".into(),
            port: 1,
            local_qpn: lqpn,
            remote_qpn: lqpn + 1,
            local_gid: [gid; 16],
            remote_gid: [9; 16],
            flow_label: 0,
            traffic_class: 106,
            hop_limit: 64,
            qp_type: 2,
            has_av: true,
        }
    }

    fn router(cfg: &ServiceTracing, queue: usize) -> (Router, Receiver<ServiceEvent>, Receiver<ServiceEvent>) {
        let (a, ra) = sync_channel(queue);
        let (b, rb) = sync_channel(queue);
        let shards = vec![
            ShardLink { device: "rxe0".into(), gid: [1; 16], tx: a },
            ShardLink { device: "rxe1".into(), gid: [2; 16], tx: b },
        ];
        (Router::new(cfg, shards, 0), ra, rb)
    }

    #[test]
    fn events_go_to_the_shard_owning_the_gid_and_destroys_follow() {
        let (mut r, ra, rb) = router(&ServiceTracing::default(), 16);
        r.event(Ok(ev(QpEventKind::Rtr, 17, 2, 5)), 10);
        r.event(Ok(ev(QpEventKind::Rtr, 18, 3, 5)), 10);
        r.event(Ok(ev(QpEventKind::Destroyed, 17, 0, 5)), 20);
        r.event(Ok(ev(QpEventKind::Destroyed, 99, 0, 5)), 20);
        assert!(ra.try_recv().is_err());
        match rb.try_recv() {
            Ok(ServiceEvent::Add(s)) => {
                assert_eq!((s.local_qpn, s.remote_qpn, s.pid), (17, 18, 5));
                assert_eq!(s.flow_label, rocemesh_bpf::effective_flow_label(&ev(QpEventKind::Rtr, 17, 2, 5)));
                assert_ne!(s.flow_label, 0, "a zero label is replaced by the one the RNIC derives");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(rb.try_recv(), Ok(ServiceEvent::Remove { local_qpn: 17, why: RemoveReason::Destroyed }));
        let s = r.stats();
        assert_eq!((s.events, s.handed, s.ended, s.unowned), (4, 1, 1, 1));
    }

    /// A late copy of a handed RTR is not handed again; a re-RTR to another peer is.
    #[test]
    fn a_repeated_rtr_of_a_held_connection_is_not_news() {
        let (mut r, _ra, rb) = router(&ServiceTracing::default(), 16);
        r.event(Ok(ev(QpEventKind::Rtr, 17, 2, 5)), 10);
        r.event(Ok(ev(QpEventKind::Rtr, 17, 2, 5)), 11);
        let mut moved = ev(QpEventKind::Rtr, 17, 2, 5);
        moved.remote_qpn = 40;
        r.event(Ok(moved), 12);
        let added: Vec<u32> = std::iter::from_fn(|| rb.try_recv().ok())
            .map(|e| match e {
                ServiceEvent::Add(s) => s.remote_qpn,
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(added, [18, 40]);
        assert_eq!((r.stats().handed, r.stats().repeated_rtr), (2, 1));
    }

    #[test]
    fn malformed_storm_and_dead_processes_are_counted_and_bounded() {
        let cfg = ServiceTracing { max_events_per_s: 100.0, max_targets_per_shard: 4, ..ServiceTracing::default() };
        let (mut r, ra, _rb) = router(&cfg, 8);
        r.event(Err(rocemesh_bpf::decode(&[1, 2, 3]).expect_err("truncated")), 0);
        // A storm of 1,000 RTRs in one instant: the bucket takes 100, the table 32, the queue 8.
        for q in 0..1_000 {
            r.event(Ok(ev(QpEventKind::Rtr, q, 1, 7)), 0);
        }
        let s = r.stats();
        assert_eq!(s.malformed, 1);
        assert_eq!(s.rate_dropped, 900, "{s:?}");
        assert_eq!(s.handed, 32);
        assert_eq!(s.table_full, 68);
        assert_eq!(s.queue_full, 24);
        assert_eq!(ra.try_iter().count(), 8);
        // The process exits without destroy events: the sweep ends every connection.
        r.sweep(1, |_| false);
        assert_eq!(r.stats().process_gone, 32);
        assert!(r.conns.is_empty());
    }
}
