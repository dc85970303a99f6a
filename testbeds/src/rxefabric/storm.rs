//! A connection storm for the service tracer: RC QPs created, brought to RTR towards a real
//! peer GID, and destroyed, in a tight loop, as a job that sets up and tears down connections
//! would. No traffic is sent; what matters is the stream of RTR and destroy events the agents'
//! tracers see. Runs inside the rxe VM, in the host's network namespace.

use std::mem::zeroed;
use std::ptr::null_mut;
use std::time::Instant;

use anyhow::{anyhow, bail};
use rdma_sys as ffi;

/// What a storm did.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Storm {
    /// QPs that reached RTR and were destroyed.
    pub qps: u32,
    pub seconds: f64,
}

fn os(what: &str) -> anyhow::Error {
    anyhow!("{what}: {}", std::io::Error::last_os_error())
}

/// `count` RC QPs on `device` (port 1, GID `gid_index`) through RESET -> INIT -> RTR towards
/// `remote_gid`, each destroyed right after.
pub fn run(device: &str, gid_index: u8, remote_gid: [u8; 16], count: u32) -> anyhow::Result<Storm> {
    let started = Instant::now();
    // SAFETY: plain verbs calls on objects created here and destroyed before returning; every
    // pointer is checked before use.
    unsafe {
        let mut n = 0;
        let list = ffi::ibv_get_device_list(&raw mut n);
        if list.is_null() {
            return Err(os("ibv_get_device_list"));
        }
        let mut ctx = null_mut();
        for i in 0..n.max(0) as usize {
            let d = *list.add(i);
            let name = std::ffi::CStr::from_ptr(ffi::ibv_get_device_name(d)).to_string_lossy();
            if name == device {
                ctx = ffi::ibv_open_device(d);
            }
        }
        ffi::ibv_free_device_list(list);
        if ctx.is_null() {
            bail!("no RDMA device {device} (or it could not be opened)");
        }
        let pd = ffi::ibv_alloc_pd(ctx);
        let cq = ffi::ibv_create_cq(ctx, 16, null_mut(), null_mut(), 0);
        if pd.is_null() || cq.is_null() {
            bail!("{device}: allocating a PD and a CQ failed: {}", std::io::Error::last_os_error());
        }
        let result = storm(pd, cq, gid_index, remote_gid, count);
        ffi::ibv_destroy_cq(cq);
        ffi::ibv_dealloc_pd(pd);
        ffi::ibv_close_device(ctx);
        result?;
    }
    Ok(Storm { qps: count, seconds: started.elapsed().as_secs_f64() })
}

/// # Safety
/// `pd` and `cq` are live objects of one context.
unsafe fn storm(
    pd: *mut ffi::ibv_pd,
    cq: *mut ffi::ibv_cq,
    gid_index: u8,
    remote_gid: [u8; 16],
    count: u32,
) -> anyhow::Result<()> {
    use ffi::ibv_qp_attr_mask as M;
    for i in 0..count {
        // SAFETY: the caller's objects; the QP is destroyed on every path below.
        unsafe {
            let mut init: ffi::ibv_qp_init_attr = zeroed();
            init.send_cq = cq;
            init.recv_cq = cq;
            init.qp_type = ffi::ibv_qp_type::IBV_QPT_RC;
            init.cap.max_send_wr = 1;
            init.cap.max_recv_wr = 1;
            init.cap.max_send_sge = 1;
            init.cap.max_recv_sge = 1;
            let qp = ffi::ibv_create_qp(pd, &raw mut init);
            if qp.is_null() {
                return Err(os(&format!("ibv_create_qp (QP {i} of the storm)")));
            }
            let mut a: ffi::ibv_qp_attr = zeroed();
            a.qp_state = ffi::ibv_qp_state::IBV_QPS_INIT;
            a.port_num = 1;
            a.qp_access_flags = ffi::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0;
            let mask = M::IBV_QP_STATE | M::IBV_QP_PKEY_INDEX | M::IBV_QP_PORT | M::IBV_QP_ACCESS_FLAGS;
            let mut rc = ffi::ibv_modify_qp(qp, &raw mut a, mask.0 as i32);
            if rc == 0 {
                let mut a: ffi::ibv_qp_attr = zeroed();
                a.qp_state = ffi::ibv_qp_state::IBV_QPS_RTR;
                a.path_mtu = ffi::ibv_mtu::IBV_MTU_1024;
                a.dest_qp_num = 0x100 + i;
                a.rq_psn = 0;
                a.max_dest_rd_atomic = 1;
                a.min_rnr_timer = 12;
                a.ah_attr.is_global = 1;
                a.ah_attr.port_num = 1;
                a.ah_attr.grh.dgid.raw = remote_gid;
                a.ah_attr.grh.sgid_index = gid_index;
                a.ah_attr.grh.hop_limit = 64;
                let mask = M::IBV_QP_STATE
                    | M::IBV_QP_AV
                    | M::IBV_QP_PATH_MTU
                    | M::IBV_QP_DEST_QPN
                    | M::IBV_QP_RQ_PSN
                    | M::IBV_QP_MAX_DEST_RD_ATOMIC
                    | M::IBV_QP_MIN_RNR_TIMER;
                rc = ffi::ibv_modify_qp(qp, &raw mut a, mask.0 as i32);
            }
            let e = std::io::Error::from_raw_os_error(rc.abs());
            ffi::ibv_destroy_qp(qp);
            if rc != 0 {
                bail!("ibv_modify_qp (QP {i} of the storm): {e}");
            }
        }
    }
    Ok(())
}
