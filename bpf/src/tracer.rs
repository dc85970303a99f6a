//! Loading the BPF object, attaching its two programs, and draining the ring buffer.
//!
//! Owns everything that touches the kernel: the preflight checks that turn the common
//! "cannot trace here" cases into errors naming the fix, the libbpf skeleton's life, the ring
//! buffer and the per-CPU counters. Decoding is [`crate::event`]'s.

use std::collections::VecDeque;
use std::fmt;
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd as _, AsRawFd as _, BorrowedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use libbpf_rs::skel::{OpenSkel as _, SkelBuilder as _};
use libbpf_rs::{ErrorKind, Link, MapCore as _, MapFlags, OpenObject, PrintLevel, RingBuffer, RingBufferBuilder};
use thiserror::Error;

use crate::event::{DecodeError, QpEvent, QpEventKind, decode, layout as l};
use crate::skel::{RdmaQpSkel, RdmaQpSkelBuilder};

/// The kernel functions [`Tracer`] hooks, as `fexit/<function>` and `fentry/<function>`, for logs.
pub const HOOKS: [&str; 2] = ["fexit/ib_modify_qp_with_udata", "fentry/ib_destroy_qp_user"];

/// Capability numbers (include/uapi/linux/capability.h).
const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

/// Lines of libbpf's log kept for an error: the reason is at the end (a verifier log can run
/// to thousands of lines).
const LOG_LINES: usize = 24;

/// Why the tracer could not be loaded or read.
#[derive(Debug, Error)]
pub enum TraceError {
    #[error(
        "{} is missing: this kernel was built without BTF (CONFIG_DEBUG_INFO_BTF), which the \
         CO-RE BPF program needs; service tracing needs a kernel with BTF; the agent goes on \
         probing the cluster mesh",
        path.display()
    )]
    NoKernelBtf { path: PathBuf },
    #[error(
        "{} is missing: ib_core is not loaded (`modprobe ib_uverbs`) or the kernel was built \
         without CONFIG_DEBUG_INFO_BTF_MODULES, so the RDMA verbs functions cannot be hooked; \
         service tracing is off on this kernel (no fallback is implemented); the agent goes on \
         probing the cluster mesh",
        path.display()
    )]
    NoRdmaModuleBtf { path: PathBuf },
    #[error(
        "missing {missing}: the QP tracer needs CAP_SYS_ADMIN, or CAP_BPF and CAP_PERFMON; run \
         as root, `setcap cap_bpf,cap_perfmon+ep` the binary, or give the systemd unit \
         AmbientCapabilities=CAP_BPF CAP_PERFMON"
    )]
    Capability { missing: &'static str },
    #[error("opening the BPF object failed: {source}{log}")]
    Open { source: libbpf_rs::Error, log: LibbpfLog },
    #[error(
        "loading the BPF programs failed (CO-RE relocation against the kernel's BTF, or the \
         verifier): {source}{}{log}",
        memlock_hint(source)
    )]
    Load { source: libbpf_rs::Error, log: LibbpfLog },
    #[error("attaching BPF program {program} to kernel function {function} failed: {source}{log}")]
    Attach { program: &'static str, function: &'static str, source: libbpf_rs::Error, log: LibbpfLog },
    #[error("setting up the ring buffer failed: {0}")]
    RingBuffer(#[source] libbpf_rs::Error),
    #[error("polling the ring buffer failed: {0}")]
    Poll(#[source] io::Error),
    #[error("reading the kernel counters failed: {0}")]
    Counters(#[source] libbpf_rs::Error),
    #[error("reading a program's run counts (bpf_prog_get_info_by_fd) failed: {0}")]
    ProgInfo(#[source] io::Error),
}

fn memlock_hint(e: &libbpf_rs::Error) -> &'static str {
    if e.kind() == ErrorKind::PermissionDenied {
        "; EPERM: kernels before 5.11 charge BPF maps to RLIMIT_MEMLOCK, raise it (`ulimit -l \
         unlimited`, systemd LimitMEMLOCK=infinity, or grant CAP_SYS_RESOURCE so libbpf raises \
         it); otherwise a security policy (lockdown, an LSM, a sandbox) forbids tracing programs"
    } else {
        ""
    }
}

/// The tail of what libbpf printed while the failing step ran; it names the relocation,
/// function or verifier check that failed, which the errno alone does not.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct LibbpfLog(Vec<String>);

impl LibbpfLog {
    /// The captured lines, oldest first, without their `libbpf: ` prefix.
    pub fn lines(&self) -> &[String] {
        &self.0
    }
}

impl fmt::Display for LibbpfLog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return Ok(());
        }
        f.write_str("; libbpf said: ")?;
        f.write_str(&self.0.join(" | "))
    }
}

/// Sums of the BPF program's per-CPU counters since load.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KernelCounters {
    /// Records submitted to the ring buffer: two per hook call reported, one per program copy.
    pub emitted: u64,
    /// Records lost because the ring buffer was full: poll more often.
    pub ringbuf_full: u64,
    /// RTR transitions without an address vector (their records have `has_av == false`).
    pub rtr_without_av: u64,
    /// Runs of a program the kernel skipped (`recursion_misses`, summed over the four): a run
    /// of that program was in progress on the CPU, preempted (fentry/fexit programs run with
    /// migration, not preemption, disabled), when a second process reached the hook. The other
    /// copy of the hook's program reports that call; a call is lost only when both copies were
    /// skipped for it, which needs two processes preempted inside the two. Before the copies,
    /// the rxe VM lost 1 of 1,800 RTRs to one skipped run with two SCHED_IDLE QP storms and CPU
    /// load.
    pub skipped_runs: u64,
}

/// Decoded records between the ring buffer callback and [`Tracer::poll`]'s caller.
type Inbox = Arc<Mutex<VecDeque<Result<QpEvent, DecodeError>>>>;

/// The attached QP tracer. Dropping it detaches the programs and frees the maps.
pub struct Tracer {
    // Fields drop in order: the ring buffer and links go before the object they refer to.
    ring: RingBuffer<'static>,
    inbox: Inbox,
    dedup: Dedup,
    _links: [Link; 4],
    skel: RdmaQpSkel<'static>,
}

/// How many recent events [`Dedup`] remembers. The two copies of one call are normally
/// adjacent in the ring; a process preempted between its two programs lets other processes'
/// events in between, and a copy arriving later than this is one more event to the consumer
/// (the agent's router also ignores a repeated RTR of a connection it holds).
const DEDUP_RECENT: usize = 64;

/// Keeps the first of the two records every hook call produces (one per program copy; the
/// reason is in rdma_qp.bpf.c). Two records are copies when kind, device, QP, process and
/// peer agree; their times differ. Once a QP's destroy is taken its RTR records are forgotten,
/// and once an RTR is taken its destroys are, so a QP number reused for the same peer is news.
#[derive(Debug)]
pub(crate) struct Dedup {
    recent: VecDeque<Fingerprint>,
    duplicates: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Fingerprint {
    kind: QpEventKind,
    device_hash: u64,
    local_qpn: u32,
    pid: u32,
    remote_qpn: u32,
    remote_gid: [u8; 16],
    flow_label: u32,
}

impl Fingerprint {
    fn of(e: &QpEvent) -> Self {
        // FNV-1a: device names are short, and a collision only merges two devices' copies.
        let device_hash =
            e.device.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
        Self {
            kind: e.kind,
            device_hash,
            local_qpn: e.local_qpn,
            pid: e.pid,
            remote_qpn: e.remote_qpn,
            remote_gid: e.remote_gid,
            flow_label: e.flow_label,
        }
    }
}

impl Dedup {
    pub(crate) fn new() -> Self {
        Self { recent: VecDeque::with_capacity(DEDUP_RECENT), duplicates: 0 }
    }

    /// Whether `e` is news (true) or a copy of a recent event (false, counted).
    pub(crate) fn admit(&mut self, e: &QpEvent) -> bool {
        let f = Fingerprint::of(e);
        if self.recent.contains(&f) {
            self.duplicates += 1;
            return false;
        }
        self.recent.retain(|r| !(r.kind != f.kind && r.device_hash == f.device_hash && r.local_qpn == f.local_qpn));
        if self.recent.len() == DEDUP_RECENT {
            self.recent.pop_front();
        }
        self.recent.push_back(f);
        true
    }
}

impl fmt::Debug for Tracer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tracer").field("hooks", &HOOKS).finish_non_exhaustive()
    }
}

impl Tracer {
    /// Checks that this kernel and process can trace, then opens the BPF object, loads it
    /// (CO-RE relocation, verification) and attaches both programs.
    pub fn load() -> Result<Tracer, TraceError> {
        // This thread's own capabilities: they are per thread, and the agent's main thread
        // drops its own while this one may still be loading (/proc/self is the main thread's).
        let status = std::fs::read_to_string("/proc/thread-self/status").unwrap_or_default();
        preflight(Path::new("/sys"), cap_eff(&status))?;
        load_unchecked()
    }

    /// Waits up to `timeout` for records and hands each, decoded, to `on_event`.
    ///
    /// A record that does not decode is handed over as its error rather than failing the
    /// poll: the others are still good. An interrupted wait (EINTR) returns `Ok` early.
    /// Timeouts beyond `i32::MAX` ms wait forever.
    pub fn poll(
        &mut self,
        timeout: Duration,
        on_event: &mut dyn FnMut(Result<QpEvent, DecodeError>),
    ) -> Result<(), TraceError> {
        // libbpf-rs converts with `as i32`: keep long timeouts from wrapping to negative.
        let timeout = if timeout.as_millis() > i32::MAX as u128 { Duration::MAX } else { timeout };
        let ret = self.ring.poll_raw(timeout);
        // Hand over what was consumed even if the poll then failed.
        loop {
            let next = self.inbox.lock().unwrap_or_else(PoisonError::into_inner).pop_front();
            match next {
                Some(Ok(ev)) if !self.dedup.admit(&ev) => {}
                Some(ev) => on_event(ev),
                None => break,
            }
        }
        if ret < 0 && ret != -libc::EINTR {
            return Err(TraceError::Poll(io::Error::from_raw_os_error(-ret)));
        }
        Ok(())
    }

    /// Records dropped as the second copy of a hook call (about one per event handed over).
    pub fn duplicates(&self) -> u64 {
        self.dedup.duplicates
    }

    /// Sums the per-CPU counters.
    pub fn kernel_counters(&self) -> Result<KernelCounters, TraceError> {
        let read = |idx: usize| -> Result<u64, TraceError> {
            let key = (idx as u32).to_ne_bytes();
            let per_cpu = self
                .skel
                .maps
                .counters
                .lookup_percpu(&key, MapFlags::ANY)
                .map_err(TraceError::Counters)?
                .unwrap_or_default();
            Ok(per_cpu
                .iter()
                .filter_map(|v| v.get(..8)?.try_into().ok())
                .map(u64::from_ne_bytes)
                .fold(0u64, u64::wrapping_add))
        };
        Ok(KernelCounters {
            emitted: read(l::CNT_EMITTED)?,
            ringbuf_full: read(l::CNT_DROPPED)?,
            rtr_without_av: read(l::CNT_RTR_NO_AV)?,
            skipped_runs: missed_runs(self.skel.progs.on_modify.as_fd())?
                + missed_runs(self.skel.progs.on_modify_copy.as_fd())?
                + missed_runs(self.skel.progs.on_destroy.as_fd())?
                + missed_runs(self.skel.progs.on_destroy_copy.as_fd())?,
        })
    }
}

/// Runs of a program the kernel skipped: `recursion_misses` of its `bpf_prog_info`.
fn missed_runs(prog: BorrowedFd<'_>) -> Result<u64, TraceError> {
    let mut info = libbpf_sys::bpf_prog_info::default();
    let mut len = std::mem::size_of_val(&info) as u32;
    // SAFETY: `info` is a bpf_prog_info of `len` bytes that outlives the call; the kernel
    // fills at most `len` bytes and sets none of the pointer fields (all zero: not asked for).
    let ret = unsafe { libbpf_sys::bpf_prog_get_info_by_fd(prog.as_raw_fd(), &raw mut info, &raw mut len) };
    if ret < 0 {
        return Err(TraceError::ProgInfo(io::Error::from_raw_os_error(-ret)));
    }
    Ok(info.recursion_misses)
}

/// The checks libbpf would otherwise fail on with a bare errno, against a sysfs mounted at
/// `sysfs` and the effective capability set `cap_eff` (`None`: unknown, let the kernel judge).
pub(crate) fn preflight(sysfs: &Path, cap_eff: Option<u64>) -> Result<(), TraceError> {
    let btf = sysfs.join("kernel/btf");
    let vmlinux = btf.join("vmlinux");
    if !vmlinux.exists() {
        return Err(TraceError::NoKernelBtf { path: vmlinux });
    }
    let ib_core = btf.join("ib_core");
    if !ib_core.exists() {
        return Err(TraceError::NoRdmaModuleBtf { path: ib_core });
    }
    if let Some(missing) = cap_eff.and_then(missing_caps) {
        return Err(TraceError::Capability { missing });
    }
    Ok(())
}

/// The `CapEff` mask of a `/proc/<pid>/status` text.
pub(crate) fn cap_eff(status: &str) -> Option<u64> {
    let hex = status.lines().find_map(|l| l.strip_prefix("CapEff:"))?;
    u64::from_str_radix(hex.trim(), 16).ok()
}

/// What `cap_eff` lacks for loading and attaching tracing programs, if anything.
fn missing_caps(cap_eff: u64) -> Option<&'static str> {
    let has = |cap: u32| cap_eff & (1u64 << cap) != 0;
    if has(CAP_SYS_ADMIN) {
        return None;
    }
    match (has(CAP_BPF), has(CAP_PERFMON)) {
        (true, true) => None,
        (false, false) => Some("CAP_BPF, CAP_PERFMON"),
        (false, true) => Some("CAP_BPF"),
        (true, false) => Some("CAP_PERFMON"),
    }
}

/// libbpf's log during a load, and the lock that keeps two loads from mixing their lines
/// (libbpf's print callback is process-wide).
static LOAD_LOCK: Mutex<()> = Mutex::new(());
static CAPTURED: Mutex<VecDeque<String>> = Mutex::new(VecDeque::new());

fn capture(_level: PrintLevel, msg: String) {
    let mut log = CAPTURED.lock().unwrap_or_else(PoisonError::into_inner);
    for line in msg.lines() {
        let line = line.trim_end();
        if line.is_empty() {
            continue;
        }
        if log.len() == LOG_LINES {
            log.pop_front();
        }
        log.push_back(line.strip_prefix("libbpf: ").unwrap_or(line).to_owned());
    }
}

fn take_log() -> LibbpfLog {
    let mut log = CAPTURED.lock().unwrap_or_else(PoisonError::into_inner);
    LibbpfLog(log.drain(..).collect())
}

/// Routes libbpf's warnings into [`CAPTURED`] while alive, then restores the previous printer.
/// Warnings of a load that succeeds are dropped: there is nothing to act on.
struct Capture(Option<(PrintLevel, libbpf_rs::PrintCallback)>);

impl Capture {
    fn start() -> Capture {
        take_log();
        Capture(libbpf_rs::set_print(Some((PrintLevel::Warn, capture))))
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        libbpf_rs::set_print(self.0.take());
        take_log();
    }
}

fn attach_error(program: &'static str, function: &'static str, source: libbpf_rs::Error) -> TraceError {
    TraceError::Attach { program, function, source, log: take_log() }
}

/// Open, load and attach without the preflight checks: the root-only test uses it to reach
/// libbpf on a kernel the preflight would refuse.
pub(crate) fn load_unchecked() -> Result<Tracer, TraceError> {
    let _serial = LOAD_LOCK.lock().unwrap_or_else(PoisonError::into_inner);
    let _capture = Capture::start();

    // The skeleton borrows the slot holding its object handle for as long as it lives, and the
    // Tracer owns the skeleton: the slot (one pointer) is leaked per load, which runs once per
    // agent (or once per retry), rather than making Tracer self-referential with unsafe code.
    let slot: &'static mut MaybeUninit<OpenObject> = Box::leak(Box::new(MaybeUninit::uninit()));
    let open =
        RdmaQpSkelBuilder::default().open(slot).map_err(|source| TraceError::Open { source, log: take_log() })?;
    let skel = open.load().map_err(|source| TraceError::Load { source, log: take_log() })?;
    attach(skel)
}

/// Attaches both programs of a loaded skeleton and sets up the ring buffer.
fn attach(skel: RdmaQpSkel<'static>) -> Result<Tracer, TraceError> {
    let on_modify =
        skel.progs.on_modify.attach().map_err(|source| attach_error("on_modify", "ib_modify_qp_with_udata", source))?;
    let on_modify_copy = skel
        .progs
        .on_modify_copy
        .attach()
        .map_err(|source| attach_error("on_modify_copy", "ib_modify_qp_with_udata", source))?;
    let on_destroy =
        skel.progs.on_destroy.attach().map_err(|source| attach_error("on_destroy", "ib_destroy_qp_user", source))?;
    let on_destroy_copy = skel
        .progs
        .on_destroy_copy
        .attach()
        .map_err(|source| attach_error("on_destroy_copy", "ib_destroy_qp_user", source))?;

    let inbox: Inbox = Arc::default();
    let sink = Arc::clone(&inbox);
    let mut builder = RingBufferBuilder::new();
    builder
        .add(&skel.maps.events, move |bytes: &[u8]| {
            sink.lock().unwrap_or_else(PoisonError::into_inner).push_back(decode(bytes));
            0
        })
        .map_err(TraceError::RingBuffer)?;
    let ring = builder.build().map_err(TraceError::RingBuffer)?;

    Ok(Tracer {
        ring,
        inbox,
        dedup: Dedup::new(),
        _links: [on_modify, on_modify_copy, on_destroy, on_destroy_copy],
        skel,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(kind: QpEventKind, qpn: u32, remote_qpn: u32, time_mono_ns: u64) -> QpEvent {
        QpEvent {
            kind,
            time_mono_ns,
            pid: 7,
            comm: "ib_write_bw".into(),
            device: "rxe0".into(),
            port: 1,
            local_qpn: qpn,
            remote_qpn,
            local_gid: [1; 16],
            remote_gid: [2; 16],
            flow_label: 0,
            traffic_class: 0,
            hop_limit: 64,
            qp_type: 2,
            has_av: kind == QpEventKind::Rtr,
        }
    }

    #[test]
    fn dedup_keeps_the_first_copy_of_each_call_and_a_reused_qpn() {
        use QpEventKind::{Destroyed, Rtr};
        let mut d = Dedup::new();
        let admitted: Vec<bool> = [
            event(Rtr, 18, 20, 1),
            event(Rtr, 18, 20, 2), // the other program's copy: a later time, same call
            event(Rtr, 19, 21, 3), // another QP
            event(Destroyed, 18, 0, 4),
            event(Rtr, 19, 21, 5), // 19's copy, after 18's destroy
            event(Destroyed, 18, 0, 6),
            event(Rtr, 18, 20, 7), // QPN 18 reused, same peer: a new connection
            event(Rtr, 18, 20, 8),
            event(Destroyed, 18, 0, 9), // and its destroy is news too
            event(Rtr, 18, 22, 10),     // re-targeted: news
        ]
        .iter()
        .map(|e| d.admit(e))
        .collect();
        assert_eq!(admitted, [true, false, true, true, false, false, true, false, true, true]);
        assert_eq!(d.duplicates, 4);
    }

    #[test]
    fn dedup_forgets_beyond_its_window() {
        let mut d = Dedup::new();
        assert!(d.admit(&event(QpEventKind::Rtr, 1, 1, 0)));
        for q in 0..DEDUP_RECENT as u32 {
            assert!(d.admit(&event(QpEventKind::Rtr, 100 + q, 1, 0)));
        }
        // Evicted: a copy this late is let through (the agent's router drops it).
        assert!(d.admit(&event(QpEventKind::Rtr, 1, 1, 0)));
        assert_eq!(d.recent.len(), DEDUP_RECENT);
    }

    const ROOT_CAPS: u64 = 0x1ff_ffff_ffff;

    fn sysfs(vmlinux: bool, ib_core: bool) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let btf = dir.path().join("kernel/btf");
        std::fs::create_dir_all(&btf).unwrap();
        if vmlinux {
            std::fs::write(btf.join("vmlinux"), b"").unwrap();
        }
        if ib_core {
            std::fs::write(btf.join("ib_core"), b"").unwrap();
        }
        dir
    }

    #[test]
    fn preflight_passes_with_btf_and_caps() {
        let dir = sysfs(true, true);
        preflight(dir.path(), Some(ROOT_CAPS)).unwrap();
        preflight(dir.path(), None).unwrap();
        let bpf_perfmon = (1 << CAP_BPF) | (1 << CAP_PERFMON);
        preflight(dir.path(), Some(bpf_perfmon)).unwrap();
        preflight(dir.path(), Some(1 << CAP_SYS_ADMIN)).unwrap();
    }

    #[test]
    fn preflight_names_missing_kernel_btf() {
        let dir = sysfs(false, true);
        let err = preflight(dir.path(), Some(ROOT_CAPS)).unwrap_err();
        assert!(matches!(err, TraceError::NoKernelBtf { .. }), "{err}");
        let msg = err.to_string();
        assert!(msg.contains("CONFIG_DEBUG_INFO_BTF"), "{msg}");
        assert!(msg.contains("kernel/btf/vmlinux"), "{msg}");
    }

    #[test]
    fn preflight_names_missing_module_btf() {
        let dir = sysfs(true, false);
        let err = preflight(dir.path(), Some(ROOT_CAPS)).unwrap_err();
        assert!(matches!(err, TraceError::NoRdmaModuleBtf { .. }), "{err}");
        let msg = err.to_string();
        assert!(msg.contains("modprobe ib_uverbs"), "{msg}");
        assert!(msg.contains("CONFIG_DEBUG_INFO_BTF_MODULES"), "{msg}");
    }

    #[test]
    fn preflight_names_missing_capabilities() {
        let dir = sysfs(true, true);
        let cases = [(0, "CAP_BPF, CAP_PERFMON"), (1 << CAP_PERFMON, "CAP_BPF"), (1 << CAP_BPF, "CAP_PERFMON")];
        for (caps, missing) in cases {
            match preflight(dir.path(), Some(caps)) {
                Err(e @ TraceError::Capability { missing: m }) => {
                    assert_eq!(m, missing);
                    assert!(e.to_string().contains("setcap"), "{e}");
                }
                other => panic!("caps {caps:#x}: {other:?}"),
            }
        }
    }

    #[test]
    fn parses_cap_eff() {
        let status = "Name:\tagent\nCapInh:\t0000000000000000\nCapEff:\t000001fffeffffff\n";
        assert_eq!(cap_eff(status), Some(0x1ff_feff_ffff));
        assert_eq!(cap_eff("Name:\tagent\n"), None);
        assert_eq!(cap_eff("CapEff:\tnot-hex\n"), None);
    }

    #[test]
    fn memlock_hint_only_on_eperm() {
        let eperm = libbpf_rs::Error::from_raw_os_error(libc::EPERM);
        assert!(memlock_hint(&eperm).contains("RLIMIT_MEMLOCK"));
        let esrch = libbpf_rs::Error::from_raw_os_error(libc::ESRCH);
        assert_eq!(memlock_hint(&esrch), "");
    }

    /// On a host without ib_core's BTF (the sandbox: no RDMA modules), load() stops at the
    /// preflight with the error that names the fix. Elsewhere it asserts nothing: the root
    /// test and the soft-RoCE VM cover real loads.
    #[test]
    fn load_without_rdma_btf_is_refused_cleanly() {
        let btf = Path::new("/sys/kernel/btf");
        if !btf.join("vmlinux").exists() {
            let result = Tracer::load();
            assert!(matches!(result, Err(TraceError::NoKernelBtf { .. })), "{result:?}");
        } else if !btf.join("ib_core").exists() {
            let result = Tracer::load();
            assert!(matches!(result, Err(TraceError::NoRdmaModuleBtf { .. })), "{result:?}");
        }
    }

    /// Reaches libbpf on this host, skipping the preflight: with no ib_core BTF the kernel
    /// functions (and the RDMA types) cannot be resolved, which must come back as a
    /// TraceError carrying libbpf's reason, not a panic.
    #[test]
    #[ignore = "needs root and BPF: cargo test -p rocemesh-bpf -- --ignored, as root"]
    fn load_reports_libbpf_failures() {
        if Path::new("/sys/kernel/btf/ib_core").exists() {
            let mut tracer = load_unchecked().expect("ib_core BTF present: load should succeed");
            tracer.kernel_counters().unwrap();
            tracer.poll(Duration::ZERO, &mut |_| {}).unwrap();
            return;
        }
        let err = load_unchecked().expect_err("no ib_core BTF: load must fail");
        let msg = err.to_string();
        eprintln!("{msg}");
        match &err {
            TraceError::Load { log, .. } => {
                assert!(!log.lines().is_empty(), "no libbpf log captured: {msg}");
            }
            other => panic!("expected TraceError::Load, got {other:?}"),
        }
        assert!(msg.contains("ib_modify_qp_with_udata") || msg.contains("ib_qp"), "{msg}");
    }

    /// The verifier accepts the programs' bodies, with CO-RE relocations taken from a
    /// stand-in BTF of the RDMA types (src/bpf/testdata/kernel_standin.c, laid out as kernel
    /// 7.3.4) as this host has no RDMA. The sandbox kernel refuses every fentry/fexit load
    /// (EPERM even for an empty program), so both programs are retyped as tp_btf on
    /// kmem:kmalloc, whose 6 arguments cover the 5 context slots on_modify reads: same
    /// program type (tracing), same helpers, same context access. What only the soft-RoCE VM
    /// can check is the real hook targets and the events.
    #[test]
    #[ignore = "needs root and BPF: cargo test -p rocemesh-bpf -- --ignored, as root"]
    fn verifier_accepts_programs_on_stand_in_hook() {
        use libbpf_rs::ProgramAttachType;

        let dir = tempfile::tempdir().unwrap();
        let btf = dir.path().join("kernel_standin.o");
        // Cargo's run-time CARGO_MANIFEST_DIR, not the compile-time one: a test binary built in
        // another checkout of the same sources (one shared target directory) is reused as is,
        // and its baked-in path named a directory that was gone.
        let src = std::env::var_os("CARGO_MANIFEST_DIR")
            .map_or_else(|| std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")), std::path::PathBuf::from)
            .join("src/bpf/testdata/kernel_standin.c");
        let clang = std::process::Command::new("clang")
            .args(["-g", "-O2", "-target", "bpf", "-c"])
            .arg(&src)
            .arg("-o")
            .arg(&btf)
            .status()
            .unwrap();
        assert!(clang.success(), "clang failed on {}", src.display());

        let _serial = LOAD_LOCK.lock().unwrap_or_else(PoisonError::into_inner);
        let _capture = Capture::start();
        let mut builder = RdmaQpSkelBuilder::default();
        builder.obj_builder.btf_custom_path(&btf).unwrap();
        let slot = Box::leak(Box::new(MaybeUninit::uninit()));
        let mut open = builder.open(slot).unwrap();
        let progs = &mut open.progs;
        for prog in [&mut progs.on_modify, &mut progs.on_modify_copy, &mut progs.on_destroy, &mut progs.on_destroy_copy]
        {
            prog.set_attach_type(ProgramAttachType::TraceRawTp);
            prog.set_attach_target(0, Some("kmalloc".into())).unwrap();
        }
        // A CO-RE relocation without a target poisons its instruction, which the verifier
        // rejects: every relocation here is on a reachable path, so loading covers them all.
        let skel = match open.load() {
            Ok(skel) => skel,
            Err(e) => panic!("load: {e}{}", take_log()),
        };
        // The rest of a Tracer's life: attach, ring buffer, poll, counters. kmalloc's arguments
        // almost never pass the programs' filters; whatever does is decoded garbage, not checked.
        let mut tracer = attach(skel).unwrap();
        tracer.poll(Duration::from_millis(10), &mut |_| {}).unwrap();
        tracer.kernel_counters().unwrap();
    }
}
