//! The bytes of a segment file: header page, close block and frames. Both the writer and the
//! reader go through these functions, so the layout is defined exactly once.

use rkyv::{Archive, Deserialize, Serialize};

/// First eight bytes of every segment file.
pub const SEGMENT_MAGIC: [u8; 8] = *b"ROCEMSEG";
/// Format version this build writes and reads.
pub const FORMAT_VERSION: u16 = 1;
/// Size of the header page; frames start here.
pub const HEADER_BYTES: usize = 4096;
/// File name suffix of an open (mmap'd, uncompressed) segment.
pub const OPEN_SUFFIX: &str = ".rseg";
/// File name suffix of a sealed (zstd) segment.
pub const SEALED_SUFFIX: &str = ".rseg.zst";

/// The first record's time a segment's file name carries: its leading Unix milliseconds, up to
/// the first `-` (the writer names a file `<ms, 13 digits>-<host>-<device>-<epoch>-<n>.rseg`).
/// `None` for a name that does not start so. `ctl collect` dates its directories by it, and
/// `analyze watch` dates the files it has forgotten.
pub fn name_first_ms(file_name: &str) -> Option<u64> {
    file_name.split('-').next()?.parse().ok()
}

/// Where the writer identity starts inside the header page.
pub(crate) const IDENTITY_OFFSET: usize = 48;
/// The close block occupies the last 64 bytes of the header page.
pub(crate) const CLOSE_OFFSET: usize = HEADER_BYTES - 64;
const CLOSE_MAGIC: u32 = u32::from_le_bytes(*b"RMCL");

/// Frame header size; payloads start right after it.
pub(crate) const FRAME_HEADER_BYTES: usize = 32;
/// Frames start on this alignment, which is also the largest alignment rkyv needs.
pub(crate) const FRAME_ALIGN: usize = 16;
const FRAME_MAGIC: u32 = u32::from_le_bytes(*b"RMCK");

/// What a frame's payload holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum FrameKind {
    /// New dictionary entries of earlier schemas (an rkyv `Vec<EndpointV1>`), ids continuing the
    /// previous ones. Read, never written.
    DictionaryV1 = 1,
    /// A chunk of probe records (an rkyv `ProbeColumns`).
    Probes = 2,
    /// A chunk of path traces (an rkyv `Vec<PathRecord>`).
    Paths = 3,
    /// New dictionary entries (an rkyv `Vec<Endpoint>`, with service connections), ids
    /// continuing the previous ones.
    Dictionary = 4,
    /// Window summaries of the probe chunks before it in the same file (an rkyv
    /// `Vec<WindowSummary>`, [`crate::window`]); the header's record count is the probes they
    /// summarise.
    Windows = 5,
}

impl FrameKind {
    fn from_u8(v: u8) -> Option<Self> {
        match v {
            1 => Some(Self::DictionaryV1),
            2 => Some(Self::Probes),
            3 => Some(Self::Paths),
            4 => Some(Self::Dictionary),
            5 => Some(Self::Windows),
            _ => None,
        }
    }
}

/// Who wrote a segment. Stored in the header, so every record of the file is attributable
/// even after the file has been shipped away from its host.
#[derive(Archive, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[rkyv(derive(Debug))]
pub struct WriterIdentity {
    /// Host name (inventory name).
    pub host: String,
    /// RNIC device (`mlx5_0`) or UDP endpoint name the shard probes from.
    pub device: String,
    /// ToR of that RNIC, when known.
    pub tor: String,
    /// Random per-start epoch of the agent; a new value means the agent restarted.
    pub agent_epoch: u32,
    /// Name and version of the writing program (`rocemesh-agent 0.1.0`, `rocemesh-testbeds ...`).
    pub tool: String,
}

/// Longest identity (archived) that fits in the header page.
pub(crate) const MAX_IDENTITY_BYTES: usize = CLOSE_OFFSET - IDENTITY_OFFSET;

/// The fixed fields of a header page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct HeaderFields {
    pub version: u16,
    pub identity_len: u32,
    pub schema_hash: u64,
    pub created_unix_ns: u64,
}

/// The close block: what is known only once a segment is complete.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub(crate) struct CloseBlock {
    pub first_unix_ns: u64,
    pub last_unix_ns: u64,
    pub records: u64,
    pub data_end: u64,
    pub chunks: u64,
}

/// A decoded frame header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FrameHeader {
    pub kind: FrameKind,
    pub payload_len: u32,
    pub records: u32,
    pub first_unix_ns: u64,
    pub payload_crc: u32,
}

/// Why a frame header could not be decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FrameHeaderError {
    /// 32 zero bytes: the end of written data in an open segment.
    Zero,
    /// Anything else: a torn or overwritten header.
    Bad(&'static str),
}

pub(crate) fn u16_at(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes([b[off], b[off + 1]])
}
pub(crate) fn u32_at(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}
pub(crate) fn u64_at(b: &[u8], off: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[off..off + 8]);
    u64::from_le_bytes(a)
}

pub(crate) const fn align_up(v: usize, a: usize) -> usize {
    (v + a - 1) & !(a - 1)
}

/// Write the header page's fixed part and identity into `page` (which must be zeroed and
/// `HEADER_BYTES` long). The identity must already be archived.
pub(crate) fn encode_header(page: &mut [u8], created_unix_ns: u64, schema_hash: u64, identity: &[u8]) {
    assert_eq!(page.len(), HEADER_BYTES);
    assert!(identity.len() <= MAX_IDENTITY_BYTES);
    page[0..8].copy_from_slice(&SEGMENT_MAGIC);
    page[8..10].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    page[12..16].copy_from_slice(&(identity.len() as u32).to_le_bytes());
    page[16..24].copy_from_slice(&schema_hash.to_le_bytes());
    page[24..32].copy_from_slice(&created_unix_ns.to_le_bytes());
    page[IDENTITY_OFFSET..IDENTITY_OFFSET + identity.len()].copy_from_slice(identity);
    let crc = header_crc(page, identity.len());
    page[32..36].copy_from_slice(&crc.to_le_bytes());
}

fn header_crc(page: &[u8], identity_len: usize) -> u32 {
    let crc = crc32c::crc32c(&page[0..32]);
    crc32c::crc32c_append(crc, &page[IDENTITY_OFFSET..IDENTITY_OFFSET + identity_len])
}

/// Decode the fixed header fields. Errors are plain reasons; the caller adds the path and
/// decides between "foreign", "unsupported version" and "damaged".
pub(crate) enum HeaderProblem {
    Foreign,
    Version(u16),
    Damaged(String),
}

pub(crate) fn decode_header(page: &[u8]) -> Result<HeaderFields, HeaderProblem> {
    if page.len() < 8 || page[0..8] != SEGMENT_MAGIC {
        return Err(HeaderProblem::Foreign);
    }
    if page.len() < HEADER_BYTES {
        return Err(HeaderProblem::Damaged(format!(
            "file is {} bytes, shorter than the {HEADER_BYTES}-byte header page",
            page.len()
        )));
    }
    let version = u16_at(page, 8);
    if version != FORMAT_VERSION {
        return Err(HeaderProblem::Version(version));
    }
    let identity_len = u32_at(page, 12);
    if identity_len as usize > MAX_IDENTITY_BYTES {
        return Err(HeaderProblem::Damaged(format!("identity length {identity_len} exceeds the header page")));
    }
    let stored = u32_at(page, 32);
    let computed = header_crc(page, identity_len as usize);
    if stored != computed {
        return Err(HeaderProblem::Damaged(format!(
            "header checksum {stored:#010x} does not match its contents ({computed:#010x})"
        )));
    }
    Ok(HeaderFields { version, identity_len, schema_hash: u64_at(page, 16), created_unix_ns: u64_at(page, 24) })
}

pub(crate) fn encode_close(page: &mut [u8], c: &CloseBlock) {
    let b = &mut page[CLOSE_OFFSET..HEADER_BYTES];
    b.fill(0);
    b[0..4].copy_from_slice(&CLOSE_MAGIC.to_le_bytes());
    b[8..16].copy_from_slice(&c.first_unix_ns.to_le_bytes());
    b[16..24].copy_from_slice(&c.last_unix_ns.to_le_bytes());
    b[24..32].copy_from_slice(&c.records.to_le_bytes());
    b[32..40].copy_from_slice(&c.data_end.to_le_bytes());
    b[40..48].copy_from_slice(&c.chunks.to_le_bytes());
    let crc = crc32c::crc32c(&b[0..60]);
    b[60..64].copy_from_slice(&crc.to_le_bytes());
}

/// `Ok(None)`: never closed (all zeros). `Err`: a close block that is present but damaged.
pub(crate) fn decode_close(page: &[u8]) -> Result<Option<CloseBlock>, &'static str> {
    let b = &page[CLOSE_OFFSET..HEADER_BYTES];
    if b.iter().all(|&x| x == 0) {
        return Ok(None);
    }
    if u32_at(b, 0) != CLOSE_MAGIC {
        return Err("close block has a wrong magic");
    }
    if crc32c::crc32c(&b[0..60]) != u32_at(b, 60) {
        return Err("close block checksum does not match");
    }
    Ok(Some(CloseBlock {
        first_unix_ns: u64_at(b, 8),
        last_unix_ns: u64_at(b, 16),
        records: u64_at(b, 24),
        data_end: u64_at(b, 32),
        chunks: u64_at(b, 40),
    }))
}

/// Fill in a frame header for a payload already written at `frame[FRAME_HEADER_BYTES..]`.
/// The header checksum is stored last, after a release fence, so that a concurrent reader
/// of the mapping never accepts a header whose payload is not there yet.
pub(crate) fn seal_frame_header(
    frame: &mut [u8],
    kind: FrameKind,
    records: u32,
    first_unix_ns: u64,
    payload_len: usize,
) {
    let payload_crc = crc32c::crc32c(&frame[FRAME_HEADER_BYTES..FRAME_HEADER_BYTES + payload_len]);
    frame[0..4].copy_from_slice(&FRAME_MAGIC.to_le_bytes());
    frame[4] = kind as u8;
    frame[5..8].fill(0);
    frame[8..12].copy_from_slice(&(payload_len as u32).to_le_bytes());
    frame[12..16].copy_from_slice(&records.to_le_bytes());
    frame[16..24].copy_from_slice(&first_unix_ns.to_le_bytes());
    frame[24..28].copy_from_slice(&payload_crc.to_le_bytes());
    let header_crc = crc32c::crc32c(&frame[0..28]);
    std::sync::atomic::fence(std::sync::atomic::Ordering::Release);
    frame[28..32].copy_from_slice(&header_crc.to_le_bytes());
}

pub(crate) fn decode_frame_header(h: &[u8]) -> Result<FrameHeader, FrameHeaderError> {
    if h.iter().all(|&x| x == 0) {
        return Err(FrameHeaderError::Zero);
    }
    if u32_at(h, 0) != FRAME_MAGIC {
        return Err(FrameHeaderError::Bad("frame magic missing"));
    }
    if crc32c::crc32c(&h[0..28]) != u32_at(h, 28) {
        return Err(FrameHeaderError::Bad("frame header checksum does not match"));
    }
    let kind = FrameKind::from_u8(h[4]).ok_or(FrameHeaderError::Bad("unknown frame kind"))?;
    Ok(FrameHeader {
        kind,
        payload_len: u32_at(h, 8),
        records: u32_at(h, 12),
        first_unix_ns: u64_at(h, 16),
        payload_crc: u32_at(h, 24),
    })
}

/// Bytes a frame with this payload occupies, padding included.
pub(crate) const fn frame_span(payload_len: usize) -> usize {
    align_up(FRAME_HEADER_BYTES + payload_len, FRAME_ALIGN)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips_and_detects_every_flipped_bit_of_fixed_fields() {
        let mut page = vec![0u8; HEADER_BYTES];
        encode_header(&mut page, 123, 456, b"identity!");
        let h = decode_header(&page).ok().expect("decodes");
        assert_eq!((h.version, h.identity_len, h.schema_hash, h.created_unix_ns), (1, 9, 456, 123));
        for byte in 10..36 {
            let mut p = page.clone();
            p[byte] ^= 0x10;
            assert!(decode_header(&p).is_err(), "flip in byte {byte} went unnoticed");
        }
    }

    #[test]
    fn frame_header_round_trips_and_zero_is_end() {
        let mut f = vec![0u8; 64];
        f[32..40].copy_from_slice(b"payload!");
        seal_frame_header(&mut f, FrameKind::Probes, 7, 99, 8);
        let h = decode_frame_header(&f[..32]).expect("decodes");
        assert_eq!((h.kind, h.records, h.first_unix_ns, h.payload_len), (FrameKind::Probes, 7, 99, 8));
        assert_eq!(h.payload_crc, crc32c::crc32c(b"payload!"));
        assert_eq!(decode_frame_header(&[0u8; 32]), Err(FrameHeaderError::Zero));
        f[12] ^= 1;
        assert!(matches!(decode_frame_header(&f[..32]), Err(FrameHeaderError::Bad(_))));
    }

    #[test]
    fn close_block_round_trips() {
        let mut page = vec![0u8; HEADER_BYTES];
        assert_eq!(decode_close(&page), Ok(None));
        let c = CloseBlock { first_unix_ns: 1, last_unix_ns: 2, records: 3, data_end: 4, chunks: 5 };
        encode_close(&mut page, &c);
        assert_eq!(decode_close(&page), Ok(Some(c)));
        page[CLOSE_OFFSET + 20] ^= 1;
        assert!(decode_close(&page).is_err());
    }
}
