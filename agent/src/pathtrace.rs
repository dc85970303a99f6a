//! Path tracing: which switches the packets of one (target, flow label) cross.
//!
//! A fabric has many equal-cost paths between two ToRs and every switch picks one by hashing
//! the packet's 5-tuple. Loss on one uplink therefore hits only the labels hashed onto it; to
//! name that uplink rather than a ToR or a spine, `analyze` must know which path each label
//! took. This module finds out as traceroute does, with the probes' own 5-tuple so that every
//! switch hashes the trace exactly as it hashes the probes: IPv4/UDP packets with TTL 1, 2, ...
//! from the probe's source address and port to the target's address and port, and the ICMP time
//! exceeded each switch on the way answers with. The transport says what that 5-tuple is
//! ([`crate::transport::Transport::wire_tuple`]): on UDP the source-port socket of the label, on
//! verbs the RoCEv2 source port the RNIC derives from the flow label.
//!
//! Two directions are traced: the forward path of every inter-ToR (target, label) this shard
//! probes, and, as responder, the path its answers take back to each (prober, label): a probe is
//! lost on either. Each is traced on first use, again every `refresh_s`, and again soon after a
//! probe of that (target, label) is lost (at most once per `min_retrace_interval_s`), all under
//! one token bucket per shard (`traces_per_s`), at most [`MAX_FLIGHTS`] at once. A trace is
//! written as a [`rocemesh_formats::record::PathRecord`] whose hops are the answering addresses;
//! `analyze` maps them to switches through the inventory.
//!
//! Owns: the trace table and its schedule, the raw sockets (an IPPROTO_RAW one to send, an ICMP
//! one bound to the shard's address to read the answers), and the tracing counters. Needs
//! CAP_NET_RAW; without it [`PathTracer::open`] says so and the shard probes without tracing.
//!
//! A trace packet that reaches its destination (the TTL one past the last switch) carries a
//! payload starting with [`TRACE_MAGIC`], which a responder counts and otherwise ignores.
//!
//! Not allocation-free per trace (a finished trace names its hops as text in the dictionary),
//! but per probe it is: [`PathTracer::on_probe`] indexes a table sized at pinglist load, and
//! [`PathTracer::on_answer`] looks up a map whose capacity is reserved at start.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::io;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use rocemesh_formats::record::MAX_HOPS;

use crate::errlog::ErrorLog;

/// First bytes of a trace packet's payload.
pub const TRACE_MAGIC: [u8; 4] = *b"RMTR";
/// Payload length: the probes' length, so that size-based policies treat traces alike.
const PAYLOAD_BYTES: usize = crate::protocol::PACKET_BYTES;
const PACKET_BYTES: usize = 20 + 8 + PAYLOAD_BYTES;
/// Traces in flight at once per shard (a slot index takes 4 bits of the IP ID).
pub const MAX_FLIGHTS: usize = 16;
/// Sends of each TTL a trace makes at most before it gives up on the missing hops.
const ATTEMPTS: u8 = 4;
/// Time for the answers of one round of a trace.
const ATTEMPT_TIMEOUT_NS: u64 = 400_000_000;
/// Highest TTL: one past [`MAX_HOPS`] switches, and it must fit the IP ID's 4 bits.
pub const MAX_TTL: u8 = MAX_HOPS as u8 + 1;
/// (prober, label) pairs a responder traces at most; more are counted, not traced.
pub const MAX_PEERS: usize = 4096;
/// ICMP answers read per poll at most.
const MAX_REPLIES_PER_POLL: usize = 64;
const REPLY_BYTES: usize = 576;
const ICMP_DEST_UNREACH: u8 = 3;
const ICMP_PORT_UNREACH: u8 = 3;
const ICMP_TIME_EXCEEDED: u8 = 11;
// linux/icmp.h: a raw ICMP socket's type filter (a bit set means "drop this type").
const SOL_RAW: libc::c_int = 255;
const ICMP_FILTER: libc::c_int = 1;

const ERR_SEND: usize = 0;
const ERR_RECV: usize = 1;
const ERROR_NAMES: [&str; 2] = ["trace_send", "trace_recv"];

/// The addresses and ports of a flow as it appears on the wire, and its IP TOS byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WireTuple {
    pub src: SocketAddrV4,
    pub dst: SocketAddrV4,
    pub tos: u8,
}

/// `[path_tracing]` values the tracer runs on (see `config::PathTracing`).
#[derive(Clone, Copy, Debug)]
pub struct TraceParams {
    pub refresh_ns: u64,
    pub min_retrace_ns: u64,
    pub traces_per_s: f64,
    pub max_ttl: u8,
}

/// Tracing counters of one shard.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PathStats {
    /// Traces begun.
    pub started: u64,
    /// Traces written as path records.
    pub written: u64,
    /// Traces that ended with a hop that never answered (loss, or a switch that does not send
    /// ICMP), or a path longer than `max_ttl`: not written, retried after `min_retrace_interval_s`.
    pub incomplete: u64,
    /// Traces that found at most one switch (the target shares this ToR): nothing to write.
    pub single_switch: u64,
    /// Traces a router answered with "unreachable": not written.
    pub unreachable: u64,
    /// Traces the transport could not give a 5-tuple for (IPv6, an unresolved target).
    pub untraceable: u64,
    /// Trace packets sent.
    pub packets_sent: u64,
    /// Trace packets the kernel refused (counted and logged, the trace goes on without them).
    pub send_errors: u64,
    /// ICMP answers that matched a trace packet.
    pub replies: u64,
    /// ICMP messages to this address that answer something else (not an error).
    pub foreign_icmp: u64,
    /// Reads of the ICMP socket that failed.
    pub recv_errors: u64,
    /// (prober, label) pairs not traced because [`MAX_PEERS`] were already.
    pub peers_full: u64,
    /// Answer paths no longer traced: no answer along them for `refresh_s` (a prober gone or
    /// restarted with new ports).
    pub peers_retired: u64,
}

/// Why tracing could not start.
#[derive(Debug, thiserror::Error)]
pub enum PathTraceError {
    #[error(
        "opening a raw socket needs CAP_NET_RAW ({0}); run the agent as root or grant it: \
         `setcap cap_net_raw+ep $(which rocemesh-agent)`, or set [path_tracing] enabled = false"
    )]
    Capability(io::Error),
    #[error("{op} failed: {source}")]
    Socket { op: &'static str, source: io::Error },
}

/// What a finished trace found: enough for a path record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Traced {
    /// Forward: the target's dictionary id. Answer path: `None`, see `peer`.
    pub target_id: Option<u32>,
    /// Answer path: the prober's address.
    pub peer: Ipv4Addr,
    pub flow_label: u32,
    /// When the trace began (wall clock, ns).
    pub started_ns: u64,
    pub hop_count: usize,
    pub hops: [Ipv4Addr; MAX_HOPS],
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    /// Forward: the target's dictionary id. Answer path: unused.
    target_id: u32,
    /// Answer path: the flow's tuple, fixed when the entry is made.
    tuple: Option<WireTuple>,
    label: u32,
    /// Next trace (u64::MAX: none wanted yet).
    due_ns: u64,
    /// Start of the last finished trace; 0: never traced.
    last_ns: u64,
    /// Switches the last complete trace found (0: unknown), to send no more TTLs than needed.
    hops_known: u8,
    busy: bool,
    /// Answer path: the last answer along it. A prober that restarts takes new source ports, and
    /// the path to its old ones must not be traced (and written under the same label) forever.
    seen_ns: u64,
}

impl Entry {
    fn new(target_id: u32, tuple: Option<WireTuple>, label: u32) -> Self {
        Self { target_id, tuple, label, due_ns: u64::MAX, last_ns: 0, hops_known: 0, busy: false, seen_ns: 0 }
    }
}

fn peer_key(tuple: &WireTuple, label: u32) -> (u32, u16, u16, u32) {
    (u32::from(*tuple.dst.ip()), tuple.dst.port(), tuple.src.port(), label)
}

/// An entry reference: forward entries by index, peers with the top bit set.
type Ref = u32;
const PEER_BIT: Ref = 1 << 31;

#[derive(Clone, Copy, Debug)]
struct Flight {
    entry: Ref,
    /// The forward entry's (target id, label) when the flight began: a pinglist reload rebuilds
    /// the forward table, and the flight finds its entry again by them.
    target_id: u32,
    label: u32,
    tuple: WireTuple,
    generation: u8,
    started_ns: u64,
    deadline_ns: u64,
    attempt: u8,
    /// TTLs 1..=sent_upto have been sent.
    sent_upto: u8,
    /// The address that answered each TTL (index ttl - 1).
    hops: [Option<Ipv4Addr>; MAX_TTL as usize],
    /// The destination answered "port unreachable" at this TTL (0: not seen).
    reached_at: u8,
    unreachable: bool,
    active: bool,
}

impl Default for Flight {
    fn default() -> Self {
        let any = SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0);
        Self {
            entry: 0,
            target_id: 0,
            label: 0,
            tuple: WireTuple { src: any, dst: any, tos: 0 },
            generation: 0,
            started_ns: 0,
            deadline_ns: 0,
            attempt: 0,
            sent_upto: 0,
            hops: [None; MAX_TTL as usize],
            reached_at: 0,
            unreachable: false,
            active: false,
        }
    }
}

/// One shard's path tracer.
pub struct PathTracer {
    params: TraceParams,
    local: Ipv4Addr,
    send: OwnedFd,
    icmp: OwnedFd,
    /// Forward entries, `base[target index] + label index`.
    forward: Vec<Entry>,
    /// First forward entry of each pinglist target (u32::MAX: not traced, e.g. same ToR).
    base: Vec<u32>,
    /// Target index by dictionary id, for losses (a probe record knows only the id).
    by_id: HashMap<u32, u32>,
    peers: Vec<Entry>,
    /// (prober address, prober port, our source port, label) -> peer entry.
    peer_index: HashMap<(u32, u16, u16, u32), u32>,
    /// Peer entries no longer answered, free for reuse.
    free_peers: Vec<u32>,
    schedule: BinaryHeap<Reverse<(u64, Ref)>>,
    flights: [Flight; MAX_FLIGHTS],
    done: Vec<Traced>,
    tokens: f64,
    refilled_ns: u64,
    next_drain_ns: u64,
    reply: Box<[u8; REPLY_BYTES]>,
    stats: PathStats,
    errors: ErrorLog<2>,
}

impl std::fmt::Debug for PathTracer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PathTracer").field("local", &self.local).field("stats", &self.stats).finish_non_exhaustive()
    }
}

fn raw_socket(protocol: libc::c_int) -> Result<OwnedFd, PathTraceError> {
    // SAFETY: plain syscall; the result is checked before use.
    let fd =
        unsafe { libc::socket(libc::AF_INET, libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC, protocol) };
    if fd < 0 {
        let e = io::Error::last_os_error();
        return Err(match e.raw_os_error() {
            Some(libc::EPERM | libc::EACCES) => PathTraceError::Capability(e),
            _ => PathTraceError::Socket { op: "socket(AF_INET, SOCK_RAW)", source: e },
        });
    }
    // SAFETY: `fd` is a fresh descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn sockaddr(a: SocketAddrV4) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: a.port().to_be(),
        sin_addr: libc::in_addr { s_addr: u32::from(*a.ip()).to_be() },
        sin_zero: [0; 8],
    }
}

/// Whether a received datagram is a trace packet that reached its destination.
pub fn is_trace_payload(payload: &[u8]) -> bool {
    payload.len() >= TRACE_MAGIC.len() && payload[..TRACE_MAGIC.len()] == TRACE_MAGIC
}

/// The IP ID of a trace packet: which flight (and which incarnation of it) and which TTL, so
/// that the answer quoting it finds its trace. Routers do not rewrite it.
fn ip_id(generation: u8, slot: usize, ttl: u8) -> u16 {
    (u16::from(generation) << 8) | ((slot as u16) << 4) | u16::from(ttl & 0xF)
}

/// Builds a trace packet: IPv4 header (checksum and total length are the kernel's, with
/// IP_HDRINCL), UDP header with checksum 0 (none, legal on IPv4; RoCEv2 sends 0 too), payload.
fn build_packet(out: &mut [u8; PACKET_BYTES], t: &WireTuple, ttl: u8, id: u16) {
    out.fill(0);
    out[0] = 0x45;
    out[1] = t.tos;
    out[2..4].copy_from_slice(&(PACKET_BYTES as u16).to_be_bytes());
    out[4..6].copy_from_slice(&id.to_be_bytes());
    // DF: a trace must not be fragmented differently from a probe.
    out[6] = 0x40;
    out[8] = ttl;
    out[9] = libc::IPPROTO_UDP as u8;
    out[12..16].copy_from_slice(&t.src.ip().octets());
    out[16..20].copy_from_slice(&t.dst.ip().octets());
    out[20..22].copy_from_slice(&t.src.port().to_be_bytes());
    out[22..24].copy_from_slice(&t.dst.port().to_be_bytes());
    out[24..26].copy_from_slice(&((8 + PAYLOAD_BYTES) as u16).to_be_bytes());
    out[28..32].copy_from_slice(&TRACE_MAGIC);
    out[32] = ttl;
}

/// What an ICMP message says about one of our trace packets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Answer {
    from: Ipv4Addr,
    icmp_type: u8,
    icmp_code: u8,
    id: u16,
    /// The quoted packet's destination and ports.
    dst: Ipv4Addr,
    sport: u16,
    dport: u16,
}

/// Parses an ICMP error read from a raw socket (outer IP header, ICMP header, the quoted IP
/// header and at least 8 bytes of its UDP header); `None` for anything else or anything short.
fn parse_answer(b: &[u8], local: Ipv4Addr) -> Option<Answer> {
    let ihl = usize::from(b.first()? & 0x0F) * 4;
    if ihl < 20 || b.len() < ihl + 8 {
        return None;
    }
    let from = Ipv4Addr::new(b[12], b[13], b[14], b[15]);
    let (icmp_type, icmp_code) = (b[ihl], b[ihl + 1]);
    let q = &b[ihl + 8..];
    let qihl = usize::from(q.first()? & 0x0F) * 4;
    if q[0] >> 4 != 4 || qihl < 20 || q.len() < qihl + 8 || q[9] != libc::IPPROTO_UDP as u8 {
        return None;
    }
    if Ipv4Addr::new(q[12], q[13], q[14], q[15]) != local {
        return None;
    }
    let u = &q[qihl..];
    Some(Answer {
        from,
        icmp_type,
        icmp_code,
        id: u16::from_be_bytes([q[4], q[5]]),
        dst: Ipv4Addr::new(q[16], q[17], q[18], q[19]),
        sport: u16::from_be_bytes([u[0], u[1]]),
        dport: u16::from_be_bytes([u[2], u[3]]),
    })
}

/// A spread of ±12.5% around `period`, fixed per entry, so that traces started together (a
/// pinglist load) do not refresh together forever.
fn jittered(period: u64, salt: u64) -> u64 {
    let h = salt.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 61; // 0..8
    period - period / 8 + period / 32 * h
}

impl PathTracer {
    /// Opens the sockets for a shard probing from `local`. `scope` names the shard in logs.
    pub fn open(local: Ipv4Addr, params: TraceParams, scope: &str) -> Result<Self, PathTraceError> {
        assert!(params.max_ttl >= 2 && params.max_ttl <= MAX_TTL, "validated by the config");
        let send = raw_socket(libc::IPPROTO_RAW)?;
        let icmp = raw_socket(libc::IPPROTO_ICMP)?;
        // Only the two types a trace can get back; echo replies and the rest stay in the kernel.
        let filter: u32 = !((1u32 << ICMP_TIME_EXCEEDED) | (1u32 << ICMP_DEST_UNREACH));
        // SAFETY: valid descriptor; `filter` is a live u32.
        let rc = unsafe {
            libc::setsockopt(
                icmp.as_raw_fd(),
                SOL_RAW,
                ICMP_FILTER,
                (&raw const filter).cast(),
                size_of::<u32>() as u32,
            )
        };
        if rc != 0 {
            return Err(PathTraceError::Socket { op: "setsockopt(ICMP_FILTER)", source: io::Error::last_os_error() });
        }
        // Bound to the shard's address: answers to another shard's traces are not ours to read.
        let sa = sockaddr(SocketAddrV4::new(local, 0));
        // SAFETY: `sa` is a valid sockaddr_in.
        let rc = unsafe {
            libc::bind(icmp.as_raw_fd(), (&raw const sa).cast(), size_of::<libc::sockaddr_in>() as libc::socklen_t)
        };
        if rc != 0 {
            return Err(PathTraceError::Socket { op: "bind(ICMP socket)", source: io::Error::last_os_error() });
        }
        Ok(Self {
            params,
            local,
            send,
            icmp,
            forward: Vec::new(),
            base: Vec::new(),
            by_id: HashMap::new(),
            peers: Vec::with_capacity(MAX_PEERS),
            peer_index: HashMap::with_capacity(MAX_PEERS),
            free_peers: Vec::with_capacity(MAX_PEERS),
            schedule: BinaryHeap::with_capacity(2 * MAX_PEERS),
            flights: [Flight::default(); MAX_FLIGHTS],
            done: Vec::with_capacity(MAX_FLIGHTS),
            tokens: params.traces_per_s.max(1.0),
            refilled_ns: 0,
            next_drain_ns: 0,
            reply: Box::new([0; REPLY_BYTES]),
            stats: PathStats::default(),
            errors: ErrorLog::new(scope.to_owned(), ERROR_NAMES),
        })
    }

    /// Counters.
    pub fn stats(&self) -> PathStats {
        let mut s = self.stats;
        s.send_errors = self.errors.count(ERR_SEND);
        s.recv_errors = self.errors.count(ERR_RECV);
        s
    }

    /// Takes a new pinglist's targets: `(dictionary id, traced, labels)` in target order
    /// (`traced`: inter-ToR). What was known of a (target, label) both lists have is kept, so a
    /// reload does not trace everything again.
    pub fn load<'a>(&mut self, targets: impl Iterator<Item = (u32, bool, &'a [u32])>) {
        let old: HashMap<(u32, u32), Entry> = self.forward.iter().map(|e| ((e.target_id, e.label), *e)).collect();
        self.forward.clear();
        self.base.clear();
        self.by_id.clear();
        for (i, (id, traced, labels)) in targets.enumerate() {
            if !traced {
                self.base.push(u32::MAX);
                continue;
            }
            self.base.push(self.forward.len() as u32);
            self.by_id.insert(id, i as u32);
            for &label in labels {
                let e = old.get(&(id, label)).copied().unwrap_or_else(|| Entry::new(id, None, label));
                self.forward.push(e);
            }
        }
        self.schedule.clear();
        self.schedule.reserve(2 * (self.forward.len() + self.peers.len()) + MAX_FLIGHTS);
        let due: Vec<(u64, Ref)> = (self.forward.iter().enumerate().map(|(i, e)| (e.due_ns, i as Ref)))
            .chain(self.peers.iter().enumerate().map(|(i, e)| (e.due_ns, i as Ref | PEER_BIT)))
            .filter(|(d, _)| *d != u64::MAX)
            .collect();
        for (d, r) in due {
            self.schedule.push(Reverse((d, r)));
        }
    }

    fn entry_mut(&mut self, r: Ref) -> &mut Entry {
        if r & PEER_BIT != 0 { &mut self.peers[(r & !PEER_BIT) as usize] } else { &mut self.forward[r as usize] }
    }

    /// Wants entry `r` traced by `at` (earlier wishes win).
    fn want(&mut self, r: Ref, at: u64) {
        let e = self.entry_mut(r);
        if e.busy || e.due_ns <= at {
            return;
        }
        e.due_ns = at;
        self.schedule.push(Reverse((at, r)));
    }

    /// A probe to pinglist target `target` with its `label_index`-th label is going out: the
    /// first one of a (target, label) asks for its trace. O(1), no allocation.
    pub fn on_probe(&mut self, target: usize, label_index: usize, now_ns: u64) {
        let Some(&base) = self.base.get(target) else { return };
        if base == u32::MAX {
            return;
        }
        let r = base + label_index as u32;
        let e = &self.forward[r as usize];
        if e.last_ns == 0 && e.due_ns == u64::MAX && !e.busy {
            self.want(r, now_ns);
        }
    }

    /// A probe to the target with dictionary id `target_id` and `label` was lost: trace that
    /// (target, label) again soon, unless it was traced within `min_retrace_interval_s`.
    pub fn on_loss(&mut self, target_id: u32, label: u32, now_ns: u64) {
        let Some(&t) = self.by_id.get(&target_id) else { return };
        let base = self.base[t as usize] as usize;
        let Some(off) =
            self.forward[base..].iter().take_while(|e| e.target_id == target_id).position(|e| e.label == label)
        else {
            return;
        };
        let r = (base + off) as Ref;
        let last = self.forward[r as usize].last_ns;
        let at = if last == 0 { now_ns } else { now_ns.max(last + self.params.min_retrace_ns) };
        self.want(r, at);
    }

    /// This shard answers a probe with `label` along `tuple` (our address and port to the
    /// prober's): the first answer of each (prober, port, label) asks for the answer path's trace.
    pub fn on_answer(&mut self, tuple: WireTuple, label: u32, now_ns: u64) {
        let key = peer_key(&tuple, label);
        if let Some(&i) = self.peer_index.get(&key) {
            self.peers[i as usize].seen_ns = now_ns;
            return;
        }
        let mut e = Entry::new(0, Some(tuple), label);
        e.seen_ns = now_ns;
        let i = if let Some(i) = self.free_peers.pop() {
            self.peers[i as usize] = e;
            i
        } else if self.peers.len() < MAX_PEERS {
            self.peers.push(e);
            self.peers.len() as u32 - 1
        } else {
            self.stats.peers_full += 1;
            return;
        };
        self.peer_index.insert(key, i);
        self.want(i | PEER_BIT, now_ns);
    }

    /// Whether peer entry `r` has had no answer for a refresh period: then it is freed instead
    /// of traced.
    fn retire_if_gone(&mut self, r: Ref, now_ns: u64) -> bool {
        if r & PEER_BIT == 0 {
            return false;
        }
        let i = r & !PEER_BIT;
        let e = self.peers[i as usize];
        if e.seen_ns + self.params.refresh_ns > now_ns {
            return false;
        }
        if let Some(t) = e.tuple {
            self.peer_index.remove(&peer_key(&t, e.label));
        }
        self.peers[i as usize].due_ns = u64::MAX;
        self.peers[i as usize].tuple = None;
        self.free_peers.push(i);
        self.stats.peers_retired += 1;
        true
    }

    /// CLOCK_REALTIME stepped by `delta_ns` (see the shard's `follow_clock_steps`): every timer
    /// moves with it, so a step back does not hold traces until the clock catches up and a step
    /// forward does not time out the flights under way. A flight across the step keeps the hops
    /// it has.
    pub fn shift_clock(&mut self, delta_ns: i64) {
        let shift = |t: &mut u64| {
            if *t != 0 && *t != u64::MAX {
                *t = t.saturating_add_signed(delta_ns);
            }
        };
        for e in self.forward.iter_mut().chain(self.peers.iter_mut()) {
            shift(&mut e.due_ns);
            shift(&mut e.last_ns);
            shift(&mut e.seen_ns);
        }
        for f in self.flights.iter_mut().filter(|f| f.active) {
            shift(&mut f.started_ns);
            shift(&mut f.deadline_ns);
        }
        // Rebuilt in place: into_vec and from reuse the heap's buffer.
        let mut due = std::mem::take(&mut self.schedule).into_vec();
        for Reverse((t, _)) in &mut due {
            shift(t);
        }
        self.schedule = BinaryHeap::from(due);
        shift(&mut self.refilled_ns);
        shift(&mut self.next_drain_ns);
    }

    /// When [`PathTracer::poll`] next has something to do without input.
    pub fn next_deadline_ns(&self) -> u64 {
        let mut t = u64::MAX;
        for f in self.flights.iter().filter(|f| f.active) {
            t = t.min(f.deadline_ns);
        }
        if let Some(Reverse((due, _))) = self.schedule.peek()
            && self.flights.iter().any(|f| !f.active)
        {
            // A due trace waits for a token: at most a second at any rate >= 1/s.
            let token_wait =
                if self.tokens >= 1.0 { 0 } else { ((1.0 - self.tokens) / self.params.traces_per_s * 1e9) as u64 };
            t = t.min((*due).max(self.refilled_ns + token_wait));
        }
        t
    }

    /// One round: read answers, finish or retry flights, start due traces. `tuple_of(target
    /// index, label)` is the transport's 5-tuple of a forward (target, label). Finished traces
    /// are collected for [`PathTracer::take_done`].
    pub fn poll(&mut self, now_ns: u64, tuple_of: impl Fn(usize, u32) -> Option<WireTuple>) {
        // A read is a syscall: every round while traces are out, else once a second to drain
        // late answers and other hosts' ICMP errors from the socket.
        if self.flights.iter().any(|f| f.active) || now_ns >= self.next_drain_ns {
            self.next_drain_ns = now_ns + 1_000_000_000;
            self.read_answers(now_ns);
        }
        for slot in 0..MAX_FLIGHTS {
            if self.flights[slot].active {
                self.advance(slot, now_ns);
            }
        }
        self.start_due(now_ns, tuple_of);
    }

    /// Traces finished since the last call.
    pub fn take_done(&mut self) -> std::vec::Drain<'_, Traced> {
        self.done.drain(..)
    }

    fn read_answers(&mut self, now_ns: u64) {
        for _ in 0..MAX_REPLIES_PER_POLL {
            // SAFETY: the buffer is ours and REPLY_BYTES long.
            let n = unsafe {
                libc::recv(self.icmp.as_raw_fd(), self.reply.as_mut_ptr().cast(), REPLY_BYTES, libc::MSG_DONTWAIT)
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::WouldBlock {
                    self.errors.record(
                        ERR_RECV,
                        now_ns,
                        format_args!("reading ICMP answers to path traces failed: {e}"),
                    );
                }
                return;
            }
            let Some(a) = parse_answer(&self.reply[..n as usize], self.local) else {
                self.stats.foreign_icmp += 1;
                continue;
            };
            let (generation, slot, ttl) = ((a.id >> 8) as u8, usize::from((a.id >> 4) & 0xF), (a.id & 0xF) as u8);
            let f = &mut self.flights[slot];
            let ours = f.active
                && f.generation == generation
                && (1..=f.sent_upto).contains(&ttl)
                && a.dst == *f.tuple.dst.ip()
                && a.sport == f.tuple.src.port()
                && a.dport == f.tuple.dst.port();
            if !ours {
                self.stats.foreign_icmp += 1;
                continue;
            }
            self.stats.replies += 1;
            match (a.icmp_type, a.icmp_code) {
                (ICMP_TIME_EXCEEDED, _) => f.hops[usize::from(ttl) - 1] = Some(a.from),
                (ICMP_DEST_UNREACH, ICMP_PORT_UNREACH) if a.from == *f.tuple.dst.ip() => {
                    f.reached_at = if f.reached_at == 0 { ttl } else { f.reached_at.min(ttl) };
                }
                _ => f.unreachable = true,
            }
        }
    }

    /// Highest TTL a switch answered, and whether every TTL below it answered too.
    fn answered(f: &Flight) -> (u8, bool) {
        let top = f.hops.iter().rposition(Option::is_some).map_or(0, |i| i as u8 + 1);
        (top, f.hops[..usize::from(top)].iter().all(Option::is_some))
    }

    fn advance(&mut self, slot: usize, now_ns: u64) {
        let f = self.flights[slot];
        let known = self.entry_known(&f);
        let (top, _) = Self::answered(&f);
        if f.unreachable {
            self.stats.unreachable += 1;
            return self.finish(slot, now_ns, false);
        }
        // The destination said where it is (a closed port answers): nothing more to wait for.
        let gapless_to = |n: u8| f.hops[..usize::from(n)].iter().all(Option::is_some);
        if f.reached_at != 0 && top + 1 == f.reached_at && gapless_to(top) {
            return self.finish(slot, now_ns, true);
        }
        if now_ns < f.deadline_ns {
            return;
        }
        if top == f.sent_upto {
            if f.sent_upto == self.params.max_ttl {
                // Longer than max_ttl: nothing to write that names the whole path.
                self.stats.incomplete += 1;
                return self.finish(slot, now_ns, false);
            }
            // Longer than last time: go on from there (not a retry).
            let upto = self.params.max_ttl;
            self.send_round(slot, f.sent_upto + 1, upto, now_ns);
            self.flights[slot].sent_upto = upto;
            self.flights[slot].deadline_ns = now_ns + ATTEMPT_TIMEOUT_NS;
            return;
        }
        let last_round = f.attempt + 1 >= ATTEMPTS;
        // Hops that must answer: as many as answered or as last time, whichever is more.
        let want = top.max(known).min(f.sent_upto);
        if gapless_to(want) && top >= known {
            // Every switch up to `top` answered and the TTL past it did not: that packet reached
            // the destination (which does not answer) or was lost. The first time, only silence
            // in every round tells the two apart; once the length is known, it does.
            if known != 0 || last_round {
                return self.finish(slot, now_ns, true);
            }
            self.send_one(slot, top + 1, now_ns);
        } else if last_round {
            self.stats.incomplete += 1;
            if gapless_to(top) && top < known {
                // Shorter than last time, or its last hops lost four times over: the next trace
                // starts from scratch rather than wait for hops that may no longer exist.
                if let Some(r) = self.entry_of(&f) {
                    self.entry_mut(r).hops_known = 0;
                }
            }
            return self.finish(slot, now_ns, false);
        } else {
            // Ask again for the hops that did not answer (all of them if none did).
            let upto = if want == 0 { f.sent_upto } else { want };
            for ttl in 1..=upto {
                if f.hops[usize::from(ttl) - 1].is_none() {
                    self.send_one(slot, ttl, now_ns);
                }
            }
        }
        self.flights[slot].attempt += 1;
        self.flights[slot].deadline_ns = now_ns + ATTEMPT_TIMEOUT_NS;
    }

    /// Switches the flight's entry found last time (0: unknown or the entry is gone).
    fn entry_known(&self, f: &Flight) -> u8 {
        self.entry_of(f).map_or(0, |r| {
            if r & PEER_BIT != 0 {
                self.peers[(r & !PEER_BIT) as usize].hops_known
            } else {
                self.forward[r as usize].hops_known
            }
        })
    }

    /// The flight's entry, if it still exists (a reload may have removed a forward one).
    fn entry_of(&self, f: &Flight) -> Option<Ref> {
        if f.entry & PEER_BIT != 0 {
            return Some(f.entry);
        }
        let e = self.forward.get(f.entry as usize)?;
        if e.target_id == f.target_id && e.label == f.label {
            return Some(f.entry);
        }
        let &t = self.by_id.get(&f.target_id)?;
        let base = self.base[t as usize] as usize;
        let off =
            self.forward[base..].iter().take_while(|e| e.target_id == f.target_id).position(|e| e.label == f.label)?;
        Some((base + off) as Ref)
    }

    fn finish(&mut self, slot: usize, now_ns: u64, complete: bool) {
        let f = self.flights[slot];
        self.flights[slot].active = false;
        let (top, _) = Self::answered(&f);
        let mut found = 0u8;
        if complete {
            if top <= 1 {
                self.stats.single_switch += 1;
            } else {
                let mut hops = [Ipv4Addr::UNSPECIFIED; MAX_HOPS];
                for (h, a) in hops.iter_mut().zip(&f.hops[..usize::from(top)]) {
                    *h = a.unwrap_or(Ipv4Addr::UNSPECIFIED);
                }
                let peer = f.entry & PEER_BIT != 0;
                self.done.push(Traced {
                    target_id: (!peer).then_some(f.target_id),
                    peer: *f.tuple.dst.ip(),
                    flow_label: f.label,
                    started_ns: f.started_ns,
                    hop_count: usize::from(top),
                    hops,
                });
                self.stats.written += 1;
            }
            found = top;
        }
        let (refresh, retry) = (self.params.refresh_ns, self.params.min_retrace_ns);
        let Some(r) = self.entry_of(&f) else { return };
        let e = self.entry_mut(r);
        e.busy = false;
        e.last_ns = f.started_ns;
        if complete {
            e.hops_known = found;
        }
        let next = if complete { f.started_ns + jittered(refresh, u64::from(r)) } else { now_ns + retry };
        e.due_ns = u64::MAX;
        self.want(r, next);
    }

    fn start_due(&mut self, now_ns: u64, tuple_of: impl Fn(usize, u32) -> Option<WireTuple>) {
        // Refill: burst of max(1, rate) traces.
        if self.refilled_ns == 0 {
            self.refilled_ns = now_ns;
        }
        let cap = self.params.traces_per_s.max(1.0);
        self.tokens =
            (self.tokens + now_ns.saturating_sub(self.refilled_ns) as f64 / 1e9 * self.params.traces_per_s).min(cap);
        self.refilled_ns = now_ns;
        while self.tokens >= 1.0 {
            let Some(&Reverse((due, r))) = self.schedule.peek() else { return };
            if due > now_ns {
                return;
            }
            let Some(slot) = self.flights.iter().position(|f| !f.active) else { return };
            self.schedule.pop();
            let e = *self.entry_mut(r);
            if e.due_ns != due || e.busy {
                continue; // stale: rescheduled or running since
            }
            if self.retire_if_gone(r, now_ns) {
                continue;
            }
            let tuple = match e.tuple {
                Some(t) => Some(t),
                None => {
                    let t = self.by_id.get(&e.target_id).copied();
                    t.and_then(|t| tuple_of(t as usize, e.label))
                }
            };
            let Some(tuple) = tuple else {
                self.stats.untraceable += 1;
                let retry = now_ns + self.params.refresh_ns;
                let e = self.entry_mut(r);
                e.due_ns = u64::MAX;
                self.want(r, retry);
                continue;
            };
            self.tokens -= 1.0;
            let entry = self.entry_mut(r);
            entry.busy = true;
            entry.due_ns = u64::MAX;
            let upto =
                if e.hops_known == 0 { self.params.max_ttl } else { (e.hops_known + 1).min(self.params.max_ttl) };
            let generation = self.flights[slot].generation.wrapping_add(1);
            self.flights[slot] = Flight {
                entry: r,
                target_id: e.target_id,
                label: e.label,
                tuple,
                generation,
                started_ns: now_ns,
                deadline_ns: now_ns + ATTEMPT_TIMEOUT_NS,
                attempt: 0,
                sent_upto: upto,
                active: true,
                ..Flight::default()
            };
            self.stats.started += 1;
            self.send_round(slot, 1, upto, now_ns);
        }
    }

    fn send_round(&mut self, slot: usize, from: u8, upto: u8, now_ns: u64) {
        for ttl in from..=upto {
            self.send_one(slot, ttl, now_ns);
        }
    }

    fn send_one(&mut self, slot: usize, ttl: u8, now_ns: u64) {
        let f = &self.flights[slot];
        let mut packet = [0u8; PACKET_BYTES];
        build_packet(&mut packet, &f.tuple, ttl, ip_id(f.generation, slot, ttl));
        let to = sockaddr(f.tuple.dst);
        // SAFETY: valid descriptor, buffer and sockaddr_in.
        let rc = unsafe {
            libc::sendto(
                self.send.as_raw_fd(),
                packet.as_ptr().cast(),
                PACKET_BYTES,
                libc::MSG_DONTWAIT,
                (&raw const to).cast(),
                size_of::<libc::sockaddr_in>() as libc::socklen_t,
            )
        };
        if rc < 0 {
            let e = io::Error::last_os_error();
            self.errors.record(
                ERR_SEND,
                now_ns,
                format_args!("a path trace packet to {} was not sent: {e}", f.tuple.dst),
            );
        } else {
            self.stats.packets_sent += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tuple() -> WireTuple {
        WireTuple {
            src: SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 2), 40_001),
            dst: SocketAddrV4::new(Ipv4Addr::new(10, 1, 0, 3), 18_515),
            tos: 0,
        }
    }

    /// The ICMP time exceeded a router at `from` sends for `packet` (outer header, ICMP header,
    /// the quoted IP header and 8 bytes of UDP, as RFC 792 requires at least).
    fn time_exceeded(from: Ipv4Addr, packet: &[u8], icmp_type: u8, code: u8) -> Vec<u8> {
        let mut b = vec![0u8; 20 + 8 + 28];
        b[0] = 0x45;
        b[9] = libc::IPPROTO_ICMP as u8;
        b[12..16].copy_from_slice(&from.octets());
        b[20] = icmp_type;
        b[21] = code;
        b[28..56].copy_from_slice(&packet[..28]);
        b
    }

    #[test]
    fn an_answer_quoting_a_trace_packet_names_its_flight_and_ttl() {
        let t = tuple();
        let mut p = [0u8; PACKET_BYTES];
        build_packet(&mut p, &t, 3, ip_id(7, 5, 3));
        assert!(is_trace_payload(&p[28..]));
        let hop = Ipv4Addr::new(172, 16, 0, 1);
        let a = parse_answer(&time_exceeded(hop, &p, ICMP_TIME_EXCEEDED, 0), *t.src.ip()).expect("ours");
        assert_eq!((a.from, a.icmp_type, a.dst, a.sport, a.dport), (hop, 11, *t.dst.ip(), 40_001, 18_515));
        assert_eq!((a.id >> 8, (a.id >> 4) & 0xF, a.id & 0xF), (7, 5, 3));
        // Another host's packet, or a truncated quote, is not ours.
        assert_eq!(parse_answer(&time_exceeded(hop, &p, 11, 0), Ipv4Addr::new(10, 0, 0, 9)), None);
        assert_eq!(parse_answer(&time_exceeded(hop, &p, 11, 0)[..50], *t.src.ip()), None);
        assert_eq!(parse_answer(&[], *t.src.ip()), None);
        assert_eq!(parse_answer(&[0x4F; 8], *t.src.ip()), None);
    }

    #[test]
    fn trace_packets_carry_the_probe_tuple_and_the_ttl() {
        let t = WireTuple { tos: 106, ..tuple() };
        let mut p = [0u8; PACKET_BYTES];
        build_packet(&mut p, &t, 2, 0x1234);
        assert_eq!((p[0], p[1], p[8], p[9]), (0x45, 106, 2, 17));
        assert_eq!(&p[12..16], &[10, 0, 0, 2]);
        assert_eq!(&p[16..20], &[10, 1, 0, 3]);
        assert_eq!(u16::from_be_bytes([p[20], p[21]]), 40_001);
        assert_eq!(u16::from_be_bytes([p[22], p[23]]), 18_515);
        assert_eq!(u16::from_be_bytes([p[4], p[5]]), 0x1234);
        assert!(!is_trace_payload(b"RMPB...."), "a probe is not a trace");
    }

    #[test]
    fn refresh_jitter_stays_within_an_eighth() {
        for salt in 0..1000 {
            let j = jittered(80_000, salt);
            assert!((70_000..=90_000).contains(&j), "{j}");
        }
    }
}
