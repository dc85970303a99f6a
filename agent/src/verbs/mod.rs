//! The RDMA verbs transport: the probe protocol over one UD queue pair per shard (rdma-sys over
//! the system's libibverbs and librdmacm).
//!
//! What it owns, per shard:
//! - one device context, protection domain and ONE registered region holding every receive
//!   buffer (pre-posted) and every send buffer, sized at start;
//! - one UD QP with separate send and receive CQs on one completion channel (event mode waits
//!   on its descriptor); a device without completion timestamps (rxe) gets plain CQs polled with
//!   `ibv_poll_cq`, never the `start_poll`/`next_poll` loop that corrupts rxe's CQ on
//!   rdma-core 44, which only extended CQs with NIC stamps use;
//! - address handles cached per (destination GID, flow label), bounded, created once;
//! - an RDMA CM `RDMA_PS_UDP` listener on the shard's address and port: peers resolve this
//!   shard's current QPN with a SIDR request (docs/design/agent.md#ctl-and-agent-restarts), and the
//!   prober resolves its targets the same way, at run time, again when they stop answering;
//! - recovery: device removal (`rdma link delete`), fatal device errors and port events tear the
//!   resources down; the shard keeps running (its probes stay local, `DeviceGone`, while its
//!   peers see it dead) and the transport reopens the device once it is back.
//!
//! Modules: [`device`] finds and opens the device and says what is missing; [`resources`] owns
//! every verbs and RDMA CM object (RAII); [`resolve`] is the peer-resolution state machine,
//! pure and tested without a device. This file drives them: the send path, the completion
//! queues, the CM events.
//!
//! Timestamps: where the device has no completion timestamps (rxe has none), the receive stamps
//! T3 and T5 are host CLOCK_REALTIME read right after `ibv_poll_cq` returns, the send stamps T2
//! and T4 the same clock right after `ibv_post_send` returns (see `flush` for why not the send
//! completion), and records say `HostPoll`. Where it has them, the CQs are extended CQs whose
//! completions carry the NIC's stamp (wall clock, or ticks of its own clock: [`clock`]), send
//! stamps come with the send completion, and records say `Nic`.

use std::io;
use std::mem::zeroed;
use std::net::{IpAddr, SocketAddr, SocketAddrV4};
use std::os::fd::RawFd;
use std::ptr::null_mut;

use rdma_sys as ffi;
use rocemesh_formats::gid::{gid_bytes, ip_of};
use rocemesh_formats::record::TsSource;

use crate::clock::now_ns;
use crate::errlog::ErrorLog;
use crate::pathtrace::WireTuple;
use crate::protocol::{Binding, PACKET_BYTES};
use crate::transport::{BATCH, DropReason, Fate, RxBatch, SEND_BATCH, Transport, TxBatch, TxNews};

pub mod clock;
pub mod device;
mod resolve;
mod resources;
pub mod view;

use clock::Clock;
use device::timed;
pub use device::{DeviceInfo, GRH_BYTES, VerbsConfig, VerbsError, discover, source_gid};
use resolve::{Peers, Resolution, Route};
use resources::{Cm, CmId, Resources, start_resolution};

/// The Q_Key RDMA CM uses for `RDMA_PS_UDP` (the kernel's RDMA_UDP_QKEY): SIDR replies carry
/// it, so our QP must use it too.
pub const RDMA_UDP_QKEY: u32 = 0x0123_4567;
/// Receive buffers pre-posted: a burst of this many packets between two polls is absorbed.
const RECV_DEPTH: usize = 1024;
/// Sends outstanding at most (signalled; a slot returns when its completion is polled).
const SEND_DEPTH: usize = 1024;
/// A receive slot: GRH, one packet, and room to tell an oversized datagram from ours.
const RECV_SLOT_BYTES: usize = GRH_BYTES + PACKET_BYTES + 64;
/// Address handles at most; a flood of probes from forged GIDs cannot exhaust device memory.
const MAX_AH: usize = 16_384;
/// Destinations resolved through RDMA CM at most (targets; answering needs no resolution).
const MAX_DESTS: usize = 65_536;
/// How often a shard whose device is gone looks for it again.
const REOPEN_EVERY_NS: u64 = 1_000_000_000;
const CM_TIMEOUT_MS: i32 = 2_000;
/// Send stamps waiting to be read (the shard reads them right after every flush).
const STAMP_RING: usize = 4 * SEND_BATCH;

/// Kinds of error the transport survives, for its [`ErrorLog`].
const ERR_POLL_CQ: usize = 0;
const ERR_SIDR_ANSWER: usize = 1;
const ERR_RESOLUTION_START: usize = 2;
const ERR_COMPLETION: usize = 3;
const ERR_DEVICE: usize = 4;
const ERROR_NAMES: [&str; 5] = ["poll_cq", "sidr_answer", "resolution_start", "completion", "device"];

/// A verbs peer: its GID, and either its QPN or (qpn 0) the RDMA CM port to resolve it on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct VerbsAddr {
    /// The peer's GID (IPv4-mapped for IPv4 RoCEv2).
    pub gid: [u8; 16],
    /// The peer's UD QPN; 0 = resolve at run time through RDMA CM on `port`.
    pub qpn: u32,
    /// The peer's RDMA CM service port (targets); 0 for a sender seen on the wire.
    pub port: u16,
}

impl VerbsAddr {
    /// Fills unused slots.
    pub const NULL: VerbsAddr = VerbsAddr { gid: [0; 16], qpn: 0, port: 0 };
}

/// Counters of the verbs layer (the shard has the probe counters).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VerbsStats {
    /// QPNs resolved through RDMA CM.
    pub resolved: u64,
    /// Resolutions refused (nothing listens: the peer's agent is down).
    pub refused: u64,
    /// Resolutions that failed (timeout, no route) or could not be started.
    pub unreachable: u64,
    /// SIDR requests answered for peers.
    pub answered_sidr: u64,
    /// Times the device went away (removal, fatal error).
    pub device_lost: u64,
    /// Times it came back and probing resumed.
    pub device_recovered: u64,
    /// Completions with an error status.
    pub completion_errors: u64,
    /// Address handles that could not be created (or the cache was full).
    pub ah_failures: u64,
    /// Polls of a completion queue that failed.
    pub poll_errors: u64,
    /// SIDR requests of peers that could not be answered (accept or reject failed).
    pub sidr_answer_errors: u64,
}

/// One queued send.
#[derive(Clone, Copy)]
struct Queued {
    to: VerbsAddr,
    label: u32,
    packet: [u8; PACKET_BYTES],
    want_tx: bool,
}

/// The transport.
pub struct VerbsTransport {
    cfg: VerbsConfig,
    res: Option<Resources>,
    cm: Option<Cm>,
    /// Resolutions in flight hold CM ids of `cm`'s channel: `lose_device` and `Drop` cancel
    /// them before `cm` goes.
    peers: Peers<CmId>,
    queue: Box<[Queued; SEND_BATCH]>,
    queued: usize,
    /// Send stamps (T2, T4) of posted packets that asked for one, for `tx_timestamps`: a ring.
    stamps: Box<[([u8; PACKET_BYTES], u64); STAMP_RING]>,
    stamps_head: usize,
    stamps_len: usize,
    /// Sends the device completed with an error, for `tx_timestamps`: (packet, status).
    failed: Box<[([u8; PACKET_BYTES], u32); BATCH]>,
    failed_len: usize,
    wrs: Box<[ffi::ibv_send_wr; SEND_BATCH]>,
    sges: Box<[ffi::ibv_sge; SEND_BATCH]>,
    wcs: Box<Completions>,
    /// Completions polled by `arm` (to close the race with notification), handed out first.
    stash_recv: Box<Completions>,
    stash_recv_n: usize,
    stash_send: Box<Completions>,
    stash_send_n: usize,
    recv_wrs: Box<[ffi::ibv_recv_wr; BATCH]>,
    recv_sges: Box<[ffi::ibv_sge; BATCH]>,
    next_reopen_ns: u64,
    /// A completion came back with an error: check whether the QP itself has failed.
    suspect_qp: Option<u32>,
    stats: VerbsStats,
    errors: ErrorLog<5>,
    /// Descriptors to wait on: completion channel, CM channel, async events. -1 = none.
    fds: [RawFd; 3],
    /// A software RoCE device (rxe): its UDP source port is the QP's, not the flow label's.
    soft_roce: bool,
}

impl std::fmt::Debug for VerbsTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsTransport")
            .field("device", &self.cfg.device)
            .field("qpn", &self.res.as_ref().map(|r| r.qpn))
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl VerbsTransport {
    /// Open the device, create the QP, post the receives and start the RDMA CM listener.
    pub fn open(cfg: VerbsConfig) -> Result<Self, VerbsError> {
        let info = discover(&cfg)?;
        // SAFETY: all-zero is a valid value for these plain C structs (null pointers, zero ints).
        let (wrs, sges, wcs, stash_recv, stash_send, recv_wrs, recv_sges) = unsafe {
            (
                Box::new(zeroed::<[ffi::ibv_send_wr; SEND_BATCH]>()),
                Box::new(zeroed::<[ffi::ibv_sge; SEND_BATCH]>()),
                Box::new(zeroed::<Completions>()),
                Box::new(zeroed::<Completions>()),
                Box::new(zeroed::<Completions>()),
                Box::new(zeroed::<[ffi::ibv_recv_wr; BATCH]>()),
                Box::new(zeroed::<[ffi::ibv_sge; BATCH]>()),
            )
        };
        // rxe (and siw) have a `parent` netdev attribute; hardware RNICs do not.
        let soft_roce = cfg.sysfs.join("class/infiniband").join(&cfg.device).join("parent").exists();
        let mut t = Self {
            soft_roce,
            res: None,
            cm: None,
            peers: Peers::new(MAX_DESTS),
            queue: Box::new(
                [Queued { to: VerbsAddr::NULL, label: 0, packet: [0; PACKET_BYTES], want_tx: false }; SEND_BATCH],
            ),
            queued: 0,
            stamps: Box::new([([0; PACKET_BYTES], 0); STAMP_RING]),
            stamps_head: 0,
            stamps_len: 0,
            failed: Box::new([([0; PACKET_BYTES], 0); BATCH]),
            failed_len: 0,
            wrs,
            sges,
            wcs,
            stash_recv,
            stash_recv_n: 0,
            stash_send,
            stash_send_n: 0,
            recv_wrs,
            recv_sges,
            next_reopen_ns: 0,
            suspect_qp: None,
            stats: VerbsStats::default(),
            errors: ErrorLog::new(cfg.device.clone(), ERROR_NAMES),
            fds: [-1; 3],
            cfg,
        };
        t.res = Some(Resources::open(&t.cfg, info)?);
        t.cm = Some(Cm::listen(&t.cfg)?);
        t.refresh_fds();
        Ok(t)
    }

    /// Counters.
    pub fn stats(&self) -> VerbsStats {
        self.stats
    }

    /// This shard's QPN (None while the device is gone).
    pub fn qpn(&self) -> Option<u32> {
        self.res.as_ref().map(|r| r.qpn)
    }

    fn refresh_fds(&mut self) {
        self.fds = [-1; 3];
        if let Some(r) = &self.res {
            // SAFETY: `channel` and `ctx` are live while `res` is.
            unsafe {
                self.fds[0] = (*r.channel).fd;
                self.fds[2] = (*r.ctx).async_fd;
            }
        }
        if let Some(c) = &self.cm {
            // SAFETY: the channel is live while `cm` is.
            self.fds[1] = unsafe { (*c.channel).fd };
        }
    }

    /// Tear everything down after the device went away; probing continues, its probes local
    /// drops (`DeviceGone`) until the device is back.
    fn lose_device(&mut self, why: &str) {
        if self.res.is_none() {
            return;
        }
        tracing::warn!(device = %self.cfg.device, "RDMA device lost ({why}); probes stay local (device_gone) until it returns");
        self.stats.device_lost += 1;
        // Resolutions in flight belong to the CM channel, which is rebuilt too.
        self.peers.cancel_all();
        self.cm = None;
        self.res = None;
        self.stash_recv_n = 0;
        self.stash_send_n = 0;
        self.next_reopen_ns = now_ns() + REOPEN_EVERY_NS;
        self.refresh_fds();
    }

    fn try_reopen(&mut self, now: u64) {
        if self.res.is_some() || now < self.next_reopen_ns {
            return;
        }
        self.next_reopen_ns = now + REOPEN_EVERY_NS;
        let info = match discover(&self.cfg) {
            Ok(info) => info,
            Err(e) => {
                tracing::debug!(device = %self.cfg.device, "device not back yet: {e}");
                return;
            }
        };
        match Resources::open(&self.cfg, info).and_then(|r| Ok((r, Cm::listen(&self.cfg)?))) {
            Ok((r, cm)) => {
                tracing::info!(device = %self.cfg.device, qpn = r.qpn, "RDMA device back; probing resumes");
                self.res = Some(r);
                self.cm = Some(cm);
                self.stats.device_recovered += 1;
                // Our new QPN is found by peers on their next resolution; theirs did not change,
                // but re-resolve anyway: their agents may have restarted meanwhile.
                self.peers.resolve_all_now(now);
                self.refresh_fds();
            }
            // Listed but not usable (yet): the same message every second would flood the log.
            Err(e) => {
                self.errors.record(ERR_DEVICE, now, format_args!("device listed but not usable yet: {e}"));
            }
        }
    }

    /// A completion failed: if the QP has gone to the error state (rxe does that on a failed
    /// send), nothing it holds will work again, so rebuild everything now; peers find the new
    /// QPN by their next resolution. A transient error on a live QP only counts.
    fn check_qp(&mut self, status: u32, now: u64) {
        let Some(r) = &self.res else { return };
        // SAFETY: all-zero is valid for both structs; the QP is live.
        let state = unsafe {
            let mut attr: ffi::ibv_qp_attr = zeroed();
            let mut init: ffi::ibv_qp_init_attr = zeroed();
            let rc =
                ffi::ibv_query_qp(r.qp, &raw mut attr, ffi::ibv_qp_attr_mask::IBV_QP_STATE.0 as i32, &raw mut init);
            if rc != 0 {
                let e = io::Error::from_raw_os_error(rc);
                self.errors.record(ERR_DEVICE, now, format_args!("ibv_query_qp after a failed completion: {e}"));
                return;
            }
            attr.qp_state
        };
        if state == ffi::ibv_qp_state::IBV_QPS_ERR {
            tracing::warn!(device = %self.cfg.device, qpn = r.qpn, status, "UD QP in the error state after a failed completion; rebuilding it");
            self.lose_device("QP error");
            self.next_reopen_ns = now;
        } else {
            tracing::debug!(device = %self.cfg.device, status, state, "completion error, QP still usable");
        }
    }

    /// Read async events (port state, fatal errors) without blocking.
    fn drain_async(&mut self) {
        /// `struct ibv_async_event` with the event type as a plain integer: the kernel may send
        /// a value the bindings' Rust enum does not have.
        #[repr(C)]
        struct RawAsyncEvent {
            element: u64,
            event_type: u32,
        }
        const PORT_ACTIVE: u32 = 9;
        const PORT_ERR: u32 = 10;
        const DEVICE_FATAL: u32 = 8;
        let Some(r) = &self.res else { return };
        let ctx = r.ctx;
        let mut fatal = false;
        for _ in 0..16 {
            // SAFETY: all-zero is a valid RawAsyncEvent.
            let mut ev: RawAsyncEvent = unsafe { zeroed() };
            // SAFETY: `ctx` is live; the async fd is non-blocking (set at open); RawAsyncEvent
            // has the layout of struct ibv_async_event.
            let rc = unsafe { ffi::ibv_get_async_event(ctx, (&raw mut ev).cast()) };
            if rc != 0 {
                break;
            }
            let kind = ev.event_type;
            // SAFETY: acknowledging the event just read.
            unsafe { ffi::ibv_ack_async_event((&raw mut ev).cast()) };
            match kind {
                DEVICE_FATAL => fatal = true,
                PORT_ERR => tracing::warn!(device = %self.cfg.device, "port down: probes will be lost"),
                PORT_ACTIVE => tracing::info!(device = %self.cfg.device, "port active"),
                other => tracing::debug!(device = %self.cfg.device, event = other, "async event"),
            }
        }
        if fatal {
            self.lose_device("fatal device error");
        }
    }

    /// Handle RDMA CM events: answer SIDR requests with our QPN, advance our own resolutions.
    fn drain_cm(&mut self, now: u64) {
        let Some(cm) = &self.cm else { return };
        let channel = cm.channel;
        let listener = cm.listener;
        let qpn = self.res.as_ref().map(|r| r.qpn);
        let mut lost = false;
        for _ in 0..64 {
            let mut ev: *mut ffi::rdma_cm_event = null_mut();
            // SAFETY: the channel is live and non-blocking; on success `ev` is ours until acked.
            if unsafe { ffi::rdma_get_cm_event(channel, &raw mut ev) } != 0 {
                break;
            }
            // SAFETY: `ev` is a valid event until rdma_ack_cm_event.
            let (kind, status, id, listen_id, ud) =
                unsafe { ((*ev).event, (*ev).status, (*ev).id, (*ev).listen_id, (*ev).param.ud) };
            use ffi::rdma_cm_event_type as E;
            if kind == E::RDMA_CM_EVENT_CONNECT_REQUEST && listen_id == listener {
                // With a QP, accept with its number; without one (device gone), reject: the peer
                // learns that nothing listens. For UD either sends the SIDR reply at once, so
                // the request's id can go right after.
                let (rc, call) = match qpn {
                    Some(qpn) => {
                        // SAFETY: all-zero is a valid rdma_conn_param.
                        let mut p: ffi::rdma_conn_param = unsafe { zeroed() };
                        p.qp_num = qpn;
                        // SAFETY: `id` is the request's new id, live until destroyed below.
                        (unsafe { ffi::rdma_accept(id, &raw mut p) }, "rdma_accept")
                    }
                    // SAFETY: as above.
                    None => (unsafe { ffi::rdma_reject(id, std::ptr::null(), 0) }, "rdma_reject"),
                };
                if rc != 0 {
                    // The peer resolves again after its timeout; until then its probes to us stay
                    // unsent on its side.
                    self.stats.sidr_answer_errors += 1;
                    let e = io::Error::last_os_error();
                    self.errors.record(ERR_SIDR_ANSWER, now, format_args!("{call} (SIDR reply) failed: {e}"));
                } else if qpn.is_some() {
                    self.stats.answered_sidr += 1;
                }
                // SAFETY: acking the event we hold, then destroying its id.
                unsafe {
                    ffi::rdma_ack_cm_event(ev);
                    ffi::rdma_destroy_id(id);
                }
                continue;
            }
            if kind == E::RDMA_CM_EVENT_DEVICE_REMOVAL {
                // The kernel waits for every id on the device to be destroyed before it lets the
                // device go: ack and destroy now (the listener with the rest in lose_device).
                // SAFETY: acking the event we hold.
                unsafe { ffi::rdma_ack_cm_event(ev) };
                lost = true;
                continue;
            }
            // Our resolutions: find the destination whose id this is (a scan: CM events are rare,
            // a handful per target per backoff period).
            let Some(key) = self.peers.find(|h| h.is(id)) else {
                // SAFETY: acking an event of an id we no longer track.
                unsafe { ffi::rdma_ack_cm_event(ev) };
                continue;
            };
            let mut done = None;
            match kind {
                E::RDMA_CM_EVENT_ADDR_RESOLVED => {
                    // SAFETY: `id` is live.
                    if timed("rdma_resolve_route", || unsafe { ffi::rdma_resolve_route(id, CM_TIMEOUT_MS) }) != 0 {
                        done = Some(Resolution::Unreachable);
                    }
                }
                E::RDMA_CM_EVENT_ROUTE_RESOLVED => {
                    // SAFETY: all-zero is a valid rdma_conn_param.
                    let mut p: ffi::rdma_conn_param = unsafe { zeroed() };
                    p.qp_num = qpn.unwrap_or(0);
                    // SAFETY: `id` is live; a UD connect sends a SIDR request.
                    if timed("rdma_connect", || unsafe { ffi::rdma_connect(id, &raw mut p) }) != 0 {
                        done = Some(Resolution::Unreachable);
                    }
                }
                E::RDMA_CM_EVENT_ESTABLISHED => done = Some(Resolution::Resolved(ud.qp_num)),
                // A SIDR reply with a non-success status (positive): the host is up and answered
                // that nothing listens. A negative status is a timeout: the network is at fault.
                E::RDMA_CM_EVENT_UNREACHABLE | E::RDMA_CM_EVENT_REJECTED if status > 0 => {
                    done = Some(Resolution::Refused);
                }
                _ => done = Some(Resolution::Unreachable),
            }
            tracing::debug!(device = %self.cfg.device, peer = %ip_of(&key.0), event = kind, status, "RDMA CM event");
            // SAFETY: acking the event we hold, before any destroy of its id.
            unsafe { ffi::rdma_ack_cm_event(ev) };
            if let Some(how) = done {
                self.finish_resolution(&key, how, now);
            }
        }
        if lost {
            self.lose_device("device removed");
        }
    }

    fn finish_resolution(&mut self, key: &resolve::PeerKey, how: Resolution, now: u64) {
        match how {
            Resolution::Resolved(qpn) => {
                self.stats.resolved += 1;
                tracing::debug!(device = %self.cfg.device, peer = %ip_of(&key.0), qpn, "peer QPN resolved");
            }
            Resolution::Refused => self.stats.refused += 1,
            Resolution::Unreachable => self.stats.unreachable += 1,
        }
        // The handle's drop destroys the CM id; its events have been acked.
        drop(self.peers.finish(key, how, now));
    }

    /// Start resolutions that are due; give up stale ones.
    fn drive_resolutions(&mut self, now: u64) {
        let Some(cm) = &self.cm else { return };
        let channel = cm.channel;
        let src = self.cfg.bind.ip();
        let errors = &mut self.errors;
        let d = self.peers.drive(
            now,
            |key| start_resolution(channel, src, ip_of(&key.0), key.1),
            |key, e| {
                errors.record(
                    ERR_RESOLUTION_START,
                    now,
                    format_args!("resolving {} port {} could not start: {e}", ip_of(&key.0), key.1),
                );
            },
        );
        self.stats.unreachable += u64::from(d.start_failed + d.given_up);
    }

    /// A CQ poll failed: counted, logged, and the QP checked (a broken CQ is a broken QP).
    fn poll_failed(&mut self, which: &str, e: PollFailed) {
        self.stats.poll_errors += 1;
        self.suspect_qp = Some(0);
        self.errors.record(ERR_POLL_CQ, now_ns(), format_args!("{which} CQ: {e}"));
    }

    /// What to do with a packet for `to` (after the device check).
    fn route(&mut self, to: &VerbsAddr, now: u64) -> Route {
        if to.qpn != 0 {
            return Route::Send(to.qpn);
        }
        self.peers.route((to.gid, to.port), now)
    }
}

/// A completion queue poll failed: the CQ (or its device) is broken.
#[derive(Debug)]
struct PollFailed(i32);

impl std::fmt::Display for PollFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "polling the CQ returned {}", self.0)
    }
}

/// What one poll took: the completions (every one must be handled, whatever follows: a send
/// slot returns, a receive is re-posted) and, after them, the error that stopped the poll.
type Polled = (usize, Option<PollFailed>);

/// Up to [`BATCH`] completions with their NIC stamps (ns of the device's clock; 0 where the
/// CQ has none).
#[repr(C)]
struct Completions {
    wc: [ffi::ibv_wc; BATCH],
    ts: [u64; BATCH],
}

/// Up to [`BATCH`] completions of a live `cq` into `out`: `ibv_poll_cq` for a plain CQ; for an
/// extended one (created with `clock`'s stamps) the `start_poll`/`next_poll` loop, which only
/// The IANA port of RoCEv2.
const ROCE_V2_UDP_PORT: u16 = 4791;

/// The UDP source port rxe gives every packet of a QP that has no address vector of its own (a
/// UD QP: the flow label of its address handles does not change it): `RXE_ROCE_V2_SPORT +
/// (hash_32(qpn, 14) & 0x3fff)` (drivers/infiniband/sw/rxe/rxe_qp.c).
fn rxe_udp_sport(qpn: u32) -> u16 {
    const GOLDEN_RATIO_32: u32 = 0x61C8_8647;
    let hash14 = qpn.wrapping_mul(GOLDEN_RATIO_32) >> (32 - 14);
    0xC000 + (hash14 & 0x3FFF) as u16
}

/// devices that report completion timestamps get (it corrupts rxe's CQ on rdma-core 44).
fn poll_cq(cq: *mut ffi::ibv_cq, clock: Option<Clock>, out: &mut Completions) -> Polled {
    let Some(clock) = clock else {
        // SAFETY: the caller's CQ is live; `out` has room for BATCH completions.
        let k = unsafe { ffi::ibv_poll_cq(cq, BATCH as i32, out.wc.as_mut_ptr()) };
        return if k < 0 { (0, Some(PollFailed(k))) } else { (k as usize, None) };
    };
    let cq = cq.cast::<ffi::ibv_cq_ex>();
    let mut attr = ffi::ibv_poll_cq_attr { comp_mask: 0 };
    // SAFETY: `cq` is a live extended CQ (created by `create_cq_ex`); between start_poll's
    // success and end_poll, the current completion's fields are readable.
    unsafe {
        let rc = ffi::ibv_start_poll(cq, &raw mut attr);
        if rc == libc::ENOENT {
            return (0, None);
        }
        if rc != 0 {
            return (0, Some(PollFailed(-rc.abs())));
        }
        let mut n = 0;
        loop {
            let wc = &mut out.wc[n];
            wc.wr_id = (*cq).wr_id;
            wc.status = (*cq).status;
            // Only a successful completion carries the rest.
            if wc.status == ffi::ibv_wc_status::IBV_WC_SUCCESS {
                wc.byte_len = ffi::ibv_wc_read_byte_len(cq);
                wc.src_qp = ffi::ibv_wc_read_src_qp(cq);
                out.ts[n] = match clock {
                    Clock::Wallclock => ffi::ibv_wc_read_completion_wallclock_ns(cq),
                    Clock::Ticks { .. } => clock.ns(ffi::ibv_wc_read_completion_ts(cq)),
                };
            } else {
                out.ts[n] = 0;
            }
            n += 1;
            if n == BATCH {
                break;
            }
            let rc = ffi::ibv_next_poll(cq);
            if rc == libc::ENOENT {
                break;
            }
            if rc != 0 {
                // The `n` completions already taken are consumed: hand them out with the error.
                ffi::ibv_end_poll(cq);
                return (n, Some(PollFailed(-rc.abs())));
            }
        }
        ffi::ibv_end_poll(cq);
        (n, None)
    }
}

/// The completions `arm` already took from `cq` (its stash) if any, else a fresh poll, in `out`.
fn take_completions(
    cq: *mut ffi::ibv_cq,
    clock: Option<Clock>,
    stash: &mut Completions,
    stash_n: &mut usize,
    out: &mut Completions,
) -> Polled {
    if *stash_n == 0 {
        return poll_cq(cq, clock, out);
    }
    let k = std::mem::take(stash_n);
    out.wc[..k].swap_with_slice(&mut stash.wc[..k]);
    out.ts[..k].swap_with_slice(&mut stash.ts[..k]);
    (k, None)
}

impl Drop for VerbsTransport {
    fn drop(&mut self) {
        tracing::info!(device = %self.cfg.device, stats = ?self.stats, "verbs transport closed");
        self.peers.cancel_all();
        self.cm = None;
        self.res = None;
    }
}

impl Transport for VerbsTransport {
    type Addr = VerbsAddr;

    fn queue(&mut self, to: &VerbsAddr, flow_label: u32, packet: &[u8; PACKET_BYTES], want_tx_ns: bool) -> bool {
        if self.queued == SEND_BATCH {
            return false;
        }
        self.queue[self.queued] = Queued { to: *to, label: flow_label, packet: *packet, want_tx: want_tx_ns };
        self.queued += 1;
        true
    }

    fn flush(&mut self, fates: &mut [Fate; SEND_BATCH]) -> usize {
        let n = self.queued;
        self.queued = 0;
        let now = now_ns();
        // Decide each packet's fate and build one chain of work requests.
        let mut chain: [u16; SEND_BATCH] = [0; SEND_BATCH];
        let mut chain_slot: [u16; SEND_BATCH] = [0; SEND_BATCH];
        let mut m = 0;
        let tc = self.cfg.traffic_class;
        for (i, fate) in fates[..n].iter_mut().enumerate() {
            let q = self.queue[i];
            // Our own device first: with it gone nothing leaves, whatever the target's state.
            if self.res.is_none() {
                *fate = Fate::Dropped(DropReason::DeviceGone);
                continue;
            }
            let qpn = match self.route(&q.to, now) {
                Route::Send(qpn) => qpn,
                Route::Refused => {
                    *fate = Fate::Refused;
                    continue;
                }
                Route::Unreachable => {
                    *fate = Fate::Unreachable;
                    continue;
                }
                Route::Resolving => {
                    *fate = Fate::Dropped(DropReason::Resolving);
                    continue;
                }
                Route::TableFull => {
                    *fate = Fate::Dropped(DropReason::TableFull);
                    continue;
                }
            };
            let Some(r) = self.res.as_mut() else { continue };
            let ah = match r.ah(q.to.gid, q.label, tc) {
                Ok(ah) => ah,
                Err(reason) => {
                    self.stats.ah_failures += 1;
                    *fate = Fate::Dropped(reason);
                    continue;
                }
            };
            let Some(slot) = r.send_free.pop() else {
                *fate = Fate::Dropped(DropReason::NoSendSlot);
                continue;
            };
            let slot = slot as usize;
            let off = Resources::send_slot_offset(slot);
            r.buf[off..off + PACKET_BYTES].copy_from_slice(&q.packet);
            r.send_want_tx[slot] = q.want_tx;
            self.sges[m] = ffi::ibv_sge {
                // SAFETY: `off` is inside the registered buffer.
                addr: unsafe { r.buf.as_ptr().add(off) } as u64,
                length: PACKET_BYTES as u32,
                // SAFETY: the MR is live.
                lkey: unsafe { (*r.mr).lkey },
            };
            let wr = &mut self.wrs[m];
            wr.wr_id = slot as u64;
            wr.next = null_mut();
            wr.sg_list = &raw mut self.sges[m];
            wr.num_sge = 1;
            wr.opcode = ffi::ibv_wr_opcode::IBV_WR_SEND;
            wr.send_flags = ffi::ibv_send_flags::IBV_SEND_SIGNALED.0;
            wr.wr.ud = ffi::ud_t { ah, remote_qpn: qpn, remote_qkey: RDMA_UDP_QKEY };
            chain[m] = i as u16;
            chain_slot[m] = slot as u16;
            m += 1;
        }
        if m == 0 {
            return n;
        }
        let Some(r) = self.res.as_mut() else { return n };
        for k in 0..m - 1 {
            self.wrs[k].next = &raw mut self.wrs[k + 1];
        }
        let mut bad: *mut ffi::ibv_send_wr = null_mut();
        // SAFETY: the QP is live; the chain points into our boxed arrays, valid for the call.
        let rc = unsafe { ffi::ibv_post_send(r.qp, self.wrs.as_mut_ptr(), &raw mut bad) };
        let posted = if rc == 0 {
            m
        } else if bad.is_null() {
            0
        } else {
            // SAFETY: `bad` points into `wrs`.
            (unsafe { bad.offset_from(self.wrs.as_ptr()) }).clamp(0, m as isize) as usize
        };
        // Without NIC timestamps the send stamp is the host clock right after the post: a soft
        // RNIC's send completion is deferred kernel work that, under load, is polled after the
        // reply has already arrived (measured on rxe: 40% of probes came out with a negative
        // RTT when T2/T4 were taken at completion-poll time). Posting happens-before the wire,
        // so T1 <= T2 < T3 <= T4 < T5 holds.
        let t = now_ns();
        let host_stamps = r.clock.is_none();
        for k in 0..m {
            let i = chain[k] as usize;
            if k < posted {
                fates[i] = Fate::Sent;
                if host_stamps && self.queue[i].want_tx && self.stamps_len < STAMP_RING {
                    let at = (self.stamps_head + self.stamps_len) % STAMP_RING;
                    self.stamps[at] = (self.queue[i].packet, t);
                    self.stamps_len += 1;
                }
            } else {
                // The provider refused the work request (its queue full, a bad AH): nothing left.
                fates[i] = Fate::Dropped(DropReason::SendError { errno: if rc > 0 { rc } else { libc::EIO } });
                r.send_free.push(chain_slot[k]);
            }
        }
        n
    }

    fn recv(&mut self, out: &mut RxBatch<VerbsAddr>) -> io::Result<usize> {
        let Some(r) = self.res.as_mut() else { return Ok(0) };
        let (got, poll_error) =
            take_completions(r.recv_cq, r.clock, &mut self.stash_recv, &mut self.stash_recv_n, &mut self.wcs);
        let t = now_ns();
        let mut n = 0;
        let lkey = {
            // SAFETY: the MR is live.
            unsafe { (*r.mr).lkey }
        };
        // NIC stamps where the CQ has them (never 0 on a success), else the poll time.
        let nic = r.clock.is_some();
        for k in 0..got {
            let wc = &self.wcs.wc[k];
            let rx_ns = if nic { self.wcs.ts[k] } else { t };
            let slot = wc.wr_id as usize % RECV_DEPTH;
            // Repost whatever happened, or the receive queue drains (rpingmesh's bug).
            self.recv_sges[k] =
                ffi::ibv_sge { addr: r.recv_slot_addr(slot) as u64, length: RECV_SLOT_BYTES as u32, lkey };
            let w = &mut self.recv_wrs[k];
            w.wr_id = slot as u64;
            w.sg_list = &raw mut self.recv_sges[k];
            w.num_sge = 1;
            w.next = null_mut();
            if wc.status != ffi::ibv_wc_status::IBV_WC_SUCCESS {
                self.stats.completion_errors += 1;
                self.suspect_qp = Some(wc.status);
                let status = wc.status;
                self.errors.record(ERR_COMPLETION, t, format_args!("a receive completed with error status {status}"));
                continue;
            }
            let base = slot * RECV_SLOT_BYTES;
            let mut grh = [0u8; GRH_BYTES];
            grh.copy_from_slice(&r.buf[base..base + GRH_BYTES]);
            let len = (wc.byte_len as usize).saturating_sub(GRH_BYTES);
            let Some(gid) = source_gid(&grh) else {
                out.len[n] = PACKET_BYTES + 1;
                out.rx_ns[n] = rx_ns;
                out.from[n] = VerbsAddr::NULL;
                n += 1;
                continue;
            };
            let take = len.min(PACKET_BYTES + 1);
            out.buf[n][..take].copy_from_slice(&r.buf[base + GRH_BYTES..base + GRH_BYTES + take]);
            out.len[n] = if len > PACKET_BYTES { PACKET_BYTES + 1 } else { len };
            out.rx_ns[n] = rx_ns;
            out.from[n] = VerbsAddr { gid, qpn: wc.src_qp, port: 0 };
            n += 1;
        }
        if got > 0 {
            for k in 0..got - 1 {
                self.recv_wrs[k].next = &raw mut self.recv_wrs[k + 1];
            }
            let mut bad: *mut ffi::ibv_recv_wr = null_mut();
            // SAFETY: live QP; the chain points into our arrays, valid for the call.
            let rc = unsafe { ffi::ibv_post_recv(r.qp, self.recv_wrs.as_mut_ptr(), &raw mut bad) };
            if rc != 0 {
                self.lose_device("receive repost failed");
            }
        }
        if let Some(e) = poll_error {
            self.poll_failed("receive", e);
        }
        Ok(n)
    }

    fn tx_timestamps(&mut self, out: &mut TxBatch) -> io::Result<usize> {
        // Send completions return their slots; a failed one is a packet that never left, told
        // to the shard with the packet (still in its slot) so the probe ends as a local drop.
        let mut poll_error = None;
        if let Some(r) = self.res.as_mut() {
            let got;
            (got, poll_error) =
                take_completions(r.send_cq, r.clock, &mut self.stash_send, &mut self.stash_send_n, &mut self.wcs);
            for (wc, &ts) in self.wcs.wc[..got].iter().zip(&self.wcs.ts[..got]) {
                let slot = wc.wr_id as usize % SEND_DEPTH;
                r.send_free.push(slot as u16);
                let off = Resources::send_slot_offset(slot);
                let packet = &r.buf[off..off + PACKET_BYTES];
                if wc.status != ffi::ibv_wc_status::IBV_WC_SUCCESS {
                    self.stats.completion_errors += 1;
                    self.suspect_qp = Some(wc.status);
                    if self.failed_len < BATCH {
                        self.failed[self.failed_len].0.copy_from_slice(packet);
                        self.failed[self.failed_len].1 = wc.status;
                        self.failed_len += 1;
                    }
                } else if r.clock.is_some() && r.send_want_tx[slot] && self.stamps_len < STAMP_RING {
                    // NIC send stamps (T2, T4) come with the completion, whenever it is polled:
                    // the stamp is the device's, not the poll's.
                    let at = (self.stamps_head + self.stamps_len) % STAMP_RING;
                    self.stamps[at].0.copy_from_slice(packet);
                    self.stamps[at].1 = ts;
                    self.stamps_len += 1;
                }
            }
        }
        let mut n = 0;
        while n < BATCH && self.failed_len > 0 {
            self.failed_len -= 1;
            let (p, status) = self.failed[self.failed_len];
            out.payload[n] = p;
            out.tx_ns[n] = 0;
            out.news[n] = TxNews::Failed(DropReason::Completion { status });
            n += 1;
        }
        while n < BATCH && self.stamps_len > 0 {
            let (p, t) = self.stamps[self.stamps_head];
            self.stamps_head = (self.stamps_head + 1) % STAMP_RING;
            self.stamps_len -= 1;
            out.payload[n] = p;
            out.tx_ns[n] = t;
            out.news[n] = TxNews::Stamp;
            n += 1;
        }
        if let Some(e) = poll_error {
            self.poll_failed("send", e);
        }
        Ok(n)
    }

    fn ts_source(&self) -> TsSource {
        match self.res.as_ref().and_then(|r| r.clock) {
            Some(_) => TsSource::Nic,
            None => TsSource::HostPoll,
        }
    }

    fn readiness_fd(&self) -> RawFd {
        self.fds[0]
    }

    fn housekeeping(&mut self, now_ns: u64) {
        if let Some(r) = self.res.as_mut()
            && r.armed
        {
            r.armed = false;
            // Read the completion events that woke us (non-blocking), acknowledge them in bulk.
            loop {
                let mut cq: *mut ffi::ibv_cq = null_mut();
                let mut ctx: *mut libc::c_void = null_mut();
                // SAFETY: live channel, non-blocking.
                if unsafe { ffi::ibv_get_cq_event(r.channel, &raw mut cq, &raw mut ctx) } != 0 {
                    break;
                }
                if cq == r.send_cq {
                    r.unacked_send += 1;
                } else {
                    r.unacked_recv += 1;
                }
            }
            // SAFETY: acknowledging events read from these CQs.
            unsafe {
                if r.unacked_send > 0 {
                    ffi::ibv_ack_cq_events(r.send_cq, r.unacked_send);
                    r.unacked_send = 0;
                }
                if r.unacked_recv > 0 {
                    ffi::ibv_ack_cq_events(r.recv_cq, r.unacked_recv);
                    r.unacked_recv = 0;
                }
            }
        }
        if let Some(status) = self.suspect_qp.take() {
            self.check_qp(status, now_ns);
        }
        self.drain_async();
        self.drain_cm(now_ns);
        self.drive_resolutions(now_ns);
        self.try_reopen(now_ns);
    }

    fn device_up(&self) -> bool {
        self.res.is_some()
    }

    fn error_counts(&self) -> [u64; crate::transport::TRANSPORT_ERROR_KINDS.len()] {
        let s = &self.stats;
        [s.completion_errors, s.poll_errors, s.ah_failures, s.sidr_answer_errors]
    }

    fn wire_tuple(&self, to: &VerbsAddr, flow_label: u32, _answer: bool) -> Option<WireTuple> {
        let IpAddr::V4(src) = self.cfg.bind.ip() else { return None };
        let IpAddr::V4(dst) = ip_of(&to.gid) else { return None };
        let sport = if self.soft_roce {
            rxe_udp_sport(self.qpn()?)
        } else if flow_label != 0 {
            rocemesh_bpf::flow_label_to_udp_sport(flow_label)
        } else {
            // mlx5 gives an address handle without a label a random port: nothing to copy.
            return None;
        };
        Some(WireTuple {
            src: SocketAddrV4::new(src, sport),
            dst: SocketAddrV4::new(dst, ROCE_V2_UDP_PORT),
            tos: self.cfg.traffic_class,
        })
    }

    fn binding_to(&self, to: &VerbsAddr) -> Binding {
        binding_to(to)
    }

    fn binding_at(&self, _at: u8) -> Binding {
        binding_at(self.cfg.bind)
    }

    fn reaches_without_state(&self, to: &VerbsAddr, flow_label: u32) -> bool {
        self.res.as_ref().is_some_and(|r| r.ahs.contains_key(&(to.gid, flow_label)))
    }

    fn answers_from(&self, probed: &VerbsAddr, from: &VerbsAddr) -> bool {
        probed.gid == from.gid && (probed.qpn == 0 || probed.qpn == from.qpn)
    }

    fn observe(&mut self, to: &VerbsAddr, answered: bool) {
        if to.qpn == 0 {
            self.peers.observe(&(to.gid, to.port), answered);
        }
    }

    fn arm(&mut self) -> bool {
        let Some(r) = self.res.as_mut() else { return true };
        // SAFETY: live CQs.
        let rc = unsafe { ffi::ibv_req_notify_cq(r.send_cq, 0) | ffi::ibv_req_notify_cq(r.recv_cq, 0) };
        if rc != 0 {
            // Without a notification the shard must not sleep: it polls instead.
            let e = io::Error::from_raw_os_error(rc.abs());
            self.errors.record(ERR_POLL_CQ, now_ns(), format_args!("ibv_req_notify_cq failed: {e}"));
            return false;
        }
        r.armed = true;
        // Completions that arrived before the notification was armed raise no event: poll once
        // more, and keep what is found for the next recv / tx_timestamps. After a failed poll
        // the shard must not sleep.
        let (mut recv_error, mut send_error) = (None, None);
        if self.stash_recv_n == 0 {
            (self.stash_recv_n, recv_error) = poll_cq(r.recv_cq, r.clock, &mut self.stash_recv);
        }
        if self.stash_send_n == 0 {
            (self.stash_send_n, send_error) = poll_cq(r.send_cq, r.clock, &mut self.stash_send);
        }
        let failed = recv_error.is_some() || send_error.is_some();
        if let Some(e) = recv_error {
            self.poll_failed("receive", e);
        }
        if let Some(e) = send_error {
            self.poll_failed("send", e);
        }
        !failed && self.stash_recv_n == 0 && self.stash_send_n == 0 && self.failed_len == 0 && self.stamps_len == 0
    }

    fn wait_fds(&self, out: &mut [RawFd; 4]) -> usize {
        let mut n = 0;
        for &fd in &self.fds {
            if fd >= 0 {
                out[n] = fd;
                n += 1;
            }
        }
        n
    }
}

/// The end a sealed packet to `to` binds: its GID. A verbs shard is its RNIC's GID (the config
/// gives each shard its own address), whatever port or QPN names its QP: a pinglist may name a
/// target's QPN and leave its RDMA CM port to a default, and an answer names the prober by the
/// QPN its completion carried.
fn binding_to(to: &VerbsAddr) -> Binding {
    Binding::new(to.gid, 0, 1)
}

/// The end a sealed packet received by the shard bound to `bind` binds ([`binding_to`]).
fn binding_at(bind: SocketAddr) -> Binding {
    Binding::new(gid_bytes(bind.ip()), 0, 1)
}

/// Targets of a verbs shard: the pinglist's address as a GID; its QPN if the pinglist gives one,
/// else resolved at run time on the target's port (or the shard's own).
#[derive(Debug, Clone, Copy)]
pub struct VerbsResolver;

impl crate::shard::Resolve<VerbsAddr> for VerbsResolver {
    fn resolve(&self, target: &rocemesh_formats::pinglist::Target, default_port: u16) -> Result<VerbsAddr, String> {
        Ok(VerbsAddr {
            gid: gid_bytes(target.addr),
            qpn: target.qpn.unwrap_or(0),
            port: target.port.unwrap_or(default_port),
        })
    }

    fn resolve_gid(&self, gid: [u8; 16], port: u16) -> Result<VerbsAddr, String> {
        Ok(VerbsAddr { gid, qpn: 0, port })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv6Addr;
    use std::path::Path;

    /// What a prober seals a probe for (the target as its pinglist names it, by port or QPN)
    /// is what the target checks it against, and what the target seals an answer for (the
    /// completion's GID and QPN) is what the prober checks; another address is not.
    #[test]
    fn both_ends_agree_on_the_binding_of_probes_and_answers() {
        let (prober, target): (SocketAddr, SocketAddr) =
            ("10.0.0.1:18515".parse().expect("addr"), "10.0.1.7:18515".parse().expect("addr"));
        let by_port = VerbsAddr { gid: gid_bytes(target.ip()), qpn: 0, port: target.port() };
        let by_qpn = VerbsAddr { gid: gid_bytes(target.ip()), qpn: 4711, port: 9999 };
        assert_eq!(binding_to(&by_port), binding_at(target));
        assert_eq!(binding_to(&by_qpn), binding_at(target), "a QPN and a default port");
        let completion_sender = VerbsAddr { gid: gid_bytes(prober.ip()), qpn: 99, port: 0 };
        assert_eq!(binding_to(&completion_sender), binding_at(prober));
        assert_ne!(binding_to(&by_port), binding_at(prober), "another address");
    }

    fn fake_sysfs(state: &str) -> tempfile::TempDir {
        let root = tempfile::tempdir().expect("tempdir");
        let port = root.path().join("class/infiniband/rxe0/ports/1");
        std::fs::create_dir_all(port.join("gids")).expect("mkdir");
        std::fs::create_dir_all(port.join("gid_attrs/types")).expect("mkdir");
        std::fs::write(port.join("state"), format!("{state}\n")).expect("state");
        for (i, gid, kind) in [
            ("0", "fe80:0000:0000:0000:0000:00ff:fe00:0001", "IB/RoCE v1"),
            ("1", "0000:0000:0000:0000:0000:ffff:0a00:0102", "RoCE v2"),
        ] {
            std::fs::write(port.join("gids").join(i), gid).expect("gid");
            std::fs::write(port.join("gid_attrs/types").join(i), kind).expect("type");
        }
        root
    }

    fn cfg(root: &Path, device: &str, bind: &str) -> VerbsConfig {
        VerbsConfig {
            device: device.into(),
            port: 1,
            bind: bind.parse().expect("bind"),
            gid_index: None,
            traffic_class: 0,
            sysfs: root.to_path_buf(),
        }
    }

    #[test]
    fn discovery_finds_the_roce_v2_gid_or_says_what_is_missing() {
        let root = fake_sysfs("4: ACTIVE");
        let info = discover(&cfg(root.path(), "rxe0", "10.0.1.2:18515")).expect("found");
        assert_eq!((info.port, info.gid_index), (1, 1));
        assert_eq!(info.gid, gid_bytes("10.0.1.2".parse().expect("ip")));

        let e = discover(&cfg(root.path(), "mlx5_0", "10.0.1.2:1")).expect_err("no such device").to_string();
        assert!(e.contains("mlx5_0") && e.contains("devices present: rxe0"), "{e}");
        let e = discover(&cfg(root.path(), "rxe0", "10.0.1.3:1")).expect_err("no GID").to_string();
        assert!(e.contains("no RoCE v2 GID ::ffff:10.0.1.3") && e.contains("gid_index"), "{e}");
        let down = fake_sysfs("1: DOWN");
        let e = discover(&cfg(down.path(), "rxe0", "10.0.1.2:1")).expect_err("down").to_string();
        assert!(e.contains("port 1 is 1: DOWN"), "{e}");
        let empty = tempfile::tempdir().expect("tempdir");
        let e = discover(&cfg(empty.path(), "rxe0", "10.0.1.2:1")).expect_err("none").to_string();
        assert!(e.contains("no RDMA devices on this host"), "{e}");
    }

    #[test]
    fn source_gid_reads_ipv4_and_ipv6_grh_areas() {
        let mut v4 = [0u8; GRH_BYTES];
        v4[20] = 0x45;
        v4[32..36].copy_from_slice(&[10, 0, 1, 7]);
        assert_eq!(source_gid(&v4), Some(gid_bytes("10.0.1.7".parse().expect("ip"))));
        let mut v6 = [0u8; GRH_BYTES];
        v6[0] = 0x60;
        let g: Ipv6Addr = "fd00::5".parse().expect("v6");
        v6[8..24].copy_from_slice(&g.octets());
        assert_eq!(source_gid(&v6), Some(g.octets()));
        assert_eq!(source_gid(&[0u8; GRH_BYTES]), None, "neither header: refused, not guessed");
    }

    #[test]
    fn opening_a_device_on_a_host_without_rdma_names_the_device_and_the_fix() {
        let root = tempfile::tempdir().expect("tempdir");
        let e = VerbsTransport::open(cfg(root.path(), "rxe0", "10.0.1.2:18515")).expect_err("no RDMA here");
        assert!(e.to_string().contains("verbs device rxe0: not found in sysfs"), "{e}");
    }
}
