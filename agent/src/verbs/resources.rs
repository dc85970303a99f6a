//! Verbs and RDMA CM resources, each owned by a value whose drop frees it: the device context
//! with its protection domain, registered buffer, completion channel, CQs and UD QP
//! ([`Resources`]); the RDMA CM event channel and listener ([`Cm`]); one CM id per resolution in
//! flight ([`CmId`]). What dies with the device dies together when its owner is dropped.

use std::collections::HashMap;
use std::io;
use std::mem::zeroed;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::RawFd;
use std::ptr::null_mut;

use rdma_sys as ffi;

use super::clock::{self, Clock, ClockCaps};
use super::device::{DeviceInfo, VerbsConfig, VerbsError, open_device, timed};
use super::{CM_TIMEOUT_MS, MAX_AH, RDMA_UDP_QKEY, RECV_DEPTH, RECV_SLOT_BYTES, SEND_DEPTH};
use crate::protocol::PACKET_BYTES;
use crate::transport::DropReason;
use crate::udp::to_sockaddr;

/// Everything that dies with the device.
pub(super) struct Resources {
    pub(super) ctx: *mut ffi::ibv_context,
    pub(super) pd: *mut ffi::ibv_pd,
    pub(super) mr: *mut ffi::ibv_mr,
    /// Receive slots, then send slots; registered as `mr`. Never reallocated while registered.
    pub(super) buf: Box<[u8]>,
    pub(super) channel: *mut ffi::ibv_comp_channel,
    pub(super) send_cq: *mut ffi::ibv_cq,
    pub(super) recv_cq: *mut ffi::ibv_cq,
    pub(super) qp: *mut ffi::ibv_qp,
    pub(super) qpn: u32,
    pub(super) info: DeviceInfo,
    pub(super) ahs: HashMap<([u8; 16], u32), *mut ffi::ibv_ah>,
    pub(super) send_free: Vec<u16>,
    pub(super) send_want_tx: Box<[bool; SEND_DEPTH]>,
    /// Completion events read from the channel and not yet acknowledged, per CQ.
    pub(super) unacked_send: u32,
    pub(super) unacked_recv: u32,
    pub(super) armed: bool,
    /// The NIC clock the CQs were created with (extended CQs), or `None`: stamped at poll time.
    pub(super) clock: Option<Clock>,
}

/// RDMA CM state: the event channel, the listener peers resolve us through.
pub(super) struct Cm {
    pub(super) channel: *mut ffi::rdma_event_channel,
    pub(super) listener: *mut ffi::rdma_cm_id,
}

/// The RDMA CM id of one resolution in flight. Dropping it destroys the id: the holder acks
/// every event of the id as it reads it, and drops it before the channel (`Cm`) goes.
#[derive(Debug)]
pub(super) struct CmId(*mut ffi::rdma_cm_id);

impl CmId {
    /// Whether `id` (from a CM event) is this one.
    pub(super) fn is(&self, id: *mut ffi::rdma_cm_id) -> bool {
        self.0 == id
    }
}

impl Drop for CmId {
    fn drop(&mut self) {
        // SAFETY: the id is ours, destroyed once; its events were acked as they were read.
        timed("rdma_destroy_id", || unsafe { ffi::rdma_destroy_id(self.0) });
    }
}

/// Start resolving `dst`:`port` from `src`: address resolution now, then (on its events) route
/// resolution and the SIDR request.
pub(super) fn start_resolution(
    channel: *mut ffi::rdma_event_channel,
    src: IpAddr,
    dst: IpAddr,
    port: u16,
) -> io::Result<CmId> {
    let mut id: *mut ffi::rdma_cm_id = null_mut();
    // SAFETY: the channel is live; `id` receives a new id on success.
    if unsafe { ffi::rdma_create_id(channel, &raw mut id, null_mut(), ffi::rdma_port_space::RDMA_PS_UDP) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let id = CmId(id);
    let (mut s, _) = to_sockaddr(SocketAddr::new(src, 0));
    let (mut d, _) = to_sockaddr(SocketAddr::new(dst, port));
    // SAFETY: both sockaddrs are valid for their family; the id is live.
    if timed("rdma_resolve_addr", || unsafe {
        ffi::rdma_resolve_addr(id.0, (&raw mut s).cast(), (&raw mut d).cast(), CM_TIMEOUT_MS)
    }) != 0
    {
        // `id` (no events yet) is destroyed on return.
        return Err(io::Error::last_os_error());
    }
    Ok(id)
}

pub(super) fn set_nonblocking(fd: RawFd) -> io::Result<()> {
    // SAFETY: fcntl on a descriptor we own.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    // SAFETY: as above.
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

impl Cm {
    pub(super) fn listen(cfg: &VerbsConfig) -> Result<Self, VerbsError> {
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
    pub(super) fn open(cfg: &VerbsConfig, info: DeviceInfo) -> Result<Self, VerbsError> {
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
            clock: None,
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
            r.create_cqs(dev)?;
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

    /// The send and receive CQs: extended ones with NIC completion timestamps where the device
    /// has them (see `clock`), plain ones stamped at poll time otherwise. The choice is logged.
    fn create_cqs(&mut self, dev: &str) -> Result<(), VerbsError> {
        let why_not = match clock::candidates(self.clock_caps(dev)) {
            Err(why) => why.to_string(),
            Ok(clocks) => {
                let mut tried = Vec::new();
                for c in clocks {
                    // SAFETY: live context and channel; what is created is stored in `self`,
                    // whose drop destroys it, or destroyed here.
                    match unsafe { (self.create_cq_ex(SEND_DEPTH, c), self.create_cq_ex(RECV_DEPTH, c)) } {
                        (Ok(s), Ok(r)) => {
                            (self.send_cq, self.recv_cq, self.clock) = (s, r, Some(c));
                            tracing::info!(device = dev, clock = ?c, "completion timestamps from the NIC");
                            return Ok(());
                        }
                        (s, r) => {
                            for cq in [s.as_ref().ok(), r.as_ref().ok()].into_iter().flatten() {
                                // SAFETY: created just above, used by nothing yet.
                                unsafe { ffi::ibv_destroy_cq(*cq) };
                            }
                            let e = s.err().or(r.err()).map(|e| e.to_string()).unwrap_or_default();
                            tried.push(format!("{c:?}: {e}"));
                        }
                    }
                }
                format!("extended CQs with timestamps could not be created ({})", tried.join("; "))
            }
        };
        let os = |op: &str| VerbsError::os(dev, op, io::Error::last_os_error());
        // SAFETY: live context and channel; the CQs are stored in `self`, whose drop frees them.
        unsafe {
            self.send_cq = ffi::ibv_create_cq(self.ctx, SEND_DEPTH as i32, null_mut(), self.channel, 0);
            if self.send_cq.is_null() {
                return Err(os("ibv_create_cq(send)"));
            }
            self.recv_cq = ffi::ibv_create_cq(self.ctx, RECV_DEPTH as i32, null_mut(), self.channel, 0);
            if self.recv_cq.is_null() {
                return Err(os("ibv_create_cq(recv)"));
            }
        }
        tracing::info!(device = dev, "completion timestamps from the host clock at poll time: {why_not}");
        Ok(())
    }

    /// What the device says about its completion clock; a device that cannot be asked has none.
    fn clock_caps(&self, dev: &str) -> ClockCaps {
        // SAFETY: the context is live.
        unsafe { super::device::query_clock_caps(self.ctx) }.unwrap_or_else(|rc| {
            tracing::info!(
                device = dev,
                "ibv_query_device_ex failed ({}): no NIC timestamps",
                io::Error::from_raw_os_error(rc.abs())
            );
            ClockCaps::default()
        })
    }

    /// An extended CQ of `cqe` entries on our channel whose completions carry `clock`'s stamp,
    /// the byte count and the source QP (what a UD receive needs).
    ///
    /// # Safety
    /// The context and channel must be live.
    unsafe fn create_cq_ex(&self, cqe: usize, clock: Clock) -> io::Result<*mut ffi::ibv_cq> {
        use ffi::ibv_create_cq_wc_flags as F;
        let stamp = match clock {
            Clock::Wallclock => F::IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK,
            Clock::Ticks { .. } => F::IBV_WC_EX_WITH_COMPLETION_TIMESTAMP,
        };
        // SAFETY: all-zero is a valid attribute set; the caller keeps the objects live.
        unsafe {
            let mut a: ffi::ibv_cq_init_attr_ex = zeroed();
            a.cqe = cqe as u32;
            a.channel = self.channel;
            a.wc_flags = u64::from((F::IBV_WC_EX_WITH_BYTE_LEN | F::IBV_WC_EX_WITH_SRC_QP | stamp).0);
            match ffi::ibv_create_cq_ex(self.ctx, &raw mut a) {
                Some(cq) if !cq.is_null() => Ok(ffi::ibv_cq_ex_to_cq(cq)),
                Some(_) => Err(io::Error::last_os_error()),
                None => Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP)),
            }
        }
    }

    pub(super) fn recv_slot_addr(&self, slot: usize) -> *const u8 {
        // SAFETY: slot < RECV_DEPTH, inside `buf`.
        unsafe { self.buf.as_ptr().add(slot * RECV_SLOT_BYTES) }
    }

    pub(super) fn send_slot_offset(slot: usize) -> usize {
        RECV_DEPTH * RECV_SLOT_BYTES + slot * PACKET_BYTES
    }

    pub(super) fn post_recv_one(&mut self, slot: usize) -> io::Result<()> {
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

    pub(super) fn ah(&mut self, gid: [u8; 16], label: u32, traffic_class: u8) -> Result<*mut ffi::ibv_ah, DropReason> {
        if let Some(&ah) = self.ahs.get(&(gid, label)) {
            return Ok(ah);
        }
        if self.ahs.len() >= MAX_AH {
            return Err(DropReason::TableFull);
        }
        // SAFETY: all-zero is a valid ibv_ah_attr.
        let mut attr: ffi::ibv_ah_attr = unsafe { zeroed() };
        attr.is_global = 1;
        attr.port_num = self.info.port;
        attr.grh.dgid = ffi::ibv_gid { raw: gid };
        // Nonzero: with 0, some NICs pick one random UDP source port per AH, and the pair is
        // stuck on one ECMP path (R-Pingmesh observed this; docs/design/verbs.md#rxe-pitfalls-avoided).
        attr.grh.flow_label = (label & 0xF_FFFF).max(1);
        attr.grh.sgid_index = self.info.gid_index;
        attr.grh.hop_limit = 64;
        attr.grh.traffic_class = traffic_class;
        // SAFETY: the PD is live; attr is valid.
        let ah = timed("ibv_create_ah", || unsafe { ffi::ibv_create_ah(self.pd, &raw mut attr) });
        if ah.is_null() {
            return Err(DropReason::AddressHandle);
        }
        self.ahs.insert((gid, label), ah);
        Ok(ah)
    }
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
