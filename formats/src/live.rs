//! Live pushes: a shard's window summaries ([`crate::window`]), sent to the live analyzer as
//! each window closes, one UDP datagram per push.
//!
//! A push is self-contained: who sent it (host, RNIC, its ToR, the agent's epoch and a sequence
//! number per shard), one summary window's keys (or a part of them: summaries are additive, so a
//! window too big for one datagram goes as several pushes, each a valid summary), the path
//! traces the shard took since its last push (with the first part, at most
//! [`MAX_PATHS_PER_PUSH`]), and the names of every dictionary id those keys and traces use. A lost datagram costs its keys and nothing else; no
//! push depends on another, so the analyzer needs no session with the agent, and one that
//! restarts has lost only the windows it did not hear.
//!
//! Layout: a [`HEADER_BYTES`] header (little endian), the rkyv-archived [`Push`], and, when the
//! push is sealed with a fleet key ([`crate::keys`]), a BLAKE3 keyed MAC of header and body.
//!
//! | bytes | field |
//! |---|---|
//! | 0..4 | magic `RMLV` |
//! | 4 | version ([`VERSION`]) |
//! | 5 | key id, 0 when unsealed |
//! | 6..8 | part, from 0 |
//! | 8..10 | parts of this window |
//! | 10 | flags: bit 0 set on the pushes of a summary its writer closed a grace after the window's end ([`Header::last`]) |
//! | 11 | 0 |
//! | 12..16 | body bytes |
//! | 16..24 | sequence number, per shard from 0 |
//! | 24..32 | sent, Unix ns |
//! | 32..36 | agent epoch |
//! | 36..40 | CRC32C of bytes 0..36 and the body |
//!
//! A push is at most [`MAX_PUSH_BYTES`] (16 KiB) but for a single key too large for one, far
//! under IPv4's 65,507-byte datagram limit. [`decode`] checks everything a reader relies on before it hands a push out: the
//! header, the CRC, the seal, rkyv's validation, the summary's own consistency
//! ([`crate::window::ArchivedWindowSummary::problem`]), and a name for every id the keys use.

use rkyv::rancor;
use rkyv::util::AlignedVec;
use rkyv::{Archive, Deserialize, Serialize};

use crate::record::{MAX_HOPS, PathRecord};
use crate::window::{ArchivedWindowSummary, KeySummary, WindowSummary, summary_bound};

/// Path traces one push carries at most; the rest wait for the next window's push.
pub const MAX_PATHS_PER_PUSH: usize = 64;
/// Archived bytes of a trace and of a name without its strings, at most (with alignment).
const PATH_BYTES: usize = 64;
const NAME_BYTES: usize = 48;

/// The first bytes of every push.
pub const MAGIC: [u8; 4] = *b"RMLV";
/// The layout this build writes and reads.
pub const VERSION: u8 = 1;
/// The fixed header.
pub const HEADER_BYTES: usize = 40;
/// The seal, when there is one.
pub const MAC_BYTES: usize = 32;
/// The largest push, header and seal included: a dozen fragments at a 1,500-byte MTU, two
/// jumbo frames (a lost fragment loses the push). A key whose histograms alone exceed it (a few
/// thousand probes spread over more than 2,000 buckets) goes alone in a larger datagram, which
/// a key's at most 3 x 1,920 cells keep under UDP's 65,507 bytes.
pub const MAX_PUSH_BYTES: usize = 16_384;
/// The analyzer's UDP port unless told otherwise.
pub const DEFAULT_PORT: u16 = 18_620;

/// Receive buffer asked for: a fleet's pushes arrive together as their windows close (10,000
/// RNICs' few datagrams each within a flush interval); the kernel caps it at `net.core.rmem_max`.
pub const RECEIVE_BUFFER_BYTES: usize = 64 << 20;

/// A UDP socket bound to `addr` for receiving pushes, its receive buffer raised toward
/// [`RECEIVE_BUFFER_BYTES`] (the kernel caps it at `net.core.rmem_max` without an error; a
/// refusal of the option itself is one).
pub fn bind_receiver(addr: std::net::SocketAddr) -> std::io::Result<std::net::UdpSocket> {
    use std::os::fd::AsRawFd;
    let socket = std::net::UdpSocket::bind(addr)?;
    let bytes = RECEIVE_BUFFER_BYTES as libc::c_int;
    // SAFETY: a valid socket and an int option of the size given.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            (&raw const bytes).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(socket)
}

/// A dictionary id's name, as the segment's dictionary has it.
#[derive(Archive, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[rkyv(derive(Debug))]
pub struct Name {
    pub id: u32,
    /// [`crate::record::EndpointRole`] as a byte.
    pub role: u8,
    pub name: String,
    pub tor: String,
    /// GID or IPv4-mapped address (a traced hop is named by the address that answered).
    pub addr: [u8; 16],
}

/// What one push carries.
#[derive(Archive, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[rkyv(derive(Debug))]
pub struct Push {
    /// The agent's host, as the inventory names it.
    pub host: String,
    /// The shard's RNIC (`host/device`) and its ToR.
    pub rnic: String,
    pub tor: String,
    /// The ids the summary's keys and the traces use, ascending.
    pub names: Vec<Name>,
    pub summary: WindowSummary,
    /// Path traces taken since the shard's previous push (first part only).
    pub paths: Vec<PathRecord>,
}

/// The header's fields other than the layout's own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Header {
    pub key_id: u8,
    /// The summary was closed a grace after its window's end: nothing more of the window
    /// follows from this shard (but a late part). A summary closed sooner (its segment rotated,
    /// the agent stopped) is not the last: the rest of the window follows in another.
    pub last: bool,
    pub part: u16,
    pub parts: u16,
    pub seq: u64,
    pub sent_unix_ns: u64,
    pub agent_epoch: u32,
}

/// Who sends: what every push of a shard repeats.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Sender {
    pub host: String,
    pub rnic: String,
    pub tor: String,
    pub agent_epoch: u32,
}

/// A fleet key to seal or check with.
#[derive(Clone)]
pub struct Seal {
    pub id: u8,
    pub secret: [u8; 32],
}

impl std::fmt::Debug for Seal {
    // Never the secret.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Seal({})", self.id)
    }
}

impl Seal {
    fn tag(&self, covered: &[u8]) -> [u8; MAC_BYTES] {
        *blake3::keyed_hash(&self.secret, covered).as_bytes()
    }
}

/// Why a datagram is not a push this reader takes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PushError {
    #[error("{0} bytes: shorter than a push's {HEADER_BYTES}-byte header")]
    Short(usize),
    #[error("not a rocemesh live push (magic {0:02x?})")]
    Magic([u8; 4]),
    #[error("layout version {0}; this build reads {VERSION}: upgrade the analyzer or the agent")]
    Version(u8),
    #[error("{got} bytes where its header says {want}: truncated or padded")]
    Length { got: usize, want: usize },
    #[error("CRC does not match: damaged in transit")]
    Crc,
    #[error("unsealed, and this analyzer checks seals (--keys): set [auth] keys on the agent")]
    Unsealed,
    #[error("sealed with key {0}, which the key file does not hold or no longer accepts")]
    UnknownKey(u8),
    #[error("seal does not verify: forged, or sealed with another secret under the same id")]
    BadMac,
    #[error("body does not validate: {0}")]
    Archive(String),
    #[error("summary cannot be true of any probes: {0}")]
    Summary(String),
    #[error("part {part} of {parts}: not a part of its window")]
    Part { part: u16, parts: u16 },
    #[error("key {key} uses id {id}, which the push does not name")]
    Unnamed { key: usize, id: u32 },
    #[error("path trace {trace} uses id {id}, which the push does not name, or {hops} hops (at most {MAX_HOPS})")]
    BadTrace { trace: usize, id: u32, hops: u32 },
}

/// The ids a trace uses.
fn trace_ids(p: &PathRecord) -> impl Iterator<Item = u32> + '_ {
    [p.src, p.dst].into_iter().chain(p.hops[..(p.hop_count as usize).min(MAX_HOPS)].iter().copied())
}

/// The pushes one closed summary goes as, with the first [`MAX_PATHS_PER_PUSH`] of `paths`: its
/// keys split so that each push fits [`MAX_PUSH_BYTES`] (the stalls and the traces go with the
/// first). `name_of(id)` gives a dictionary id's name: [`decode`] refuses a push with an id it
/// does not name. `last`: see [`Header::last`]. Returns the traces taken.
#[allow(clippy::too_many_arguments, reason = "the push's parts, named")]
pub fn encode(
    sender: &Sender,
    seq: &mut u64,
    sent_unix_ns: u64,
    last: bool,
    summary: &WindowSummary,
    paths: &[PathRecord],
    name_of: &dyn Fn(u32) -> Option<Name>,
    seal: Option<&Seal>,
    out: &mut Vec<Vec<u8>>,
) -> Result<usize, PushError> {
    let fixed = HEADER_BYTES + MAC_BYTES + 256 + sender.host.len() + sender.rnic.len() + sender.tor.len();
    let budget = MAX_PUSH_BYTES.saturating_sub(fixed);
    // Traces take at most half of the first part; the rest wait for the next push.
    let mut n = paths.len().min(MAX_PATHS_PER_PUSH);
    while n > 0 && traces_bytes(&paths[..n], name_of) > budget / 2 {
        n -= 1;
    }
    let paths = &paths[..n];
    let traced = traces_bytes(paths, name_of);
    let spans = split(summary, name_of, budget, traced);
    let parts = u16::try_from(spans.len()).map_err(|_| PushError::Part { part: u16::MAX, parts: u16::MAX })?;
    for (part, (from, to)) in spans.into_iter().enumerate() {
        let with = if part == 0 { paths } else { &[] };
        let push = part_of(sender, summary, from, to, with, name_of);
        let body = rkyv::to_bytes::<rancor::Error>(&push).map_err(|e| PushError::Archive(e.to_string()))?;
        let header = Header {
            key_id: seal.map_or(0, |s| s.id),
            last,
            part: part as u16,
            parts,
            seq: *seq,
            sent_unix_ns,
            agent_epoch: sender.agent_epoch,
        };
        *seq += 1;
        out.push(frame(&header, &body, seal));
    }
    Ok(paths.len())
}

/// What `paths` and the names only they use add to a push, at most.
fn traces_bytes(paths: &[PathRecord], name_of: &dyn Fn(u32) -> Option<Name>) -> usize {
    let mut ids: Vec<u32> = paths.iter().flat_map(trace_ids).collect();
    ids.sort_unstable();
    ids.dedup();
    let names: usize = ids.into_iter().filter_map(name_of).map(|n| NAME_BYTES + n.name.len() + n.tor.len()).sum();
    paths.len() * PATH_BYTES + names
}

/// Key ranges of `summary`, each within `budget` bytes archived (a key's cells, stalls and names
/// bounded as [`summary_bound`] bounds them). At least one range, even for an empty summary.
fn split(
    summary: &WindowSummary,
    name_of: &dyn Fn(u32) -> Option<Name>,
    budget: usize,
    traced: usize,
) -> Vec<(usize, usize)> {
    let name_bytes = |id: u32| name_of(id).map_or(0, |n| NAME_BYTES + n.name.len() + n.tor.len());
    let mut spans = Vec::new();
    let (mut from, mut used) = (0, summary_bound(0, 0, summary.stalls.len()) + traced);
    let mut named: Vec<u32> = Vec::new();
    for (i, k) in summary.keys.iter().enumerate() {
        let mut cost = summary_bound(1, k.cells_len as usize, 0) - summary_bound(0, 0, 0);
        for id in [k.prober, k.target] {
            if !named.contains(&id) {
                cost += name_bytes(id);
            }
        }
        if i > from && used + cost > budget {
            spans.push((from, i));
            (from, used) = (i, summary_bound(0, 0, 0));
            named.clear();
            cost = summary_bound(1, k.cells_len as usize, 0) - summary_bound(0, 0, 0);
            cost += name_bytes(k.prober) + name_bytes(k.target);
        }
        used += cost;
        for id in [k.prober, k.target] {
            if !named.contains(&id) {
                named.push(id);
            }
        }
    }
    spans.push((from, summary.keys.len()));
    spans
}

/// The push holding keys `from..to` of `summary`.
fn part_of(
    sender: &Sender,
    summary: &WindowSummary,
    from: usize,
    to: usize,
    paths: &[PathRecord],
    name_of: &dyn Fn(u32) -> Option<Name>,
) -> Push {
    let first = from == 0;
    let keys = &summary.keys[from..to];
    let cells_from = keys.first().map_or(0, |k| k.cells_start as usize);
    let cells_to = keys.last().map_or(cells_from, |k| (k.cells_start + k.cells_len) as usize);
    let mut ids: Vec<u32> = keys.iter().flat_map(|k| [k.prober, k.target]).collect();
    ids.extend(paths.iter().flat_map(trace_ids));
    ids.sort_unstable();
    ids.dedup();
    Push {
        host: sender.host.clone(),
        rnic: sender.rnic.clone(),
        tor: sender.tor.clone(),
        names: ids.into_iter().filter_map(name_of).collect(),
        summary: WindowSummary {
            start_unix_ns: summary.start_unix_ns,
            window_ns: summary.window_ns,
            late_max_ns: if first { summary.late_max_ns } else { 0 },
            late_sends: if first { summary.late_sends } else { 0 },
            stalls_dropped: if first { summary.stalls_dropped } else { 0 },
            stalls: if first { summary.stalls.clone() } else { Vec::new() },
            keys: keys.iter().map(|k| KeySummary { cells_start: k.cells_start - cells_from as u32, ..*k }).collect(),
            cells: summary.cells[cells_from..cells_to].to_vec(),
        },
        paths: paths.to_vec(),
    }
}

/// Header, body and seal as one datagram.
fn frame(h: &Header, body: &[u8], seal: Option<&Seal>) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_BYTES + body.len() + MAC_BYTES);
    out.extend_from_slice(&MAGIC);
    out.push(VERSION);
    out.push(h.key_id);
    out.extend_from_slice(&h.part.to_le_bytes());
    out.extend_from_slice(&h.parts.to_le_bytes());
    out.extend_from_slice(&[u8::from(h.last), 0]);
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(&h.seq.to_le_bytes());
    out.extend_from_slice(&h.sent_unix_ns.to_le_bytes());
    out.extend_from_slice(&h.agent_epoch.to_le_bytes());
    let crc = crc32c::crc32c_append(crc32c::crc32c(&out), body);
    out.extend_from_slice(&crc.to_le_bytes());
    out.extend_from_slice(body);
    if let Some(s) = seal {
        let tag = s.tag(&out);
        out.extend_from_slice(&tag);
    }
    out
}

/// What the reader checks seals against.
#[allow(missing_debug_implementations, reason = "holds a closure")]
pub enum Keys<'a> {
    /// No key file: seals are not checked, sealed and unsealed pushes are taken alike.
    Unchecked,
    /// Every push must be sealed with a key `accepted(id)` returns.
    Checked(&'a dyn Fn(u8) -> Option<Seal>),
}

/// A push as read: its header and body, checked.
#[derive(Debug, Clone)]
pub struct Received {
    pub header: Header,
    pub push: Push,
}

fn le<const N: usize>(b: &[u8], at: usize) -> [u8; N] {
    let mut a = [0u8; N];
    a.copy_from_slice(&b[at..at + N]);
    a
}

/// Reads one datagram (see the module's list of what is checked).
pub fn decode(bytes: &[u8], keys: &Keys<'_>) -> Result<Received, PushError> {
    if bytes.len() < HEADER_BYTES {
        return Err(PushError::Short(bytes.len()));
    }
    let magic = le::<4>(bytes, 0);
    if magic != MAGIC {
        return Err(PushError::Magic(magic));
    }
    if bytes[4] != VERSION {
        return Err(PushError::Version(bytes[4]));
    }
    let header = Header {
        key_id: bytes[5],
        last: bytes[10] & 1 == 1,
        part: u16::from_le_bytes(le(bytes, 6)),
        parts: u16::from_le_bytes(le(bytes, 8)),
        seq: u64::from_le_bytes(le(bytes, 16)),
        sent_unix_ns: u64::from_le_bytes(le(bytes, 24)),
        agent_epoch: u32::from_le_bytes(le(bytes, 32)),
    };
    let body_len = u32::from_le_bytes(le(bytes, 12)) as usize;
    let mac = if header.key_id == 0 { 0 } else { MAC_BYTES };
    let want = HEADER_BYTES.saturating_add(body_len).saturating_add(mac);
    if bytes.len() != want {
        return Err(PushError::Length { got: bytes.len(), want });
    }
    let body = &bytes[HEADER_BYTES..HEADER_BYTES + body_len];
    if crc32c::crc32c_append(crc32c::crc32c(&bytes[..36]), body).to_le_bytes() != le::<4>(bytes, 36)
        || bytes[10] > 1
        || bytes[11] != 0
    {
        return Err(PushError::Crc);
    }
    if let Keys::Checked(accepted) = keys {
        if header.key_id == 0 {
            return Err(PushError::Unsealed);
        }
        let seal = accepted(header.key_id).ok_or(PushError::UnknownKey(header.key_id))?;
        let covered = HEADER_BYTES + body_len;
        if seal.tag(&bytes[..covered]) != le::<MAC_BYTES>(bytes, covered) {
            return Err(PushError::BadMac);
        }
    }
    if header.parts == 0 || header.part >= header.parts {
        return Err(PushError::Part { part: header.part, parts: header.parts });
    }
    let mut aligned = AlignedVec::<16>::with_capacity(body.len());
    aligned.extend_from_slice(body);
    let a = rkyv::access::<ArchivedPush, rancor::Error>(&aligned).map_err(|e| PushError::Archive(e.to_string()))?;
    if let Some(why) = ArchivedWindowSummary::problem(&a.summary) {
        return Err(PushError::Summary(why));
    }
    let named = |id: u32| a.names.binary_search_by_key(&id, |n| n.id.to_native()).is_ok();
    for (key, k) in a.summary.keys.iter().enumerate() {
        for id in [k.prober.to_native(), k.target.to_native()] {
            if !named(id) {
                return Err(PushError::Unnamed { key, id });
            }
        }
    }
    for (trace, p) in a.paths.iter().enumerate() {
        let hops = p.hop_count.to_native();
        let ids = [p.src.to_native(), p.dst.to_native()].into_iter().chain(p.hops.iter().map(|h| h.to_native()));
        let used = 2 + (hops as usize).min(MAX_HOPS);
        if let Some(id) = ids.take(used).find(|&id| !named(id)) {
            return Err(PushError::BadTrace { trace, id, hops });
        }
        if hops as usize > MAX_HOPS {
            return Err(PushError::BadTrace { trace, id: 0, hops });
        }
    }
    let push = rkyv::deserialize::<Push, rancor::Error>(a).map_err(|e| PushError::Archive(e.to_string()))?;
    Ok(Received { header, push })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::window::Cell;

    fn summary(keys: u32, cells_per_key: u32) -> WindowSummary {
        let mut s = WindowSummary { start_unix_ns: 5_000_000_000, window_ns: 5_000_000_000, ..Default::default() };
        s.stalls.push((5_100_000_000, 300_000_000));
        s.late_sends = 3;
        for t in 0..keys {
            let start = s.cells.len() as u32;
            for measure in 0..3 {
                for b in 0..cells_per_key {
                    s.cells.push(Cell { count: 1, bucket: 200 + b as u16, measure, ts_source: 1 });
                }
            }
            let mut counts = [0; 7];
            counts[0] = cells_per_key;
            s.keys.push(KeySummary {
                first_t1_ns: 5_000_000_001,
                last_t1_ns: 9_000_000_000,
                first_ok_t1_ns: 5_000_000_001,
                prober: 0,
                target: t + 1,
                flow_label: 7,
                counts,
                cells_start: start,
                cells_len: 3 * cells_per_key,
                ..Default::default()
            });
        }
        s
    }

    fn names(id: u32) -> Option<Name> {
        let (name, tor) = (format!("tor{}-h{}/rnic0", id / 16, id % 16), format!("tor{}", id / 16));
        Some(Name { id, role: 0, name, tor, addr: [id as u8; 16] })
    }

    fn traces(n: u32) -> Vec<PathRecord> {
        let trace = |i: u32| PathRecord {
            t_unix_ns: 5_000_000_000 + u64::from(i),
            src: 0,
            dst: 1 + i % 7,
            flow_label: i,
            hop_count: 3,
            hops: [100, 200 + i % 2, 101, 0, 0, 0, 0, 0],
        };
        (0..n).map(trace).collect()
    }

    fn sender() -> Sender {
        Sender { host: "tor0-h0".into(), rnic: "tor0-h0/rnic0".into(), tor: "tor0".into(), agent_epoch: 4 }
    }

    fn pushes(s: &WindowSummary, seal: Option<&Seal>) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let mut seq = 10;
        encode(&sender(), &mut seq, 77, true, s, &[], &names, seal, &mut out).unwrap();
        assert_eq!(seq, 10 + out.len() as u64);
        out
    }

    /// The parts of a split window add up to the window, each fits a datagram, and the stalls
    /// go once.
    #[test]
    fn a_wide_window_goes_as_parts_that_add_up() {
        let s = summary(3000, 2);
        let out = pushes(&s, None);
        assert!(out.len() > 1, "{} pushes", out.len());
        let (mut keys, mut cells, mut stalls) = (Vec::new(), 0, 0);
        for (i, p) in out.iter().enumerate() {
            assert!(p.len() <= MAX_PUSH_BYTES, "push {i}: {} bytes", p.len());
            let r = decode(p, &Keys::Unchecked).unwrap();
            assert_eq!((r.header.part as usize, r.header.parts as usize), (i, out.len()));
            assert_eq!((r.header.seq, r.header.agent_epoch, r.push.rnic.as_str()), (10 + i as u64, 4, "tor0-h0/rnic0"));
            stalls += r.push.summary.stalls.len();
            cells += r.push.summary.cells.len();
            for k in &r.push.summary.keys {
                let n = &r.push.names[r.push.names.binary_search_by_key(&k.target, |n| n.id).unwrap()];
                assert_eq!(n.name, names(k.target).unwrap().name);
            }
            keys.extend(r.push.summary.keys.iter().map(|k| k.target));
        }
        assert_eq!(keys, s.keys.iter().map(|k| k.target).collect::<Vec<_>>());
        assert_eq!((cells, stalls), (s.cells.len(), 1));
    }

    #[test]
    fn an_empty_window_is_one_push() {
        let s = summary(0, 0);
        let out = pushes(&s, None);
        assert_eq!(out.len(), 1);
        assert_eq!(decode(&out[0], &Keys::Unchecked).unwrap().push.summary.stalls, s.stalls);
    }

    /// Every byte of a push is covered: a flipped bit anywhere is refused, never read as other
    /// counts; a cut is refused by length.
    #[test]
    fn damage_anywhere_is_refused() {
        let out = pushes(&summary(20, 3), None);
        let p = &out[0];
        for i in 0..p.len() {
            let mut d = p.clone();
            d[i] ^= 0x10;
            assert!(decode(&d, &Keys::Unchecked).is_err(), "byte {i} flipped read as a push");
        }
        for cut in [0, 3, HEADER_BYTES, p.len() - 1] {
            assert!(decode(&p[..cut], &Keys::Unchecked).is_err(), "cut at {cut}");
        }
    }

    #[test]
    fn seals_are_checked_when_keys_are_given() {
        let key = Seal { id: 3, secret: [0x5a; 32] };
        let other = Seal { id: 3, secret: [0x5b; 32] };
        let sealed = pushes(&summary(5, 2), Some(&key));
        let plain = pushes(&summary(5, 2), None);
        let holds = |id: u8| (id == 3).then(|| key.clone());
        let wrong = |id: u8| (id == 3).then(|| other.clone());
        assert!(decode(&sealed[0], &Keys::Checked(&holds)).is_ok());
        assert!(decode(&sealed[0], &Keys::Unchecked).is_ok());
        assert_eq!(decode(&plain[0], &Keys::Checked(&holds)).unwrap_err(), PushError::Unsealed);
        assert_eq!(decode(&sealed[0], &Keys::Checked(&wrong)).unwrap_err(), PushError::BadMac);
        assert_eq!(decode(&sealed[0], &Keys::Checked(&|_| None)).unwrap_err(), PushError::UnknownKey(3));
        // A forger who fixes the CRC still cannot pass the seal.
        let mut forged = sealed[0].clone();
        let body_end = forged.len() - MAC_BYTES;
        forged[body_end - 1] ^= 1;
        let crc = crc32c::crc32c_append(crc32c::crc32c(&forged[..36]), &forged[HEADER_BYTES..body_end]);
        forged[36..40].copy_from_slice(&crc.to_le_bytes());
        assert!(matches!(decode(&forged, &Keys::Checked(&holds)), Err(PushError::BadMac | PushError::Archive(_))));
    }

    /// A body that validates as rkyv but holds an impossible summary, or a key whose id is not
    /// named, is refused by what it claims, not trusted.
    #[test]
    fn impossible_summaries_and_unnamed_ids_are_refused() {
        let mut s = summary(4, 2);
        s.keys[1].first_t1_ns = 1;
        assert!(matches!(decode(&pushes(&s, None)[0], &Keys::Unchecked), Err(PushError::Summary(_))));
        let s = summary(4, 2);
        let mut out = Vec::new();
        let partial = |id: u32| if id == 3 { None } else { names(id) };
        encode(&sender(), &mut 0, 0, true, &s, &[], &partial, None, &mut out).unwrap();
        assert_eq!(decode(&out[0], &Keys::Unchecked).unwrap_err(), PushError::Unnamed { key: 2, id: 3 });
        out.clear();
        let no_hop = |id: u32| if id == 201 { None } else { names(id) };
        encode(&sender(), &mut 0, 0, true, &summary(0, 0), &traces(2), &no_hop, None, &mut out).unwrap();
        assert_eq!(decode(&out[0], &Keys::Unchecked).unwrap_err(), PushError::BadTrace { trace: 1, id: 201, hops: 3 });
    }

    /// Traces ride with the first part of a window, named; past [`MAX_PATHS_PER_PUSH`] they
    /// wait; a wide window with traces still fits its datagrams.
    #[test]
    fn traces_go_with_the_first_part_and_name_their_hops() {
        let all = traces(MAX_PATHS_PER_PUSH as u32 + 10);
        let mut out = Vec::new();
        let taken = encode(&sender(), &mut 0, 0, true, &summary(3000, 2), &all, &names, None, &mut out).unwrap();
        assert_eq!(taken, MAX_PATHS_PER_PUSH);
        assert!(out.len() > 1);
        for (i, p) in out.iter().enumerate() {
            assert!(p.len() <= MAX_PUSH_BYTES, "push {i}: {} bytes", p.len());
            let r = decode(p, &Keys::Unchecked).unwrap();
            if i == 0 {
                assert_eq!(r.push.paths, all[..MAX_PATHS_PER_PUSH]);
                for id in [100, 200, 201, 101] {
                    assert!(r.push.names.iter().any(|n| n.id == id && n.addr == [id as u8; 16]), "hop {id} named");
                }
            } else {
                assert!(r.push.paths.is_empty());
            }
        }
    }
}
