//! The device as the host shows it: what the configuration names (device, port, address),
//! where sysfs says its RoCE v2 GID is, how libibverbs opens it, and the errors that say what is
//! missing and what to do (a device absent, a port down, a GID not configured, a memlock limit).

use std::ffi::CStr;
use std::io;
use std::net::{Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::ptr::null_mut;

use rdma_sys as ffi;

use super::clock::ClockCaps;
use rocemesh_formats::gid::gid_of;

/// UD receives start with 40 bytes of GRH (for RoCEv2 over IPv4: 20 undefined bytes, then the
/// IPv4 header).
pub const GRH_BYTES: usize = 40;

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
    pub(super) fn new(device: &str, what: impl Into<String>, hint: impl Into<String>) -> Self {
        let hint = hint.into();
        let hint = if hint.is_empty() { hint } else { format!(": {hint}") };
        Self { device: device.to_string(), what: what.into(), hint }
    }

    pub(super) fn os(device: &str, op: &str, e: io::Error) -> Self {
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

pub(super) fn memlock_hint() -> String {
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
            format!("no RoCE v2 GID {want} on port {}", cfg.port),
            "the address in `bind` must be configured on the device's netdev (see `show_gids`), or set `gid_index`",
        )),
    }
}

/// What `device` says about its completion clock, asked on a context of its own and closed
/// again: what `agent doctor` reports as the clock a shard on it would choose.
pub fn clock_caps(device: &str) -> Result<ClockCaps, VerbsError> {
    let ctx = open_device(device)?;
    // SAFETY: a live context, closed right after.
    let caps = unsafe { query_clock_caps(ctx) };
    // SAFETY: nothing else holds the context.
    unsafe { ffi::ibv_close_device(ctx) };
    caps.map_err(|rc| VerbsError::os(device, "ibv_query_device_ex", io::Error::from_raw_os_error(rc.abs())))
}

/// `ibv_query_device_ex`'s completion clock fields, or its return code.
///
/// # Safety
/// `ctx` must be a live device context.
pub(super) unsafe fn query_clock_caps(ctx: *mut ffi::ibv_context) -> Result<ClockCaps, i32> {
    // SAFETY: all-zero is valid for both structs; the caller keeps the context live.
    let (rc, attr) = unsafe {
        let input: ffi::ibv_query_device_ex_input = std::mem::zeroed();
        let mut attr: ffi::ibv_device_attr_ex = std::mem::zeroed();
        (ffi::ibv_query_device_ex(ctx, &raw const input, &raw mut attr), attr)
    };
    if rc != 0 {
        return Err(rc);
    }
    Ok(ClockCaps { completion_timestamp_mask: attr.completion_timestamp_mask, hca_core_clock_khz: attr.hca_core_clock })
}

/// Run a verbs or RDMA CM call and say so when it blocked the shard: these calls are meant to
/// return at once, and a slow one shows up in the data as a frozen host.
pub(super) fn timed<R>(what: &str, f: impl FnOnce() -> R) -> R {
    let t = std::time::Instant::now();
    let r = f();
    let took = t.elapsed();
    if took > std::time::Duration::from_millis(50) {
        tracing::warn!(call = what, ms = took.as_millis() as u64, "a verbs call blocked the shard");
    }
    r
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
        return Some(rocemesh_formats::gid::gid_bytes(ip.into()));
    }
    None
}

pub(super) fn open_device(name: &str) -> Result<*mut ffi::ibv_context, VerbsError> {
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
