//! What the fuzz targets share: UTF-8 for the text loaders, a scratch file for the readers that
//! only take a path, and the segment checksums.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The input as the file loaders see it: they read files with `read_to_string`, which refuses
/// anything that is not UTF-8 before any parser runs.
pub fn text(data: &[u8]) -> Option<&str> {
    std::str::from_utf8(data).ok()
}

/// The TOML formats' round trip: what `parse` accepts, `write` turns into text that `parse`
/// reads back equal (every format's `to_toml_string` promises it). Returns what was parsed.
pub fn toml_round_trip<T, E, W>(
    data: &[u8],
    parse: impl Fn(&str, &Path) -> Result<T, E>,
    write: impl Fn(&T) -> Result<String, W>,
) -> Option<T>
where
    T: PartialEq + std::fmt::Debug,
    E: std::fmt::Display,
    W: std::fmt::Debug,
{
    let path = Path::new("fuzz.toml");
    let parsed = parse(text(data)?, path).ok()?;
    let written = write(&parsed).expect("an accepted file serialises");
    match parse(&written, path) {
        Ok(back) => assert_eq!(back, parsed, "read back differently from:\n{written}"),
        Err(e) => panic!("its own output is refused: {e}\n{written}"),
    }
    Some(parsed)
}

/// Writes `bytes` to this process's scratch file named `name` and returns its path.
///
/// On tmpfs (`/dev/shm`) when there is one, so that a file per input costs a memcpy, not disk
/// I/O. `scripts/fuzz` points `ROCEMESH_FUZZ_TMP` at a directory it removes afterwards; without
/// it, each process leaves one file per name in `/dev/shm` (or the temp directory).
pub fn scratch_file(name: &str, bytes: &[u8]) -> PathBuf {
    let path = scratch_path(name);
    std::fs::write(&path, bytes).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    path
}

/// Where [`scratch_file`] puts `name`, without writing it.
pub fn scratch_path(name: &str) -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    let dir = DIR.get_or_init(|| {
        let dir = match std::env::var_os("ROCEMESH_FUZZ_TMP") {
            Some(d) => PathBuf::from(d),
            None if Path::new("/dev/shm").is_dir() => PathBuf::from("/dev/shm"),
            None => std::env::temp_dir(),
        };
        // Per process: `scripts/fuzz` may run several targets, and libFuzzer forks in -fork mode.
        let dir = dir.join(format!("rocemesh-fuzz-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
        dir
    });
    dir.join(name)
}

pub mod segment;
