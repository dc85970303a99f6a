//! The UDP transport: the probe protocol over kernel UDP sockets, for hosts and CI without RNICs.
//!
//! Kernel software timestamps (`SO_TIMESTAMPING`) play the role of NIC completion timestamps:
//! T3 and T5 are the kernel's receive stamps, T2 and T4 its send stamps, read back from the
//! socket's error queue. They are CLOCK_REALTIME, the same clock as the agent's T1 and T6, so
//! every subtraction stays in one clock domain. Send stamps are matched to packets by the payload
//! the kernel echoes (not by `SOF_TIMESTAMPING_OPT_ID` counters, which drift if one send fails
//! half-way), so a stamp can never be attributed to the wrong probe.
//!
//! **Source ports per flow label.** Switches hash a UDP packet's 5-tuple onto an ECMP path, so
//! the flow labels a pinglist gives a target are played, on UDP, by source ports: probes leave
//! from one of K extra sockets bound to the same address on ports the kernel picks, and the
//! responder answers to that port, so both directions take the path of that label. A target's
//! labels take consecutive sockets (from one its first label picks), so up to K labels of one
//! target leave from K distinct ports and the coverage `ctl` computed for them holds; a label
//! not in the pinglist takes socket `label mod K`. Answers to other
//! agents' probes leave from the bound socket, whose address is what the peers probe. With K
//! sockets, one epoll set tells which have packets or stamps waiting, and event mode waits on
//! it. K = 0 sends everything from the bound socket.
//!
//! All buffers are allocated once, when the transport is created.

use std::io;
use std::mem::{size_of, zeroed};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use rocemesh_formats::record::TsSource;

use crate::pathtrace::WireTuple;
use crate::protocol::{Binding, PACKET_BYTES, is_probe};
use crate::transport::{BATCH, DropReason, Fate, RxBatch, SEND_BATCH, Transport, TxBatch, TxNews};

// asm-generic/socket.h; with a 64-bit time_t the "old" option already carries 64-bit seconds.
const SO_TIMESTAMPING: libc::c_int = 37;
const SCM_TIMESTAMPING: libc::c_int = SO_TIMESTAMPING;
const CMSG_BYTES: usize = 128;
/// Error-queue messages echo the packet with its headers (link, IP, UDP): room for all of them.
const ERRQ_BYTES: usize = 256;
const RCVBUF_BYTES: libc::c_int = 4 << 20;
/// Most source-port sockets per shard (socket indices fit a byte).
pub const MAX_SOURCE_PORTS: usize = 255;

/// UDP sockets with kernel timestamps: the bound one, and the source-port sockets.
#[derive(Debug)]
pub struct UdpTransport {
    fd: OwnedFd,
    local: SocketAddr,
    /// Probes leave from `paths[..]` (see the module docs); empty: from `fd`.
    paths: Vec<OwnedFd>,
    /// The port of each of `paths`.
    path_ports: Vec<u16>,
    /// The (label, port) plan last logged.
    logged_plan: Vec<(u32, u16)>,
    /// Path socket index of each flow label of the pinglist in force.
    label_path: std::collections::HashMap<u32, u8>,
    /// Readiness of `fd` and `paths`, when there are paths; event data = socket index.
    epoll: Option<OwnedFd>,
    events: Vec<libc::epoll_event>,
    rx: Box<RecvState>,
    tx: Box<SendState>,
}

// The iovecs and headers point into the state's own arrays; it lives in a Box so that those
// addresses never move, and the pointers are set again before every call anyway.
struct RecvState {
    hdrs: [libc::mmsghdr; BATCH],
    iov: [libc::iovec; BATCH],
    names: [libc::sockaddr_storage; BATCH],
    cmsg: [[u64; CMSG_BYTES / 8]; BATCH],
    errq_hdrs: [libc::mmsghdr; BATCH],
    errq_iov: [libc::iovec; BATCH],
    errq_buf: [[u8; ERRQ_BYTES]; BATCH],
    errq_cmsg: [[u64; CMSG_BYTES / 8]; BATCH],
}

// Same arrangement for sending: one sendmmsg per flush.
struct SendState {
    hdrs: [libc::mmsghdr; SEND_BATCH],
    iov: [libc::iovec; SEND_BATCH],
    names: [libc::sockaddr_storage; SEND_BATCH],
    name_len: [libc::socklen_t; SEND_BATCH],
    packets: [[u8; PACKET_BYTES]; SEND_BATCH],
    want_tx: [bool; SEND_BATCH],
    cmsg: [[u64; 4]; SEND_BATCH],
    /// Socket index of each queued packet: 0 the bound socket, 1 + k `paths[k]`.
    sock: [u8; SEND_BATCH],
    /// Queue positions in socket order, for one sendmmsg per socket.
    order: [u16; SEND_BATCH],
    queued: usize,
}

impl std::fmt::Debug for RecvState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RecvState")
    }
}

impl std::fmt::Debug for SendState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SendState({} queued)", self.queued)
    }
}

/// Why the transport could not be created.
#[derive(Debug, thiserror::Error)]
#[error("UDP transport on {addr}: {op} failed: {source}{hint}")]
pub struct UdpError {
    addr: SocketAddr,
    op: &'static str,
    source: io::Error,
    hint: &'static str,
}

impl UdpTransport {
    /// Bind `addr` and enable kernel software timestamps; everything is sent from `addr`.
    pub fn bind(addr: SocketAddr) -> Result<Self, UdpError> {
        Self::bind_with_source_ports(addr, 0)
    }

    /// [`UdpTransport::bind`], plus `source_ports` sockets on the same address that probes
    /// leave from, one per flow label class (see the module docs); at most [`MAX_SOURCE_PORTS`].
    pub fn bind_with_source_ports(addr: SocketAddr, source_ports: usize) -> Result<Self, UdpError> {
        let err = |op, source: io::Error| UdpError { addr, op, source, hint: "" };
        if source_ports > MAX_SOURCE_PORTS {
            return Err(err("source_ports", io::Error::new(io::ErrorKind::InvalidInput, "more than 255 source ports")));
        }
        let fd = open_socket(addr)?;
        let local = local_addr(&fd).map_err(|e| err("getsockname", e))?;
        let any_port = SocketAddr::new(addr.ip(), 0);
        let paths = (0..source_ports).map(|_| open_socket(any_port)).collect::<Result<Vec<_>, _>>()?;
        let path_ports = paths
            .iter()
            .map(|p| local_addr(p).map(|a| a.port()))
            .collect::<io::Result<Vec<_>>>()
            .map_err(|e| err("getsockname", e))?;
        let epoll = if paths.is_empty() {
            None
        } else {
            // SAFETY: plain syscall; the result is checked before use.
            let raw = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
            if raw < 0 {
                return Err(err("epoll_create1", io::Error::last_os_error()));
            }
            // SAFETY: `raw` is a fresh descriptor we own.
            let ep = unsafe { OwnedFd::from_raw_fd(raw) };
            for (i, sock) in std::iter::once(&fd).chain(&paths).enumerate() {
                // EPOLLERR (error queue not empty: send stamps, ICMP) is always reported.
                let mut ev = libc::epoll_event { events: libc::EPOLLIN as u32, u64: i as u64 };
                // SAFETY: valid descriptors and event.
                if unsafe { libc::epoll_ctl(ep.as_raw_fd(), libc::EPOLL_CTL_ADD, sock.as_raw_fd(), &raw mut ev) } != 0 {
                    return Err(err("epoll_ctl", io::Error::last_os_error()));
                }
            }
            Some(ep)
        };
        let events = vec![libc::epoll_event { events: 0, u64: 0 }; paths.len() + 1];
        // SAFETY: all-zero is a valid value for these plain C structs and arrays.
        let rx: Box<RecvState> = Box::new(unsafe { zeroed() });
        // SAFETY: as above.
        let tx: Box<SendState> = Box::new(unsafe { zeroed() });
        Ok(Self {
            fd,
            local,
            paths,
            path_ports,
            logged_plan: Vec::new(),
            label_path: std::collections::HashMap::new(),
            epoll,
            events,
            rx,
            tx,
        })
    }

    /// The bound address (with the port the kernel chose, if 0 was asked for).
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Socket index a probe with `flow_label` leaves from: 0 = the bound one, 1.. = `paths`.
    fn socket_of_label(&self, flow_label: u32) -> u8 {
        if self.paths.is_empty() {
            return 0;
        }
        1 + self.label_path.get(&flow_label).copied().unwrap_or((flow_label % self.paths.len() as u32) as u8)
    }

    fn socket(&self, index: usize) -> RawFd {
        if index == 0 { self.fd.as_raw_fd() } else { self.paths[index - 1].as_raw_fd() }
    }

    /// Ready sockets (those with `mask` events) into `self.events[..n]`; with no paths, the
    /// bound socket, unasked.
    fn ready(&mut self, mask: u32) -> usize {
        let Some(ep) = &self.epoll else {
            self.events[0] = libc::epoll_event { events: mask, u64: 0 };
            return 1;
        };
        // SAFETY: `events` has room for `len` entries; timeout 0 never blocks.
        let n = unsafe { libc::epoll_wait(ep.as_raw_fd(), self.events.as_mut_ptr(), self.events.len() as i32, 0) };
        let mut kept = 0;
        for i in 0..n.max(0) as usize {
            if self.events[i].events & mask != 0 {
                self.events[kept] = self.events[i];
                kept += 1;
            }
        }
        kept
    }
}

/// A non-blocking UDP socket bound to `addr`, with kernel software timestamps and ICMP errors
/// on its error queue.
fn open_socket(addr: SocketAddr) -> Result<OwnedFd, UdpError> {
    let err = |op, source: io::Error| {
        let hint = match source.raw_os_error() {
            Some(libc::EADDRINUSE) => "; another process (an agent already running?) holds this address",
            Some(libc::EADDRNOTAVAIL) => "; the address is not configured on this host: check `bind` in the config",
            Some(libc::EACCES) => "; ports below 1024 need CAP_NET_BIND_SERVICE",
            _ => "",
        };
        UdpError { addr, op, source, hint }
    };
    let family = if addr.is_ipv4() { libc::AF_INET } else { libc::AF_INET6 };
    // SAFETY: plain syscall; the result is checked before use.
    let raw = unsafe { libc::socket(family, libc::SOCK_DGRAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(err("socket", io::Error::last_os_error()));
    }
    // SAFETY: `raw` is a fresh descriptor we own.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let flags: libc::c_uint =
        libc::SOF_TIMESTAMPING_SOFTWARE | libc::SOF_TIMESTAMPING_RX_SOFTWARE | libc::SOF_TIMESTAMPING_TX_SOFTWARE;
    setsockopt(&fd, libc::SOL_SOCKET, SO_TIMESTAMPING, &flags).map_err(|e| err("enable SO_TIMESTAMPING", e))?;
    // SO_RCVBUF is silently capped by net.core.rmem_max (~208 KiB by default, a few hundred
    // probes); with CAP_NET_ADMIN the FORCE variant gets the size asked for.
    if setsockopt(&fd, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, &RCVBUF_BYTES).is_err() {
        setsockopt(&fd, libc::SOL_SOCKET, libc::SO_RCVBUF, &RCVBUF_BYTES).map_err(|e| err("set SO_RCVBUF", e))?;
    }
    // ICMP errors (port unreachable: the peer's agent is down) onto the error queue, with
    // the offending payload, so the probe they answer can be recorded as refused.
    let one: libc::c_int = 1;
    let (level, name) =
        if addr.is_ipv4() { (libc::IPPROTO_IP, libc::IP_RECVERR) } else { (libc::IPPROTO_IPV6, libc::IPV6_RECVERR) };
    setsockopt(&fd, level, name, &one).map_err(|e| err("enable IP_RECVERR", e))?;
    let (sa, len) = to_sockaddr(addr);
    // SAFETY: `sa` is a valid sockaddr of `len` bytes.
    if unsafe { libc::bind(fd.as_raw_fd(), (&raw const sa).cast(), len) } != 0 {
        return Err(err("bind", io::Error::last_os_error()));
    }
    Ok(fd)
}

impl Transport for UdpTransport {
    type Addr = SocketAddr;

    fn queue(&mut self, to: &SocketAddr, flow_label: u32, packet: &[u8; PACKET_BYTES], want_tx_ns: bool) -> bool {
        let sock = if is_probe(packet) { self.socket_of_label(flow_label) } else { 0 };
        let st = &mut *self.tx;
        if st.queued == SEND_BATCH {
            return false;
        }
        let i = st.queued;
        st.sock[i] = sock;
        let (sa, len) = to_sockaddr(*to);
        st.names[i] = sa;
        st.name_len[i] = len;
        st.packets[i] = *packet;
        st.want_tx[i] = want_tx_ns;
        st.queued += 1;
        true
    }

    fn binding_to(&self, to: &SocketAddr) -> Binding {
        Binding::of_socket(*to)
    }

    /// Socket `at` (0: the bound one, k: path socket k), on the bound address: the config
    /// refuses an unspecified address with `[auth]`, which peers could not name.
    fn binding_at(&self, at: u8) -> Binding {
        let port = match usize::from(at) {
            0 => self.local.port(),
            k => self.path_ports.get(k - 1).copied().unwrap_or(0),
        };
        Binding::of_socket(SocketAddr::new(self.local.ip(), port))
    }

    fn wire_tuple(&self, to: &SocketAddr, flow_label: u32, answer: bool) -> Option<WireTuple> {
        let SocketAddr::V4(dst) = to else { return None };
        let sock = if answer { 0 } else { usize::from(self.socket_of_label(flow_label)) };
        let src = if sock == 0 { self.local } else { SocketAddr::new(self.local.ip(), self.path_ports[sock - 1]) };
        let SocketAddr::V4(src) = src else { return None };
        (!src.ip().is_unspecified()).then_some(WireTuple { src, dst: *dst, tos: 0 })
    }

    fn plan_labels<'a>(&mut self, targets: impl Iterator<Item = &'a [u32]>) {
        let k = self.paths.len();
        if k == 0 {
            return;
        }
        self.label_path.clear();
        for labels in targets {
            let base = labels.first().map_or(0, |&l| l as usize % k);
            for (i, &label) in labels.iter().enumerate() {
                // A label shared by two targets keeps its first socket.
                self.label_path.entry(label).or_insert(((base + i) % k) as u8);
            }
        }
        // Which port a label leaves from is the kernel's choice, and what an operator (or the
        // Clos testbed) needs to replay a probe's 5-tuple: `ip route get ... sport P`.
        let mut plan: Vec<(u32, u16)> =
            self.label_path.iter().map(|(&l, &s)| (l, self.path_ports[usize::from(s)])).collect();
        plan.sort_unstable();
        if plan != self.logged_plan {
            let text: Vec<String> = plan.iter().map(|(l, p)| format!("{l}:{p}")).collect();
            tracing::info!(local = %self.local, labels = %text.join(","), "flow label source ports (label:port)");
            self.logged_plan = plan;
        }
    }

    fn flush(&mut self, fates: &mut [Fate; SEND_BATCH]) -> usize {
        let st = &mut *self.tx;
        let n = st.queued;
        st.queued = 0;
        // Queue positions grouped by socket (a stable counting sort), one sendmmsg per group.
        let mut starts = [0u16; MAX_SOURCE_PORTS + 2];
        for i in 0..n {
            starts[usize::from(st.sock[i]) + 1] += 1;
        }
        for k in 1..starts.len() {
            starts[k] += starts[k - 1];
        }
        let mut next = starts;
        for i in 0..n {
            let k = usize::from(st.sock[i]);
            st.order[usize::from(next[k])] = i as u16;
            next[k] += 1;
        }
        for (j, &i) in st.order[..n].iter().enumerate() {
            let i = usize::from(i);
            st.iov[j] = libc::iovec { iov_base: st.packets[i].as_mut_ptr().cast(), iov_len: PACKET_BYTES };
            let h = &mut st.hdrs[j].msg_hdr;
            h.msg_name = (&raw mut st.names[i]).cast();
            h.msg_namelen = st.name_len[i];
            h.msg_iov = &raw mut st.iov[j];
            h.msg_iovlen = 1;
            if st.want_tx[i] {
                // SAFETY: the control buffer is 32 bytes, room for one cmsg carrying a u32.
                unsafe {
                    h.msg_control = st.cmsg[i].as_mut_ptr().cast();
                    h.msg_controllen = libc::CMSG_SPACE(size_of::<u32>() as u32) as usize;
                    let c = libc::CMSG_FIRSTHDR(h);
                    (*c).cmsg_level = libc::SOL_SOCKET;
                    (*c).cmsg_type = SO_TIMESTAMPING;
                    (*c).cmsg_len = libc::CMSG_LEN(size_of::<u32>() as u32) as usize;
                    libc::CMSG_DATA(c).cast::<u32>().write_unaligned(libc::SOF_TIMESTAMPING_TX_SOFTWARE);
                }
            } else {
                h.msg_control = std::ptr::null_mut();
                h.msg_controllen = 0;
            }
        }
        for k in 0..=self.paths.len() {
            let fd = if k == 0 { self.fd.as_raw_fd() } else { self.paths[k - 1].as_raw_fd() };
            let (mut start, end) = (usize::from(starts[k]), usize::from(starts[k + 1]));
            let mut retried = false;
            while start < end {
                // SAFETY: headers [start, end) point at buffers owned by `st`, valid for the call.
                let sent_now = unsafe { libc::sendmmsg(fd, st.hdrs[start..].as_mut_ptr(), (end - start) as u32, 0) };
                if sent_now > 0 {
                    for &i in &st.order[start..start + sent_now as usize] {
                        fates[usize::from(i)] = Fate::Sent;
                    }
                    start += sent_now as usize;
                    retried = false;
                    continue;
                }
                // With IP_RECVERR an ICMP error for an earlier datagram is also reported once as
                // the socket's pending error, failing this call: it belongs to that earlier
                // datagram (the error queue has it), so retry once before blaming this packet.
                let e = io::Error::last_os_error();
                if pending_icmp_errno(e.raw_os_error()) && !retried {
                    retried = true;
                    continue;
                }
                // The kernel refused this datagram before it left (no route, EACCES for a
                // broadcast, a full buffer): this host's failure, not the network's.
                let errno = e.raw_os_error().unwrap_or(libc::EIO);
                fates[usize::from(st.order[start])] = Fate::Dropped(DropReason::SendError { errno });
                start += 1;
                retried = false;
            }
        }
        n
    }

    fn recv(&mut self, out: &mut RxBatch<SocketAddr>) -> io::Result<usize> {
        let mut n = 0;
        for e in 0..self.ready(libc::EPOLLIN as u32) {
            let sock = self.events[e].u64 as usize;
            let got = recv_into(self.socket(sock), &mut self.rx, out, n)?;
            out.at[n..n + got].fill(sock as u8);
            n += got;
            if n == BATCH {
                break;
            }
        }
        Ok(n)
    }

    fn tx_timestamps(&mut self, out: &mut TxBatch) -> io::Result<usize> {
        let mut n = 0;
        for e in 0..self.ready(libc::EPOLLERR as u32) {
            let fd = self.socket(self.events[e].u64 as usize);
            let got = errqueue_into(fd, &mut self.rx, out, n)?;
            if got == 0 && self.epoll.is_some() {
                // EPOLLERR with an empty error queue: a pending ICMP error (see `flush`) that
                // nothing has consumed; reading it clears it, or epoll would report it forever.
                let mut pending: libc::c_int = 0;
                let mut len = size_of::<libc::c_int>() as libc::socklen_t;
                // SAFETY: valid descriptor and out-pointers of the sizes passed.
                unsafe {
                    libc::getsockopt(fd, libc::SOL_SOCKET, libc::SO_ERROR, (&raw mut pending).cast(), &raw mut len)
                };
            }
            n += got;
            if n == BATCH {
                break;
            }
        }
        Ok(n)
    }

    fn ts_source(&self) -> TsSource {
        TsSource::KernelSoftware
    }

    fn readiness_fd(&self) -> RawFd {
        self.epoll.as_ref().unwrap_or(&self.fd).as_raw_fd()
    }
}

/// Whether a failed call's errno can be a socket's pending ICMP error rather than its own
/// failure: port unreachable (a peer's agent is down) or, since path traces carry the probes'
/// own 5-tuple, the time exceeded a switch answers a trace packet with. Either fails one call
/// on a socket with IP_RECVERR; the caller tries once more before believing it.
fn pending_icmp_errno(errno: Option<i32>) -> bool {
    matches!(errno, Some(libc::ECONNREFUSED | libc::EHOSTUNREACH))
}

/// Datagrams waiting on `fd` into `out[start..]`; how many.
fn recv_into(fd: RawFd, st: &mut RecvState, out: &mut RxBatch<SocketAddr>, start: usize) -> io::Result<usize> {
    let room = BATCH - start;
    for i in 0..room {
        st.iov[i] = libc::iovec { iov_base: out.buf[start + i].as_mut_ptr().cast(), iov_len: PACKET_BYTES + 1 };
        let h = &mut st.hdrs[i].msg_hdr;
        h.msg_name = (&raw mut st.names[i]).cast();
        h.msg_namelen = size_of::<libc::sockaddr_storage>() as u32;
        h.msg_iov = &raw mut st.iov[i];
        h.msg_iovlen = 1;
        h.msg_control = st.cmsg[i].as_mut_ptr().cast();
        h.msg_controllen = CMSG_BYTES;
        h.msg_flags = 0;
    }
    let mut n = -1;
    for _ in 0..2 {
        // SAFETY: the first `room` headers point at buffers owned by `st` and `out`.
        n = unsafe { libc::recvmmsg(fd, st.hdrs.as_mut_ptr(), room as u32, libc::MSG_DONTWAIT, std::ptr::null_mut()) };
        // A pending ICMP error (see `flush`) fails one call; the data is still there.
        if n >= 0 || !pending_icmp_errno(io::Error::last_os_error().raw_os_error()) {
            break;
        }
    }
    if n < 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == io::ErrorKind::WouldBlock || pending_icmp_errno(e.raw_os_error()) {
            Ok(0)
        } else {
            Err(e)
        };
    }
    let n = n as usize;
    for i in 0..n {
        let truncated = st.hdrs[i].msg_hdr.msg_flags & libc::MSG_TRUNC != 0;
        out.len[start + i] = if truncated { PACKET_BYTES + 1 } else { st.hdrs[i].msg_len as usize };
        out.rx_ns[start + i] = timestamp_ns(&st.hdrs[i].msg_hdr);
        out.from[start + i] = from_sockaddr(&st.names[i]).unwrap_or(out.from[start + i]);
    }
    Ok(n)
}

/// Send stamps and ICMP errors waiting on `fd`'s error queue into `out[start..]`; how many.
fn errqueue_into(fd: RawFd, st: &mut RecvState, out: &mut TxBatch, start: usize) -> io::Result<usize> {
    let room = BATCH - start;
    for i in 0..room {
        st.errq_iov[i] = libc::iovec { iov_base: st.errq_buf[i].as_mut_ptr().cast(), iov_len: ERRQ_BYTES };
        let h = &mut st.errq_hdrs[i].msg_hdr;
        h.msg_name = std::ptr::null_mut();
        h.msg_namelen = 0;
        h.msg_iov = &raw mut st.errq_iov[i];
        h.msg_iovlen = 1;
        h.msg_control = st.errq_cmsg[i].as_mut_ptr().cast();
        h.msg_controllen = CMSG_BYTES;
        h.msg_flags = 0;
    }
    // SAFETY: the first `room` headers point at buffers owned by `st`, valid for the call.
    let got = unsafe {
        libc::recvmmsg(
            fd,
            st.errq_hdrs.as_mut_ptr(),
            room as u32,
            libc::MSG_ERRQUEUE | libc::MSG_DONTWAIT,
            std::ptr::null_mut(),
        )
    };
    if got < 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == io::ErrorKind::WouldBlock { Ok(0) } else { Err(e) };
    }
    let mut n = 0;
    for i in 0..got as usize {
        let h = &st.errq_hdrs[i].msg_hdr;
        let len = st.errq_hdrs[i].msg_len as usize;
        let ts = timestamp_ns(h);
        let refused = icmp_refused(h);
        // The echoed packet ends with our payload, whatever headers precede it.
        if (ts != 0 || refused) && len >= PACKET_BYTES && h.msg_flags & libc::MSG_TRUNC == 0 {
            out.payload[start + n].copy_from_slice(&st.errq_buf[i][len - PACKET_BYTES..len]);
            out.tx_ns[start + n] = if refused { 0 } else { ts };
            out.news[start + n] = if refused { TxNews::Refused } else { TxNews::Stamp };
            n += 1;
        }
    }
    Ok(n)
}

fn setsockopt<T>(fd: &OwnedFd, level: libc::c_int, name: libc::c_int, value: &T) -> io::Result<()> {
    // SAFETY: `value` is a live T of the size passed.
    let rc = unsafe {
        libc::setsockopt(fd.as_raw_fd(), level, name, (value as *const T).cast(), size_of::<T>() as libc::socklen_t)
    };
    if rc == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
}

/// The software timestamp (ts[0] of `scm_timestamping`) in a received message's control data.
fn timestamp_ns(h: &libc::msghdr) -> u64 {
    // SAFETY: CMSG_* walk the control buffer the kernel filled, bounded by msg_controllen.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(h);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == SCM_TIMESTAMPING {
                let ts = libc::CMSG_DATA(c).cast::<libc::timespec>().read_unaligned();
                return (ts.tv_sec as u64).wrapping_mul(1_000_000_000).wrapping_add(ts.tv_nsec as u64);
            }
            c = libc::CMSG_NXTHDR(h, c);
        }
    }
    0
}

/// Whether an error-queue message is an ICMP "port unreachable" for one of our datagrams.
fn icmp_refused(h: &libc::msghdr) -> bool {
    // SAFETY: CMSG_* walk the control buffer the kernel filled, bounded by msg_controllen.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(h);
        while !c.is_null() {
            let ip = (*c).cmsg_level == libc::IPPROTO_IP && (*c).cmsg_type == libc::IP_RECVERR;
            let ip6 = (*c).cmsg_level == libc::IPPROTO_IPV6 && (*c).cmsg_type == libc::IPV6_RECVERR;
            if ip || ip6 {
                let ee = libc::CMSG_DATA(c).cast::<libc::sock_extended_err>().read_unaligned();
                let icmp = ee.ee_origin == libc::SO_EE_ORIGIN_ICMP || ee.ee_origin == libc::SO_EE_ORIGIN_ICMP6;
                return icmp && ee.ee_errno == libc::ECONNREFUSED as u32;
            }
            c = libc::CMSG_NXTHDR(h, c);
        }
    }
    false
}

/// `addr` as a C sockaddr (also what RDMA CM takes).
pub(crate) fn to_sockaddr(addr: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: all-zero is a valid sockaddr_storage.
    let mut ss: libc::sockaddr_storage = unsafe { zeroed() };
    match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr { s_addr: u32::from(*a.ip()).to_be() },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is large enough and suitably aligned for sockaddr_in.
            unsafe { (&raw mut ss).cast::<libc::sockaddr_in>().write(sin) };
            (ss, size_of::<libc::sockaddr_in>() as libc::socklen_t)
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo().to_be(),
                sin6_addr: libc::in6_addr { s6_addr: a.ip().octets() },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: sockaddr_storage is large enough and suitably aligned for sockaddr_in6.
            unsafe { (&raw mut ss).cast::<libc::sockaddr_in6>().write(sin6) };
            (ss, size_of::<libc::sockaddr_in6>() as libc::socklen_t)
        }
    }
}

pub(crate) fn from_sockaddr(ss: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match ss.ss_family as libc::c_int {
        libc::AF_INET => {
            // SAFETY: the family says this storage holds a sockaddr_in.
            let sin = unsafe { (ss as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>().read() };
            let ip = Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
            Some(SocketAddr::V4(SocketAddrV4::new(ip, u16::from_be(sin.sin_port))))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says this storage holds a sockaddr_in6.
            let s6 = unsafe { (ss as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>().read() };
            let ip = Ipv6Addr::from(s6.sin6_addr.s6_addr);
            Some(SocketAddr::V6(SocketAddrV6::new(ip, u16::from_be(s6.sin6_port), 0, s6.sin6_scope_id)))
        }
        _ => None,
    }
}

fn local_addr(fd: &OwnedFd) -> io::Result<SocketAddr> {
    // SAFETY: all-zero is a valid sockaddr_storage; getsockname fills at most `len` bytes.
    let mut ss: libc::sockaddr_storage = unsafe { zeroed() };
    let mut len = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: valid pointers for the call.
    if unsafe { libc::getsockname(fd.as_raw_fd(), (&raw mut ss).cast(), &raw mut len) } != 0 {
        return Err(io::Error::last_os_error());
    }
    from_sockaddr(&ss).ok_or_else(|| io::Error::other("unknown address family"))
}

/// The unspecified address of `ip`'s family, for initialising address slots.
pub fn unspecified_like(ip: IpAddr) -> SocketAddr {
    match ip {
        IpAddr::V4(_) => SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)),
        IpAddr::V6(_) => SocketAddr::from((Ipv6Addr::UNSPECIFIED, 0)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{Kind, Packet};

    impl UdpTransport {
        /// The source-port sockets' addresses, in socket order.
        fn source_addrs(&self) -> io::Result<Vec<SocketAddr>> {
            self.paths.iter().map(local_addr).collect()
        }

        fn send(&mut self, to: &SocketAddr, _: u32, packet: &[u8; PACKET_BYTES]) -> io::Result<()> {
            assert!(self.queue(to, 1, packet, true));
            let mut fates = [Fate::Sent; SEND_BATCH];
            assert_eq!(self.flush(&mut fates), 1);
            match fates[0] {
                Fate::Sent => Ok(()),
                other => Err(io::Error::other(format!("not sent: {other:?}"))),
            }
        }
    }

    #[test]
    fn a_send_the_local_stack_refuses_is_a_local_drop_with_its_errno() {
        // The IPv4 broadcast address without SO_BROADCAST: the kernel refuses it before anything
        // leaves the host. f9b751e reported such a packet as merely "not sent", and the shard
        // recorded its probe as network loss.
        let mut a = UdpTransport::bind("127.0.0.1:0".parse().expect("addr")).expect("bind");
        let to: SocketAddr = "255.255.255.255:18515".parse().expect("addr");
        let ok: SocketAddr = a.local_addr();
        assert!(a.queue(&to, 1, &[0; PACKET_BYTES], true));
        assert!(a.queue(&ok, 1, &[0; PACKET_BYTES], false));
        let mut fates = [Fate::Refused; SEND_BATCH];
        assert_eq!(a.flush(&mut fates), 2);
        assert_eq!(fates[0], Fate::Dropped(DropReason::SendError { errno: libc::EACCES }));
        assert_eq!(fates[1], Fate::Sent, "one refused datagram does not take its batch with it");
    }

    #[test]
    fn loopback_exchange_has_kernel_timestamps_on_both_sides() {
        let mut a = UdpTransport::bind("127.0.0.1:0".parse().expect("addr")).expect("bind a");
        let mut b = UdpTransport::bind("127.0.0.1:0".parse().expect("addr")).expect("bind b");
        let p = Packet { kind: Kind::Probe, seq: 42, flow_label: 1, responder_epoch: 0, t3_ns: 0, t4_ns: 0 };
        let mut bytes = [0u8; PACKET_BYTES];
        p.encode(&mut bytes);
        let mut rx = RxBatch::new(unspecified_like(IpAddr::V4(Ipv4Addr::LOCALHOST)));
        let mut tx = TxBatch::default();
        let exchange = |a: &mut UdpTransport, b: &mut UdpTransport, rx: &mut RxBatch<SocketAddr>| {
            a.send(&b.local_addr(), 1, &bytes).expect("send");
            for _ in 0..1000 {
                let got = b.recv(rx).expect("recv");
                if got > 0 {
                    return got;
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            0
        };
        // The kernel turns receive stamping on lazily (a deferred static key) when the first
        // timestamping socket appears: warm it up so that what follows tests stamping itself.
        for _ in 0..50 {
            let got = exchange(&mut a, &mut b, &mut rx);
            assert_eq!(got, 1);
            a.tx_timestamps(&mut tx).expect("drain");
            if rx.rx_ns[0] != 0 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let before = crate::clock::now_ns();
        let got = exchange(&mut a, &mut b, &mut rx);
        assert_eq!(got, 1);
        assert_eq!(rx.from[0], a.local_addr());
        assert_eq!(Packet::decode(&rx.buf[0][..rx.len[0]]), Ok(p));
        assert!(rx.rx_ns[0] >= before && rx.rx_ns[0] < before + 1_000_000_000, "rx stamp {}", rx.rx_ns[0]);
        let n = a.tx_timestamps(&mut tx).expect("errqueue");
        assert_eq!(n, 1, "the send timestamp of the probe");
        assert_eq!(tx.news[0], TxNews::Stamp);
        assert_eq!(tx.payload[0], bytes, "matched by the echoed payload");
        assert!(tx.tx_ns[0] >= before && tx.tx_ns[0] <= rx.rx_ns[0], "tx {} rx {}", tx.tx_ns[0], rx.rx_ns[0]);
    }

    /// Polls `f` until it yields something or a second passes.
    fn within_a_second(mut f: impl FnMut() -> usize) -> usize {
        for _ in 0..1000 {
            let n = f();
            if n > 0 {
                return n;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        0
    }

    #[test]
    fn probes_leave_from_the_source_port_of_their_label_and_answers_from_the_bound_one() {
        let mut a = UdpTransport::bind_with_source_ports("127.0.0.1:0".parse().expect("addr"), 4).expect("bind a");
        let peer = std::net::UdpSocket::bind("127.0.0.1:0").expect("peer");
        peer.set_read_timeout(Some(std::time::Duration::from_secs(1))).expect("timeout");
        let ports = a.source_addrs().expect("source addrs");
        assert_eq!(ports.len(), 4);
        assert!(ports.iter().all(|p| *p != a.local_addr() && p.ip() == a.local_addr().ip()), "{ports:?}");
        let packet = |kind, label| {
            let mut b = [0u8; PACKET_BYTES];
            Packet { kind, seq: u64::from(label), flow_label: label, responder_epoch: 0, t3_ns: 0, t4_ns: 0 }
                .encode(&mut b);
            b
        };
        // One target probed with labels 11..=14 takes 4 consecutive sockets from 11 mod 4 = 3;
        // labels 1..=4 are in no target and take `label mod 4`.
        a.plan_labels([&[11u32, 12, 13, 14][..]].into_iter());
        let socket_of = |label: u32| if label > 10 { (3 + label as usize - 11) % 4 } else { label as usize % 4 };
        // 8 probes and two ACKs in one flush: grouped per socket, all sent.
        let to = peer.local_addr().expect("peer addr");
        for label in [1, 2, 3, 4, 11, 12, 13, 14u32] {
            assert!(a.queue(&to, label, &packet(Kind::Probe, label), true));
        }
        assert!(a.queue(&to, 3, &packet(Kind::Ack1, 100), true));
        assert!(a.queue(&to, 5, &packet(Kind::Ack2, 101), false));
        let mut fates = [Fate::Refused; SEND_BATCH];
        assert_eq!(a.flush(&mut fates), 10);
        assert!(fates[..10].iter().all(|&f| f == Fate::Sent), "{fates:?}");
        let mut buf = [0u8; 128];
        let mut from_of = std::collections::HashMap::new();
        for _ in 0..10 {
            let (len, from) = peer.recv_from(&mut buf).expect("a packet");
            let p = Packet::decode(&buf[..len]).expect("ours");
            from_of.insert(p.seq, from);
        }
        for label in [1, 2, 3, 4, 11, 12, 13, 14u32] {
            assert_eq!(from_of[&u64::from(label)], ports[socket_of(label)], "label {label}");
        }
        let target_ports: std::collections::HashSet<_> = (11..=14u64).map(|l| from_of[&l]).collect();
        assert_eq!(target_ports.len(), 4, "a target's 4 labels leave from 4 distinct ports");
        assert_eq!((from_of[&100], from_of[&101]), (a.local_addr(), a.local_addr()), "ACKs from the bound socket");

        // Answers to two source ports come back through recv, and every probe's send stamp
        // through tx_timestamps (error queues of four sockets).
        let mut stamps = TxBatch::default();
        let mut stamped = 0;
        while stamped < 9 {
            let n = within_a_second(|| a.tx_timestamps(&mut stamps).expect("errqueue"));
            assert!(n > 0, "{stamped} of 9 stamps (8 probes, 1 ACK1)");
            stamped += n;
        }
        for (label, port) in [(1u32, ports[1]), (2, ports[2])] {
            peer.send_to(&packet(Kind::Ack1, label), port).expect("answer");
        }
        let mut rx = RxBatch::new(unspecified_like(IpAddr::V4(Ipv4Addr::LOCALHOST)));
        let mut got = 0;
        while got < 2 {
            let n = within_a_second(|| a.recv(&mut rx).expect("recv"));
            assert!(n > 0, "{got} of 2 answers");
            assert!(rx.from[..n].iter().all(|f| *f == to));
            got += n;
        }
    }

    #[test]
    fn a_probe_to_a_port_nobody_listens_on_comes_back_refused() {
        let mut a = UdpTransport::bind("127.0.0.1:0".parse().expect("addr")).expect("bind");
        let closed = std::net::UdpSocket::bind("127.0.0.1:0").expect("std");
        let dead = closed.local_addr().expect("addr");
        drop(closed);
        let mut bytes = [0u8; PACKET_BYTES];
        Packet { kind: Kind::Probe, seq: 7, flow_label: 1, responder_epoch: 0, t3_ns: 0, t4_ns: 0 }.encode(&mut bytes);
        a.send(&dead, 1, &bytes).expect("send");
        let mut tx = TxBatch::default();
        let mut refused = None;
        for _ in 0..1000 {
            let n = a.tx_timestamps(&mut tx).expect("errqueue");
            if let Some(i) = (0..n).find(|&i| tx.news[i] == TxNews::Refused) {
                refused = Some(tx.payload[i]);
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert_eq!(refused, Some(bytes), "the refusal carries the probe it answers");
        // The pending socket error must not fail the next, unrelated send.
        a.send(&a.local_addr(), 1, &bytes).expect("next send still works");
    }

    #[test]
    fn oversized_datagrams_are_marked_so_they_fail_to_decode() {
        let mut b = UdpTransport::bind("127.0.0.1:0".parse().expect("addr")).expect("bind");
        let s = std::net::UdpSocket::bind("127.0.0.1:0").expect("std");
        s.send_to(&[7u8; 500], b.local_addr()).expect("send");
        let mut rx = RxBatch::new(unspecified_like(IpAddr::V4(Ipv4Addr::LOCALHOST)));
        let mut got = 0;
        for _ in 0..1000 {
            got = b.recv(&mut rx).expect("recv");
            if got > 0 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert_eq!((got, rx.len[0]), (1, PACKET_BYTES + 1));
    }
}
