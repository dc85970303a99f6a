//! The counters a shard keeps ([`ShardStats`]): a leaf that the shard writes, the live state
//! publishes, and the runtime, the exporter and the one-sided view read, so that none of them
//! depends on another for the type alone.

use crate::pathtrace::PathStats;
use crate::service::ServiceStats;
use crate::transport::DropReason;

/// Per-shard counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ShardStats {
    /// Probes handed to the transport.
    pub probes_sent: u64,
    /// Probes that completed with valid delays.
    pub ok: u64,
    /// Probes lost: sent and not answered in time, or their target unreachable (verbs: its
    /// address could not be resolved over the network). What the network is blamed for.
    pub lost: u64,
    /// Of `lost`: probes never sent because their target could not be resolved (verbs).
    pub unreachable: u64,
    /// Probes that never left this host, per [`DropReason`] (indexed by `DropReason::index`).
    /// Recorded as `Outcome::LocalDrop`, never as loss.
    pub local_drops: [u64; DropReason::COUNT],
    /// Probes with all packets but a negative or absurd delay, or a missing timestamp.
    pub invalid: u64,
    /// ACKs for probes that had already timed out.
    pub late: u64,
    /// Well-formed packets that match nothing of ours (a previous epoch, another prober).
    pub unknown: u64,
    /// Datagrams refused: wrong length, magic, version, kind or checksum (garbage or forged).
    pub malformed: u64,
    /// Well-formed packets refused by probe authentication, per
    /// [`crate::auth::AuthRefusal::index`]: never answered as a probe, never matched as an ACK
    /// (a probe refused for its keying alone gets a REFUSAL, [`crate::auth`]).
    pub auth_refused: [u64; crate::auth::AuthRefusal::COUNT],
    /// Probes of this shard recorded `auth_refused`: their target is alive but keyed otherwise
    /// (it refused them, or answered with packets this shard refused for their keying).
    pub probes_auth_refused: u64,
    /// REFUSALs sent to probers keyed otherwise.
    pub refusals_sent: u64,
    /// REFUSALs held back: by the rate limit, or because the transport would have had to
    /// create state to send them ([`crate::transport::Transport::reaches_without_state`]).
    pub refusals_held: u64,
    /// REFUSALs (or ACKs refused for their keying) from a target that answered this shard
    /// within a probe timeout: not taken ([`crate::auth`]).
    pub auth_refusals_ignored: u64,
    /// A second ACK of the same kind for one probe (a duplicate or a replay): ignored.
    pub duplicate_acks: u64,
    /// Steps of CLOCK_REALTIME seen (an operator's `date -s`, a PTP or NTP step); the shard's
    /// timers were moved with the clock.
    pub clock_steps: u64,
    /// Id of the fleet key packets are sealed with; `None`: unauthenticated.
    pub send_key_id: Option<u8>,
    /// Probes whose target host answered that its agent is not running (UDP only).
    pub peer_down: u64,
    /// Probes answered as responder.
    pub answered: u64,
    /// ACKs (answers to other agents' probes) that never left this host.
    pub acks_not_sent: u64,
    /// Receive calls that failed (counted, logged, and the shard went on).
    pub recv_errors: u64,
    /// Send-timestamp reads that failed (counted, logged, and the shard went on).
    pub tx_stamp_errors: u64,
    /// Records the segment writer refused (disk full, I/O error); see `records_dropped`.
    pub write_errors: u64,
    /// In-flight probes finalised early because the in-flight table was full.
    pub inflight_overflow: u64,
    /// Probe slots given up: the shard fell further behind its schedule than a catch-up covers
    /// (its host froze it, or its core was taken for longer than a scheduler slice), so the
    /// cadence restarted from then instead of firing the backlog.
    pub slots_skipped: u64,
    /// Records the segment writer could not store.
    pub records_dropped: u64,
    /// Window summaries written, dropped (no room in their segment: that file's records are
    /// read instead), and parts opened for records completing after their window closed
    /// (`summary_window_s`; all 0 without summaries).
    pub summaries_written: u64,
    pub summaries_dropped: u64,
    pub summary_late_parts: u64,
    /// Live pushes (`[live]`; all 0 without collectors).
    pub live: crate::push::PushStats,
    /// Traced service connections: probed now, taken, ended, refused.
    pub services: ServiceStats,
    /// Other agents' path trace packets that reached this shard (their last TTL): expected,
    /// counted apart from `malformed`.
    pub trace_arrivals: u64,
    /// Path tracing (all zero when it is off).
    pub paths: PathStats,
    /// The transport's own errors, per [`crate::transport::TRANSPORT_ERROR_KINDS`].
    pub transport_errors: [u64; crate::transport::TRANSPORT_ERROR_KINDS.len()],
    /// Whether the device is usable (verbs: present and its QP working; UDP: always).
    pub device_up: bool,
}
