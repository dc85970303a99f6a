use std::path::{Path, PathBuf};

use rocemesh_formats::inventory::FileError;

/// Why a ctl operation could not run. Every variant says what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file (inventory, pinglist, host description, ToR map, results file) was refused;
    /// it names the file, the line and the field.
    #[error(transparent)]
    File(#[from] FileError),
    /// Reading or writing a local file or directory failed.
    #[error("{}: cannot {action}: {source} (fix: {fix})", .path.display())]
    Io {
        path: PathBuf,
        action: &'static str,
        #[source]
        source: std::io::Error,
        fix: String,
    },
    /// The options or inputs do not fit together (not about one line of a file).
    #[error("{problem} (fix: {fix})")]
    Invalid { problem: String, fix: String },
}

impl Error {
    pub(crate) fn io(path: &Path, action: &'static str, source: std::io::Error) -> Error {
        let fix = match source.kind() {
            std::io::ErrorKind::NotFound => "check the path",
            std::io::ErrorKind::PermissionDenied => "run as a user who may access it, or choose another path",
            std::io::ErrorKind::StorageFull => "free space on that filesystem",
            _ => "check the path and the filesystem",
        };
        Error::Io { path: path.to_path_buf(), action, source, fix: fix.to_owned() }
    }

    pub(crate) fn invalid(problem: impl Into<String>, fix: impl Into<String>) -> Error {
        Error::Invalid { problem: problem.into(), fix: fix.into() }
    }
}

/// 1-based line of `byte_offset` in `text`.
pub(crate) fn line_of(text: &str, byte_offset: usize) -> usize {
    let end = byte_offset.min(text.len());
    text.as_bytes()[..end].iter().filter(|&&b| b == b'\n').count() + 1
}

pub use rocemesh_formats::describe::host_name_problem;
