//! Live pushes: each window summary the shard's writer closes goes, as it closes, to the
//! collectors `[live]` names (`analyze live`), in the datagrams `formats::live` defines.
//!
//! UDP, from one unconnected non-blocking socket per shard: a send never waits (a full socket
//! buffer or an unreachable collector is a counter, said once in the log), the agent keeps no
//! state per collector, and a collector that is down, restarts or is replaced costs nothing but
//! the windows it did not hear. Pushes leave at the shard's flush, a few per window, never per
//! probe. Sealed with the fleet key the probes are sealed with, when `[auth]` has one.

use std::net::{SocketAddr, UdpSocket};

use rocemesh_formats::live::{Name, Seal, Sender, encode};
use rocemesh_formats::record::PathRecord;
use rocemesh_formats::segment::SegmentWriter;
use rocemesh_formats::window::WindowSummary;

/// What the pusher did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PushStats {
    /// Window summaries (or parts left by a segment's rotation) pushed.
    pub windows: u64,
    /// Datagrams handed to the kernel, summed over collectors.
    pub sent: u64,
    /// Datagrams the kernel refused (socket buffer full, no route): those windows are lost to
    /// that collector, not to the segment.
    pub failed: u64,
    /// Summaries that could not be encoded (more parts than a window may have).
    pub unencodable: u64,
    /// Summaries the writer dropped because they were not taken in time.
    pub not_taken: u64,
    /// Path traces pushed, and dropped unpushed (more waiting than [`MAX_PENDING_PATHS`]).
    pub paths: u64,
    pub paths_dropped: u64,
}

/// Path traces waiting for a window's push at most (a few seconds of a shard's tracing).
pub const MAX_PENDING_PATHS: usize = 1024;

/// A shard's pusher.
#[derive(Debug)]
pub struct Pusher {
    socket: UdpSocket,
    collectors: Vec<SocketAddr>,
    sender: Sender,
    seq: u64,
    summaries: Vec<WindowSummary>,
    /// Traces taken from the writer, waiting for a window's push.
    paths: Vec<PathRecord>,
    datagrams: Vec<Vec<u8>>,
    stats: PushStats,
    /// Whether a failed send was logged (once per shard).
    failure_logged: bool,
}

impl Pusher {
    /// A pusher to `collectors` for the shard `sender` names; its socket is bound to any address
    /// of the collectors' family.
    pub fn new(collectors: Vec<SocketAddr>, sender: Sender) -> std::io::Result<Pusher> {
        let any: SocketAddr = match collectors.first() {
            Some(SocketAddr::V6(_)) => "[::]:0".parse().expect("an address"),
            _ => "0.0.0.0:0".parse().expect("an address"),
        };
        let socket = UdpSocket::bind(any)?;
        socket.set_nonblocking(true)?;
        Ok(Pusher {
            socket,
            collectors,
            sender,
            seq: 0,
            summaries: Vec::new(),
            paths: Vec::new(),
            datagrams: Vec::new(),
            stats: PushStats::default(),
            failure_logged: false,
        })
    }

    /// Push what `writer` closed since the last call, sealed with `seal` when there is one.
    /// `stopping`: the shard is stopping, so what its writer closed is the last of each window.
    pub fn push(&mut self, writer: &mut SegmentWriter, seal: Option<&Seal>, now_ns: u64, stopping: bool) {
        writer.take_summaries(&mut self.summaries);
        writer.take_paths(&mut self.paths);
        let over = self.paths.len().saturating_sub(MAX_PENDING_PATHS);
        self.paths.drain(..over);
        self.stats.paths_dropped += over as u64;
        let name_of = |id: u32| {
            writer.entry(id).map(|e| Name { id, role: e.role, name: e.name.clone(), tor: e.tor.clone(), addr: e.addr })
        };
        let grace_ns = writer.summary_grace_ns();
        for s in self.summaries.drain(..) {
            // Closed by its grace, or sooner (a rotation, a stop): the analyzer waits for the rest.
            let last = stopping || now_ns >= s.start_unix_ns.saturating_add(s.window_ns).saturating_add(grace_ns);
            let (seq, paths, out) = (&mut self.seq, &self.paths, &mut self.datagrams);
            let Ok(traces) = encode(&self.sender, seq, now_ns, last, &s, paths, &name_of, seal, out) else {
                self.datagrams.clear();
                self.stats.unencodable += 1;
                continue;
            };
            self.paths.drain(..traces);
            self.stats.paths += traces as u64;
            self.stats.windows += 1;
            for d in self.datagrams.drain(..) {
                for c in &self.collectors {
                    match self.socket.send_to(&d, c) {
                        Ok(_) => self.stats.sent += 1,
                        Err(e) => {
                            self.stats.failed += 1;
                            if !self.failure_logged {
                                self.failure_logged = true;
                                tracing::warn!(
                                    rnic = %self.sender.rnic, collector = %c, error = %e,
                                    "live push failed: that window is lost to the collector (counted as \
                                     live_push_failed; said once per shard)"
                                );
                            }
                        }
                    }
                }
            }
        }
        self.stats.not_taken = writer.stats().summaries_not_taken;
    }

    /// Counters.
    pub fn stats(&self) -> PushStats {
        self.stats
    }
}
