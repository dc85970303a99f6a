//! The UDP transport: the probe protocol over kernel UDP sockets, for hosts and CI without RNICs.
//!
//! Kernel software timestamps (`SO_TIMESTAMPING`) play the role of NIC completion timestamps:
//! T3 and T5 are the kernel's receive stamps, T2 and T4 its send stamps, read back from the
//! socket's error queue. They are CLOCK_REALTIME, the same clock as the agent's T1 and T6, so
//! every subtraction stays in one clock domain. Send stamps are matched to packets by the payload
//! the kernel echoes (not by `SOF_TIMESTAMPING_OPT_ID` counters, which drift if one send fails
//! half-way), so a stamp can never be attributed to the wrong probe.
//!
//! All buffers are allocated once, when the transport is created.

use std::io;
use std::mem::{size_of, zeroed};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use rocemesh_formats::record::TsSource;

use crate::protocol::PACKET_BYTES;
use crate::transport::{BATCH, RxBatch, SEND_BATCH, Transport, TxBatch};

// asm-generic/socket.h; with a 64-bit time_t the "old" option already carries 64-bit seconds.
const SO_TIMESTAMPING: libc::c_int = 37;
const SCM_TIMESTAMPING: libc::c_int = SO_TIMESTAMPING;
const CMSG_BYTES: usize = 128;
/// Error-queue messages echo the packet with its headers (link, IP, UDP): room for all of them.
const ERRQ_BYTES: usize = 256;
const RCVBUF_BYTES: libc::c_int = 4 << 20;

/// A UDP socket with kernel timestamps.
#[derive(Debug)]
pub struct UdpTransport {
    fd: OwnedFd,
    local: SocketAddr,
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
    /// Bind `addr` and enable kernel software timestamps.
    pub fn bind(addr: SocketAddr) -> Result<Self, UdpError> {
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
        let (level, name) = if addr.is_ipv4() {
            (libc::IPPROTO_IP, libc::IP_RECVERR)
        } else {
            (libc::IPPROTO_IPV6, libc::IPV6_RECVERR)
        };
        setsockopt(&fd, level, name, &one).map_err(|e| err("enable IP_RECVERR", e))?;
        let (sa, len) = to_sockaddr(addr);
        // SAFETY: `sa` is a valid sockaddr of `len` bytes.
        if unsafe { libc::bind(fd.as_raw_fd(), (&raw const sa).cast(), len) } != 0 {
            return Err(err("bind", io::Error::last_os_error()));
        }
        let local = local_addr(&fd).map_err(|e| err("getsockname", e))?;
        // SAFETY: all-zero is a valid value for these plain C structs and arrays.
        let rx: Box<RecvState> = Box::new(unsafe { zeroed() });
        // SAFETY: as above.
        let tx: Box<SendState> = Box::new(unsafe { zeroed() });
        Ok(Self { fd, local, rx, tx })
    }

    /// The bound address (with the port the kernel chose, if 0 was asked for).
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }
}

impl Transport for UdpTransport {
    type Addr = SocketAddr;

    fn queue(&mut self, to: &SocketAddr, _flow_label: u32, packet: &[u8; PACKET_BYTES], want_tx_ns: bool) -> bool {
        let st = &mut *self.tx;
        if st.queued == SEND_BATCH {
            return false;
        }
        let i = st.queued;
        let (sa, len) = to_sockaddr(*to);
        st.names[i] = sa;
        st.name_len[i] = len;
        st.packets[i] = *packet;
        st.want_tx[i] = want_tx_ns;
        st.queued += 1;
        true
    }

    fn flush(&mut self, sent: &mut [bool; SEND_BATCH]) -> usize {
        let st = &mut *self.tx;
        let n = st.queued;
        st.queued = 0;
        for i in 0..n {
            st.iov[i] = libc::iovec { iov_base: st.packets[i].as_mut_ptr().cast(), iov_len: PACKET_BYTES };
            let h = &mut st.hdrs[i].msg_hdr;
            h.msg_name = (&raw mut st.names[i]).cast();
            h.msg_namelen = st.name_len[i];
            h.msg_iov = &raw mut st.iov[i];
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
        let mut start = 0;
        let mut retried = false;
        while start < n {
            // SAFETY: headers [start, n) point at buffers owned by `st`, valid for the call.
            let k =
                unsafe { libc::sendmmsg(self.fd.as_raw_fd(), st.hdrs[start..].as_mut_ptr(), (n - start) as u32, 0) };
            if k > 0 {
                sent[start..start + k as usize].fill(true);
                start += k as usize;
                retried = false;
                continue;
            }
            // With IP_RECVERR an ICMP error for an earlier datagram is also reported once as the
            // socket's pending error, failing this call: it belongs to that earlier datagram
            // (the error queue has it), so retry once before blaming this packet.
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::ECONNREFUSED) && !retried {
                retried = true;
                continue;
            }
            sent[start] = false;
            start += 1;
            retried = false;
        }
        n
    }

    fn recv(&mut self, out: &mut RxBatch<SocketAddr>) -> io::Result<usize> {
        let st = &mut *self.rx;
        for i in 0..BATCH {
            st.iov[i] = libc::iovec { iov_base: out.buf[i].as_mut_ptr().cast(), iov_len: PACKET_BYTES + 1 };
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
            // SAFETY: the headers point at buffers owned by `st` and `out`, valid for the call.
            n = unsafe {
                libc::recvmmsg(
                    self.fd.as_raw_fd(),
                    st.hdrs.as_mut_ptr(),
                    BATCH as u32,
                    libc::MSG_DONTWAIT,
                    std::ptr::null_mut(),
                )
            };
            // A pending ICMP error (see `send`) fails one call; the data is still there.
            if n >= 0 || io::Error::last_os_error().raw_os_error() != Some(libc::ECONNREFUSED) {
                break;
            }
        }
        if n < 0 {
            let e = io::Error::last_os_error();
            return if e.kind() == io::ErrorKind::WouldBlock || e.raw_os_error() == Some(libc::ECONNREFUSED) {
                Ok(0)
            } else {
                Err(e)
            };
        }
        let n = n as usize;
        for i in 0..n {
            let truncated = st.hdrs[i].msg_hdr.msg_flags & libc::MSG_TRUNC != 0;
            out.len[i] = if truncated { PACKET_BYTES + 1 } else { st.hdrs[i].msg_len as usize };
            out.rx_ns[i] = timestamp_ns(&st.hdrs[i].msg_hdr);
            out.from[i] = from_sockaddr(&st.names[i]).unwrap_or(out.from[i]);
        }
        Ok(n)
    }

    fn tx_timestamps(&mut self, out: &mut TxBatch) -> io::Result<usize> {
        let st = &mut *self.rx;
        for i in 0..BATCH {
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
        // SAFETY: the headers point at buffers owned by `st`, valid for the call.
        let got = unsafe {
            libc::recvmmsg(
                self.fd.as_raw_fd(),
                st.errq_hdrs.as_mut_ptr(),
                BATCH as u32,
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
                out.payload[n].copy_from_slice(&st.errq_buf[i][len - PACKET_BYTES..len]);
                out.tx_ns[n] = if refused { 0 } else { ts };
                out.refused[n] = refused;
                n += 1;
            }
        }
        Ok(n)
    }

    fn ts_source(&self) -> TsSource {
        TsSource::KernelSoftware
    }

    fn readiness_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
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

fn from_sockaddr(ss: &libc::sockaddr_storage) -> Option<SocketAddr> {
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
        fn send(&mut self, to: &SocketAddr, _: u32, packet: &[u8; PACKET_BYTES]) -> io::Result<()> {
            assert!(self.queue(to, 1, packet, true));
            let mut sent = [false; SEND_BATCH];
            assert_eq!(self.flush(&mut sent), 1);
            if sent[0] { Ok(()) } else { Err(io::Error::other("not sent")) }
        }
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
        assert!(!tx.refused[0]);
        assert_eq!(tx.payload[0], bytes, "matched by the echoed payload");
        assert!(tx.tx_ns[0] >= before && tx.tx_ns[0] <= rx.rx_ns[0], "tx {} rx {}", tx.tx_ns[0], rx.rx_ns[0]);
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
            if let Some(i) = (0..n).find(|&i| tx.refused[i]) {
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
