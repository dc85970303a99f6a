//! The RDMA verbs transport: the probe protocol over one UD queue pair per shard (rdma-sys over
//! the system's libibverbs and librdmacm).
//!
//! What it owns, per shard:
//! - one device context, protection domain and ONE registered region holding every receive
//!   buffer (pre-posted) and every send buffer, sized at start;
//! - one UD QP with separate send and receive CQs on one completion channel (event mode waits
//!   on its descriptor; completions are polled with `ibv_poll_cq`, never the
//!   `start_poll`/`next_poll` loop that corrupts rxe's CQ on rdma-core 44);
//! - address handles cached per (destination GID, flow label), bounded, created once;
//! - an RDMA CM `RDMA_PS_UDP` listener on the shard's address and port: peers resolve this
//!   shard's current QPN with a SIDR request (ARCHITECTURE.md, "ctl and agent restarts"), and the
//!   prober resolves its targets the same way, at run time, again when they stop answering;
//! - recovery: device removal (`rdma link delete`), fatal device errors and port events tear the
//!   resources down; the shard keeps running (its probes are lost, which is what the network
//!   sees) and the transport reopens the device once it is back.
//!
//! Timestamps: where the device has no completion timestamps (rxe has none: anchors.md), the
//! receive stamps T3 and T5 are host CLOCK_REALTIME read right after `ibv_poll_cq` returns, the
//! send stamps T2 and T4 the same clock right after `ibv_post_send` returns (see `flush` for why
//! not the send completion), and records say `HostPoll`. Raw NIC ticks are never used; NIC
//! wall-clock completion stamps (extended CQs) are not built yet: no device here has them.

use std::collections::HashMap;
use std::ffi::CStr;
use std::io;
use std::mem::zeroed;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::os::fd::RawFd;
use std::path::PathBuf;
use std::ptr::null_mut;

use rdma_sys as ffi;
use rocemesh_formats::record::TsSource;

use crate::clock::now_ns;
use crate::protocol::PACKET_BYTES;
use crate::transport::{BATCH, RxBatch, SEND_BATCH, Transport, TxBatch};
use crate::udp::to_sockaddr;

/// The Q_Key RDMA CM uses for `RDMA_PS_UDP` (the kernel's RDMA_UDP_QKEY): SIDR replies carry
/// it, so our QP must use it too.
pub const RDMA_UDP_QKEY: u32 = 0x0123_4567;
/// Receive buffers pre-posted: a burst of this many packets between two polls is absorbed.
const RECV_DEPTH: usize = 1024;
/// Sends outstanding at most (signalled; a slot returns when its completion is polled).
const SEND_DEPTH: usize = 1024;
/// UD receives start with 40 bytes of GRH (for RoCEv2 over IPv4: 20 undefined bytes, then the
/// IPv4 header).
const GRH_BYTES: usize = 40;
/// A receive slot: GRH, one packet, and room to tell an oversized datagram from ours.
const RECV_SLOT_BYTES: usize = GRH_BYTES + PACKET_BYTES + 64;
/// Address handles at most; a flood of probes from forged GIDs cannot exhaust device memory.
const MAX_AH: usize = 16_384;
/// Destinations resolved through RDMA CM at most (targets; answering needs no resolution).
const MAX_DESTS: usize = 65_536;
/// A target whose first resolution has not finished within this is treated as unreachable
/// (its probes are lost, not "refused"): a dead RNIC must not hide behind a pending SIDR.
const FIRST_RESOLUTION_GRACE_NS: u64 = 3_000_000_000;
/// A SIDR attempt older than this is abandoned. The kernel gives up by itself after about a
/// minute (15 retries of 4 s) and reports it; destroying an id whose request is still being
/// retried made `rdma_destroy_id` block the shard for about a second in the VM, so this is only
/// a backstop beyond the kernel's own timeout.
const RESOLUTION_GIVE_UP_NS: u64 = 90_000_000_000;
/// Consecutive unanswered probes that trigger a re-resolution of the target's QPN.
const MISSES_BEFORE_RESOLVE: u32 = 3;
const RESOLVE_BACKOFF_MIN_NS: u64 = 1_000_000_000;
const RESOLVE_BACKOFF_MAX_NS: u64 = 30_000_000_000;
/// How often a shard whose device is gone looks for it again.
const REOPEN_EVERY_NS: u64 = 1_000_000_000;
const CM_TIMEOUT_MS: i32 = 2_000;
/// Send stamps waiting to be read (the shard reads them right after every flush).
const STAMP_RING: usize = 4 * SEND_BATCH;

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

/// What the shard configuration says about its device.
#[derive(Clone, Debug)]
pub struct VerbsConfig {
    /// Device name (`mlx5_0`, `rxe0`).
    pub device: String,
    /// Port number on the device (1-based).
    pub port: u8,
    /// The RNIC's address: selects the RoCEv2 GID; its port is the RDMA CM service port.
    pub bind: SocketAddr,
    /// GID index to use instead of the one discovered from `bind`'s address.
    pub gid_index: Option<u8>,
    /// Traffic class (DSCP << 2 | ECN) of every probe and answer.
    pub traffic_class: u8,
    /// Where sysfs is mounted (tests point it elsewhere).
    pub sysfs: PathBuf,
}

/// Why the verbs transport cannot run, with what to do about it.
#[derive(Debug, thiserror::Error)]
#[error("verbs device {device}: {what}{hint}")]
pub struct VerbsError {
    device: String,
    what: String,
    hint: String,
}

impl VerbsError {
    fn new(device: &str, what: impl Into<String>, hint: impl Into<String>) -> Self {
        let hint = hint.into();
        let hint = if hint.is_empty() { hint } else { format!(": {hint}") };
        Self { device: device.to_string(), what: what.into(), hint }
    }

    fn os(device: &str, op: &str, e: io::Error) -> Self {
        let hint = match e.raw_os_error() {
            Some(libc::ENOMEM) | Some(libc::EPERM) if op.contains("reg_mr") => memlock_hint(),
            Some(libc::ENOSYS) | Some(libc::ENODEV) => {
                "this kernel or device has no RDMA support (is the driver loaded? `rdma link` lists devices)".into()
            }
            Some(libc::EACCES) => "run as root or grant access to /dev/infiniband".into(),
            Some(libc::EADDRINUSE) => "another process (an agent already running?) listens on this port".into(),
            _ => String::new(),
        };
        Self::new(device, format!("{op} failed: {e}"), hint)
    }
}

fn memlock_hint() -> String {
    let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit fills the struct we own.
    unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &raw mut r) };
    format!(
        "RLIMIT_MEMLOCK is {} bytes; registering buffers pins memory: raise it (`ulimit -l unlimited`, \
         systemd LimitMEMLOCK=infinity) or give the agent CAP_IPC_LOCK",
        r.rlim_cur
    )
}

/// A device as sysfs shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Port used.
    pub port: u8,
    /// GID index used.
    pub gid_index: u8,
    /// The GID at that index.
    pub gid: [u8; 16],
}

/// Find `cfg.device`'s port and RoCEv2 GID for `cfg.bind`'s address in sysfs, or say exactly
/// what is missing: the device (with the ones present), the port's state, the GID.
pub fn discover(cfg: &VerbsConfig) -> Result<DeviceInfo, VerbsError> {
    let class = cfg.sysfs.join("class/infiniband");
    let dev_dir = class.join(&cfg.device);
    if !dev_dir.exists() {
        let mut present: Vec<String> = std::fs::read_dir(&class)
            .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
            .unwrap_or_default();
        present.sort();
        let hint = if present.is_empty() {
            "no RDMA devices on this host (load the driver, or `rdma link add rxe0 type rxe netdev eth0` \
             for soft-RoCE); check `device` in the config"
                .to_string()
        } else {
            format!("devices present: {}; check `device` in the config", present.join(", "))
        };
        return Err(VerbsError::new(&cfg.device, "not found in sysfs", hint));
    }
    let port_dir = dev_dir.join("ports").join(cfg.port.to_string());
    let state = std::fs::read_to_string(port_dir.join("state")).map_err(|e| {
        VerbsError::new(&cfg.device, format!("port {} unreadable ({e})", cfg.port), "check `ib_port` in the config")
    })?;
    if !state.contains("ACTIVE") {
        return Err(VerbsError::new(
            &cfg.device,
            format!("port {} is {}", cfg.port, state.trim()),
            "bring the link up (the netdev under a RoCE device must be up and have the address)",
        ));
    }
    let want = gid_of(cfg.bind.ip());
    if let Some(i) = cfg.gid_index {
        let text = std::fs::read_to_string(port_dir.join(format!("gids/{i}"))).unwrap_or_default();
        let gid = text.trim().parse::<Ipv6Addr>().map_err(|_| {
            VerbsError::new(&cfg.device, format!("GID index {i} unreadable"), "check `gid_index` in the config")
        })?;
        return Ok(DeviceInfo { port: cfg.port, gid_index: i, gid: gid.octets() });
    }
    match crate::describe::roce_v2_gid(&cfg.sysfs, &cfg.device, cfg.bind.ip()) {
        Some((port, index, gid)) if port == cfg.port => {
            Ok(DeviceInfo { port, gid_index: index as u8, gid: gid.octets() })
        }
        _ => Err(VerbsError::new(
            &cfg.device,
            format!("no RoCE v2 GID {} on port {}", Ipv6Addr::from(want), cfg.port),
            "the address in `bind` must be configured on the device's netdev (see `show_gids`), or set `gid_index`",
        )),
    }
}

/// Run a verbs or RDMA CM call and say so when it blocked the shard: these calls are meant to
/// return at once, and a slow one shows up in the data as a frozen host.
fn timed<R>(what: &str, f: impl FnOnce() -> R) -> R {
    let t = std::time::Instant::now();
    let r = f();
    let took = t.elapsed();
    if took > std::time::Duration::from_millis(50) {
        tracing::warn!(call = what, ms = took.as_millis() as u64, "a verbs call blocked the shard");
    }
    r
}

/// The GID of an address: IPv4-mapped for IPv4 (RoCEv2).
pub fn gid_of(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

fn ip_of(gid: &[u8; 16]) -> IpAddr {
    let v6 = Ipv6Addr::from(*gid);
    match v6.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(v6),
    }
}

/// The sender's GID from a UD receive's 40-byte GRH area: an IPv6 GRH carries the source GID
/// at bytes 8..24; for RoCEv2 over IPv4 the IPv4 header sits in bytes 20..40.
pub fn source_gid(grh: &[u8; GRH_BYTES]) -> Option<[u8; 16]> {
    if grh[0] >> 4 == 6 {
        let mut g = [0u8; 16];
        g.copy_from_slice(&grh[8..24]);
        return Some(g);
    }
    if grh[20] >> 4 == 4 {
        let ip = std::net::Ipv4Addr::new(grh[32], grh[33], grh[34], grh[35]);
        return Some(ip.to_ipv6_mapped().octets());
    }
    None
}

/// How RDMA CM resolution of a target stands.
#[derive(Debug)]
struct Dest {
    gid: [u8; 16],
    port: u16,
    /// Last resolved QPN, 0 if none.
    qpn: u32,
    /// The peer's host answered that nothing listens on the port (its agent is down).
    refused: bool,
    /// A SIDR exchange in progress (its CM id) and when it began.
    resolving: *mut ffi::rdma_cm_id,
    resolving_since: u64,
    first_attempt: u64,
    next_attempt: u64,
    backoff: u64,
    misses: u32,
}

/// Counters of the verbs layer (the shard has the probe counters).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VerbsStats {
    /// QPNs resolved through RDMA CM.
    pub resolved: u64,
    /// Resolutions refused (nothing listens: the peer's agent is down).
    pub refused: u64,
    /// Resolutions that failed (timeout, no route).
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
}

/// Everything that dies with the device.
struct Resources {
    ctx: *mut ffi::ibv_context,
    pd: *mut ffi::ibv_pd,
    mr: *mut ffi::ibv_mr,
    /// Receive slots, then send slots; registered as `mr`. Never reallocated while registered.
    buf: Box<[u8]>,
    channel: *mut ffi::ibv_comp_channel,
    send_cq: *mut ffi::ibv_cq,
    recv_cq: *mut ffi::ibv_cq,
    qp: *mut ffi::ibv_qp,
    qpn: u32,
    info: DeviceInfo,
    ahs: HashMap<([u8; 16], u32), *mut ffi::ibv_ah>,
    send_free: Vec<u16>,
    send_want_tx: Box<[bool; SEND_DEPTH]>,
    /// Completion events read from the channel and not yet acknowledged, per CQ.
    unacked_send: u32,
    unacked_recv: u32,
    armed: bool,
}

/// RDMA CM state: the event channel, the listener peers resolve us through.
struct Cm {
    channel: *mut ffi::rdma_event_channel,
    listener: *mut ffi::rdma_cm_id,
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
    dests: HashMap<([u8; 16], u16), Dest>,
    queue: Box<[Queued; SEND_BATCH]>,
    queued: usize,
    /// Probes answered by a refusal (peer agent down) instead of a send stamp, for `tx_timestamps`.
    refusals: Box<[[u8; PACKET_BYTES]; SEND_BATCH]>,
    refusals_n: usize,
    /// Send stamps (T2, T4) of posted packets that asked for one, for `tx_timestamps`: a ring.
    stamps: Box<[([u8; PACKET_BYTES], u64); STAMP_RING]>,
    stamps_head: usize,
    stamps_len: usize,
    wrs: Box<[ffi::ibv_send_wr; SEND_BATCH]>,
    sges: Box<[ffi::ibv_sge; SEND_BATCH]>,
    wcs: Box<[ffi::ibv_wc; BATCH]>,
    /// Completions polled by `arm` (to close the race with notification), handed out first.
    stash_recv: Box<[ffi::ibv_wc; BATCH]>,
    stash_recv_n: usize,
    stash_send: Box<[ffi::ibv_wc; BATCH]>,
    stash_send_n: usize,
    recv_wrs: Box<[ffi::ibv_recv_wr; BATCH]>,
    recv_sges: Box<[ffi::ibv_sge; BATCH]>,
    next_reopen_ns: u64,
    /// A completion came back with an error: check whether the QP itself has failed.
    suspect_qp: Option<u32>,
    stats: VerbsStats,
    /// Descriptors to wait on: completion channel, CM channel, async events. -1 = none.
    fds: [RawFd; 3],
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
                Box::new(zeroed::<[ffi::ibv_wc; BATCH]>()),
                Box::new(zeroed::<[ffi::ibv_wc; BATCH]>()),
                Box::new(zeroed::<[ffi::ibv_wc; BATCH]>()),
                Box::new(zeroed::<[ffi::ibv_recv_wr; BATCH]>()),
                Box::new(zeroed::<[ffi::ibv_sge; BATCH]>()),
            )
        };
        let mut t = Self {
            res: None,
            cm: None,
            dests: HashMap::new(),
            queue: Box::new(
                [Queued { to: VerbsAddr::NULL, label: 0, packet: [0; PACKET_BYTES], want_tx: false }; SEND_BATCH],
            ),
            queued: 0,
            refusals: Box::new([[0; PACKET_BYTES]; SEND_BATCH]),
            refusals_n: 0,
            stamps: Box::new([([0; PACKET_BYTES], 0); STAMP_RING]),
            stamps_head: 0,
            stamps_len: 0,
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

    /// Destroy the CM ids of resolutions in flight (before their channel goes).
    fn cancel_resolutions(&mut self) {
        for d in self.dests.values_mut() {
            if !d.resolving.is_null() {
                // SAFETY: the id is ours and not yet destroyed; no event of it is held.
                unsafe { ffi::rdma_destroy_id(d.resolving) };
                d.resolving = null_mut();
            }
        }
    }

    /// Tear everything down after the device went away; probing continues, lost.
    fn lose_device(&mut self, why: &str) {
        if self.res.is_none() {
            return;
        }
        tracing::warn!(device = %self.cfg.device, "RDMA device lost ({why}); probes are lost until it returns");
        self.stats.device_lost += 1;
        // Resolutions in flight belong to the CM channel, which is rebuilt too.
        self.cancel_resolutions();
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
        let Ok(info) = discover(&self.cfg) else { return };
        match Resources::open(&self.cfg, info).and_then(|r| Ok((r, Cm::listen(&self.cfg)?))) {
            Ok((r, cm)) => {
                tracing::info!(device = %self.cfg.device, qpn = r.qpn, "RDMA device back; probing resumes");
                self.res = Some(r);
                self.cm = Some(cm);
                self.stats.device_recovered += 1;
                // Our new QPN is found by peers on their next resolution; theirs did not change,
                // but re-resolve anyway: their agents may have restarted meanwhile.
                for d in self.dests.values_mut() {
                    d.next_attempt = now;
                    d.misses = MISSES_BEFORE_RESOLVE;
                }
                self.refresh_fds();
            }
            Err(e) => tracing::debug!(device = %self.cfg.device, "device not usable yet: {e}"),
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
            if ffi::ibv_query_qp(r.qp, &raw mut attr, ffi::ibv_qp_attr_mask::IBV_QP_STATE.0 as i32, &raw mut init) != 0
            {
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
                match qpn {
                    Some(qpn) => {
                        // SAFETY: all-zero is a valid rdma_conn_param.
                        let mut p: ffi::rdma_conn_param = unsafe { zeroed() };
                        p.qp_num = qpn;
                        // SAFETY: `id` is the request's new id; for UD, accept sends the SIDR
                        // reply at once, so the id can go right after.
                        unsafe {
                            ffi::rdma_accept(id, &raw mut p);
                            ffi::rdma_ack_cm_event(ev);
                            ffi::rdma_destroy_id(id);
                        }
                        self.stats.answered_sidr += 1;
                    }
                    None => {
                        // SAFETY: as above; rejecting tells the peer nothing listens.
                        unsafe {
                            ffi::rdma_reject(id, std::ptr::null(), 0);
                            ffi::rdma_ack_cm_event(ev);
                            ffi::rdma_destroy_id(id);
                        }
                    }
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
            let key = self.dests.iter().find(|(_, d)| d.resolving == id).map(|(k, _)| *k);
            let Some(key) = key else {
                // SAFETY: acking an event of an id we no longer track.
                unsafe { ffi::rdma_ack_cm_event(ev) };
                continue;
            };
            let mut done: Option<Result<u32, bool>> = None; // Ok(qpn) | Err(refused)
            match kind {
                E::RDMA_CM_EVENT_ADDR_RESOLVED => {
                    // SAFETY: `id` is live.
                    if timed("rdma_resolve_route", || unsafe { ffi::rdma_resolve_route(id, CM_TIMEOUT_MS) }) != 0 {
                        done = Some(Err(false));
                    }
                }
                E::RDMA_CM_EVENT_ROUTE_RESOLVED => {
                    // SAFETY: all-zero is a valid rdma_conn_param.
                    let mut p: ffi::rdma_conn_param = unsafe { zeroed() };
                    p.qp_num = qpn.unwrap_or(0);
                    // SAFETY: `id` is live; a UD connect sends a SIDR request.
                    if timed("rdma_connect", || unsafe { ffi::rdma_connect(id, &raw mut p) }) != 0 {
                        done = Some(Err(false));
                    }
                }
                E::RDMA_CM_EVENT_ESTABLISHED => done = Some(Ok(ud.qp_num)),
                // A SIDR reply with a non-success status (positive): the host is up and answered
                // that nothing listens. A negative status is a timeout: the network is at fault.
                E::RDMA_CM_EVENT_UNREACHABLE | E::RDMA_CM_EVENT_REJECTED => done = Some(Err(status > 0)),
                _ => done = Some(Err(false)),
            }
            tracing::debug!(device = %self.cfg.device, peer = %ip_of(&key.0), event = kind, status, "RDMA CM event");
            // SAFETY: acking the event we hold, before any destroy of its id.
            unsafe { ffi::rdma_ack_cm_event(ev) };
            if let Some(outcome) = done {
                self.finish_resolution(key, outcome, now);
            }
        }
        if lost {
            self.lose_device("device removed");
        }
    }

    fn finish_resolution(&mut self, key: ([u8; 16], u16), outcome: Result<u32, bool>, now: u64) {
        let Some(d) = self.dests.get_mut(&key) else { return };
        if !d.resolving.is_null() {
            // SAFETY: the id is ours; its events have been acked.
            timed("rdma_destroy_id", || unsafe { ffi::rdma_destroy_id(d.resolving) });
            d.resolving = null_mut();
        }
        match outcome {
            Ok(qpn) => {
                if d.qpn != qpn {
                    tracing::info!(device = %self.cfg.device, peer = %ip_of(&d.gid), qpn, "peer QPN resolved");
                    d.backoff = RESOLVE_BACKOFF_MIN_NS;
                } else {
                    // Same QPN and still no answers: the fault is elsewhere; do not ask again
                    // at every third probe (an answered probe resets the backoff).
                    d.next_attempt = now + d.backoff;
                    d.backoff = (d.backoff * 2).min(RESOLVE_BACKOFF_MAX_NS);
                }
                d.qpn = qpn;
                d.refused = false;
                d.misses = 0;
                self.stats.resolved += 1;
            }
            Err(refused) => {
                if refused {
                    // Nothing listens there now: the QPN we had is gone with its agent.
                    d.qpn = 0;
                    d.refused = true;
                    self.stats.refused += 1;
                } else {
                    self.stats.unreachable += 1;
                }
                d.next_attempt = now + d.backoff;
                d.backoff = (d.backoff * 2).min(RESOLVE_BACKOFF_MAX_NS);
            }
        }
    }

    /// Start resolutions that are due.
    fn drive_resolutions(&mut self, now: u64) {
        let Some(cm) = &self.cm else { return };
        let channel = cm.channel;
        let src = self.cfg.bind.ip();
        let mut failed = Vec::new();
        for (key, d) in self.dests.iter_mut() {
            if !d.resolving.is_null() {
                if now.saturating_sub(d.resolving_since) > RESOLUTION_GIVE_UP_NS {
                    failed.push(*key);
                }
                continue;
            }
            let wanted = d.qpn == 0 || d.misses >= MISSES_BEFORE_RESOLVE;
            if !wanted || now < d.next_attempt {
                continue;
            }
            tracing::debug!(device = %self.cfg.device, peer = %ip_of(&d.gid), misses = d.misses, "resolving the peer's QPN");
            match start_resolution(channel, src, ip_of(&d.gid), d.port) {
                Ok(id) => {
                    d.resolving = id;
                    d.resolving_since = now;
                    if d.first_attempt == 0 {
                        d.first_attempt = now;
                    }
                    d.misses = 0;
                }
                Err(_) => {
                    d.next_attempt = now + d.backoff;
                    d.backoff = (d.backoff * 2).min(RESOLVE_BACKOFF_MAX_NS);
                }
            }
        }
        for key in failed {
            self.finish_resolution(key, Err(false), now);
        }
    }

    /// The QPN to send to, or what to do instead.
    fn route(&mut self, to: &VerbsAddr, now: u64) -> Route {
        if to.qpn != 0 {
            return Route::Send(to.qpn);
        }
        let key = (to.gid, to.port);
        if !self.dests.contains_key(&key) {
            if self.dests.len() >= MAX_DESTS {
                return Route::Drop;
            }
            self.dests.insert(
                key,
                Dest {
                    gid: to.gid,
                    port: to.port,
                    qpn: 0,
                    refused: false,
                    resolving: null_mut(),
                    resolving_since: 0,
                    first_attempt: 0,
                    next_attempt: now,
                    backoff: RESOLVE_BACKOFF_MIN_NS,
                    misses: 0,
                },
            );
            self.drive_resolutions(now);
        }
        let Some(d) = self.dests.get(&key) else { return Route::Drop };
        if d.qpn != 0 {
            Route::Send(d.qpn)
        } else if d.refused {
            Route::Refused
        } else if d.first_attempt == 0 || now.saturating_sub(d.first_attempt) < FIRST_RESOLUTION_GRACE_NS {
            // Not resolved yet (agents starting together): not the network's fault.
            Route::Refused
        } else {
            Route::Drop
        }
    }
}

/// Up to [`BATCH`] completions of a live `cq` into `out`.
fn poll_cq(cq: *mut ffi::ibv_cq, out: &mut [ffi::ibv_wc; BATCH]) -> io::Result<usize> {
    // SAFETY: the caller's CQ is live; `out` has room for BATCH completions.
    let k = unsafe { ffi::ibv_poll_cq(cq, BATCH as i32, out.as_mut_ptr()) };
    if k < 0 { Err(io::Error::other("ibv_poll_cq failed")) } else { Ok(k as usize) }
}

/// The completions `arm` already took from `cq` (its stash) if any, else a fresh poll, in `wcs`.
fn take_completions(
    cq: *mut ffi::ibv_cq,
    stash: &mut [ffi::ibv_wc; BATCH],
    stash_n: &mut usize,
    wcs: &mut [ffi::ibv_wc; BATCH],
) -> io::Result<usize> {
    if *stash_n == 0 {
        return poll_cq(cq, wcs);
    }
    let k = std::mem::take(stash_n);
    wcs[..k].swap_with_slice(&mut stash[..k]);
    Ok(k)
}

enum Route {
    Send(u32),
    Refused,
    Drop,
}

fn start_resolution(
    channel: *mut ffi::rdma_event_channel,
    src: IpAddr,
    dst: IpAddr,
    port: u16,
) -> io::Result<*mut ffi::rdma_cm_id> {
    let mut id: *mut ffi::rdma_cm_id = null_mut();
    // SAFETY: the channel is live; `id` receives a new id on success.
    if unsafe { ffi::rdma_create_id(channel, &raw mut id, null_mut(), ffi::rdma_port_space::RDMA_PS_UDP) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let (mut s, _) = to_sockaddr(SocketAddr::new(src, 0));
    let (mut d, _) = to_sockaddr(SocketAddr::new(dst, port));
    // SAFETY: both sockaddrs are valid for their family; the id is live.
    if timed("rdma_resolve_addr", || unsafe {
        ffi::rdma_resolve_addr(id, (&raw mut s).cast(), (&raw mut d).cast(), CM_TIMEOUT_MS)
    }) != 0
    {
        let e = io::Error::last_os_error();
        // SAFETY: the id is ours and has no events.
        unsafe { ffi::rdma_destroy_id(id) };
        return Err(e);
    }
    Ok(id)
}

fn set_nonblocking(fd: RawFd) -> io::Result<()> {
    // SAFETY: fcntl on a descriptor we own.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    // SAFETY: as above.
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

impl Cm {
    fn listen(cfg: &VerbsConfig) -> Result<Self, VerbsError> {
        let dev = &cfg.device;
        // SAFETY: plain constructor; checked for null.
        let channel = unsafe { ffi::rdma_create_event_channel() };
        if channel.is_null() {
            return Err(VerbsError::os(
                dev,
                "rdma_create_event_channel (/dev/infiniband/rdma_cm)",
                io::Error::last_os_error(),
            ));
        }
        let mut cm = Cm { channel, listener: null_mut() };
        // SAFETY: the channel is live.
        set_nonblocking(unsafe { (*channel).fd }).map_err(|e| VerbsError::os(dev, "fcntl(rdma_cm fd)", e))?;
        let mut id: *mut ffi::rdma_cm_id = null_mut();
        // SAFETY: the channel is live.
        if unsafe { ffi::rdma_create_id(channel, &raw mut id, null_mut(), ffi::rdma_port_space::RDMA_PS_UDP) } != 0 {
            return Err(VerbsError::os(dev, "rdma_create_id", io::Error::last_os_error()));
        }
        cm.listener = id;
        let (mut sa, _) = to_sockaddr(cfg.bind);
        // SAFETY: valid sockaddr; live id.
        if unsafe { ffi::rdma_bind_addr(id, (&raw mut sa).cast()) } != 0 {
            return Err(VerbsError::os(dev, &format!("rdma_bind_addr({})", cfg.bind), io::Error::last_os_error()));
        }
        // SAFETY: live, bound id.
        if unsafe { ffi::rdma_listen(id, 128) } != 0 {
            return Err(VerbsError::os(dev, &format!("rdma_listen({})", cfg.bind), io::Error::last_os_error()));
        }
        Ok(cm)
    }
}

impl Drop for Cm {
    fn drop(&mut self) {
        // SAFETY: the listener (if any) and the channel are ours; events were acked as read.
        unsafe {
            if !self.listener.is_null() {
                ffi::rdma_destroy_id(self.listener);
            }
            ffi::rdma_destroy_event_channel(self.channel);
        }
    }
}

impl Resources {
    fn open(cfg: &VerbsConfig, info: DeviceInfo) -> Result<Self, VerbsError> {
        let dev = cfg.device.as_str();
        let ctx = open_device(dev)?;
        // From here on, a failure drops `r`, which frees whatever was created.
        let total = RECV_DEPTH * RECV_SLOT_BYTES + SEND_DEPTH * PACKET_BYTES;
        let mut r = Resources {
            ctx,
            pd: null_mut(),
            mr: null_mut(),
            buf: vec![0u8; total].into_boxed_slice(),
            channel: null_mut(),
            send_cq: null_mut(),
            recv_cq: null_mut(),
            qp: null_mut(),
            qpn: 0,
            info,
            ahs: HashMap::with_capacity(1024),
            send_free: (0..SEND_DEPTH as u16).rev().collect(),
            send_want_tx: Box::new([false; SEND_DEPTH]),
            unacked_send: 0,
            unacked_recv: 0,
            armed: false,
        };
        let os = |op: &str| VerbsError::os(dev, op, io::Error::last_os_error());
        // SAFETY: each call below gets live objects created just before and is checked; the
        // buffer outlives the MR (both die in Drop, MR first).
        unsafe {
            set_nonblocking((*ctx).async_fd).map_err(|e| VerbsError::os(dev, "fcntl(async fd)", e))?;
            r.pd = ffi::ibv_alloc_pd(ctx);
            if r.pd.is_null() {
                return Err(os("ibv_alloc_pd"));
            }
            let access = ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0 as i32;
            r.mr = ffi::ibv_reg_mr(r.pd, r.buf.as_mut_ptr().cast(), total, access);
            if r.mr.is_null() {
                return Err(os("ibv_reg_mr"));
            }
            r.channel = ffi::ibv_create_comp_channel(ctx);
            if r.channel.is_null() {
                return Err(os("ibv_create_comp_channel"));
            }
            set_nonblocking((*r.channel).fd).map_err(|e| VerbsError::os(dev, "fcntl(completion channel)", e))?;
            r.send_cq = ffi::ibv_create_cq(ctx, SEND_DEPTH as i32, null_mut(), r.channel, 0);
            if r.send_cq.is_null() {
                return Err(os("ibv_create_cq(send)"));
            }
            r.recv_cq = ffi::ibv_create_cq(ctx, RECV_DEPTH as i32, null_mut(), r.channel, 0);
            if r.recv_cq.is_null() {
                return Err(os("ibv_create_cq(recv)"));
            }
            let mut init: ffi::ibv_qp_init_attr = zeroed();
            init.send_cq = r.send_cq;
            init.recv_cq = r.recv_cq;
            init.cap.max_send_wr = SEND_DEPTH as u32;
            init.cap.max_recv_wr = RECV_DEPTH as u32;
            init.cap.max_send_sge = 1;
            init.cap.max_recv_sge = 1;
            init.qp_type = ffi::ibv_qp_type::IBV_QPT_UD;
            init.sq_sig_all = 1;
            r.qp = ffi::ibv_create_qp(r.pd, &raw mut init);
            if r.qp.is_null() {
                return Err(os("ibv_create_qp(UD)"));
            }
            r.qpn = (*r.qp).qp_num;
            use ffi::ibv_qp_attr_mask as M;
            let mut a: ffi::ibv_qp_attr = zeroed();
            a.qp_state = ffi::ibv_qp_state::IBV_QPS_INIT;
            a.pkey_index = 0;
            a.port_num = info.port;
            a.qkey = RDMA_UDP_QKEY;
            let mask = M::IBV_QP_STATE | M::IBV_QP_PKEY_INDEX | M::IBV_QP_PORT | M::IBV_QP_QKEY;
            if ffi::ibv_modify_qp(r.qp, &raw mut a, mask.0 as i32) != 0 {
                return Err(os("ibv_modify_qp(INIT)"));
            }
            let mut a: ffi::ibv_qp_attr = zeroed();
            a.qp_state = ffi::ibv_qp_state::IBV_QPS_RTR;
            if ffi::ibv_modify_qp(r.qp, &raw mut a, M::IBV_QP_STATE.0 as i32) != 0 {
                return Err(os("ibv_modify_qp(RTR)"));
            }
            let mut a: ffi::ibv_qp_attr = zeroed();
            a.qp_state = ffi::ibv_qp_state::IBV_QPS_RTS;
            a.sq_psn = 0;
            if ffi::ibv_modify_qp(r.qp, &raw mut a, (M::IBV_QP_STATE | M::IBV_QP_SQ_PSN).0 as i32) != 0 {
                return Err(os("ibv_modify_qp(RTS)"));
            }
        }
        for slot in 0..RECV_DEPTH {
            r.post_recv_one(slot).map_err(|e| VerbsError::os(dev, "ibv_post_recv", e))?;
        }
        Ok(r)
    }

    fn recv_slot_addr(&self, slot: usize) -> *const u8 {
        // SAFETY: slot < RECV_DEPTH, inside `buf`.
        unsafe { self.buf.as_ptr().add(slot * RECV_SLOT_BYTES) }
    }

    fn send_slot_offset(slot: usize) -> usize {
        RECV_DEPTH * RECV_SLOT_BYTES + slot * PACKET_BYTES
    }

    fn post_recv_one(&mut self, slot: usize) -> io::Result<()> {
        let mut sge = ffi::ibv_sge {
            addr: self.recv_slot_addr(slot) as u64,
            length: RECV_SLOT_BYTES as u32,
            // SAFETY: the MR is live.
            lkey: unsafe { (*self.mr).lkey },
        };
        let mut wr = ffi::ibv_recv_wr { wr_id: slot as u64, next: null_mut(), sg_list: &raw mut sge, num_sge: 1 };
        let mut bad: *mut ffi::ibv_recv_wr = null_mut();
        // SAFETY: the QP is live; wr and sge are valid for the call (the provider copies them).
        let rc = unsafe { ffi::ibv_post_recv(self.qp, &raw mut wr, &raw mut bad) };
        if rc == 0 { Ok(()) } else { Err(io::Error::from_raw_os_error(rc)) }
    }

    fn ah(&mut self, gid: [u8; 16], label: u32, traffic_class: u8) -> Option<*mut ffi::ibv_ah> {
        if let Some(&ah) = self.ahs.get(&(gid, label)) {
            return Some(ah);
        }
        if self.ahs.len() >= MAX_AH {
            return None;
        }
        // SAFETY: all-zero is a valid ibv_ah_attr.
        let mut attr: ffi::ibv_ah_attr = unsafe { zeroed() };
        attr.is_global = 1;
        attr.port_num = self.info.port;
        attr.grh.dgid = ffi::ibv_gid { raw: gid };
        // Nonzero: with 0, some NICs pick one random UDP source port per AH, and the pair is
        // stuck on one ECMP path (anchors.md).
        attr.grh.flow_label = (label & 0xF_FFFF).max(1);
        attr.grh.sgid_index = self.info.gid_index;
        attr.grh.hop_limit = 64;
        attr.grh.traffic_class = traffic_class;
        // SAFETY: the PD is live; attr is valid.
        let ah = timed("ibv_create_ah", || unsafe { ffi::ibv_create_ah(self.pd, &raw mut attr) });
        if ah.is_null() {
            return None;
        }
        self.ahs.insert((gid, label), ah);
        Some(ah)
    }
}

fn open_device(name: &str) -> Result<*mut ffi::ibv_context, VerbsError> {
    let mut n = 0;
    // SAFETY: returns a list we free below, or null with errno.
    let list = unsafe { ffi::ibv_get_device_list(&raw mut n) };
    if list.is_null() {
        return Err(VerbsError::os(name, "ibv_get_device_list", io::Error::last_os_error()));
    }
    let mut ctx = null_mut();
    let mut found = false;
    let mut names = Vec::new();
    for i in 0..n.max(0) as usize {
        // SAFETY: i < n entries of the list.
        let d = unsafe { *list.add(i) };
        // SAFETY: the device's name is a NUL-terminated string owned by the list.
        let dn = unsafe { CStr::from_ptr(ffi::ibv_get_device_name(d)) }.to_string_lossy().into_owned();
        if dn == name {
            found = true;
            // SAFETY: opening a listed device.
            ctx = unsafe { ffi::ibv_open_device(d) };
        }
        names.push(dn);
    }
    let err = io::Error::last_os_error();
    // SAFETY: freeing the list we got; the opened context stays valid.
    unsafe { ffi::ibv_free_device_list(list) };
    if !found {
        return Err(VerbsError::new(
            name,
            "not among libibverbs' devices",
            format!("devices: [{}]; is the provider (ibverbs-providers) installed?", names.join(", ")),
        ));
    }
    if ctx.is_null() {
        return Err(VerbsError::os(name, "ibv_open_device", err));
    }
    Ok(ctx)
}

impl Drop for Resources {
    fn drop(&mut self) {
        // SAFETY: every handle is ours and destroyed once, dependents first. On a disassociated
        // (removed) device these calls fail harmlessly and free the user-space side.
        unsafe {
            for (_, ah) in self.ahs.drain() {
                ffi::ibv_destroy_ah(ah);
            }
            if !self.qp.is_null() {
                ffi::ibv_destroy_qp(self.qp);
            }
            if self.unacked_send > 0 && !self.send_cq.is_null() {
                ffi::ibv_ack_cq_events(self.send_cq, self.unacked_send);
            }
            if self.unacked_recv > 0 && !self.recv_cq.is_null() {
                ffi::ibv_ack_cq_events(self.recv_cq, self.unacked_recv);
            }
            if !self.send_cq.is_null() {
                ffi::ibv_destroy_cq(self.send_cq);
            }
            if !self.recv_cq.is_null() {
                ffi::ibv_destroy_cq(self.recv_cq);
            }
            if !self.channel.is_null() {
                ffi::ibv_destroy_comp_channel(self.channel);
            }
            if !self.mr.is_null() {
                ffi::ibv_dereg_mr(self.mr);
            }
            if !self.pd.is_null() {
                ffi::ibv_dealloc_pd(self.pd);
            }
            ffi::ibv_close_device(self.ctx);
        }
    }
}

impl Drop for VerbsTransport {
    fn drop(&mut self) {
        tracing::info!(device = %self.cfg.device, stats = ?self.stats, "verbs transport closed");
        self.cancel_resolutions();
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

    fn flush(&mut self, sent: &mut [bool; SEND_BATCH]) -> usize {
        let n = self.queued;
        self.queued = 0;
        sent[..n].fill(false);
        let now = now_ns();
        // Decide each packet's fate and build one chain of work requests.
        let mut chain: [u16; SEND_BATCH] = [0; SEND_BATCH];
        let mut chain_slot: [u16; SEND_BATCH] = [0; SEND_BATCH];
        let mut m = 0;
        let tc = self.cfg.traffic_class;
        for (i, went) in sent[..n].iter_mut().enumerate() {
            let q = self.queue[i];
            let qpn = match self.route(&q.to, now) {
                Route::Send(qpn) => qpn,
                Route::Refused => {
                    if q.want_tx && self.refusals_n < SEND_BATCH {
                        self.refusals[self.refusals_n] = q.packet;
                        self.refusals_n += 1;
                        *went = true;
                    }
                    continue;
                }
                Route::Drop => continue,
            };
            let Some(r) = self.res.as_mut() else { continue };
            let Some(ah) = r.ah(q.to.gid, q.label, tc) else {
                self.stats.ah_failures += 1;
                continue;
            };
            let Some(slot) = r.send_free.pop() else { continue };
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
        for k in 0..m {
            if k < posted {
                let i = chain[k] as usize;
                sent[i] = true;
                if self.queue[i].want_tx && self.stamps_len < STAMP_RING {
                    let at = (self.stamps_head + self.stamps_len) % STAMP_RING;
                    self.stamps[at] = (self.queue[i].packet, t);
                    self.stamps_len += 1;
                }
            } else {
                r.send_free.push(chain_slot[k]);
            }
        }
        n
    }

    fn recv(&mut self, out: &mut RxBatch<VerbsAddr>) -> io::Result<usize> {
        let Some(r) = self.res.as_mut() else { return Ok(0) };
        let got = take_completions(r.recv_cq, &mut self.stash_recv, &mut self.stash_recv_n, &mut self.wcs)?;
        let t = now_ns();
        let mut n = 0;
        let lkey = {
            // SAFETY: the MR is live.
            unsafe { (*r.mr).lkey }
        };
        for k in 0..got {
            let wc = &self.wcs[k];
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
                continue;
            }
            let base = slot * RECV_SLOT_BYTES;
            let mut grh = [0u8; GRH_BYTES];
            grh.copy_from_slice(&r.buf[base..base + GRH_BYTES]);
            let len = (wc.byte_len as usize).saturating_sub(GRH_BYTES);
            let Some(gid) = source_gid(&grh) else {
                out.len[n] = PACKET_BYTES + 1;
                out.rx_ns[n] = t;
                out.from[n] = VerbsAddr::NULL;
                n += 1;
                continue;
            };
            let take = len.min(PACKET_BYTES + 1);
            out.buf[n][..take].copy_from_slice(&r.buf[base + GRH_BYTES..base + GRH_BYTES + take]);
            out.len[n] = if len > PACKET_BYTES { PACKET_BYTES + 1 } else { len };
            out.rx_ns[n] = t;
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
        Ok(n)
    }

    fn tx_timestamps(&mut self, out: &mut TxBatch) -> io::Result<usize> {
        let mut n = 0;
        while n < BATCH && self.refusals_n > 0 {
            self.refusals_n -= 1;
            out.payload[n] = self.refusals[self.refusals_n];
            out.tx_ns[n] = 0;
            out.refused[n] = true;
            n += 1;
        }
        while n < BATCH && self.stamps_len > 0 {
            let (p, t) = self.stamps[self.stamps_head];
            self.stamps_head = (self.stamps_head + 1) % STAMP_RING;
            self.stamps_len -= 1;
            out.payload[n] = p;
            out.tx_ns[n] = t;
            out.refused[n] = false;
            n += 1;
        }
        // Send completions only return their slots (and count errors: a probe whose send failed
        // completes no exchange and its deadline records it as lost).
        let Some(r) = self.res.as_mut() else { return Ok(n) };
        let got = take_completions(r.send_cq, &mut self.stash_send, &mut self.stash_send_n, &mut self.wcs)?;
        for wc in &self.wcs[..got] {
            r.send_free.push((wc.wr_id as usize % SEND_DEPTH) as u16);
            if wc.status != ffi::ibv_wc_status::IBV_WC_SUCCESS {
                self.stats.completion_errors += 1;
                self.suspect_qp = Some(wc.status);
            }
        }
        Ok(n)
    }

    fn ts_source(&self) -> TsSource {
        TsSource::HostPoll
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

    fn answers_from(&self, probed: &VerbsAddr, from: &VerbsAddr) -> bool {
        probed.gid == from.gid && (probed.qpn == 0 || probed.qpn == from.qpn)
    }

    fn observe(&mut self, to: &VerbsAddr, answered: bool) {
        if to.qpn != 0 {
            return;
        }
        if let Some(d) = self.dests.get_mut(&(to.gid, to.port)) {
            if answered {
                d.misses = 0;
                d.backoff = RESOLVE_BACKOFF_MIN_NS;
            } else {
                d.misses = d.misses.saturating_add(1);
            }
        }
    }

    fn arm(&mut self) -> bool {
        let Some(r) = self.res.as_mut() else { return true };
        // SAFETY: live CQs.
        let rc = unsafe { ffi::ibv_req_notify_cq(r.send_cq, 0) | ffi::ibv_req_notify_cq(r.recv_cq, 0) };
        if rc != 0 {
            return false;
        }
        r.armed = true;
        // Completions that arrived before the notification was armed raise no event: poll once
        // more, and keep what is found for the next recv / tx_timestamps.
        if self.stash_recv_n == 0 {
            self.stash_recv_n = poll_cq(r.recv_cq, &mut self.stash_recv).unwrap_or(0);
        }
        if self.stash_send_n == 0 {
            self.stash_send_n = poll_cq(r.send_cq, &mut self.stash_send).unwrap_or(0);
        }
        self.stash_recv_n == 0 && self.stash_send_n == 0 && self.refusals_n == 0 && self.stamps_len == 0
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

/// Targets of a verbs shard: the pinglist's address as a GID; its QPN if the pinglist gives one,
/// else resolved at run time on the target's port (or the shard's own).
#[derive(Debug, Clone, Copy)]
pub struct VerbsResolver;

impl crate::shard::Resolve<VerbsAddr> for VerbsResolver {
    fn resolve(&self, target: &rocemesh_formats::pinglist::Target, default_port: u16) -> Result<VerbsAddr, String> {
        Ok(VerbsAddr {
            gid: gid_of(target.addr),
            qpn: target.qpn.unwrap_or(0),
            port: target.port.unwrap_or(default_port),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

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
        assert_eq!(info.gid, gid_of("10.0.1.2".parse().expect("ip")));

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
        assert_eq!(source_gid(&v4), Some(gid_of("10.0.1.7".parse().expect("ip"))));
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
