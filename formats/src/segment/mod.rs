//! Segment files: where every probe an agent makes is kept until `analyze` reads it.
//!
//! A segment is one file per shard and time slice. While open it is a preallocated file
//! (`*.rseg`) the writer appends framed, checksummed chunks to (with `pwrite` by default, or
//! through a shared mapping: [`WriteMode`]) and readers mmap; when it is closed (by size, by
//! age, or at shutdown) it is sealed into a zstd-compressed copy (`*.rseg.zst`) for shipping.
//! The [`SegmentReader`] reads both, validating everything before it hands out a byte.
//!
//! File layout (all integers little-endian):
//!
//! ```text
//! 0       header page (4 KiB): magic, format version, schema hash, creation time, crc,
//!         writer identity (rkyv); at its end the close block (time range, records, data end),
//!         written once when the segment is closed
//! 4096    frame, frame, ...   each: 32-byte frame header (magic, kind, payload length,
//!         record count, first timestamp, payload crc32c, header crc32c) + rkyv payload,
//!         padded to 16 bytes
//! ...     zeros (the preallocated, not yet written part of an open segment)
//! ```
//!
//! A sealed file is that layout (up to the end of its last frame) as a run of independent zstd
//! frames, one per group of frames of one content (`frames`), followed by a zstd skippable frame
//! holding its summary (`summary`): what planning a read of the file needs, so that planning
//! does not inflate it, and the index of those zstd frames, so that a read inflates only the
//! ones it needs.
//!
//! Crash safety rests on two rules: a frame's payload is written before its header, and its
//! header checksum last; and nothing already written is ever rewritten. After `kill -9` at any
//! moment the page cache holds a prefix of frames plus at most one torn frame, which the reader
//! reports as a torn tail and skips.

mod frames;
mod layout;
mod reader;
mod seal;
mod summary;
mod writer;

use std::path::PathBuf;

pub use frames::{Content, GROUP_RAW_BYTES, Pick, SealedFrame};
pub use layout::{FORMAT_VERSION, FrameKind, HEADER_BYTES, OPEN_SUFFIX, SEALED_SUFFIX, WriterIdentity, name_first_ms};
pub use reader::{Damage, DamageKind, SegmentReader};
pub use seal::{Eviction, SealReport, enforce_quota, seal};
pub use summary::{
    LONG_GAP_FACTOR, LONG_GAP_MIN_NS, SUMMARY_VERSION, SealedSummary, SendGaps, Summary, SummaryRead, read_summary,
    send_gaps,
};
pub use writer::{SegmentWriter, WriteMode, WriterConfig, WriterStats};

/// Everything that can go wrong with a segment file. Each variant names the file; its message
/// says what to do.
#[derive(Debug, thiserror::Error)]
pub enum SegmentError {
    /// The operating system refused an operation on the file.
    #[error("{path}: {op} failed: {source}{}", hint(.source))]
    Io {
        /// File or directory concerned.
        path: PathBuf,
        /// What was being done ("create", "reserve 64 MiB", "mmap", ...).
        op: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The file is not a rocemesh segment at all (wrong magic).
    #[error(
        "{path}: not a rocemesh segment (starts with {found}); point the reader at *.rseg or \
         *.rseg.zst files written by a rocemesh agent or simulator"
    )]
    Foreign {
        /// The file.
        path: PathBuf,
        /// The first bytes found, in hex.
        found: String,
    },
    /// A segment file that was created but never written: its writer died between creating
    /// the file and writing the header. It holds no records.
    #[error(
        "{path}: created but never written (its writer died while creating it); it holds no records and can be deleted"
    )]
    Unwritten {
        /// The file.
        path: PathBuf,
    },
    /// A segment whose format version this build does not read.
    #[error(
        "{path}: segment format version {found} is not supported by this build (it reads \
         version {supported}); read it with a matching rocemesh release"
    )]
    UnsupportedVersion {
        /// The file.
        path: PathBuf,
        /// Version in the file.
        found: u16,
        /// Version this build reads.
        supported: u16,
    },
    /// Same format version, different record schema: a build from another revision wrote it.
    #[error(
        "{path}: record schema {found:#018x} differs from this build's {expected:#018x}; the \
         file was written by a different rocemesh build: read it with that build"
    )]
    SchemaMismatch {
        /// The file.
        path: PathBuf,
        /// Hash in the file.
        found: u64,
        /// Hash of this build ([`crate::record::SCHEMA_HASH`]).
        expected: u64,
    },
    /// The header page is damaged or truncated, so no frame can be trusted.
    #[error("{path}: segment header unreadable: {reason}; the file cannot be read (keep it for inspection)")]
    BadHeader {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A sealed file that does not decompress, or decompresses to more than the limit.
    #[error("{path}: sealed segment does not decompress: {reason}")]
    BadSealed {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A value the caller passed is out of range (the message says which and why).
    #[error("{0}")]
    Config(String),
    /// Writing a chunk would not fit even an empty segment: the chunk size is too large for the
    /// configured segment size.
    #[error(
        "a chunk of {chunk_bytes} bytes does not fit a segment of {segment_bytes} bytes; raise \
         segment_bytes or lower chunk_records"
    )]
    ChunkTooLarge {
        /// Bytes the chunk needs.
        chunk_bytes: usize,
        /// Configured segment size.
        segment_bytes: u64,
    },
}

fn hint(e: &std::io::Error) -> &'static str {
    match e.raw_os_error() {
        Some(libc::ENOSPC) | Some(libc::EDQUOT) => {
            "; the disk is full: free space, or lower the agent's segment quota so sealed \
             segments are evicted sooner"
        }
        Some(libc::EACCES) | Some(libc::EPERM) => {
            "; the agent's user cannot write there: fix the directory's owner or permissions"
        }
        Some(libc::EFBIG) => {
            "; the process file-size limit (ulimit -f, LimitFSIZE) is below the segment size: \
             raise it or lower segment_bytes"
        }
        Some(libc::ENOENT) => "; the directory does not exist: create it or fix the path",
        _ => "",
    }
}

/// The error for a failed `op` on `path`, built only when there is an error: the success path
/// of a chunk write must not allocate.
fn io_err<'a>(path: &'a std::path::Path, op: &'a str) -> impl FnOnce(std::io::Error) -> SegmentError + 'a {
    move |source| SegmentError::Io { path: path.to_path_buf(), op: op.to_owned(), source }
}

#[cfg(test)]
mod tests;
