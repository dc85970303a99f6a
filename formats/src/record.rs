//! The probe record and the path-trace record: what one probe (or one traceroute) leaves behind.
//!
//! [`ProbeRecord`] is the row an agent hands to the segment writer once per probe. On disk,
//! records are stored column-wise, one [`ProbeColumns`] per chunk (an rkyv archive of column
//! arrays), because the reader that matters, `analyze`, wants columns: it can hand whole
//! `&[u64]` slices to polars instead of transposing row by row (see docs/design/segments.md#the-probe-record and the
//! `bench formats` numbers for the row layout measured against it).
//!
//! Identities are compact `u32` ids resolved through the segment's endpoint dictionary
//! ([`Endpoint`]), not 16-byte GIDs per record: a shard probes at most a few thousand targets,
//! so the dictionary costs a few hundred KiB per segment while GIDs would cost 32 bytes per probe.
//!
//! Delays are kept, not the six raw timestamps: `network_rtt_ns`, `prober_delay_ns` and
//! `responder_delay_ns` are each computed inside one clock domain by the agent (rpingmesh's
//! wall-vs-monotonic bug; docs/design/segments.md#the-probe-record) and are exactly what analysis
//! needs; together with `t1_unix_ns` they give back T6-T1 = prober_delay + network_rtt +
//! responder_delay and T5-T2.

use rkyv::{Archive, Deserialize, Serialize};

/// Which of a probe's three packets were seen by the prober. A lost ACK2 after ACK1 is not a
/// lost probe: ACK1 proves the forward path and the responder alive (Pingmesh, R-Pingmesh).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Arrived(pub u8);

impl Arrived {
    /// The probe's own send completed (T2 known). A send error leaves this unset.
    pub const PROBE_SENT: u8 = 1;
    /// ACK1 (carrying T3) arrived back at the prober.
    pub const ACK1: u8 = 2;
    /// ACK2 (carrying T4) arrived back at the prober.
    pub const ACK2: u8 = 4;
    /// Every packet of the exchange.
    pub const ALL: Arrived = Arrived(Self::PROBE_SENT | Self::ACK1 | Self::ACK2);

    /// Whether `bit` (one of the constants above) is set.
    pub fn has(self, bit: u8) -> bool {
        self.0 & bit == bit
    }
}

/// How a probe ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Outcome {
    /// Every timestamp present and every derived delay plausible.
    Ok = 0,
    /// Not complete by the pinglist's timeout, or (verbs, `arrived` without `PROBE_SENT`) the
    /// target's address could not be resolved over the network past the start-up grace period.
    /// [`Arrived`] says how far it got. This is what analysis counts as network loss.
    Lost = 1,
    /// Timestamps present but a delay negative or absurd (clock step, NIC clock glitch).
    /// Counted, never silently dropped, and never used as a latency sample.
    Invalid = 2,
    /// The target's host answered that nothing listens (UDP: ICMP port unreachable): the host is
    /// up and reachable, its agent is not running. Not packet loss (Pingmesh: a dead peer is not
    /// a network drop); verbs has no such signal, and there a dead agent shows as `Lost`.
    Refused = 3,
    /// The probe never left this host, for a reason of this host's own: the local stack refused
    /// the send (no route in the local table, a full socket buffer), no send slot, the RNIC is
    /// gone, a local table is full, or the target is still being resolved at start-up. Counted
    /// per reason by the agent; never network loss, never a latency sample.
    LocalDrop = 4,
    /// The target is alive but keyed otherwise: it refused the probe for its authentication
    /// alone (a REFUSAL came back), or answered with packets this agent refused for theirs (a
    /// key roll-out that missed one of the two hosts). Classed [`Class::Refused`]: never
    /// network loss, never evidence; the agents count it by reason.
    AuthRefused = 5,
}

impl Outcome {
    /// Decode the on-disk byte; `None` for a value this build does not know.
    pub fn from_u8(v: u8) -> Option<Self> {
        match v {
            0 => Some(Self::Ok),
            1 => Some(Self::Lost),
            2 => Some(Self::Invalid),
            3 => Some(Self::Refused),
            4 => Some(Self::LocalDrop),
            5 => Some(Self::AuthRefused),
            _ => None,
        }
    }
}

/// Where the completion timestamps (T2..T5) came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum TsSource {
    /// NIC completion timestamps converted to wall-clock ns by the device (verbs, hardware).
    Nic = 0,
    /// Host clock: receive stamps read when the completion was polled, send stamps when the send
    /// was posted (soft-RoCE, or verbs without NIC timestamps).
    HostPoll = 1,
    /// Kernel socket timestamps (UDP transport, SO_TIMESTAMPING software).
    KernelSoftware = 2,
    /// Kernel socket timestamps taken by the NIC (UDP transport, SO_TIMESTAMPING hardware).
    KernelHardware = 3,
}

impl TsSource {
    /// Decode the on-disk byte; `None` for a value this build does not know.
    pub fn from_u8(v: u8) -> Option<Self> {
        match v {
            0 => Some(Self::Nic),
            1 => Some(Self::HostPoll),
            2 => Some(Self::KernelSoftware),
            3 => Some(Self::KernelHardware),
            _ => None,
        }
    }
}

/// One probe, as the agent reports it. 48 bytes; the archived form is identical in size.
///
/// Field order is widest first so that the archived struct has no padding.
#[derive(Archive, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
#[rkyv(derive(Debug))]
pub struct ProbeRecord {
    /// T1: host wall clock (CLOCK_REALTIME, ns since the Unix epoch) when the probe was posted.
    /// Windows in analysis are aligned on this.
    pub t1_unix_ns: u64,
    /// Probe sequence number; the high 32 bits are the prober's random epoch so that a previous
    /// run's ACKs are never matched to this run's probes.
    pub seq: u64,
    /// (T5-T2) - (T4-T3), each difference in one clock domain. 0 when not [`Outcome::Ok`].
    pub network_rtt_ns: i32,
    /// (T6-T1) - (T5-T2): time the probe and its ACK spent in the prober's host.
    pub prober_delay_ns: i32,
    /// T4-T3: time the probe spent in the responder's host.
    pub responder_delay_ns: i32,
    /// Dictionary id of the probing endpoint (the shard's RNIC).
    pub prober: u32,
    /// Dictionary id of the probed endpoint.
    pub target: u32,
    /// GRH flow label (verbs) or the flow label the UDP source port was derived from (UDP).
    pub flow_label: u32,
    /// Epoch the responder reported in its ACK; 0 when no ACK arrived. A change between two
    /// probes to the same target is an agent restart, not a network event.
    pub responder_epoch: u32,
    /// `ProbeKind` of the pinglist entry (tor_mesh = 0, inter_tor = 1, service = 2).
    pub kind: u8,
    /// [`Outcome`] as a byte.
    pub outcome: u8,
    /// [`Arrived`] bitmap.
    pub arrived: u8,
    /// [`TsSource`] as a byte.
    pub ts_source: u8,
}

/// RTT above this is not a measurement, it is a broken timestamp (rpingmesh's rule).
pub const ABSURD_RTT_NS: i64 = 10_000_000_000;
/// Host delays above this are a broken timestamp or a clock step.
pub const ABSURD_DELAY_NS: i64 = 1_000_000_000;

/// The three delays of the six-timestamp protocol from T1..T6 (`t[0]..t[5]`), each difference
/// inside one clock domain: `(network_rtt, prober_delay, responder_delay)`. `None` when a
/// timestamp is missing (0) or a delay is negative or absurd, which makes the probe
/// [`Outcome::Invalid`]. Shared by the agent and the simulator so that both classify alike.
pub fn six_timestamp_delays(t: [u64; 6]) -> Option<(i32, i32, i32)> {
    if t.contains(&0) {
        return None;
    }
    let d = |a: u64, b: u64| a as i64 - b as i64;
    let prober_span = d(t[4], t[1]);
    let responder = d(t[3], t[2]);
    let rtt = prober_span - responder;
    let prober = d(t[5], t[0]) - prober_span;
    let ok = (0..ABSURD_RTT_NS).contains(&rtt)
        && (0..ABSURD_DELAY_NS).contains(&prober)
        && (0..ABSURD_DELAY_NS).contains(&responder);
    ok.then(|| (rtt.min(i64::from(i32::MAX)) as i32, prober as i32, responder as i32))
}

/// Maximum switch hops kept per path trace; RoCE fabrics are 3-tier at most (5 switch hops).
pub const MAX_HOPS: usize = 8;

/// One path trace: the switches a given (src, dst, flow label) crosses. Rare (one per flow label
/// per refresh), so it is stored row-wise.
#[derive(Archive, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
#[rkyv(derive(Debug))]
pub struct PathRecord {
    /// When the trace was taken (host wall clock, ns since the Unix epoch).
    pub t_unix_ns: u64,
    /// Dictionary id of the source endpoint.
    pub src: u32,
    /// Dictionary id of the destination endpoint.
    pub dst: u32,
    /// Flow label the trace was sent with (the same label as the probes it explains).
    pub flow_label: u32,
    /// Number of valid entries in `hops`.
    pub hop_count: u32,
    /// Dictionary ids of the switches on the path, in order; `hops[hop_count..]` are 0.
    pub hops: [u32; MAX_HOPS],
}

const _: () = {
    assert!(size_of::<ProbeRecord>() == 48);
    assert!(size_of::<ArchivedProbeRecord>() == 48);
    assert!(align_of::<ArchivedProbeRecord>() <= 8);
    assert!(size_of::<ArchivedPathRecord>() == 56);
};

/// What a dictionary entry names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum EndpointRole {
    /// An RNIC (or, for the UDP transport, a probing address).
    Rnic = 0,
    /// A switch seen in path traces. Simulated traces name it (`spine2`) and leave `addr` zero;
    /// the agent's traces know only the address that answered (`name` is that address as text,
    /// `addr` the address, IPv4-mapped) and `analyze` maps it to a switch through the inventory.
    Switch = 1,
    /// A traced service connection (an RDMA QP of a job on this host, discovered by the `bpf`
    /// tracer): its probes follow the connection's own GIDs and flow label. `name` is unique per
    /// connection, `tor` and `addr` are the remote end's, and [`Endpoint::service`] says which
    /// connection it is.
    Service = 2,
    /// An address that probed this agent and is not in its pinglist, seen by a path trace of
    /// the answers to it (the ACK path). `name` is the address as text and `addr` the address;
    /// `analyze` names it after the RNIC whose own segments declare that address.
    Peer = 3,
}

/// One entry of a segment's dictionary: who a compact id in the records stands for.
#[derive(Archive, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash, Default)]
#[rkyv(derive(Debug))]
pub struct Endpoint {
    /// The id records use. Ids are dense from 0 within a segment.
    pub id: u32,
    /// [`EndpointRole`] as a byte.
    pub role: u8,
    /// Entity name, as in the inventory and in findings (`tor3-h5/mlx5_0`, `spine2`).
    pub name: String,
    /// ToR (or rail ToR) the endpoint hangs off; empty for switches and when unknown.
    pub tor: String,
    /// GID or IPv4-mapped IPv6 address (16 bytes, network order); all zero when unknown.
    pub addr: [u8; 16],
    /// For [`EndpointRole::Service`]: the connection. `None` for every other role.
    pub service: Option<ServiceConn>,
}

/// The RDMA connection a [`EndpointRole::Service`] endpoint stands for: enough for an operator to
/// find the job (pid, command) and the QP pair (`rdma resource show qp lqpn N`).
#[derive(Archive, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash, Default)]
#[rkyv(derive(Debug))]
pub struct ServiceConn {
    /// Process that brought the QP to RTR (the thread group id).
    pub pid: u32,
    /// Local QP number.
    pub local_qpn: u32,
    /// Remote QP number.
    pub remote_qpn: u32,
    /// The connection's flow label as its RoCEv2 packets carry it (the kernel's
    /// `rdma_calc_flow_label` when the application left it 0); the service probes use it.
    pub flow_label: u32,
    /// GRH traffic class of the connection.
    pub traffic_class: u8,
    /// The process's command (`comm`, at most 15 bytes).
    pub comm: String,
    /// The remote RNIC's entity name (`host/device`) when the agent could name it from its
    /// pinglist; empty otherwise (`analyze --inventory` resolves `addr`).
    pub remote: String,
}

/// The dictionary entry of schemas before [`ServiceConn`] (dictionary frames of kind 1): kept so
/// that segments written by earlier agents stay readable.
#[derive(Archive, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[rkyv(derive(Debug))]
pub struct EndpointV1 {
    pub id: u32,
    pub role: u8,
    pub name: String,
    pub tor: String,
    pub addr: [u8; 16],
}

impl From<EndpointV1> for Endpoint {
    fn from(e: EndpointV1) -> Self {
        Endpoint { id: e.id, role: e.role, name: e.name, tor: e.tor, addr: e.addr, service: None }
    }
}

/// A chunk of probe records, column-wise. Every column has the same length.
///
/// The writer keeps one of these preallocated to the chunk size and clears it after each flush,
/// so appending never allocates.
#[derive(Archive, Serialize, Clone, Debug, Default, PartialEq, Eq)]
#[rkyv(derive(Debug))]
pub struct ProbeColumns {
    /// See [`ProbeRecord::t1_unix_ns`].
    pub t1_unix_ns: Vec<u64>,
    /// See [`ProbeRecord::seq`].
    pub seq: Vec<u64>,
    /// See [`ProbeRecord::network_rtt_ns`].
    pub network_rtt_ns: Vec<i32>,
    /// See [`ProbeRecord::prober_delay_ns`].
    pub prober_delay_ns: Vec<i32>,
    /// See [`ProbeRecord::responder_delay_ns`].
    pub responder_delay_ns: Vec<i32>,
    /// See [`ProbeRecord::prober`].
    pub prober: Vec<u32>,
    /// See [`ProbeRecord::target`].
    pub target: Vec<u32>,
    /// See [`ProbeRecord::flow_label`].
    pub flow_label: Vec<u32>,
    /// See [`ProbeRecord::responder_epoch`].
    pub responder_epoch: Vec<u32>,
    /// See [`ProbeRecord::kind`].
    pub kind: Vec<u8>,
    /// See [`ProbeRecord::outcome`].
    pub outcome: Vec<u8>,
    /// See [`ProbeRecord::arrived`].
    pub arrived: Vec<u8>,
    /// See [`ProbeRecord::ts_source`].
    pub ts_source: Vec<u8>,
}

impl ProbeColumns {
    /// Columns with room for `records` rows, so that `push` does not allocate until then.
    pub fn with_capacity(records: usize) -> Self {
        Self {
            t1_unix_ns: Vec::with_capacity(records),
            seq: Vec::with_capacity(records),
            network_rtt_ns: Vec::with_capacity(records),
            prober_delay_ns: Vec::with_capacity(records),
            responder_delay_ns: Vec::with_capacity(records),
            prober: Vec::with_capacity(records),
            target: Vec::with_capacity(records),
            flow_label: Vec::with_capacity(records),
            responder_epoch: Vec::with_capacity(records),
            kind: Vec::with_capacity(records),
            outcome: Vec::with_capacity(records),
            arrived: Vec::with_capacity(records),
            ts_source: Vec::with_capacity(records),
        }
    }

    /// Number of rows.
    pub fn len(&self) -> usize {
        self.t1_unix_ns.len()
    }

    /// Whether there are no rows.
    pub fn is_empty(&self) -> bool {
        self.t1_unix_ns.is_empty()
    }

    /// Append one row.
    #[inline]
    pub fn push(&mut self, r: &ProbeRecord) {
        self.t1_unix_ns.push(r.t1_unix_ns);
        self.seq.push(r.seq);
        self.network_rtt_ns.push(r.network_rtt_ns);
        self.prober_delay_ns.push(r.prober_delay_ns);
        self.responder_delay_ns.push(r.responder_delay_ns);
        self.prober.push(r.prober);
        self.target.push(r.target);
        self.flow_label.push(r.flow_label);
        self.responder_epoch.push(r.responder_epoch);
        self.kind.push(r.kind);
        self.outcome.push(r.outcome);
        self.arrived.push(r.arrived);
        self.ts_source.push(r.ts_source);
    }

    /// Remove every row, keeping the allocations.
    pub fn clear(&mut self) {
        self.t1_unix_ns.clear();
        self.seq.clear();
        self.network_rtt_ns.clear();
        self.prober_delay_ns.clear();
        self.responder_delay_ns.clear();
        self.prober.clear();
        self.target.clear();
        self.flow_label.clear();
        self.responder_epoch.clear();
        self.kind.clear();
        self.outcome.clear();
        self.arrived.clear();
        self.ts_source.clear();
    }

    /// Upper bound of the archived size of `records` rows, for sizing a write window.
    pub const fn archived_bound(records: usize) -> usize {
        // 2×8 + 7×4 + 4×1 bytes per row; each column padded to 16 at most; the root struct
        // is 13 relative pointers + lengths (8 bytes each with pointer_width_32).
        records * (2 * 8 + 7 * 4 + 4) + 13 * 16 + 13 * 8 + 16
    }
}

impl ArchivedProbeColumns {
    /// Number of rows.
    pub fn len(&self) -> usize {
        self.t1_unix_ns.len()
    }

    /// Whether there are no rows.
    pub fn is_empty(&self) -> bool {
        self.t1_unix_ns.is_empty()
    }

    /// Whether every column has the same length; a chunk that fails this is corrupt even when
    /// its checksum holds (a buggy or foreign writer).
    pub fn is_rectangular(&self) -> bool {
        let n = self.t1_unix_ns.len();
        [
            self.seq.len(),
            self.network_rtt_ns.len(),
            self.prober_delay_ns.len(),
            self.responder_delay_ns.len(),
            self.prober.len(),
            self.target.len(),
            self.flow_label.len(),
            self.responder_epoch.len(),
            self.kind.len(),
            self.outcome.len(),
            self.arrived.len(),
            self.ts_source.len(),
        ]
        .iter()
        .all(|&l| l == n)
    }

    /// Row `i` as an owned record (tests, tools; analysis reads the columns directly).
    ///
    /// # Panics
    /// When `i >= self.len()`.
    pub fn row(&self, i: usize) -> ProbeRecord {
        ProbeRecord {
            t1_unix_ns: self.t1_unix_ns[i].to_native(),
            seq: self.seq[i].to_native(),
            network_rtt_ns: self.network_rtt_ns[i].to_native(),
            prober_delay_ns: self.prober_delay_ns[i].to_native(),
            responder_delay_ns: self.responder_delay_ns[i].to_native(),
            prober: self.prober[i].to_native(),
            target: self.target[i].to_native(),
            flow_label: self.flow_label[i].to_native(),
            responder_epoch: self.responder_epoch[i].to_native(),
            kind: self.kind[i],
            outcome: self.outcome[i],
            arrived: self.arrived[i],
            ts_source: self.ts_source[i],
        }
    }
}

/// The description the schema hash is computed from. Any change to a record, a column or the
/// dictionary entry must change this string (and, if old files must stay readable, the reader).
pub const SCHEMA: &str = "outcome{ok=0,lost=1,invalid=2,refused=3,local_drop=4,auth_refused=5};probe_columns{t1_unix_ns:u64,seq:u64,network_rtt_ns:i32,\
prober_delay_ns:i32,responder_delay_ns:i32,prober:u32,target:u32,flow_label:u32,\
responder_epoch:u32,kind:u8,outcome:u8,arrived:u8,ts_source:u8};\
path_record{t_unix_ns:u64,src:u32,dst:u32,flow_label:u32,hop_count:u32,hops:[u32;8]};\
endpoint{id:u32,role:u8{rnic=0,switch=1,service=2,peer=3},name:str,tor:str,addr:[u8;16],\
service:opt<service_conn{pid:u32,local_qpn:u32,remote_qpn:u32,flow_label:u32,traffic_class:u8,comm:str,remote:str}>};\
window_summary{start_unix_ns:u64,window_ns:u64,late_max_ns:u64,late_sends:u32,stalls_dropped:u32,stalls:[(u64,u64)],\
keys:[key{first_t1_ns:u64,last_t1_ns:u64,first_ok_t1_ns:u64,prober:u32,target:u32,flow_label:u32,responder_epoch:u32,\
epoch_changes:u32,counts:[u32;7],cells_start:u32,cells_len:u32,kind:u8}],cells:[cell{count:u32,bucket:u16,measure:u8,ts_source:u8}]};\
rkyv0.8/le/align/pw32";

/// The schema before window summaries (frame kind 5), whose files hold none: the same records.
const SCHEMA_BEFORE_WINDOWS: &str = "outcome{ok=0,lost=1,invalid=2,refused=3,local_drop=4,auth_refused=5};probe_columns{t1_unix_ns:u64,seq:u64,network_rtt_ns:i32,\
prober_delay_ns:i32,responder_delay_ns:i32,prober:u32,target:u32,flow_label:u32,\
responder_epoch:u32,kind:u8,outcome:u8,arrived:u8,ts_source:u8};\
path_record{t_unix_ns:u64,src:u32,dst:u32,flow_label:u32,hop_count:u32,hops:[u32;8]};\
endpoint{id:u32,role:u8{rnic=0,switch=1,service=2},name:str,tor:str,addr:[u8;16],\
service:opt<service_conn{pid:u32,local_qpn:u32,remote_qpn:u32,flow_label:u32,traffic_class:u8,comm:str,remote:str}>};\
rkyv0.8/le/align/pw32";

/// FNV-1a of [`SCHEMA`]: written into every segment header and checked by every reader.
pub const SCHEMA_HASH: u64 = fnv1a64(SCHEMA.as_bytes());

/// Schemas this build reads besides its own. Their probe and path layouts are this one's. The
/// first is this one before window summaries, whose files simply hold no frame of kind 5. The
/// others' dictionary frames are [`EndpointV1`] (frame kind 1), which the reader converts, but for the
/// last one's (this schema before `auth_refused`), which never wrote outcome 5. The schema
/// before `local_drop` simply never wrote outcome 4. Segments that agents of earlier releases
/// wrote stay readable.
pub const READABLE_SCHEMA_HASHES: [u64; 5] = [
    SCHEMA_HASH,
    fnv1a64(SCHEMA_BEFORE_WINDOWS.as_bytes()),
    fnv1a64(
        b"outcome{ok=0,lost=1,invalid=2,refused=3,local_drop=4};probe_columns{t1_unix_ns:u64,seq:u64,network_rtt_ns:i32,\
prober_delay_ns:i32,responder_delay_ns:i32,prober:u32,target:u32,flow_label:u32,\
responder_epoch:u32,kind:u8,outcome:u8,arrived:u8,ts_source:u8};\
path_record{t_unix_ns:u64,src:u32,dst:u32,flow_label:u32,hop_count:u32,hops:[u32;8]};\
endpoint{id:u32,role:u8,name:str,tor:str,addr:[u8;16]};rkyv0.8/le/align/pw32",
    ),
    fnv1a64(
        b"outcome{ok=0,lost=1,invalid=2,refused=3};probe_columns{t1_unix_ns:u64,seq:u64,network_rtt_ns:i32,\
prober_delay_ns:i32,responder_delay_ns:i32,prober:u32,target:u32,flow_label:u32,\
responder_epoch:u32,kind:u8,outcome:u8,arrived:u8,ts_source:u8};\
path_record{t_unix_ns:u64,src:u32,dst:u32,flow_label:u32,hop_count:u32,hops:[u32;8]};\
endpoint{id:u32,role:u8,name:str,tor:str,addr:[u8;16]};rkyv0.8/le/align/pw32",
    ),
    fnv1a64(
        b"outcome{ok=0,lost=1,invalid=2,refused=3,local_drop=4};probe_columns{t1_unix_ns:u64,seq:u64,network_rtt_ns:i32,\
prober_delay_ns:i32,responder_delay_ns:i32,prober:u32,target:u32,flow_label:u32,\
responder_epoch:u32,kind:u8,outcome:u8,arrived:u8,ts_source:u8};\
path_record{t_unix_ns:u64,src:u32,dst:u32,flow_label:u32,hop_count:u32,hops:[u32;8]};\
endpoint{id:u32,role:u8{rnic=0,switch=1,service=2},name:str,tor:str,addr:[u8;16],\
service:opt<service_conn{pid:u32,local_qpn:u32,remote_qpn:u32,flow_label:u32,traffic_class:u8,comm:str,remote:str}>};\
rkyv0.8/le/align/pw32",
    ),
];

const fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut i = 0;
    while i < bytes.len() {
        h ^= bytes[i] as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
        i += 1;
    }
    h
}

/// What one probe record counts as, from its outcome byte and arrival bitmap: the one
/// classification `analyze` (every output) and the agent's live metrics share. The
/// discriminants are packed into bytes on the report's hot path (three bits, analyze's
/// `report::prepare`), so they stay below 8.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum Class {
    /// A complete exchange: a loss-free probe and an RTT and host-delay sample.
    Ok = 0,
    /// Lost before ACK1 came back: what loss is.
    Lost = 1,
    /// Only ACK2 missing: neither loss nor a sample.
    Partial = 2,
    /// Timestamps implausible.
    Invalid = 3,
    /// The peer's host refused (agent down), or the peer refused for authentication alone.
    Refused = 4,
    /// Never left the prober's host, for a reason of its own.
    LocalDrop = 5,
    /// An outcome byte this build does not know.
    Unknown = 6,
}

impl Class {
    /// Every class, in discriminant order.
    pub const ALL: [Class; 7] =
        [Class::Ok, Class::Lost, Class::Partial, Class::Invalid, Class::Refused, Class::LocalDrop, Class::Unknown];

    /// The class of a record from its outcome byte and arrival bitmap.
    #[inline]
    pub fn of(outcome: u8, arrived: u8) -> Class {
        const OK: u8 = Outcome::Ok as u8;
        const LOST: u8 = Outcome::Lost as u8;
        const INVALID: u8 = Outcome::Invalid as u8;
        const REFUSED: u8 = Outcome::Refused as u8;
        const LOCAL_DROP: u8 = Outcome::LocalDrop as u8;
        const AUTH_REFUSED: u8 = Outcome::AuthRefused as u8;
        match outcome {
            OK => Class::Ok,
            LOST if arrived & Arrived::ACK1 != 0 => Class::Partial,
            LOST => Class::Lost,
            INVALID => Class::Invalid,
            REFUSED | AUTH_REFUSED => Class::Refused,
            LOCAL_DROP => Class::LocalDrop,
            _ => Class::Unknown,
        }
    }

    /// The class of a discriminant; `None` above [`Class::Unknown`].
    pub fn from_u8(v: u8) -> Option<Class> {
        Class::ALL.get(usize::from(v)).copied()
    }

    /// The name used in every output (`local_drop`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Class::Ok => "ok",
            Class::Lost => "lost",
            Class::Partial => "partial",
            Class::Invalid => "invalid",
            Class::Refused => "refused",
            Class::LocalDrop => "local_drop",
            Class::Unknown => "unknown",
        }
    }

    /// Whether the probe is in the loss ratio's denominator (ok, partial, lost): it was sent
    /// into the network and its fate there is known.
    pub fn in_loss_denominator(self) -> bool {
        matches!(self, Class::Ok | Class::Partial | Class::Lost)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(i: u64) -> ProbeRecord {
        ProbeRecord {
            t1_unix_ns: 1_700_000_000_000_000_000 + i * 100_000,
            seq: (0xABCD_u64 << 32) | i,
            network_rtt_ns: 4_000 + (i % 7) as i32,
            prober_delay_ns: 2_000,
            responder_delay_ns: -1,
            prober: 0,
            target: (i % 33) as u32,
            flow_label: 0xF_FFFF,
            responder_epoch: 77,
            kind: 1,
            outcome: Outcome::Invalid as u8,
            arrived: Arrived::ALL.0,
            ts_source: TsSource::KernelSoftware as u8,
        }
    }

    #[test]
    fn columns_round_trip_through_rkyv() {
        let mut cols = ProbeColumns::with_capacity(100);
        let rows: Vec<_> = (0..100).map(sample).collect();
        for r in &rows {
            cols.push(r);
        }
        let bytes = rkyv::to_bytes::<rkyv::rancor::Error>(&cols).expect("serialise");
        assert!(bytes.len() <= ProbeColumns::archived_bound(100));
        let arch = rkyv::access::<ArchivedProbeColumns, rkyv::rancor::Error>(&bytes).expect("access");
        assert!(arch.is_rectangular());
        assert_eq!(arch.len(), 100);
        for (i, r) in rows.iter().enumerate() {
            assert_eq!(&arch.row(i), r);
        }
    }

    #[test]
    fn row_record_round_trips_and_has_fixed_size() {
        let r = sample(5);
        let bytes = rkyv::to_bytes::<rkyv::rancor::Error>(&r).expect("serialise");
        assert_eq!(bytes.len(), 48);
        let back = rkyv::from_bytes::<ProbeRecord, rkyv::rancor::Error>(&bytes).expect("read");
        assert_eq!(back, r);
    }

    #[test]
    fn enums_decode_only_known_values() {
        assert_eq!(Outcome::from_u8(2), Some(Outcome::Invalid));
        assert_eq!(Outcome::from_u8(3), Some(Outcome::Refused));
        assert_eq!(Outcome::from_u8(4), Some(Outcome::LocalDrop));
        assert_eq!(Outcome::from_u8(5), Some(Outcome::AuthRefused));
        assert_eq!(Outcome::from_u8(6), None);
        assert_eq!(Class::of(5, 0), Class::Refused, "refused by authentication is neither loss nor evidence");
        assert_eq!(TsSource::from_u8(3), Some(TsSource::KernelHardware));
        assert_eq!(TsSource::from_u8(9), None);
        assert!(Arrived(Arrived::PROBE_SENT | Arrived::ACK1).has(Arrived::ACK1));
        assert!(!Arrived(Arrived::PROBE_SENT | Arrived::ACK1).has(Arrived::ACK2));
    }

    #[test]
    fn earlier_schemas_stay_readable_and_differ_only_by_the_dictionary_and_local_drop() {
        let distinct: std::collections::HashSet<_> = READABLE_SCHEMA_HASHES.iter().collect();
        assert_eq!(distinct.len(), READABLE_SCHEMA_HASHES.len());
        // Window summaries are a frame kind of their own: the schema before them is this one
        // without them (and without the peer role's name, which it wrote all the same).
        let (records, windows) = SCHEMA.split_once("window_summary{").expect("window summaries in the schema");
        let (_, tail) = windows.split_once("};").expect("the window summary's end");
        assert_eq!(format!("{records}{tail}").replace(",peer=3}", "}"), SCHEMA_BEFORE_WINDOWS);
        // The hashes pinned by segments of earlier releases: before service endpoints (8bf8c11),
        // and before local_drop as well (f9b751e).
        let before = SCHEMA_BEFORE_WINDOWS;
        let v1_endpoint = "endpoint{id:u32,role:u8,name:str,tor:str,addr:[u8;16]};rkyv0.8/le/align/pw32";
        assert_eq!(fnv1a64(before.replace(",auth_refused=5}", "}").as_bytes()), READABLE_SCHEMA_HASHES[4]);
        let (head, _) = before.split_once("endpoint{").expect("endpoint in the schema");
        let head = head.replace(",auth_refused=5}", "}");
        let before_services = format!("{head}{v1_endpoint}");
        assert_eq!(fnv1a64(before_services.as_bytes()), READABLE_SCHEMA_HASHES[2]);
        let before_local_drop = before_services.replace(",local_drop=4}", "}");
        assert_eq!(fnv1a64(before_local_drop.as_bytes()), READABLE_SCHEMA_HASHES[3]);
    }

    #[test]
    fn archived_bound_holds_for_every_small_size() {
        let mut cols = ProbeColumns::with_capacity(64);
        for n in 0..64u64 {
            let bytes = rkyv::to_bytes::<rkyv::rancor::Error>(&cols).expect("serialise");
            assert!(bytes.len() <= ProbeColumns::archived_bound(n as usize), "n={n}");
            cols.push(&sample(n));
        }
    }
}
