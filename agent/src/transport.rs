//! The transport a shard probes over, behind one trait so that the UDP transport (any Linux
//! box, CI) and the RDMA verbs transport (issue 7) run the same shard code.
//!
//! A transport is non-blocking and batch-oriented: the shard asks it for what has arrived and
//! for the send timestamps that have become known, into buffers sized once at shard start.

use std::io;
use std::os::fd::RawFd;

use rocemesh_formats::record::TsSource;

use crate::protocol::PACKET_BYTES;

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
}

impl<A: Copy> RxBatch<A> {
    /// An empty batch; `filler` initialises the address slots.
    pub fn new(filler: A) -> Self {
        Self {
            buf: Box::new([[0; PACKET_BYTES + 1]; BATCH]),
            len: [0; BATCH],
            rx_ns: [0; BATCH],
            from: [filler; BATCH],
        }
    }
}

/// Send timestamps that became known: the payload that was sent, and when it left.
#[derive(Debug)]
pub struct TxBatch {
    /// The sent packet (as the transport echoes it back).
    pub payload: Box<[[u8; PACKET_BYTES]; BATCH]>,
    /// When it was sent (ns, the transport's clock); 0 when `refused`.
    pub tx_ns: [u64; BATCH],
    /// Instead of a timestamp: the destination's host said nothing listens there (its agent is
    /// down). UDP only.
    pub refused: [bool; BATCH],
}

impl Default for TxBatch {
    fn default() -> Self {
        Self { payload: Box::new([[0; PACKET_BYTES]; BATCH]), tx_ns: [0; BATCH], refused: [false; BATCH] }
    }
}

/// A probing transport.
pub trait Transport {
    /// How the transport names a peer (a socket address; a GID + QPN + address handle).
    type Addr: Copy + Eq + std::fmt::Debug;

    /// Queue one packet for the next [`Transport::flush`]; `want_tx_ns` asks for its send
    /// timestamp (probes and ACK1 need one, ACK2 does not). Returns false when the queue is
    /// full: flush, then queue again.
    fn queue(&mut self, to: &Self::Addr, flow_label: u32, packet: &[u8; PACKET_BYTES], want_tx_ns: bool) -> bool;

    /// Send everything queued, in as few calls as the transport allows; `sent[i]` says whether
    /// the i-th queued packet went out. Returns how many were queued.
    fn flush(&mut self, sent: &mut [bool; SEND_BATCH]) -> usize;

    /// Receive what has arrived, without blocking. Returns the number of packets in `out`.
    fn recv(&mut self, out: &mut RxBatch<Self::Addr>) -> io::Result<usize>;

    /// Collect send timestamps that are known (and refusals, where the transport learns of
    /// them), without blocking.
    fn tx_timestamps(&mut self, out: &mut TxBatch) -> io::Result<usize>;

    /// Where the timestamps come from, for the records.
    fn ts_source(&self) -> TsSource;

    /// A descriptor that becomes readable when packets arrive (event mode waits on it).
    fn readiness_fd(&self) -> RawFd;

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

    /// Whether a packet from `from` can be the answer to a probe sent to `probed`. UDP: the same
    /// socket address. Verbs: the same GID (a target named by GID and service port answers from
    /// its QP, whose number the pinglist does not carry).
    fn answers_from(&self, probed: &Self::Addr, from: &Self::Addr) -> bool {
        probed == from
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
