//! Serves the shards' views ([`crate::view`]) to collectors: a thread of its own (not a shard's)
//! listens with RDMA CM (RC port space) on each verbs shard's bind address and `[view] port`,
//! and for an allowed collector creates one RC queue pair and accepts, telling it the region's
//! address, length and rkey in the accept's private data ([`Grant`]). From then on the
//! collector's NIC reads the region and nothing on this host runs: no thread wakes, no
//! completion is posted (the agent never posts on these QPs).
//!
//! Access: per shard one protection domain holding one memory region, the view's bytes and
//! nothing else, registered remote-read only; the collectors' QPs are the only QPs of that
//! domain. A wrong rkey, an address outside the region or a write fails in the responder's
//! NIC, which moves that collector's QP to the error state; the agent's own QP and memory are
//! in another domain. Collectors not in `[view] allow`, and more than `max_readers` per shard,
//! are rejected with a reason in the reject's private data.

use std::io;
use std::mem::zeroed;
use std::net::{IpAddr, SocketAddr};
use std::ptr::null_mut;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rdma_sys as ffi;
use rocemesh_formats::view::{Grant, Region};

use crate::config::{Prefix, ViewConfig};
use crate::errlog::ErrorLog;

use super::resources::set_nonblocking;

/// One shard's view to serve.
#[derive(Debug, Clone)]
pub struct ViewShard {
    pub device: String,
    pub bind: IpAddr,
    pub region: Arc<Region>,
}

/// Counters of the view thread, logged with its stats line.
#[derive(Debug, Default, Clone, Copy)]
pub struct ViewStats {
    pub accepted: u64,
    pub rejected_not_allowed: u64,
    pub rejected_busy: u64,
    pub disconnected: u64,
    pub listen_errors: u64,
    pub accept_errors: u64,
}

const ERR_LISTEN: usize = 0;
const ERR_NOT_ALLOWED: usize = 1;
const ERR_BUSY: usize = 2;
const ERR_ACCEPT: usize = 3;
const ERR_DEVICE: usize = 4;
const ERROR_NAMES: [&str; 5] = ["listen", "not_allowed", "busy", "accept", "device_removed"];

/// How soon a shard whose listener failed (device absent, address not yet up) is tried again.
const RETRY: Duration = Duration::from_secs(1);
/// Responder resources offered: RDMA READs a collector may have outstanding on its QP.
const RESPONDER_RESOURCES: u8 = 4;

/// One shard's listener and what hangs off it. Raw pointers are null when absent.
struct Listener {
    shard: ViewShard,
    id: *mut ffi::rdma_cm_id,
    pd: *mut ffi::ibv_pd,
    mr: *mut ffi::ibv_mr,
    cq: *mut ffi::ibv_cq,
    /// Accepted (or being accepted) collectors' ids, each with its QP.
    readers: Vec<(*mut ffi::rdma_cm_id, IpAddr)>,
    retry_at: Instant,
}

impl Listener {
    fn closed(shard: ViewShard) -> Self {
        Self {
            shard,
            id: null_mut(),
            pd: null_mut(),
            mr: null_mut(),
            cq: null_mut(),
            readers: Vec::new(),
            retry_at: Instant::now(),
        }
    }

    /// Listen on the shard's address and register its region; on failure everything made so
    /// far is undone and the error names the call.
    fn open(&mut self, channel: *mut ffi::rdma_event_channel, port: u16, max_readers: usize) -> Result<(), String> {
        let fail = |s: &mut Self, what: &str| {
            let e = io::Error::last_os_error();
            s.close();
            Err(format!("{what}: {e}"))
        };
        // SAFETY: the channel is live; `self.id` receives a new id on success.
        if unsafe { ffi::rdma_create_id(channel, &raw mut self.id, null_mut(), ffi::rdma_port_space::RDMA_PS_TCP) } != 0
        {
            self.id = null_mut();
            return fail(self, "rdma_create_id");
        }
        let (mut sa, _) = crate::udp::to_sockaddr(SocketAddr::new(self.shard.bind, port));
        // SAFETY: a valid sockaddr; the id is live.
        if unsafe { ffi::rdma_bind_addr(self.id, (&raw mut sa).cast()) } != 0 {
            return fail(self, &format!("rdma_bind_addr({}:{port})", self.shard.bind));
        }
        // SAFETY: bound to one address, the id has its device's context.
        let ctx = unsafe { (*self.id).verbs };
        if ctx.is_null() {
            self.close();
            return Err(format!("{}:{port} is not on an RDMA device", self.shard.bind));
        }
        // SAFETY: a live context; results checked for null.
        unsafe {
            self.pd = ffi::ibv_alloc_pd(ctx);
            if self.pd.is_null() {
                return fail(self, "ibv_alloc_pd");
            }
            let access = ffi::ibv_access_flags::IBV_ACCESS_REMOTE_READ.0 as i32;
            // The region never moves and outlives the registration: `self.shard.region` holds it.
            let r = &self.shard.region;
            self.mr = ffi::ibv_reg_mr(self.pd, r.as_ptr().cast_mut().cast(), r.len_bytes(), access);
            if self.mr.is_null() {
                return fail(self, &format!("ibv_reg_mr({} bytes, remote read)", r.len_bytes()));
            }
            // The collectors' QPs need a CQ; nothing is ever posted on them, so it stays empty.
            self.cq = ffi::ibv_create_cq(ctx, (2 * max_readers) as i32, null_mut(), null_mut(), 0);
            if self.cq.is_null() {
                return fail(self, "ibv_create_cq");
            }
            if ffi::rdma_listen(self.id, 16) != 0 {
                return fail(self, &format!("rdma_listen({}:{port})", self.shard.bind));
            }
        }
        Ok(())
    }

    fn grant(&self) -> Grant {
        // SAFETY: the MR is live while the listener is open.
        let rkey = unsafe { (*self.mr).rkey };
        Grant { addr: self.shard.region.as_ptr() as u64, rkey, len: self.shard.region.len_bytes() as u32 }
    }

    /// Drop one reader: its QP, then its id (its events acked already).
    fn drop_reader(&mut self, id: *mut ffi::rdma_cm_id) -> bool {
        let Some(i) = self.readers.iter().position(|r| r.0 == id) else { return false };
        self.readers.swap_remove(i);
        // SAFETY: the id and its QP are ours, destroyed once.
        unsafe {
            if !(*id).qp.is_null() {
                ffi::rdma_destroy_qp(id);
            }
            ffi::rdma_destroy_id(id);
        }
        true
    }

    /// Undo everything, readers first (the kernel lets a removed device go only when every id
    /// on it is destroyed).
    fn close(&mut self) {
        while let Some(&(id, _)) = self.readers.last() {
            self.drop_reader(id);
        }
        // SAFETY: each object is ours, destroyed once, in dependency order.
        unsafe {
            if !self.cq.is_null() {
                ffi::ibv_destroy_cq(self.cq);
            }
            if !self.mr.is_null() {
                ffi::ibv_dereg_mr(self.mr);
            }
            if !self.pd.is_null() {
                ffi::ibv_dealloc_pd(self.pd);
            }
            if !self.id.is_null() {
                ffi::rdma_destroy_id(self.id);
            }
        }
        (self.cq, self.mr, self.pd, self.id) = (null_mut(), null_mut(), null_mut(), null_mut());
        self.retry_at = Instant::now() + RETRY;
    }
}

/// The view thread's state.
struct Server {
    channel: *mut ffi::rdma_event_channel,
    listeners: Vec<Listener>,
    allow: Vec<Prefix>,
    port: u16,
    max_readers: usize,
    stats: ViewStats,
    errors: ErrorLog<5>,
}

// SAFETY: the raw pointers are used only by the view thread, which owns the server.
unsafe impl Send for Server {}

impl Server {
    fn open_due(&mut self, now_ns: u64) {
        let now = Instant::now();
        for l in &mut self.listeners {
            if l.id.is_null() && now >= l.retry_at {
                match l.open(self.channel, self.port, self.max_readers) {
                    Ok(()) => tracing::info!(
                        device = %l.shard.device,
                        listen = %SocketAddr::new(l.shard.bind, self.port),
                        bytes = l.shard.region.len_bytes(),
                        "live view served to allowed collectors (RDMA READ)"
                    ),
                    Err(e) => {
                        self.stats.listen_errors += 1;
                        let msg = format_args!("view of {} not served yet (retried every 1 s): {e}", l.shard.device);
                        self.errors.record(ERR_LISTEN, now_ns, msg);
                    }
                }
            }
        }
    }

    /// Handle every CM event waiting.
    fn drain(&mut self, now_ns: u64) {
        use ffi::rdma_cm_event_type as E;
        loop {
            let mut ev: *mut ffi::rdma_cm_event = null_mut();
            // SAFETY: the channel is live and non-blocking; `ev` is ours until acked.
            if unsafe { ffi::rdma_get_cm_event(self.channel, &raw mut ev) } != 0 {
                return;
            }
            // SAFETY: `ev` is valid until acked.
            let (kind, id, listen_id) = unsafe { ((*ev).event, (*ev).id, (*ev).listen_id) };
            if kind == E::RDMA_CM_EVENT_CONNECT_REQUEST {
                let Some(li) = self.listeners.iter().position(|l| l.id == listen_id && !l.id.is_null()) else {
                    // SAFETY: an event of an id we do not hold any more: ack, and let the request go.
                    unsafe {
                        ffi::rdma_reject(id, std::ptr::null(), 0);
                        ffi::rdma_ack_cm_event(ev);
                        ffi::rdma_destroy_id(id);
                    }
                    continue;
                };
                self.request(li, id, now_ns);
                // SAFETY: acking the event we hold (`request` destroys nothing: a refused
                // request's id goes below, after the ack).
                unsafe { ffi::rdma_ack_cm_event(ev) };
                if !self.listeners[li].readers.iter().any(|r| r.0 == id) {
                    // SAFETY: refused: the id is ours and its only event is acked.
                    unsafe { ffi::rdma_destroy_id(id) };
                }
                continue;
            }
            // SAFETY: acking before any destroy of the event's id.
            unsafe { ffi::rdma_ack_cm_event(ev) };
            let listener = self.listeners.iter().position(|l| !l.id.is_null() && l.id == id);
            let reader = self.listeners.iter().position(|l| l.readers.iter().any(|r| r.0 == id));
            match kind {
                E::RDMA_CM_EVENT_ESTABLISHED => {
                    if let Some(li) = reader {
                        let l = &self.listeners[li];
                        let from = l.readers.iter().find(|r| r.0 == id).map(|r| r.1);
                        tracing::info!(device = %l.shard.device, collector = ?from, readers = l.readers.len(), "view collector connected");
                    }
                }
                E::RDMA_CM_EVENT_DEVICE_REMOVAL => {
                    if let Some(li) = listener.or(reader) {
                        let l = &mut self.listeners[li];
                        let msg = format_args!(
                            "{}: device removed; the view is served again when it is back",
                            l.shard.device
                        );
                        self.errors.record(ERR_DEVICE, now_ns, msg);
                        l.close();
                    }
                }
                // Disconnects, failed accepts, and anything else on a reader's id: that reader
                // is gone.
                _ => {
                    if let Some(li) = reader {
                        let l = &mut self.listeners[li];
                        if l.drop_reader(id) {
                            self.stats.disconnected += 1;
                            tracing::info!(device = %l.shard.device, event = kind, readers = l.readers.len(), "view collector gone");
                        }
                    }
                }
            }
        }
    }

    /// A collector asks to connect on listener `li`: check it, create its QP, accept with the
    /// grant; or reject with the reason.
    fn request(&mut self, li: usize, id: *mut ffi::rdma_cm_id, now_ns: u64) {
        // SAFETY: the request's id is live; its route holds the peer's address.
        let peer = unsafe { crate::udp::from_sockaddr(&(*id).route.addr.dst_addr_union.dst_storage) }.map(|a| a.ip());
        let l = &mut self.listeners[li];
        let reject = |why: &str| {
            // SAFETY: a live request id; the reason is copied by the call.
            if unsafe { ffi::rdma_reject(id, why.as_ptr().cast(), why.len() as u8) } != 0 {
                // The collector then times out instead of reading the reason; the refusal
                // itself is counted and logged by the caller.
                tracing::debug!("rdma_reject ({why}) failed: {}", io::Error::last_os_error());
            }
        };
        let Some(peer) = peer.filter(|p| self.allow.iter().any(|a| a.contains(*p))) else {
            self.stats.rejected_not_allowed += 1;
            reject("rocemesh view: not in [view] allow");
            let msg = format_args!("view of {}: refused collector {peer:?}: not in [view] allow", l.shard.device);
            self.errors.record(ERR_NOT_ALLOWED, now_ns, msg);
            return;
        };
        if l.readers.len() >= self.max_readers {
            self.stats.rejected_busy += 1;
            reject("rocemesh view: max_readers reached");
            let msg = format_args!(
                "view of {}: refused collector {peer}: {} collectors read it already (raise [view] max_readers)",
                l.shard.device,
                l.readers.len()
            );
            self.errors.record(ERR_BUSY, now_ns, msg);
            return;
        }
        // SAFETY: all-zero is a valid init attr; the PD and CQ are live; `id` is live.
        let rc = unsafe {
            let mut init: ffi::ibv_qp_init_attr = zeroed();
            init.send_cq = l.cq;
            init.recv_cq = l.cq;
            init.qp_type = ffi::ibv_qp_type::IBV_QPT_RC;
            init.cap.max_send_wr = 1;
            init.cap.max_recv_wr = 1;
            init.cap.max_send_sge = 1;
            init.cap.max_recv_sge = 1;
            ffi::rdma_create_qp(id, l.pd, &raw mut init)
        };
        if rc != 0 {
            let e = io::Error::last_os_error();
            self.stats.accept_errors += 1;
            reject("rocemesh view: no queue pair");
            self.errors.record(ERR_ACCEPT, now_ns, format_args!("view of {}: rdma_create_qp: {e}", l.shard.device));
            return;
        }
        let grant = l.grant().encode();
        // SAFETY: all-zero is a valid conn param; the private data outlives the call.
        let rc = unsafe {
            let mut p: ffi::rdma_conn_param = zeroed();
            p.private_data = grant.as_ptr().cast();
            p.private_data_len = grant.len() as u8;
            p.responder_resources = RESPONDER_RESOURCES;
            p.initiator_depth = 0;
            p.rnr_retry_count = 7;
            ffi::rdma_accept(id, &raw mut p)
        };
        if rc != 0 {
            let e = io::Error::last_os_error();
            self.stats.accept_errors += 1;
            // SAFETY: the QP we just created on this id.
            unsafe { ffi::rdma_destroy_qp(id) };
            self.errors.record(ERR_ACCEPT, now_ns, format_args!("view of {}: rdma_accept: {e}", l.shard.device));
            return;
        }
        self.stats.accepted += 1;
        l.readers.push((id, peer));
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        for l in &mut self.listeners {
            l.close();
        }
        // SAFETY: every id on the channel is destroyed above.
        unsafe { ffi::rdma_destroy_event_channel(self.channel) };
    }
}

/// Start the view thread for `shards`. It runs until `stop` or `signal` (the process-wide SIGINT
/// or SIGTERM); a shard whose address or device is
/// not (yet) there is retried every second.
pub fn spawn(
    shards: Vec<ViewShard>,
    cfg: &ViewConfig,
    stop: Arc<AtomicBool>,
    signal: &'static AtomicBool,
    stats_interval_s: u64,
) -> Result<std::thread::JoinHandle<()>, String> {
    let allow = cfg.prefixes()?;
    let (port, max_readers) = (cfg.port, cfg.max_readers);
    // SAFETY: plain constructor; checked for null.
    let channel = unsafe { ffi::rdma_create_event_channel() };
    if channel.is_null() {
        return Err(format!("rdma_create_event_channel (/dev/infiniband/rdma_cm): {}", io::Error::last_os_error()));
    }
    let mut server = Server {
        channel,
        listeners: shards.into_iter().map(Listener::closed).collect(),
        allow,
        port,
        max_readers,
        stats: ViewStats::default(),
        errors: ErrorLog::new("view", ERROR_NAMES),
    };
    // SAFETY: the channel is live.
    set_nonblocking(unsafe { (*channel).fd }).map_err(|e| format!("fcntl(rdma_cm fd): {e}"))?;
    std::thread::Builder::new()
        .name("view".into())
        .spawn(move || {
            // SAFETY: the channel is live until the server drops.
            let fd = unsafe { (*server.channel).fd };
            let stats_every = Duration::from_secs(stats_interval_s.max(1));
            let mut next_stats = Instant::now() + stats_every;
            while !stop.load(Ordering::Relaxed) && !signal.load(Ordering::Relaxed) {
                let now_ns = crate::clock::now_ns();
                server.open_due(now_ns);
                let mut pfd = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
                // SAFETY: one valid pollfd.
                unsafe { libc::poll(&raw mut pfd, 1, 200) };
                server.drain(crate::clock::now_ns());
                if stats_interval_s > 0 && Instant::now() >= next_stats {
                    next_stats = Instant::now() + stats_every;
                    log_stats(&server, false);
                }
            }
            log_stats(&server, true);
        })
        .map_err(|e| format!("starting the view thread: {e}"))
}

fn log_stats(s: &Server, last: bool) {
    let st = s.stats;
    tracing::info!(
        final_ = last,
        serving = s.listeners.iter().filter(|l| !l.id.is_null()).count(),
        readers = s.listeners.iter().map(|l| l.readers.len()).sum::<usize>(),
        accepted = st.accepted,
        rejected_not_allowed = st.rejected_not_allowed,
        rejected_busy = st.rejected_busy,
        disconnected = st.disconnected,
        listen_errors = st.listen_errors,
        accept_errors = st.accept_errors,
        "view stats"
    );
}
