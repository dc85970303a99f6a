//! `ctl scrape`: read agents' live views (`rocemesh_formats::view`) with RDMA READ, so that the
//! agents on training nodes spend no CPU on being observed (MicroView).
//!
//! One thread, one RDMA CM event channel. Per agent shard (an address and the `[view] port`):
//! resolve, connect an RC queue pair, take the region's address, length and rkey from the
//! accept's private data, register a local buffer, then at every tick post one RDMA READ of the
//! header, the fixed part and the ToR slots in use (the length the last snapshot gave). A torn
//! read (an update ran during it) is read again at once; a read that covered fewer slots than
//! are in use is read again longer. A failed read (wrong rkey, out of bounds: the remote NIC
//! refuses it and the QP goes to error) or a lost connection is reported with the target and
//! the reason, and the target is connected again a second later. What was read is printed as
//! JSON lines and, with `--prom`, written as a Prometheus text file at every tick.
//!
//! Between ticks the thread sleeps in poll(2) on the CM channel and each device's completion
//! channel: it spins on nothing, so that a read's latency is the fabric's and not the
//! collector's polling step. A target whose read is still in flight at a tick is read once as
//! soon as that read completes, so that a read slower than a tick costs one tick's delay, not
//! the tick.

use std::io::{self, Write};
use std::mem::zeroed;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::ptr::null_mut;
use std::time::{Duration, Instant};

use rdma_sys as ffi;
use rocemesh_formats::view::{self, COUNTER_NAMES, FIXED_WORDS, Grant, OUTCOMES, STATE_NAMES, Snapshot, ViewError};

/// Deliberately wrong reads, to show that an agent refuses them without harm (tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Forge {
    /// Read with an rkey that is not the one granted.
    Rkey,
    /// Read 64 bytes starting 8 bytes before the region's end.
    OutOfBounds,
}

/// What to scrape and how.
#[derive(Debug, Clone)]
pub struct ScrapeOptions {
    /// Agent shards: each shard's bind address with the `[view] port`.
    pub targets: Vec<SocketAddr>,
    /// Reads per second per target.
    pub rate_hz: f64,
    /// Stop after this long; `None`: until interrupted.
    pub duration: Option<Duration>,
    /// Print each snapshot as a JSON line.
    pub json: bool,
    /// Rewrite this Prometheus text file (atomically) after every tick.
    pub prom: Option<PathBuf>,
    pub forge: Option<Forge>,
    /// How long a read may take before it counts as failed.
    pub read_timeout: Duration,
}

/// Per target, what happened.
#[derive(Debug, Clone, Default)]
pub struct TargetSummary {
    pub target: String,
    pub connects: u64,
    pub reads: u64,
    pub snapshots: u64,
    pub torn: u64,
    pub failures: u64,
    /// Reads completed (successfully), and the sum and largest of their times from post to
    /// completion, ns.
    pub completed: u64,
    pub read_ns_sum: u64,
    pub read_ns_max: u64,
    /// Ticks that found a read still in flight (that target was read when it completed).
    pub late_ticks: u64,
    /// The last failure, as said.
    pub last_failure: Option<String>,
}

/// The run's totals.
#[derive(Debug, Clone, Default)]
pub struct Summary {
    pub targets: Vec<TargetSummary>,
    pub seconds: f64,
    /// CPU time of this process (user + system), s.
    pub cpu_s: f64,
    /// Ticks that passed while the loop was busy (writing, decoding) or descheduled, so that no
    /// read was posted for them.
    pub ticks_missed: u64,
    /// Ticks at which reads were posted.
    pub ticks: u64,
}

impl Summary {
    /// Consistent snapshots per second over the run.
    pub fn snapshots_per_s(&self) -> f64 {
        self.targets.iter().map(|t| t.snapshots).sum::<u64>() as f64 / self.seconds.max(1e-9)
    }
}

enum State {
    /// Resolving or connecting.
    Connecting,
    /// Connected: reads may be posted.
    Ready {
        grant: Grant,
        buf: Vec<u8>,
        mr: *mut ffi::ibv_mr,
        want: usize,
        in_flight: Option<Instant>,
        /// A tick came while a read was in flight: read again when it completes.
        owed: bool,
    },
    /// Down; connect again at this time.
    Down { retry_at: Instant },
}

struct Target {
    addr: SocketAddr,
    id: *mut ffi::rdma_cm_id,
    state: State,
    summary: TargetSummary,
    last: Option<Snapshot>,
}

/// Per device context: the protection domain and completion queue of its targets' QPs, and the
/// completion channel (non-blocking) that wakes the thread when the queue has work.
struct Device {
    ctx: *mut ffi::ibv_context,
    pd: *mut ffi::ibv_pd,
    channel: *mut ffi::ibv_comp_channel,
    /// The channel's descriptor, for poll(2).
    fd: libc::c_int,
    /// The channel failed (its device went): no longer waited on, so that a descriptor that
    /// polls as an error for good cannot make the loop spin. Its CQ is still polled every loop
    /// and ticks and read timeouts still bound the wait.
    dead: bool,
    cq: *mut ffi::ibv_cq,
}

struct Collector {
    channel: *mut ffi::rdma_event_channel,
    targets: Vec<Target>,
    devices: Vec<Device>,
}

/// The error of a failed start (no RDMA CM, no device).
#[derive(Debug, thiserror::Error)]
#[error("{what}: {source}")]
pub struct ScrapeError {
    what: String,
    #[source]
    source: io::Error,
}

fn os_error(what: impl Into<String>) -> ScrapeError {
    ScrapeError { what: what.into(), source: io::Error::last_os_error() }
}

const RETRY: Duration = Duration::from_secs(1);
const CM_TIMEOUT_MS: i32 = 2_000;
/// Completions polled at once.
const POLL_BATCH: usize = 32;

impl Collector {
    fn device(
        &mut self,
        ctx: *mut ffi::ibv_context,
        targets: usize,
    ) -> Result<(*mut ffi::ibv_pd, *mut ffi::ibv_cq), String> {
        if let Some(d) = self.devices.iter().find(|d| d.ctx == ctx) {
            return Ok((d.pd, d.cq));
        }
        // SAFETY: a live context (from a resolved id); results checked.
        unsafe {
            let pd = ffi::ibv_alloc_pd(ctx);
            if pd.is_null() {
                return Err(format!("ibv_alloc_pd: {}", io::Error::last_os_error()));
            }
            let channel = ffi::ibv_create_comp_channel(ctx);
            if channel.is_null() {
                let e = io::Error::last_os_error();
                ffi::ibv_dealloc_pd(pd);
                return Err(format!("ibv_create_comp_channel: {e}"));
            }
            let cq = ffi::ibv_create_cq(ctx, (2 * targets + 16) as i32, null_mut(), channel, 0);
            if cq.is_null() {
                let e = io::Error::last_os_error();
                ffi::ibv_destroy_comp_channel(channel);
                ffi::ibv_dealloc_pd(pd);
                return Err(format!("ibv_create_cq: {e}"));
            }
            let d = Device { ctx, pd, channel, fd: (*channel).fd, cq, dead: false };
            // A blocking channel would stall the loop in ibv_get_cq_event; an unarmed CQ would
            // never wake it.
            let flags = libc::fcntl(d.fd, libc::F_GETFL);
            let armed = flags >= 0
                && libc::fcntl(d.fd, libc::F_SETFL, flags | libc::O_NONBLOCK) == 0
                && ffi::ibv_req_notify_cq(cq, 0) == 0;
            if !armed {
                let e = io::Error::last_os_error();
                d.destroy();
                return Err(format!("arming the completion channel (O_NONBLOCK, ibv_req_notify_cq): {e}"));
            }
            self.devices.push(d);
            Ok((pd, cq))
        }
    }

    /// Start (again) connecting target `i`.
    fn connect(&mut self, i: usize) {
        let t = &mut self.targets[i];
        t.summary.connects += 1;
        let mut id: *mut ffi::rdma_cm_id = null_mut();
        // SAFETY: the channel is live; the context pointer is only our index.
        let rc = unsafe {
            ffi::rdma_create_id(self.channel, &raw mut id, i as *mut libc::c_void, ffi::rdma_port_space::RDMA_PS_TCP)
        };
        if rc != 0 {
            let e = io::Error::last_os_error();
            self.fail(i, format!("rdma_create_id: {e}"));
            return;
        }
        t.id = id;
        t.state = State::Connecting;
        let mut dst = sockaddr(t.addr);
        // SAFETY: a live id; a valid sockaddr.
        if unsafe { ffi::rdma_resolve_addr(id, null_mut(), (&raw mut dst).cast(), CM_TIMEOUT_MS) } != 0 {
            let e = io::Error::last_os_error();
            self.fail(i, format!("rdma_resolve_addr: {e}"));
        }
    }

    /// Target `i` is down for `why`: said once per failure, resources released, retried later.
    fn fail(&mut self, i: usize, why: String) {
        let t = &mut self.targets[i];
        t.summary.failures += 1;
        eprintln!("ctl scrape: {}: {why}", t.addr);
        t.summary.last_failure = Some(why);
        release(t);
        t.state = State::Down { retry_at: Instant::now() + RETRY };
    }

    fn drain_cm(&mut self) {
        use ffi::rdma_cm_event_type as E;
        loop {
            let mut ev: *mut ffi::rdma_cm_event = null_mut();
            // SAFETY: live, non-blocking channel; `ev` is ours until acked.
            if unsafe { ffi::rdma_get_cm_event(self.channel, &raw mut ev) } != 0 {
                return;
            }
            // SAFETY: `ev` is valid until acked; private data is copied out before.
            let (kind, status, id, private) = unsafe {
                let conn = (*ev).param.conn;
                let private = if conn.private_data.is_null() {
                    Vec::new()
                } else {
                    std::slice::from_raw_parts(conn.private_data.cast::<u8>(), usize::from(conn.private_data_len))
                        .to_vec()
                };
                ((*ev).event, (*ev).status, (*ev).id, private)
            };
            // SAFETY: acked before anything destroys the id.
            unsafe { ffi::rdma_ack_cm_event(ev) };
            let Some(i) = self.targets.iter().position(|t| t.id == id && !id.is_null()) else { continue };
            match kind {
                E::RDMA_CM_EVENT_ADDR_RESOLVED => {
                    // SAFETY: a live id.
                    if unsafe { ffi::rdma_resolve_route(id, CM_TIMEOUT_MS) } != 0 {
                        let e = io::Error::last_os_error();
                        self.fail(i, format!("rdma_resolve_route: {e}"));
                    }
                }
                E::RDMA_CM_EVENT_ROUTE_RESOLVED => {
                    if let Err(e) = self.create_qp_and_connect(i) {
                        self.fail(i, e);
                    }
                }
                E::RDMA_CM_EVENT_ESTABLISHED => match Grant::decode(&private) {
                    Ok(grant) => {
                        if let Err(e) = self.ready(i, grant) {
                            self.fail(i, e);
                        }
                    }
                    Err(e) => self.fail(i, format!("the agent's accept carried no view grant: {e}")),
                },
                E::RDMA_CM_EVENT_REJECTED => {
                    let reason = String::from_utf8_lossy(&private).trim_end_matches('\0').to_string();
                    let why = if reason.is_empty() {
                        format!("rejected (status {status}): no agent view on this port, or an agent without [view]")
                    } else {
                        format!("rejected by the agent: {reason}")
                    };
                    self.fail(i, why);
                }
                E::RDMA_CM_EVENT_DISCONNECTED => {
                    self.fail(i, "disconnected by the agent (stopping, or its device went)".into())
                }
                other => self.fail(i, format!("connection failed: RDMA CM event {other}, status {status}")),
            }
        }
    }

    fn create_qp_and_connect(&mut self, i: usize) -> Result<(), String> {
        let id = self.targets[i].id;
        // SAFETY: a route-resolved id has its device context.
        let ctx = unsafe { (*id).verbs };
        let n = self.targets.len();
        let (pd, cq) = self.device(ctx, n)?;
        // SAFETY: all-zero is a valid init attr; the PD, CQ and id are live.
        let rc = unsafe {
            let mut init: ffi::ibv_qp_init_attr = zeroed();
            init.send_cq = cq;
            init.recv_cq = cq;
            init.qp_type = ffi::ibv_qp_type::IBV_QPT_RC;
            init.cap.max_send_wr = 4;
            init.cap.max_recv_wr = 1;
            init.cap.max_send_sge = 1;
            init.cap.max_recv_sge = 1;
            init.sq_sig_all = 1;
            ffi::rdma_create_qp(id, pd, &raw mut init)
        };
        if rc != 0 {
            return Err(format!("rdma_create_qp: {}", io::Error::last_os_error()));
        }
        // SAFETY: all-zero is a valid conn param; a live id with its QP.
        let rc = unsafe {
            let mut p: ffi::rdma_conn_param = zeroed();
            p.initiator_depth = 1;
            p.responder_resources = 0;
            p.retry_count = 7;
            p.rnr_retry_count = 7;
            ffi::rdma_connect(id, &raw mut p)
        };
        if rc != 0 {
            return Err(format!("rdma_connect: {}", io::Error::last_os_error()));
        }
        Ok(())
    }

    fn ready(&mut self, i: usize, grant: Grant) -> Result<(), String> {
        let id = self.targets[i].id;
        // SAFETY: a connected id has its context and PD.
        let pd = unsafe { (*(*id).qp).pd };
        let len = grant.len as usize;
        if len < 8 * FIXED_WORDS {
            return Err(format!("the agent granted {len} bytes, less than a view's fixed part"));
        }
        let mut buf = vec![0u8; len + 64];
        let access = ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0 as i32;
        // SAFETY: the buffer lives in the state with its MR and is deregistered before it drops.
        let mr = unsafe { ffi::ibv_reg_mr(pd, buf.as_mut_ptr().cast(), buf.len(), access) };
        if mr.is_null() {
            return Err(format!("ibv_reg_mr({} bytes): {}", buf.len(), io::Error::last_os_error()));
        }
        let want = self.targets[i].last.as_ref().map_or(8 * FIXED_WORDS, |s| s.read_bytes().min(len));
        self.targets[i].state = State::Ready { grant, buf, mr, want, in_flight: None, owed: false };
        Ok(())
    }

    /// Post one read on target `i` (ready, nothing in flight).
    fn post_read(&mut self, i: usize, forge: Option<Forge>) {
        let t = &mut self.targets[i];
        let id = t.id;
        let State::Ready { grant, buf, mr, want, in_flight, .. } = &mut t.state else { return };
        let (mut remote, mut rkey, mut length) = (grant.addr, grant.rkey, (*want).min(grant.len as usize) as u32);
        match forge {
            Some(Forge::Rkey) => rkey ^= 0x5a5a_5a5a,
            Some(Forge::OutOfBounds) => {
                remote = grant.addr + u64::from(grant.len) - 8;
                length = 64;
            }
            None => {}
        }
        // SAFETY: the MR is live and covers `buf`, which has room for `length` (len + 64); the
        // QP is the connected id's.
        let rc = unsafe {
            let mut sge = ffi::ibv_sge { addr: buf.as_mut_ptr() as u64, length, lkey: (**mr).lkey };
            let mut wr: ffi::ibv_send_wr = zeroed();
            // The connection's number rides along: a completion of an earlier connection's read
            // (flushed when its QP failed) must not fail the one that replaced it.
            wr.wr_id = (t.summary.connects << 32) | i as u64;
            wr.sg_list = &raw mut sge;
            wr.num_sge = 1;
            wr.opcode = ffi::ibv_wr_opcode::IBV_WR_RDMA_READ;
            wr.send_flags = ffi::ibv_send_flags::IBV_SEND_SIGNALED.0;
            wr.wr.rdma = ffi::rdma_t { remote_addr: remote, rkey };
            let mut bad: *mut ffi::ibv_send_wr = null_mut();
            ffi::ibv_post_send((*id).qp, &raw mut wr, &raw mut bad)
        };
        if rc == 0 {
            *in_flight = Some(Instant::now());
            t.summary.reads += 1;
        } else {
            let e = io::Error::from_raw_os_error(rc);
            self.fail(i, format!("ibv_post_send(RDMA READ): {e}"));
        }
    }

    /// A tick: a read on every ready target; one with a read in flight is owed one.
    fn tick(&mut self, forge: Option<Forge>) {
        for i in 0..self.targets.len() {
            match &mut self.targets[i].state {
                State::Ready { in_flight: None, .. } => self.post_read(i, forge),
                State::Ready { owed, .. } => {
                    *owed = true;
                    self.targets[i].summary.late_ticks += 1;
                }
                _ => {}
            }
        }
    }

    /// Takes the completion channels' events and arms their CQs again. Called before the CQs
    /// are polled, so that a completion that lands between the two wakes the next poll(2).
    fn rearm(&mut self) {
        for d in self.devices.iter_mut().filter(|d| !d.dead) {
            let mut n = 0u32;
            loop {
                let (mut cq, mut ctx): (*mut ffi::ibv_cq, *mut libc::c_void) = (null_mut(), null_mut());
                // SAFETY: a live, non-blocking channel; the event is acked below.
                if unsafe { ffi::ibv_get_cq_event(d.channel, &raw mut cq, &raw mut ctx) } != 0 {
                    break;
                }
                n += 1;
            }
            // SAFETY: the CQ is live; n events were taken from it.
            unsafe {
                if n > 0 {
                    ffi::ibv_ack_cq_events(d.cq, n);
                }
                if ffi::ibv_req_notify_cq(d.cq, 0) != 0 {
                    d.fail(&format!("ibv_req_notify_cq: {}", io::Error::last_os_error()));
                }
            }
        }
    }

    /// How long the thread may sleep: until the next tick, the first read timeout or the first
    /// reconnection, whichever comes first.
    fn sleep_for(&self, next_tick: Instant, read_timeout: Duration) -> Duration {
        let now = Instant::now();
        let until = self
            .targets
            .iter()
            .filter_map(|t| match t.state {
                State::Ready { in_flight: Some(at), .. } => Some(at + read_timeout),
                State::Down { retry_at } => Some(retry_at),
                _ => None,
            })
            .fold(next_tick, Instant::min);
        until.saturating_duration_since(now)
    }

    /// Completions: decode what was read; a torn or short read is posted again at once.
    fn poll(&mut self, opts: &ScrapeOptions, out: &mut dyn Write) -> io::Result<()> {
        // SAFETY: all-zero is a valid ibv_wc array.
        let mut wc: [ffi::ibv_wc; POLL_BATCH] = unsafe { zeroed() };
        let cqs: Vec<*mut ffi::ibv_cq> = self.devices.iter().map(|d| d.cq).collect();
        for cq in cqs {
            loop {
                // SAFETY: a live CQ; `wc` has room for POLL_BATCH.
                let n = unsafe { ffi::ibv_poll_cq(cq, POLL_BATCH as i32, wc.as_mut_ptr()) };
                if n <= 0 {
                    break;
                }
                for w in &wc[..n as usize] {
                    let (i, connection) = ((w.wr_id & 0xffff_ffff) as usize, w.wr_id >> 32);
                    if i >= self.targets.len() || self.targets[i].summary.connects != connection {
                        continue;
                    }
                    if w.status != ffi::ibv_wc_status::IBV_WC_SUCCESS {
                        let why = format!(
                            "RDMA READ failed: {} (status {}, vendor error {:#x}); the agent refused it",
                            wc_status(w.status),
                            w.status,
                            w.vendor_err
                        );
                        self.fail(i, why);
                        continue;
                    }
                    self.completed(i, opts, out)?;
                }
            }
        }
        // Reads that never completed.
        for i in 0..self.targets.len() {
            if let State::Ready { in_flight: Some(at), .. } = self.targets[i].state
                && at.elapsed() > opts.read_timeout
            {
                self.fail(i, format!("RDMA READ not completed in {:?}", opts.read_timeout));
            }
        }
        Ok(())
    }

    fn completed(&mut self, i: usize, opts: &ScrapeOptions, out: &mut dyn Write) -> io::Result<()> {
        enum Next {
            Done,
            Again,
            Fail(String),
        }
        let t = &mut self.targets[i];
        let State::Ready { buf, want, in_flight, grant, owed, .. } = &mut t.state else { return Ok(()) };
        if let Some(at) = in_flight.take() {
            let ns = at.elapsed().as_nanos() as u64;
            t.summary.completed += 1;
            t.summary.read_ns_sum += ns;
            t.summary.read_ns_max = t.summary.read_ns_max.max(ns);
        }
        let got = (*want).min(grant.len as usize);
        let next = match view::read(&buf[..got], COUNTER_NAMES.len()) {
            Ok(s) if (s.slots.len() as u64) < s.slots_used && s.read_bytes() > got => {
                // More slots in use than this read covered: read them all, now.
                *want = s.read_bytes().min(grant.len as usize);
                Next::Again
            }
            Ok(s) => {
                *want = s.read_bytes().min(grant.len as usize);
                t.summary.snapshots += 1;
                if opts.json {
                    writeln!(out, "{}", json_line(&t.addr, &s))?;
                }
                t.last = Some(s);
                if std::mem::take(owed) { Next::Again } else { Next::Done }
            }
            Err(ViewError::Torn { .. }) => {
                t.summary.torn += 1;
                Next::Again
            }
            Err(e) => Next::Fail(format!("read {got} bytes that are not a view: {e}")),
        };
        match next {
            Next::Done => {}
            Next::Again => self.post_read(i, opts.forge),
            Next::Fail(why) => self.fail(i, why),
        }
        Ok(())
    }
}

fn release(t: &mut Target) {
    if let State::Ready { mr, .. } = &mut t.state
        && !mr.is_null()
    {
        // SAFETY: our MR, deregistered once; the buffer is still alive in the state.
        unsafe { ffi::ibv_dereg_mr(*mr) };
        *mr = null_mut();
    }
    if !t.id.is_null() {
        // SAFETY: our id (its events acked as read) and its QP, destroyed once.
        unsafe {
            if !(*t.id).qp.is_null() {
                ffi::rdma_destroy_qp(t.id);
            }
            ffi::rdma_destroy_id(t.id);
        }
        t.id = null_mut();
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        for t in &mut self.targets {
            if let State::Ready { .. } = t.state {
                // SAFETY: a connected id.
                unsafe { ffi::rdma_disconnect(t.id) };
            }
            release(t);
        }
        for d in &self.devices {
            d.destroy();
        }
        // SAFETY: every id on the channel is destroyed above.
        unsafe { ffi::rdma_destroy_event_channel(self.channel) };
    }
}

impl Device {
    /// Stops waiting on this device's channel, saying why once.
    fn fail(&mut self, why: &str) {
        if !self.dead {
            eprintln!(
                "ctl scrape: a device's completion channel failed ({why}; was it removed?): its reads are polled at ticks only"
            );
            self.dead = true;
        }
    }

    /// Destroys the CQ, its channel and the PD (every event taken was acked in `rearm`).
    fn destroy(&self) {
        // SAFETY: no QP uses them any more; the CQ goes before its channel.
        unsafe {
            ffi::ibv_destroy_cq(self.cq);
            ffi::ibv_destroy_comp_channel(self.channel);
            ffi::ibv_dealloc_pd(self.pd);
        }
    }
}

fn wc_status(s: u32) -> String {
    // SAFETY: ibv_wc_status_str returns a static string for any value.
    let p = unsafe { ffi::ibv_wc_status_str(s) };
    if p.is_null() {
        return format!("status {s}");
    }
    // SAFETY: a NUL-terminated static string.
    unsafe { std::ffi::CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

fn sockaddr(a: SocketAddr) -> libc::sockaddr_storage {
    // SAFETY: all-zero is a valid sockaddr_storage.
    let mut ss: libc::sockaddr_storage = unsafe { zeroed() };
    match a {
        SocketAddr::V4(v4) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: v4.port().to_be(),
                sin_addr: libc::in_addr { s_addr: u32::from(*v4.ip()).to_be() },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is large and aligned enough for sockaddr_in.
            unsafe { (&raw mut ss).cast::<libc::sockaddr_in>().write(sin) };
        }
        SocketAddr::V6(v6) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: v6.port().to_be(),
                sin6_flowinfo: 0,
                sin6_addr: libc::in6_addr { s6_addr: v6.ip().octets() },
                sin6_scope_id: v6.scope_id(),
            };
            // SAFETY: as above, for sockaddr_in6.
            unsafe { (&raw mut ss).cast::<libc::sockaddr_in6>().write(sin6) };
        }
    }
    ss
}

fn json_string(s: &str) -> String {
    let mut o = String::with_capacity(s.len() + 2);
    o.push('"');
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            c if (c as u32) < 0x20 => o.push_str(&format!("\\u{:04x}", c as u32)),
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

/// One snapshot as a JSON object on one line.
pub fn json_line(target: &SocketAddr, s: &Snapshot) -> String {
    let mut o = format!(
        "{{\"target\":{},\"host\":{},\"device\":{},\"tor\":{},\"version\":{},\"updated_unix_ns\":{},\"window_ns\":{}",
        json_string(&target.to_string()),
        json_string(&s.host),
        json_string(&s.device),
        json_string(&s.tor),
        s.version,
        s.updated_unix_ns,
        s.window_ns
    );
    for (n, v) in STATE_NAMES.iter().zip(&s.state) {
        o.push_str(&format!(",\"{n}\":{v}"));
    }
    o.push_str(",\"counters\":{");
    let c: Vec<String> = COUNTER_NAMES.iter().zip(&s.counters).map(|(n, v)| format!("\"{n}\":{v}")).collect();
    o.push_str(&c.join(","));
    o.push_str("},\"tors\":[");
    let window = |w: &view::Window| {
        let outcomes: Vec<String> = OUTCOMES.iter().zip(&w.outcomes).map(|(n, v)| format!("\"{n}\":{v}")).collect();
        let buckets: Vec<String> = w.rtt_buckets.iter().map(u64::to_string).collect();
        format!("{{{},\"rtt_buckets\":[{}],\"rtt_sum_ns\":{}}}", outcomes.join(","), buckets.join(","), w.rtt_sum_ns)
    };
    let tors: Vec<String> = s
        .slots
        .iter()
        .map(|t| {
            format!(
                "{{\"tor\":{},\"current\":{},\"last\":{}}}",
                json_string(&t.tor),
                window(&t.current),
                window(&t.last)
            )
        })
        .collect();
    o.push_str(&tors.join(","));
    o.push_str("]}");
    o
}

/// The last snapshots in the Prometheus text format (0.0.4, what node_exporter's textfile
/// collector reads; or for the live metrics work to reuse): counters, the last complete window
/// per target ToR, pinglist and health, labelled by host and device as the agent's own
/// `/metrics` are.
pub fn prometheus_text(targets: &[(SocketAddr, Option<&Snapshot>)]) -> String {
    let mut o = String::new();
    let family = |o: &mut String, name: &str, kind: &str, help: &str| {
        o.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n"));
    };
    family(&mut o, "rocemesh_view_up", "gauge", "Whether the last read of the target gave a consistent view.");
    for (a, s) in targets {
        o.push_str(&format!("rocemesh_view_up{{target=\"{a}\"}} {}\n", u8::from(s.is_some())));
    }
    let label = |s: &Snapshot| format!("host=\"{}\",device=\"{}\"", label_value(&s.host), label_value(&s.device));
    for (i, n) in COUNTER_NAMES.iter().enumerate() {
        let name = format!("rocemesh_view_{n}_total");
        family(&mut o, &name, "counter", &format!("The shard's {n} counter, as read from its view."));
        for s in targets.iter().filter_map(|t| t.1) {
            o.push_str(&format!("{name}{{{}}} {}\n", label(s), s.counters.get(i).copied().unwrap_or(0)));
        }
    }
    family(
        &mut o,
        "rocemesh_view_last_window_probes",
        "gauge",
        "Probes of the last complete window, by target ToR and outcome class.",
    );
    for s in targets.iter().filter_map(|t| t.1) {
        for t in &s.slots {
            for (c, v) in OUTCOMES.iter().zip(&t.last.outcomes) {
                o.push_str(&format!(
                    "rocemesh_view_last_window_probes{{{},target_tor=\"{}\",class=\"{c}\"}} {v}\n",
                    label(s),
                    label_value(&t.tor)
                ));
            }
        }
    }
    family(&mut o, "rocemesh_view_pinglist_generation", "gauge", "The pinglist generation the shard runs.");
    for s in targets.iter().filter_map(|t| t.1) {
        o.push_str(&format!(
            "rocemesh_view_pinglist_generation{{{}}} {}\n",
            label(s),
            s.state("pinglist_generation").unwrap_or(0)
        ));
    }
    family(&mut o, "rocemesh_view_device_up", "gauge", "Whether the shard's RNIC is up.");
    for s in targets.iter().filter_map(|t| t.1) {
        let up = u64::from(s.state("flags").unwrap_or(0) & view::FLAG_DEVICE_UP != 0);
        o.push_str(&format!("rocemesh_view_device_up{{{}}} {up}\n", label(s)));
    }
    o
}

/// A label value, escaped as the text format wants.
fn label_value(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

fn cpu_seconds() -> f64 {
    // SAFETY: getrusage fills the struct we own.
    let mut u: libc::rusage = unsafe { zeroed() };
    // SAFETY: as above.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &raw mut u) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(u.ru_utime) + tv(u.ru_stime)
}

/// Scrape until `opts.duration` passes (or SIGINT/SIGTERM set `stop`).
pub fn run(
    opts: &ScrapeOptions,
    stop: &std::sync::atomic::AtomicBool,
    out: &mut dyn Write,
) -> Result<Summary, ScrapeError> {
    use std::sync::atomic::Ordering;
    // SAFETY: plain constructor; checked.
    let channel = unsafe { ffi::rdma_create_event_channel() };
    if channel.is_null() {
        return Err(os_error(
            "rdma_create_event_channel (/dev/infiniband/rdma_cm; is an RDMA device and rdma_ucm loaded?)",
        ));
    }
    let mut c = Collector {
        channel,
        targets: opts
            .targets
            .iter()
            .map(|a| Target {
                addr: *a,
                id: null_mut(),
                state: State::Down { retry_at: Instant::now() },
                summary: TargetSummary { target: a.to_string(), ..TargetSummary::default() },
                last: None,
            })
            .collect(),
        devices: Vec::new(),
    };
    // SAFETY: the channel is live.
    let fd = unsafe { (*channel).fd };
    // SAFETY: fcntl on our descriptor. A blocking channel would stall the read loop in
    // rdma_get_cm_event, so a failure is an error.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    // SAFETY: as above.
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(os_error("fcntl(rdma_cm fd, O_NONBLOCK)"));
    }
    let started = Instant::now();
    let cpu0 = cpu_seconds();
    let tick = Duration::from_secs_f64(1.0 / opts.rate_hz.max(0.001));
    let mut next_tick = Instant::now();
    let mut pfds: Vec<libc::pollfd> = Vec::with_capacity(1 + c.targets.len());
    let mut ticks_missed = 0;
    let mut ticks = 0;
    let mut waited: Vec<usize> = Vec::new();
    loop {
        if stop.load(Ordering::Relaxed) || opts.duration.is_some_and(|d| started.elapsed() >= d) {
            break;
        }
        let now = Instant::now();
        for i in 0..c.targets.len() {
            if matches!(c.targets[i].state, State::Down { retry_at } if now >= retry_at) {
                c.connect(i);
            }
        }
        if now >= next_tick {
            ticks += 1;
            next_tick += tick;
            if next_tick < now {
                ticks_missed += ((now - next_tick).as_nanos() / tick.as_nanos().max(1)) as u64 + 1;
                next_tick = now + tick;
            }
            c.tick(opts.forge);
            if let Some(path) = &opts.prom {
                let snaps: Vec<(SocketAddr, Option<&Snapshot>)> = c
                    .targets
                    .iter()
                    .map(|t| (t.addr, t.last.as_ref().filter(|_| matches!(t.state, State::Ready { .. }))))
                    .collect();
                let tmp = path.with_extension("prom.tmp");
                std::fs::write(&tmp, prometheus_text(&snaps))
                    .and_then(|()| std::fs::rename(&tmp, path))
                    .map_err(|e| ScrapeError { what: format!("writing {}", path.display()), source: e })?;
            }
        }
        c.drain_cm();
        c.rearm();
        c.poll(opts, out).map_err(|e| ScrapeError { what: "writing the output".into(), source: e })?;
        // Sleep until a CM event, a completion, or the next deadline. Rounded up to whole ms:
        // a wait rounded down to 0 would spin until the deadline.
        let wait = c.sleep_for(next_tick, opts.read_timeout);
        pfds.clear();
        pfds.push(libc::pollfd { fd, events: libc::POLLIN, revents: 0 });
        waited.clear();
        waited.extend((0..c.devices.len()).filter(|&i| !c.devices[i].dead));
        pfds.extend(waited.iter().map(|&i| libc::pollfd { fd: c.devices[i].fd, events: libc::POLLIN, revents: 0 }));
        let ms = wait.as_micros().div_ceil(1_000).min(1_000) as i32;
        // SAFETY: `pfds` holds pfds.len() valid pollfds.
        unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, ms) };
        for (p, &i) in pfds[1..].iter().zip(&waited) {
            if p.revents & (libc::POLLERR | libc::POLLHUP | libc::POLLNVAL) != 0 {
                c.devices[i].fail(&format!("poll revents {:#x}", p.revents));
            }
        }
    }
    let summary = Summary {
        targets: c.targets.iter().map(|t| t.summary.clone()).collect(),
        seconds: started.elapsed().as_secs_f64(),
        cpu_s: cpu_seconds() - cpu0,
        ticks_missed,
        ticks,
    };
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rocemesh_formats::view::{Region, Update, Window};

    #[test]
    fn json_and_prometheus_text_of_a_snapshot() {
        let r = Region::new(2);
        let counters: Vec<u64> = (1..=COUNTER_NAMES.len() as u64).collect();
        let mut state = [0u64; STATE_NAMES.len()];
        state[1] = 7; // pinglist_generation
        state[4] = view::FLAG_DEVICE_UP;
        let u = Update {
            updated_unix_ns: 5,
            window_ns: 10,
            host: "h\"0",
            device: "rxe0",
            tor: "t0",
            state,
            counters: &counters,
            ..Update::default()
        };
        let w = Window { outcomes: [3, 1, 0, 0, 0, 0], ..Window::default() };
        r.update(&u, [("t1", &w, &w)].into_iter());
        let s = view::read(&r.copy_ascending(r.len_bytes(), |_| {}), COUNTER_NAMES.len()).unwrap();
        let a: SocketAddr = "10.0.0.1:18601".parse().unwrap();
        let j = json_line(&a, &s);
        assert!(j.starts_with("{\"target\":\"10.0.0.1:18601\",\"host\":\"h\\\"0\""), "{j}");
        assert!(j.contains("\"probes_sent\":1,") && j.contains("\"pinglist_generation\":7"), "{j}");
        assert!(j.contains("{\"tor\":\"t1\",\"current\":{\"ok\":3,\"lost\":1"), "{j}");
        let p = prometheus_text(&[(a, Some(&s)), ("10.0.0.2:18601".parse().unwrap(), None)]);
        assert!(p.contains("# TYPE rocemesh_view_probes_sent_total counter\n"), "{p}");
        assert!(p.contains("rocemesh_view_up{target=\"10.0.0.2:18601\"} 0\n"), "{p}");
        assert!(
            p.contains(r#"rocemesh_view_last_window_probes{host="h\"0",device="rxe0",target_tor="t1",class="lost"} 1"#),
            "{p}"
        );
        assert!(p.contains(r#"rocemesh_view_device_up{host="h\"0",device="rxe0"} 1"#), "{p}");
    }
}
