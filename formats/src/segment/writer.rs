//! The segment writer: one per shard, appending probe records into preallocated segment files.
//!
//! The hot path is [`SegmentWriter::append`], which copies a record into preallocated column
//! buffers and, once per `chunk_records`, serialises the columns into one reused buffer it
//! `pwrite`s (or straight into a shared mapping of the file: [`WriteMode`]).
//! It never allocates after the first chunk. Everything slow (file creation, msync, fsync,
//! truncation) happens once per segment, and compression happens elsewhere ([`super::seal`]),
//! so the shard's core is never blocked for long.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use memmap2::MmapMut;
use rkyv::rancor;
use rkyv::ser::Positional;
use rkyv::ser::allocator::Arena;
use rkyv::ser::writer::Buffer;

use super::layout::{
    CLOSE_OFFSET, CloseBlock, FRAME_HEADER_BYTES, FrameKind, HEADER_BYTES, MAX_IDENTITY_BYTES, OPEN_SUFFIX,
    WriterIdentity, decode_frame_header, encode_close, encode_header, frame_span, seal_frame_header,
};
use super::{SegmentError, io_err};
use crate::record::{Endpoint, EndpointRole, PathRecord, ProbeColumns, ProbeRecord, SCHEMA_HASH, ServiceConn};
use crate::window::{Summariser, WindowSummary};

/// Path records are rare; flushing them every this many keeps their frames small.
const PATH_CHUNK_RECORDS: usize = 1024;
/// Pages of the mapping are write-faulted this far ahead of the write position, in one
/// `MADV_POPULATE_WRITE` call instead of one page fault per 4 KiB (measured: faults and their
/// zero-fill cost ~3x the column pushes themselves; see `bench formats`).
const POPULATE_AHEAD_BYTES: usize = 2 << 20;
/// Room kept in every segment for dictionary frames on top of two probe chunks.
const DICTIONARY_HEADROOM_BYTES: u64 = 1 << 20;

/// How a writer cuts its output into segments.
#[derive(Clone, Debug)]
pub struct WriterConfig {
    /// Directory the segments are created in (created if missing).
    pub dir: PathBuf,
    /// Size of each open segment file, preallocated at creation. Default 64 MiB (~1.3 M probes).
    pub segment_bytes: u64,
    /// A segment whose records span more than this is closed (by record time, so that the
    /// simulator's simulated time rotates exactly like an agent's wall clock). Default 10 min.
    pub max_age_ns: u64,
    /// Records per chunk: the unit of checksumming, of zero-copy column access, and of what a
    /// crash can lose. Default 4096.
    pub chunk_records: usize,
    /// How frames reach the file. Default [`WriteMode::Pwrite`].
    pub write_mode: WriteMode,
    /// Window summaries ([`crate::window`]) of this length are written beside the records; 0
    /// (the default) writes none.
    pub summary_window_ns: u64,
    /// A window's summary is closed once a record sent this long after the window's end is
    /// written: at least the probe timeout, since a record is written when its probe completes.
    /// Default 2 s.
    pub summary_grace_ns: u64,
    /// The closed summaries are also kept for the caller to take
    /// ([`SegmentWriter::take_summaries`]): the agent pushes them to the live analyzer.
    pub keep_summaries: bool,
}

/// How the writer puts frames into the segment file. Either way the file is preallocated, the
/// bytes are the same, and readers mmap it; a crash of the agent loses nothing written, since
/// both go through the page cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WriteMode {
    /// Serialise each frame into one reused, aligned buffer and `pwrite` it: one syscall per
    /// chunk, and a `kill -9` cannot tear a frame (it cannot interrupt the kernel's copy).
    /// The default, because populating a shared mapping page by page costs page faults and
    /// zero-fill of every new page, which `bench formats` measures at several times the cost.
    #[default]
    Pwrite,
    /// Serialise straight into a shared mapping of the file (no copy, but a write fault per new
    /// page, batched with `MADV_POPULATE_WRITE`).
    Mmap,
}

impl WriterConfig {
    /// Defaults for `dir`.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            segment_bytes: 64 << 20,
            max_age_ns: 600 * 1_000_000_000,
            chunk_records: 4096,
            write_mode: WriteMode::default(),
            summary_window_ns: 0,
            summary_grace_ns: 2_000_000_000,
            keep_summaries: false,
        }
    }

    fn validate(&self) -> Result<(), SegmentError> {
        if self.chunk_records == 0 || self.chunk_records > u32::MAX as usize {
            return Err(SegmentError::Config(format!(
                "chunk_records = {} is out of range: use 1 to {}",
                self.chunk_records,
                u32::MAX
            )));
        }
        let chunk_bytes = frame_span(ProbeColumns::archived_bound(self.chunk_records));
        // With summaries, room for what one chunk's records can add to them (sent in order).
        let summaries = if self.summary_window_ns == 0 {
            0
        } else {
            frame_span(crate::window::summary_bound(self.chunk_records, 3 * self.chunk_records, 0)) as u64
        };
        let needed = HEADER_BYTES as u64 + 2 * chunk_bytes as u64 + DICTIONARY_HEADROOM_BYTES + summaries;
        if self.segment_bytes < needed {
            return Err(SegmentError::ChunkTooLarge { chunk_bytes, segment_bytes: self.segment_bytes });
        }
        if self.max_age_ns == 0 {
            return Err(SegmentError::Config("max_age_ns = 0: a segment must be allowed to live".into()));
        }
        Ok(())
    }
}

/// Counters a shard exports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WriterStats {
    /// Records handed to `append`.
    pub records_appended: u64,
    /// Records inside complete, checksummed frames.
    pub records_written: u64,
    /// Records thrown away because no segment could be written (disk full, permissions).
    pub records_dropped: u64,
    /// Probe chunks written.
    pub chunks_written: u64,
    /// Segment files created.
    pub segments_opened: u64,
    /// Segment files closed.
    pub segments_closed: u64,
    /// Failed attempts to create, write or close a segment.
    pub write_errors: u64,
    /// Window summaries written (parts of a window count once each).
    pub summaries_written: u64,
    /// Parts of a window opened for records written after its summary was closed.
    pub summary_late_parts: u64,
    /// Summaries never written: no room for them in their segment (which then reads its
    /// records rather than its summaries), or too many waiting while no segment could be opened.
    pub summaries_dropped: u64,
    /// Summaries kept for the caller (`keep_summaries`) and dropped before it took them.
    pub summaries_not_taken: u64,
    /// Path traces kept for the caller and dropped before it took them.
    pub paths_not_taken: u64,
}

struct OpenSegment {
    path: PathBuf,
    file: File,
    sink: Sink,
    /// Preallocated size of the file.
    len: usize,
    pos: usize,
    close: CloseBlock,
    dictionary_written: usize,
}

enum Sink {
    Mapped { map: MmapMut, populated: usize },
    Buffered { frame: rkyv::util::AlignedVec<16> },
}

impl OpenSegment {
    /// A writable window for the next frame: its header and up to `payload_cap` payload bytes.
    fn window(&mut self, payload_cap: usize) -> &mut [u8] {
        let span = FRAME_HEADER_BYTES + payload_cap;
        match &mut self.sink {
            Sink::Mapped { map, populated } => {
                let end = self.pos + span;
                if end > *populated {
                    // One MADV_POPULATE_WRITE instead of a page fault per 4 KiB. Best effort:
                    // kernels before 5.14 refuse it and the faults simply happen one by one.
                    let upto = end.max(*populated + POPULATE_AHEAD_BYTES).min(self.len);
                    let ok = map.advise_range(memmap2::Advice::PopulateWrite, *populated, upto - *populated).is_ok();
                    *populated = if ok { upto } else { self.len };
                }
                &mut map[self.pos..end]
            }
            Sink::Buffered { frame } => {
                let want = frame_span(payload_cap);
                if frame.len() < want {
                    frame.resize(want, 0);
                }
                &mut frame[..span]
            }
        }
    }

    /// The payload is in the window: write the header (checksum last), put the frame in the
    /// file, check it reads back, and advance.
    fn commit(&mut self, kind: FrameKind, records: u32, first_ns: u64, payload_len: usize) -> Result<(), SegmentError> {
        let end = FRAME_HEADER_BYTES + payload_len;
        let span = frame_span(payload_len);
        let mut readback = [0u8; FRAME_HEADER_BYTES];
        match &mut self.sink {
            Sink::Mapped { map, .. } => {
                seal_frame_header(&mut map[self.pos..self.pos + end], kind, records, first_ns, payload_len);
                readback.copy_from_slice(&map[self.pos..self.pos + FRAME_HEADER_BYTES]);
            }
            Sink::Buffered { frame } => {
                seal_frame_header(&mut frame[..end], kind, records, first_ns, payload_len);
                frame[end..span].fill(0);
                self.file.write_all_at(&frame[..span], self.pos as u64).map_err(io_err(&self.path, "write frame"))?;
                self.file
                    .read_exact_at(&mut readback, self.pos as u64)
                    .map_err(io_err(&self.path, "read frame back"))?;
            }
        }
        // The other side of the write: what is now in the file must decode as what we meant.
        let check = decode_frame_header(&readback);
        assert!(
            matches!(check, Ok(h) if h.kind == kind && h.records == records && h.payload_len as usize == payload_len),
            "frame at {} of {} does not read back: {check:?}",
            self.pos,
            self.path.display()
        );
        self.pos += span;
        Ok(())
    }

    /// Copy an already-archived payload into the next frame.
    fn write_frame(
        &mut self,
        kind: FrameKind,
        records: u32,
        first_ns: u64,
        payload: &[u8],
    ) -> Result<(), SegmentError> {
        self.window(payload.len())[FRAME_HEADER_BYTES..].copy_from_slice(payload);
        self.commit(kind, records, first_ns, payload.len())
    }

    /// Write bytes of the header page (header or close block) and read them back.
    fn write_header_bytes(&mut self, offset: usize, bytes: &[u8]) -> Result<(), SegmentError> {
        let mut back = vec![0u8; bytes.len()];
        match &mut self.sink {
            Sink::Mapped { map, .. } => {
                map[offset..offset + bytes.len()].copy_from_slice(bytes);
                back.copy_from_slice(&map[offset..offset + bytes.len()]);
            }
            Sink::Buffered { .. } => {
                self.file.write_all_at(bytes, offset as u64).map_err(io_err(&self.path, "write segment header"))?;
                self.file
                    .read_exact_at(&mut back, offset as u64)
                    .map_err(io_err(&self.path, "read segment header back"))?;
            }
        }
        assert!(back == bytes, "header bytes at {offset} of {} do not read back", self.path.display());
        Ok(())
    }
}

/// Appends records into rotating segment files. Not thread-safe by design: one per shard.
pub struct SegmentWriter {
    cfg: WriterConfig,
    identity: WriterIdentity,
    identity_bytes: rkyv::util::AlignedVec,
    open: Option<OpenSegment>,
    columns: ProbeColumns,
    paths: Vec<PathRecord>,
    dictionary: Vec<Endpoint>,
    dictionary_ids: NameIds,
    arena: Arena,
    next_segment: u64,
    spare_frame: Option<rkyv::util::AlignedVec<16>>,
    closed: Vec<PathBuf>,
    stats: WriterStats,
    summariser: Option<Summariser>,
    /// Closed summaries kept for [`SegmentWriter::take_summaries`] (`keep_summaries`).
    kept: Vec<WindowSummary>,
    /// Path traces kept for [`SegmentWriter::take_paths`] (`keep_summaries`).
    kept_paths: Vec<PathRecord>,
}

impl std::fmt::Debug for SegmentWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SegmentWriter")
            .field("dir", &self.cfg.dir)
            .field("identity", &self.identity)
            .field("current", &self.open.as_ref().map(|o| &o.path))
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl SegmentWriter {
    /// A writer for `identity` into `cfg.dir`. No file is created until the first flush.
    pub fn new(cfg: WriterConfig, identity: WriterIdentity) -> Result<Self, SegmentError> {
        cfg.validate()?;
        std::fs::create_dir_all(&cfg.dir).map_err(io_err(&cfg.dir, "create segment directory"))?;
        let identity_bytes =
            rkyv::to_bytes::<rancor::Error>(&identity).map_err(|e| SegmentError::Config(e.to_string()))?;
        if identity_bytes.len() > MAX_IDENTITY_BYTES {
            return Err(SegmentError::Config(format!(
                "writer identity archives to {} bytes, more than the {MAX_IDENTITY_BYTES} the header holds: \
                 shorten the host, device or tool name",
                identity_bytes.len()
            )));
        }
        let columns = ProbeColumns::with_capacity(cfg.chunk_records);
        // One chunk's worth of rkyv scratch so that serialising never allocates in steady state.
        let arena = Arena::with_capacity(4096);
        let summariser =
            (cfg.summary_window_ns > 0).then(|| Summariser::new(cfg.summary_window_ns, cfg.summary_grace_ns));
        Ok(Self {
            cfg,
            identity,
            identity_bytes,
            open: None,
            columns,
            paths: Vec::with_capacity(PATH_CHUNK_RECORDS),
            dictionary: Vec::new(),
            dictionary_ids: NameIds::default(),
            arena,
            next_segment: 0,
            spare_frame: None,
            closed: Vec::new(),
            stats: WriterStats::default(),
            summariser,
            kept: Vec::new(),
            kept_paths: Vec::new(),
        })
    }

    /// The id records use for the endpoint called `name`, defining it on first use. Call this
    /// when a pinglist is loaded, not per probe.
    pub fn endpoint(&mut self, role: EndpointRole, name: &str, tor: &str, addr: [u8; 16]) -> u32 {
        if let Some(id) = self.dictionary_ids.get(name, &self.dictionary) {
            return id;
        }
        let id = self.dictionary.len() as u32;
        if self.dictionary.len() == self.dictionary.capacity() {
            // A definition past what was reserved (a traced hop, a service, a reload's new
            // target) grows the table by an eighth, not to twice a pinglist's size.
            self.dictionary.reserve_exact((self.dictionary.len() / 8).max(64));
        }
        self.dictionary.push(Endpoint {
            id,
            role: role as u8,
            name: name.to_owned(),
            tor: tor.to_owned(),
            addr,
            service: None,
        });
        self.dictionary_ids.insert(name, id);
        if let Some(s) = &mut self.summariser {
            // Probes between two ends under one ToR take no path a label chooses.
            s.set_same_tor(id, !tor.is_empty() && tor == self.identity.tor);
        }
        id
    }

    /// The id records use for a traced service connection called `name` (unique per connection),
    /// defining it on first use. Called when the connection becomes a target, not per probe.
    pub fn service_endpoint(&mut self, name: &str, tor: &str, addr: [u8; 16], conn: &ServiceConn) -> u32 {
        if let Some(id) = self.dictionary_ids.get(name, &self.dictionary) {
            return id;
        }
        let id = self.endpoint(EndpointRole::Service, name, tor, addr);
        self.dictionary[id as usize].service = Some(conn.clone());
        id
    }

    /// The first entry with `role` and `addr` (a linear scan: for rare lookups, such as naming
    /// a traced connection's remote end, never per probe).
    pub fn endpoint_by_addr(&self, role: EndpointRole, addr: &[u8; 16]) -> Option<&Endpoint> {
        self.dictionary.iter().find(|e| e.role == role as u8 && &e.addr == addr)
    }

    /// Make room for the endpoints among `names` not yet defined (a name listed twice counts
    /// twice): grown by doubling, a pinglist of 10,000 targets would leave the dictionary at
    /// 16,384 entries of 144 bytes. Call before [`SegmentWriter::endpoint`] for each.
    pub fn reserve_endpoints<'a>(&mut self, names: impl Iterator<Item = &'a str>) {
        let new = names.filter(|n| self.dictionary_ids.get(n, &self.dictionary).is_none()).count();
        self.dictionary.reserve_exact(new);
        self.dictionary_ids.reserve(new);
    }

    /// Close windows `grace_ns` after their end from now on, at most the configured
    /// `summary_grace_ns` (which sized the windows held open). Only where the summaries are
    /// kept for a live push (`keep_summaries`): a file's own summaries keep the configured grace.
    pub fn set_summary_grace(&mut self, grace_ns: u64) {
        if let Some(s) = &mut self.summariser
            && self.cfg.keep_summaries
        {
            s.set_grace(grace_ns.min(self.cfg.summary_grace_ns));
        }
    }

    /// How long after its end a window's summary is closed now (0 without summaries).
    pub fn summary_grace_ns(&self) -> u64 {
        self.summariser.as_ref().map_or(0, Summariser::grace_ns)
    }

    /// Closed summaries kept since the last call, oldest first, moved onto `out`
    /// (`WriterConfig::keep_summaries`).
    pub fn take_summaries(&mut self, out: &mut Vec<WindowSummary>) {
        out.append(&mut self.kept);
    }

    /// Path traces appended since the last call, oldest first, moved onto `out`
    /// (`WriterConfig::keep_summaries`).
    pub fn take_paths(&mut self, out: &mut Vec<PathRecord>) {
        out.append(&mut self.kept_paths);
    }

    /// The dictionary entry of `id`.
    pub fn entry(&self, id: u32) -> Option<&Endpoint> {
        self.dictionary.get(id as usize)
    }

    /// Dictionary entries defined so far (every segment repeats them all).
    pub fn dictionary_len(&self) -> usize {
        self.dictionary.len()
    }

    /// Append one probe record. Writes a chunk when `chunk_records` have accumulated.
    ///
    /// An error means the chunk could not be written (its records are counted as dropped);
    /// the writer stays usable and retries with a new segment on the next chunk.
    #[inline]
    pub fn append(&mut self, record: &ProbeRecord) -> Result<(), SegmentError> {
        self.columns.push(record);
        self.stats.records_appended += 1;
        if self.columns.len() >= self.cfg.chunk_records { self.flush() } else { Ok(()) }
    }

    /// A send due at `due_ns` left `late_ns` late: the shard's schedule slipped (a frozen host,
    /// a busy core). Noted in the window's summary; call it only for sends late by more than
    /// [`crate::window::LATE_SEND_NS`], which are rare.
    pub fn note_late(&mut self, due_ns: u64, late_ns: u64) {
        if let Some(s) = &mut self.summariser {
            s.note_late(due_ns, late_ns);
        }
    }

    /// Append one path trace.
    pub fn append_path(&mut self, record: &PathRecord) -> Result<(), SegmentError> {
        self.paths.push(*record);
        if self.cfg.keep_summaries {
            if self.kept_paths.len() >= MAX_KEPT_PATHS {
                self.kept_paths.remove(0);
                self.stats.paths_not_taken += 1;
            }
            self.kept_paths.push(*record);
        }
        if self.paths.len() >= PATH_CHUNK_RECORDS { self.flush() } else { Ok(()) }
    }

    /// Write whatever is buffered as (possibly short) frames. The agent calls this on a timer so
    /// that a crash loses at most one flush interval of probes.
    pub fn flush(&mut self) -> Result<(), SegmentError> {
        if self.columns.is_empty() && self.paths.is_empty() {
            return Ok(());
        }
        let result = self.write_buffered();
        if result.is_err() {
            self.stats.write_errors += 1;
            self.stats.records_dropped += self.columns.len() as u64;
            self.columns.clear();
            self.paths.clear();
            // Do not keep writing into a file that just failed (EIO, a full disk during a
            // pwrite): close what it holds, best effort, and start a fresh one next time.
            if let Some(seg) = self.open.take() {
                let _ = self.close_segment(seg);
            }
        }
        result
    }

    /// Flush and close the current segment; it is then ready for [`super::seal`]. Returns its
    /// path, if one was open.
    pub fn rotate(&mut self) -> Result<Option<PathBuf>, SegmentError> {
        let flushed = self.flush();
        let closed = match self.open.take() {
            Some(seg) => Some(self.close_segment(seg)?),
            None => None,
        };
        flushed.map(|()| closed)
    }

    /// Close the current segment if its first record is older than `max_age_ns` at `now_unix_ns`.
    /// For idle shards, whose records alone would never trigger age rotation.
    pub fn rotate_if_older(&mut self, now_unix_ns: u64) -> Result<Option<PathBuf>, SegmentError> {
        match &self.open {
            Some(seg) if now_unix_ns.saturating_sub(seg.close.first_unix_ns) > self.cfg.max_age_ns => self.rotate(),
            _ => Ok(None),
        }
    }

    /// Closed segments not yet handed out; the caller seals them (off the hot path).
    pub fn take_closed(&mut self) -> Vec<PathBuf> {
        std::mem::take(&mut self.closed)
    }

    /// Flush, close, and return every closed segment not yet taken.
    pub fn finish(mut self) -> Result<Vec<PathBuf>, SegmentError> {
        self.rotate()?;
        Ok(std::mem::take(&mut self.closed))
    }

    /// Counters.
    pub fn stats(&self) -> WriterStats {
        self.stats
    }

    /// The open segment's path, if any.
    pub fn current_path(&self) -> Option<&Path> {
        self.open.as_ref().map(|o| o.path.as_path())
    }

    /// The writer's identity.
    pub fn identity(&self) -> &WriterIdentity {
        &self.identity
    }

    /// Stop as a crash would: the open segment keeps what was written, gets no close block, and
    /// its lock is released; buffered records are lost.
    #[cfg(test)]
    pub(crate) fn crash(mut self) {
        drop(self.open.take());
    }

    fn write_buffered(&mut self) -> Result<(), SegmentError> {
        let (first_ns, last_ns) = self.buffered_time_range();
        let probe_bound =
            if self.columns.is_empty() { 0 } else { frame_span(ProbeColumns::archived_bound(self.columns.len())) };
        let paths_bound = if self.paths.is_empty() { 0 } else { frame_span(self.paths.len() * 64 + 64) };
        let span_ns = last_ns.saturating_sub(first_ns);
        // Room kept for the summaries the chunk closes: a segment without it is rotated first
        // (summaries that still do not fit are dropped, never the records).
        let summary_room = self.summariser.as_ref().map_or(0, |s| frame_span(s.bound(self.columns.len(), span_ns)));
        let rotate = match &self.open {
            Some(seg) => {
                let dict_bound = dictionary_bound(&self.dictionary[seg.dictionary_written..]);
                let need = dict_bound + probe_bound + paths_bound + summary_room;
                seg.pos + need > seg.len || last_ns.saturating_sub(seg.close.first_unix_ns) > self.cfg.max_age_ns
            }
            None => false,
        };
        if rotate && let Some(seg) = self.open.take() {
            self.close_segment(seg)?;
        }
        if self.open.is_none() {
            self.open = Some(self.open_segment(first_ns)?);
        }
        let Some(seg) = self.open.as_mut() else {
            return Err(SegmentError::Config("internal: no open segment after opening one".into()));
        };
        let need = dictionary_bound(&self.dictionary[seg.dictionary_written..]) + probe_bound + paths_bound;
        if seg.pos + need > seg.len {
            return Err(SegmentError::ChunkTooLarge { chunk_bytes: need, segment_bytes: self.cfg.segment_bytes });
        }

        for piece in self.dictionary[seg.dictionary_written..].chunks(DICTIONARY_FRAME_ENTRIES) {
            let bytes =
                rkyv::to_bytes::<rancor::Error>(&piece.to_vec()).map_err(|e| encode_failure("dictionary", e))?;
            seg.write_frame(FrameKind::Dictionary, piece.len() as u32, 0, &bytes)?;
            seg.dictionary_written += piece.len();
        }
        if !self.columns.is_empty() {
            let n = self.columns.len();
            let window = &mut seg.window(ProbeColumns::archived_bound(n))[FRAME_HEADER_BYTES..];
            let buffer = rkyv::api::low::to_bytes_in_with_alloc::<_, _, rancor::Error>(
                &self.columns,
                Buffer::from(window),
                self.arena.acquire(),
            )
            .map_err(|e| encode_failure("probe chunk", e))?;
            let len = buffer.pos();
            seg.commit(FrameKind::Probes, n as u32, first_ns, len)?;
            seg.close.records += n as u64;
            seg.close.chunks += 1;
            self.stats.records_written += n as u64;
            self.stats.chunks_written += 1;
            if let Some(s) = &mut self.summariser {
                s.fold(&self.columns);
            }
            self.columns.clear();
        }
        if !self.paths.is_empty() {
            let bytes = rkyv::to_bytes::<rancor::Error>(&self.paths).map_err(|e| encode_failure("path chunk", e))?;
            seg.write_frame(FrameKind::Paths, self.paths.len() as u32, first_ns, &bytes)?;
            self.paths.clear();
        }
        seg.close.first_unix_ns = seg.close.first_unix_ns.min(first_ns);
        seg.close.last_unix_ns = seg.close.last_unix_ns.max(last_ns);
        if let Some(s) = &mut self.summariser {
            // The records are in the file whatever becomes of their summaries.
            let kept = self.cfg.keep_summaries.then_some(&mut self.kept);
            write_summaries(seg, s, &mut self.stats, kept);
        }
        Ok(())
    }

    fn buffered_time_range(&self) -> (u64, u64) {
        let probes = self.columns.t1_unix_ns.iter().copied();
        let paths = self.paths.iter().map(|p| p.t_unix_ns);
        probes.chain(paths).fold((u64::MAX, 0), |(lo, hi), t| (lo.min(t), hi.max(t)))
    }

    fn open_segment(&mut self, first_ns: u64) -> Result<OpenSegment, SegmentError> {
        let name = format!(
            "{:013}-{}-{}-{:08x}-{:06}{OPEN_SUFFIX}",
            first_ns / 1_000_000,
            file_safe(&self.identity.host),
            file_safe(&self.identity.device),
            self.identity.agent_epoch,
            self.next_segment,
        );
        let path = self.cfg.dir.join(name);
        // create_new: an existing file is someone's data, never overwrite it.
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(io_err(&path, "create segment"))?;
        // The lock says "a live writer owns this file": `seal` refuses locked segments, and the
        // kernel drops the lock when the process dies, however it dies.
        lock_exclusive(&file).map_err(io_err(&path, "lock new segment"))?;
        let len = self.cfg.segment_bytes;
        if let Err(e) = reserve(&file, len) {
            let _ = std::fs::remove_file(&path);
            return Err(SegmentError::Io {
                path,
                op: format!("reserve {} MiB for a new segment", len >> 20),
                source: e,
            });
        }
        let sink = match self.cfg.write_mode {
            WriteMode::Mmap => {
                // SAFETY: the file was created by us with create_new and is only ever mapped
                // writable by this writer; readers map it read-only and never truncate it.
                let map = unsafe { MmapMut::map_mut(&file) }.map_err(io_err(&path, "mmap segment"))?;
                Sink::Mapped { map, populated: HEADER_BYTES }
            }
            WriteMode::Pwrite => Sink::Buffered {
                frame: self.spare_frame.take().unwrap_or_else(|| {
                    rkyv::util::AlignedVec::with_capacity(frame_span(ProbeColumns::archived_bound(
                        self.cfg.chunk_records,
                    )))
                }),
            },
        };
        let mut seg = OpenSegment {
            path,
            file,
            sink,
            len: len as usize,
            pos: HEADER_BYTES,
            close: CloseBlock { first_unix_ns: u64::MAX, ..CloseBlock::default() },
            dictionary_written: 0,
        };
        let mut page = vec![0u8; HEADER_BYTES];
        encode_header(&mut page, first_ns, SCHEMA_HASH, &self.identity_bytes);
        // No msync or fsync here, nor at close: a synchronous flush of up to 64 MiB would stall
        // the shard's probes for hundreds of milliseconds (measured in `bench formats`). The page
        // cache already survives a crash of the agent; durability against power loss comes from
        // sealing, which fsyncs the compressed copy right after rotation, off the shard.
        seg.write_header_bytes(0, &page)?;
        self.next_segment += 1;
        self.stats.segments_opened += 1;
        Ok(seg)
    }

    fn close_segment(&mut self, mut seg: OpenSegment) -> Result<PathBuf, SegmentError> {
        if let Some(s) = &mut self.summariser {
            // Its records' windows close with it (the next segment summarises its own records),
            // so that a closed segment's summaries count exactly its records. Room for them was
            // kept by every flush's bound.
            s.close_all();
            let kept = self.cfg.keep_summaries.then_some(&mut self.kept);
            write_summaries(&mut seg, s, &mut self.stats, kept);
        }
        if seg.close.chunks == 0 {
            seg.close.first_unix_ns = seg.close.first_unix_ns.min(seg.close.last_unix_ns);
        }
        seg.close.data_end = seg.pos as u64;
        let mut page = vec![0u8; HEADER_BYTES];
        encode_close(&mut page, &seg.close);
        seg.write_header_bytes(CLOSE_OFFSET, &page[CLOSE_OFFSET..])?;
        let OpenSegment { path, file, sink, pos, .. } = seg;
        if let Sink::Buffered { frame } = sink {
            self.spare_frame = Some(frame);
        }
        // (The mapping, if any, is gone by now: truncating under a live mapping would be a
        // SIGBUS waiting for the next write.)
        // Give back the preallocated, unused tail; the close block says where data ends anyway.
        file.set_len(pos as u64).map_err(io_err(&path, "truncate closed segment"))?;
        self.stats.segments_closed += 1;
        self.closed.push(path.clone());
        Ok(path)
    }
}

impl Drop for SegmentWriter {
    /// Best effort: a writer dropped without `finish` (an error path in its owner) still leaves
    /// a closed, complete segment behind. Errors here have nowhere to go; the reader will see an
    /// unclosed segment at worst, which it reads fine.
    fn drop(&mut self) {
        if self.open.is_some() {
            let _ = self.rotate();
        }
    }
}

/// Endpoint ids by name, without a second copy of every name: an id under its name's 64-bit
/// hash, and the rare name whose hash an earlier name holds, whole. An agent probing 10,000
/// targets defines 10,000 names, and a map keyed by the names would hold each one twice.
struct NameIds {
    hash: fn(&str) -> u64,
    by_hash: HashMap<u64, u32, foldhash::fast::RandomState>,
    collided: HashMap<String, u32>,
}

impl Default for NameIds {
    fn default() -> Self {
        NameIds::with_hash(|name| {
            use std::hash::BuildHasher;
            foldhash::quality::FixedState::with_seed(0x6e61_6d65).hash_one(name)
        })
    }
}

impl NameIds {
    fn with_hash(hash: fn(&str) -> u64) -> Self {
        NameIds { hash, by_hash: HashMap::default(), collided: HashMap::new() }
    }

    /// The id of `name`, whose entry `entries` holds at that id.
    fn get(&self, name: &str, entries: &[Endpoint]) -> Option<u32> {
        let &id = self.by_hash.get(&(self.hash)(name))?;
        if entries.get(id as usize).is_some_and(|e| e.name == name) {
            return Some(id);
        }
        self.collided.get(name).copied()
    }

    /// Define `name` as `id` (not defined before).
    fn insert(&mut self, name: &str, id: u32) {
        match self.by_hash.entry((self.hash)(name)) {
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert(id);
            }
            std::collections::hash_map::Entry::Occupied(_) => {
                self.collided.insert(name.to_owned(), id);
            }
        }
    }

    fn reserve(&mut self, n: usize) {
        self.by_hash.reserve(n);
    }
}

/// Write the summaries `s` has closed as one frame of `seg`. They are of `seg`'s records and of
/// no other file's: ones that do not fit (or fail to write) are dropped and counted, and the
/// segment's reader then finds summaries that do not count all its records, and reads the
/// records.
///
/// With `kept`, the summaries are moved there (whether or not they fit the file: they count
/// true probes either way); at most [`MAX_KEPT`] wait there, the oldest dropped and counted.
fn write_summaries(
    seg: &mut OpenSegment,
    s: &mut Summariser,
    stats: &mut WriterStats,
    kept: Option<&mut Vec<WindowSummary>>,
) {
    stats.summary_late_parts = s.late_parts;
    let ready = s.ready();
    let Some(first) = ready.first() else { return };
    let (n, start) = (ready.len() as u64, first.start_unix_ns);
    let probes: u64 = ready.iter().map(WindowSummary::probes).sum();
    let written = rkyv::to_bytes::<rancor::Error>(ready).ok().is_some_and(|bytes| {
        seg.pos + frame_span(bytes.len()) <= seg.len
            && seg.write_frame(FrameKind::Windows, probes as u32, start, &bytes).is_ok()
    });
    if written {
        stats.summaries_written += n;
    } else {
        stats.summaries_dropped += n;
    }
    match kept {
        Some(kept) => {
            s.take_ready_into(kept);
            let over = kept.len().saturating_sub(MAX_KEPT);
            kept.drain(..over);
            stats.summaries_not_taken += over as u64;
        }
        None => s.clear_ready(),
    }
    stats.summaries_dropped += std::mem::take(&mut s.dropped);
}

/// Closed summaries kept for a caller that does not take them (a minute of 5 s windows, a few
/// times over).
const MAX_KEPT: usize = 64;
/// Path traces kept for a caller that does not take them: a shard traces a few a second.
const MAX_KEPT_PATHS: usize = 1024;

/// Size of an archived [`Endpoint`] without its strings' bytes.
const ARCHIVED_ENDPOINT_BYTES: usize = size_of::<crate::record::ArchivedEndpoint>();

/// Entries per dictionary frame. Every new segment repeats the whole dictionary, and the write
/// buffer (`Sink::Buffered`) keeps the size of the largest frame it wrote: in one frame, 10,000
/// targets' entries would hold it at 1 MiB, five times what a probe chunk needs.
const DICTIONARY_FRAME_ENTRIES: usize = 1024;

/// The bytes `entries` take in the file, as frames of [`DICTIONARY_FRAME_ENTRIES`].
pub(crate) fn dictionary_bound(entries: &[Endpoint]) -> usize {
    entries.chunks(DICTIONARY_FRAME_ENTRIES).map(dictionary_frame_bound).sum()
}

fn dictionary_frame_bound(entries: &[Endpoint]) -> usize {
    if entries.is_empty() {
        return 0;
    }
    // The archived entry is fixed-size (the service option is inline) plus its strings' bytes,
    // each padded to rkyv's alignment; `dictionary_bound_holds` checks it.
    let strings = |e: &Endpoint| {
        let conn = e.service.as_ref().map_or(0, |c| c.comm.len() + c.remote.len() + 16);
        e.name.len() + e.tor.len() + 16 + conn
    };
    let body: usize = entries.iter().map(|e| ARCHIVED_ENDPOINT_BYTES + strings(e)).sum();
    frame_span(body + 64)
}

fn encode_failure(what: &str, e: rancor::Error) -> SegmentError {
    SegmentError::Config(format!("encoding a {what} failed: {e} (a bug in rocemesh: please report it)"))
}

/// Take the writer's advisory lock on a segment without waiting.
pub(crate) fn lock_exclusive(file: &File) -> std::io::Result<()> {
    // SAFETY: plain syscall on a valid, owned descriptor.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Reserve real blocks for the whole file: a write to a sparse mmap'd file on a full disk is a
/// SIGBUS that kills the agent; a failed fallocate is an error we can report.
fn reserve(file: &File, len: u64) -> std::io::Result<()> {
    // SAFETY: plain syscall on a valid, owned descriptor.
    let rc = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len as libc::off_t) };
    match rc {
        0 => Ok(()),
        // Filesystems without fallocate: fall back to a sparse file (the SIGBUS risk remains
        // there and is documented in docs/design/segments.md#segments).
        libc::EOPNOTSUPP | libc::EINVAL => file.set_len(len),
        errno => Err(std::io::Error::from_raw_os_error(errno)),
    }
}

pub(crate) fn sync_dir(dir: &Path) -> Result<(), SegmentError> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(io_err(dir, "fsync directory"))
}

fn file_safe(s: &str) -> String {
    let cleaned: String =
        s.chars().map(|c| if c.is_ascii_alphanumeric() || c == '.' || c == '_' { c } else { '_' }).collect();
    if cleaned.is_empty() { "_".into() } else { cleaned }
}

#[cfg(test)]
mod name_tests {
    use super::*;

    fn entries(names: &[&str]) -> Vec<Endpoint> {
        let e = |(i, n): (usize, &&str)| Endpoint { id: i as u32, name: n.to_string(), ..Endpoint::default() };
        names.iter().enumerate().map(e).collect()
    }

    #[test]
    fn names_whose_hashes_collide_keep_their_own_ids() {
        let all = entries(&["tor0-h1/mlx5_0", "tor0-h2/mlx5_0", "tor1-h1/mlx5_1"]);
        for hash in [(|_: &str| 7) as fn(&str) -> u64, |n: &str| n.len() as u64, NameIds::default().hash] {
            let mut ids = NameIds::with_hash(hash);
            for e in &all {
                assert_eq!(ids.get(&e.name, &all[..e.id as usize]), None, "{} not defined yet", e.name);
                ids.insert(&e.name, e.id);
            }
            for e in &all {
                assert_eq!(ids.get(&e.name, &all), Some(e.id), "{}", e.name);
            }
            assert_eq!(ids.get("tor9-h9/mlx5_0", &all), None);
        }
    }

    #[test]
    fn a_pinglists_endpoints_are_held_in_exactly_the_room_they_need() {
        let dir = tempfile::tempdir().expect("tempdir");
        let identity = WriterIdentity {
            host: "tor0-h1".into(),
            device: "mlx5_0".into(),
            tor: "tor0".into(),
            agent_epoch: 1,
            tool: "test".into(),
        };
        let mut w = SegmentWriter::new(WriterConfig::new(dir.path()), identity).expect("writer");
        let names: Vec<String> = (0..10_000).map(|i| format!("t{i}/mlx5_0")).collect();
        for round in 0..2 {
            // A reload of the same pinglist plus one new target.
            let more = format!("t{}/mlx5_0", 10_000 + round);
            let list = || names.iter().map(String::as_str).chain([more.as_str()]);
            w.reserve_endpoints(list());
            for (i, n) in list().enumerate() {
                let id = w.endpoint(EndpointRole::Rnic, n, "tor1", [0; 16]);
                assert_eq!(id as usize, if i < 10_000 { i } else { 10_000 + round }, "{n}");
            }
            assert_eq!(w.dictionary.capacity(), 10_001 + round, "round {round}");
        }
        // A traced hop defined after the pinglist grows the table by an eighth, not twice.
        assert_eq!(w.endpoint(EndpointRole::Switch, "spine0", "", [0; 16]), 10_002);
        assert_eq!(w.dictionary.capacity(), 10_002 + 10_002 / 8);
    }
}
