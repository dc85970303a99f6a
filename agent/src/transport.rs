//! The transport a shard probes over, behind one trait so that the UDP transport (any Linux
//! box, CI) and the RDMA verbs transport (issue 7) run the same shard code.
//!
//! A transport is non-blocking and batch-oriented: the shard asks it for what has arrived and
//! for the send timestamps that have become known, into buffers sized once at shard start.

use std::io;
use std::os::fd::RawFd;

use rocemesh_formats::record::TsSource;

use crate::protocol::{Binding, PACKET_BYTES};

/// Datagrams one receive call returns at most.
pub const BATCH: usize = 64;
/// Packets one flush sends at most.
pub const SEND_BATCH: usize = 128;

/// What arrived: up to [`BATCH`] packets with their receive timestamps and senders.
#[derive(Debug)]
pub struct RxBatch<A> {
    /// Payload bytes; only `len[i]` of `buf[i]` are valid (a longer datagram is truncated and
    /// reported with `len = PACKET_BYTES + 1`, so it fails to decode).
    pub buf: Box<[[u8; PACKET_BYTES + 1]; BATCH]>,
    /// Length of each datagram.
    pub len: [usize; BATCH],
    /// Receive timestamp (ns, the transport's clock), 0 if the transport had none for it.
    pub rx_ns: [u64; BATCH],
    /// Sender.
    pub from: [A; BATCH],
    /// Which of the transport's own ends it arrived at ([`Transport::binding_at`]).
    pub at: [u8; BATCH],
}

impl<A: Copy> RxBatch<A> {
    /// An empty batch; `filler` initialises the address slots.
    pub fn new(filler: A) -> Self {
        Self {
            buf: Box::new([[0; PACKET_BYTES + 1]; BATCH]),
            len: [0; BATCH],
            rx_ns: [0; BATCH],
            from: [filler; BATCH],
            at: [0; BATCH],
        }
    }
}

/// Send timestamps that became known: the payload that was sent, and when it left.
#[derive(Debug)]
pub struct TxBatch {
    /// The sent packet (as the transport echoes it back).
    pub payload: Box<[[u8; PACKET_BYTES]; BATCH]>,
    /// When it was sent (ns, the transport's clock); 0 unless `news` is [`TxNews::Stamp`].
    pub tx_ns: [u64; BATCH],
    /// What is known of the packet.
    pub news: [TxNews; BATCH],
}

/// What the transport learnt about a sent packet after [`Transport::flush`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TxNews {
    /// It left at `tx_ns`.
    Stamp,
    /// The destination's host said nothing listens there (its agent is down). UDP: an ICMP
    /// port unreachable.
    Refused,
    /// It did not leave after all: the device completed the send with an error. Verbs only.
    Failed(DropReason),
}

impl Default for TxBatch {
    fn default() -> Self {
        Self { payload: Box::new([[0; PACKET_BYTES]; BATCH]), tx_ns: [0; BATCH], news: [TxNews::Stamp; BATCH] }
    }
}

/// Why a packet never left this host. Each is this host's own doing, not the network's: a probe
/// that ends so is recorded `Outcome::LocalDrop` and counted per reason, never as loss.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DropReason {
    /// The local stack refused the send; the errno says why (no route in the local table,
    /// a full socket buffer, a broadcast address without `SO_BROADCAST`).
    SendError {
        /// `errno` of the failed call.
        errno: i32,
    },
    /// Every send slot of the queue pair is waiting for its completion.
    NoSendSlot,
    /// The RNIC is gone (removed, fatal error, QP rebuilt) and not back yet.
    DeviceGone,
    /// A bounded table of the transport is full (resolved destinations, address handles).
    TableFull,
    /// The device refused to create the address handle for this destination.
    AddressHandle,
    /// The target's queue pair number is still being resolved, within the start-up grace period
    /// (agents starting together): nothing to send to yet.
    Resolving,
    /// The device completed the send with an error status (`ibv_wc_status`): it never left.
    Completion {
        /// The completion's status.
        status: u32,
    },
}

impl DropReason {
    /// Number of reasons, for per-reason counters.
    pub const COUNT: usize = 7;
    /// Names, indexed by [`DropReason::index`], as logs and counters show them.
    pub const NAMES: [&'static str; Self::COUNT] =
        ["send_error", "no_send_slot", "device_gone", "table_full", "address_handle", "resolving", "completion_error"];

    /// Dense index for counters.
    pub fn index(self) -> usize {
        match self {
            Self::SendError { .. } => 0,
            Self::NoSendSlot => 1,
            Self::DeviceGone => 2,
            Self::TableFull => 3,
            Self::AddressHandle => 4,
            Self::Resolving => 5,
            Self::Completion { .. } => 6,
        }
    }
}

impl std::fmt::Display for DropReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::SendError { errno } => {
                write!(f, "the local stack refused the send: {}", io::Error::from_raw_os_error(*errno))
            }
            Self::NoSendSlot => f.write_str("no free send slot (every send is waiting for its completion)"),
            Self::DeviceGone => f.write_str("the RDMA device is gone (until it comes back)"),
            Self::TableFull => f.write_str("a bounded destination table is full"),
            Self::AddressHandle => f.write_str("the device refused to create an address handle"),
            Self::Resolving => f.write_str("the target's QPN is still being resolved (start-up grace period)"),
            Self::Completion { status } => write!(f, "the device completed the send with error status {status}"),
        }
    }
}

/// What became of one queued packet at [`Transport::flush`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fate {
    /// Handed to the device or the kernel.
    Sent,
    /// Not sent: the destination's host said nothing listens there (verbs: its SIDR reject).
    Refused,
    /// Not sent: the destination could not be resolved over the network (verbs: address, route
    /// or SIDR resolution failed past the start-up grace period). The network, or the target,
    /// is at fault: a probe ending so is loss.
    Unreachable,
    /// Never left this host, for a reason of its own.
    Dropped(DropReason),
}

/// `kind` label values of a transport's own errors (verbs; UDP has none of its own).
pub const TRANSPORT_ERROR_KINDS: [&str; 4] = ["completion", "poll", "address_handle", "sidr_answer"];

/// A probing transport.
pub trait Transport {
    /// How the transport names a peer (a socket address; a GID + QPN + address handle).
    type Addr: Copy + Eq + std::fmt::Debug;

    /// Queue one packet for the next [`Transport::flush`]; `want_tx_ns` asks for its send
    /// timestamp (probes and ACK1 need one, ACK2 does not). Returns false when the queue is
    /// full: flush, then queue again.
    fn queue(&mut self, to: &Self::Addr, flow_label: u32, packet: &[u8; PACKET_BYTES], want_tx_ns: bool) -> bool;

    /// Send everything queued, in as few calls as the transport allows; `fates[i]` says what
    /// became of the i-th queued packet. Returns how many were queued.
    fn flush(&mut self, fates: &mut [Fate; SEND_BATCH]) -> usize;

    /// Receive what has arrived, without blocking. Returns the number of packets in `out`.
    fn recv(&mut self, out: &mut RxBatch<Self::Addr>) -> io::Result<usize>;

    /// Collect send timestamps that are known (and refusals, where the transport learns of
    /// them), without blocking.
    fn tx_timestamps(&mut self, out: &mut TxBatch) -> io::Result<usize>;

    /// Where the timestamps come from, for the records.
    fn ts_source(&self) -> TsSource;

    /// A descriptor that becomes readable when packets arrive (event mode waits on it).
    fn readiness_fd(&self) -> RawFd;

    /// Whether the device is usable (verbs: present and its QP working).
    fn device_up(&self) -> bool {
        true
    }

    /// The transport's own error counts, per [`TRANSPORT_ERROR_KINDS`].
    fn error_counts(&self) -> [u64; TRANSPORT_ERROR_KINDS.len()] {
        [0; TRANSPORT_ERROR_KINDS.len()]
    }

    /// Work that is not a packet: control events, peer resolution, device recovery. Called once
    /// per shard round; must not block.
    fn housekeeping(&mut self, _now_ns: u64) {}

    /// The flow labels of every target, in pinglist order, each time a pinglist is loaded.
    /// Transports that carry a label some other way (UDP: as a source port) use it to give a
    /// target's labels distinct paths.
    fn plan_labels<'a>(&mut self, _targets: impl Iterator<Item = &'a [u32]>) {}

    /// What became of a probe to `to`: answered (an ACK came back) or not. Transports that
    /// resolve peers at run time use it to notice a peer that moved (a restarted agent).
    fn observe(&mut self, _to: &Self::Addr, _answered: bool) {}

    /// The end a sealed packet to `to` is bound to ([`crate::protocol::Binding`]): `to` as this
    /// transport names it, probe or answer alike (the kind is in the MAC already).
    fn binding_to(&self, to: &Self::Addr) -> Binding;

    /// The end a sealed packet that arrived at this transport's end `at` ([`RxBatch::at`]) must
    /// be bound to: that end as its peers name it.
    fn binding_at(&self, at: u8) -> Binding;

    /// Whether a packet to `to` with `flow_label` can be sent without creating state for it
    /// (verbs: an address handle already exists). REFUSALs answer unauthenticated packets,
    /// whose sender chooses both, so they go only where this holds.
    fn reaches_without_state(&self, _to: &Self::Addr, _flow_label: u32) -> bool {
        true
    }

    /// Whether a packet from `from` can be the answer to a probe sent to `probed`. UDP: the same
    /// socket address. Verbs: the same GID (a target named by GID and service port answers from
    /// its QP, whose number the pinglist does not carry).
    fn answers_from(&self, probed: &Self::Addr, from: &Self::Addr) -> bool {
        probed == from
    }

    /// The addresses and ports the packets this transport sends to `to` with `flow_label` carry
    /// on the wire (`answer`: answers to `to`'s probes, rather than probes), so that a path
    /// trace copying them is hashed by every switch onto the same path. `None`: the transport
    /// cannot say (IPv6, a peer not resolved yet, a device that picks ports of its own).
    fn wire_tuple(&self, _to: &Self::Addr, _flow_label: u32, _answer: bool) -> Option<crate::pathtrace::WireTuple> {
        None
    }

    /// Ask for a wake-up on the next arrival before the shard sleeps. False when work may
    /// already be waiting (the shard must not sleep then).
    fn arm(&mut self) -> bool {
        true
    }

    /// Descriptors event mode waits on (readable = work); returns how many were written.
    fn wait_fds(&self, out: &mut [RawFd; 4]) -> usize {
        out[0] = self.readiness_fd();
        1
    }
}
