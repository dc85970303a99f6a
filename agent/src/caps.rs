//! Least privilege: the agent uses its capabilities only while it sets up, then drops them.
//!
//! What needs one, and when:
//! - `CAP_NET_RAW`: path tracing's raw sockets, opened by the main thread before any shard
//!   starts (`runtime`), then kept open without the capability.
//! - `CAP_BPF` and `CAP_PERFMON`: loading the service tracer's eBPF programs, in the tracer's
//!   own thread, which drops everything once they are loaded (reading their ring buffer and
//!   maps needs only the descriptors).
//! - `CAP_IPC_LOCK`: memory the verbs transport registers beyond RLIMIT_MEMLOCK. Kept while
//!   verbs shards run: a device that goes away and returns is registered again.
//!
//! Capabilities are per thread in Linux. The main thread drops its own after the privileged
//! setup and before it starts the shards, sealer, watcher and metrics threads, so that every
//! thread it starts (glommio's helper threads too) inherits only what is kept.

use std::io;

/// Path tracing's raw sockets.
pub const CAP_NET_RAW: u32 = 13;
/// Locked memory beyond RLIMIT_MEMLOCK.
pub const CAP_IPC_LOCK: u32 = 14;
/// perf events and kprobes (the service tracer's attachments).
pub const CAP_PERFMON: u32 = 38;
/// Loading eBPF programs and maps.
pub const CAP_BPF: u32 = 39;

const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;
const PR_CAP_AMBIENT: libc::c_int = 47;
const PR_CAP_AMBIENT_CLEAR_ALL: libc::c_ulong = 4;

#[repr(C)]
struct Header {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct Data {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// The calling thread's (effective, permitted) sets as bit masks.
pub fn current() -> io::Result<(u64, u64)> {
    let mut h = Header { version: LINUX_CAPABILITY_VERSION_3, pid: 0 };
    let mut d = [Data::default(); 2];
    // SAFETY: capget writes two `Data` (version 3) into `d`, which we own.
    if unsafe { libc::syscall(libc::SYS_capget, &raw mut h, d.as_mut_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let join = |lo: u32, hi: u32| u64::from(lo) | (u64::from(hi) << 32);
    Ok((join(d[0].effective, d[1].effective), join(d[0].permitted, d[1].permitted)))
}

/// Reduce the calling thread to the capabilities in `keep` (a bit mask; those it does not have
/// stay absent), with no inheritable or ambient ones left.
pub fn drop_thread(keep: u64) -> io::Result<()> {
    let (eff, perm) = current()?;
    let (eff, perm) = (eff & keep, perm & keep);
    let h = Header { version: LINUX_CAPABILITY_VERSION_3, pid: 0 };
    let d = [
        Data { effective: eff as u32, permitted: perm as u32, inheritable: 0 },
        Data { effective: (eff >> 32) as u32, permitted: (perm >> 32) as u32, inheritable: 0 },
    ];
    // SAFETY: capset reads the header and two `Data` we own.
    if unsafe { libc::syscall(libc::SYS_capset, &raw const h, d.as_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // Ambient capabilities (systemd's AmbientCapabilities) must be in the inheritable set, so
    // they are gone already; clear them explicitly in case a kernel keeps them listed.
    // SAFETY: prctl with integer arguments.
    unsafe { libc::prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) };
    Ok(())
}

/// The names of the capabilities in `mask` that this module knows, for logs.
pub fn names(mask: u64) -> Vec<&'static str> {
    [(CAP_NET_RAW, "CAP_NET_RAW"), (CAP_IPC_LOCK, "CAP_IPC_LOCK"), (CAP_PERFMON, "CAP_PERFMON"), (CAP_BPF, "CAP_BPF")]
        .into_iter()
        .filter(|(c, _)| mask & (1 << c) != 0)
        .map(|(_, n)| n)
        .collect()
}

/// Drop the calling thread's capabilities but `keep`, saying what was kept; a failure is logged
/// (the agent goes on: it is no worse off than before).
pub fn drop_or_say(who: &str, keep: u64) {
    match drop_thread(keep) {
        Ok(()) => {
            let kept = current().map(|(e, _)| e).unwrap_or(0);
            tracing::debug!(thread = who, kept = ?names(kept), "capabilities dropped");
        }
        Err(e) => {
            tracing::warn!(thread = who, "dropping capabilities failed: {e}; this thread keeps what it was given")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_drops_to_what_it_keeps_and_other_threads_are_untouched() {
        let before = current().expect("capget");
        let keep = 1u64 << CAP_IPC_LOCK;
        let after = std::thread::spawn(move || {
            drop_thread(keep).expect("capset");
            current().expect("capget")
        })
        .join()
        .expect("thread");
        assert_eq!(after.0 & !keep, 0, "only CAP_IPC_LOCK may stay: {:x}", after.0);
        assert_eq!(after.1 & !keep, 0, "permitted too: {:x}", after.1);
        assert_eq!(after.0 & keep, before.0 & keep, "kept if it was there");
        assert_eq!(current().expect("capget"), before, "capabilities are per thread");
        assert_eq!(names(keep | (1 << CAP_BPF)), ["CAP_IPC_LOCK", "CAP_BPF"]);
    }
}
