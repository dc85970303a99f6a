//! `ctl keys`: the fleet key file beside the pinglists ([`rocemesh_formats::keys`]): a new key
//! that every agent accepts at once and sends with after a grace period, the old one accepted
//! for a grace period more, so that a rotation pushed within the grace never loses a probe.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use rocemesh_formats::keys::{FILE_NAME, FleetKeys, SECRET_BYTES};
use rocemesh_formats::time::civil_utc;

use crate::error::Error;
use crate::pinglist_dir::atomic_write_private;

/// The key file of the pinglist directory `dir`.
pub fn path(dir: &Path) -> PathBuf {
    dir.join(FILE_NAME)
}

/// What a rotation did.
#[derive(Debug, Clone)]
pub struct Rotated {
    /// The file written.
    pub path: PathBuf,
    /// The new key's id.
    pub id: u8,
    /// The file as written.
    pub keys: FleetKeys,
}

/// Adds a key to `dir`'s key file (creating it), sent from `now_unix_s + grace_s`, and writes
/// the file back durably, mode 0600.
pub fn rotate(dir: &Path, now_unix_s: u64, grace_s: u64) -> Result<Rotated, Error> {
    let path = path(dir);
    let mut keys = if path.exists() { FleetKeys::load(&path)? } else { FleetKeys::new() };
    let id = keys.rotate(now_unix_s, grace_s, random_secret()?).map_err(|e| {
        Error::invalid(
            format!("{}: {e}", path.display()),
            "rotate after the oldest key's grace ends, or with a shorter --grace-s",
        )
    })?;
    let text = keys
        .to_toml_string()
        .map_err(|e| Error::invalid(format!("cannot write the key file: {e}"), "report this as a ctl bug"))?;
    write_private(&path, text.as_bytes()).map_err(|e| Error::io(&path, "write the key file", e))?;
    Ok(Rotated { path, id, keys })
}

/// Writes `bytes` to `path` durably, mode 0600 from the temporary file's first byte on.
pub(crate) fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    atomic_write_private(path, bytes)
}

fn random_secret() -> Result<[u8; SECRET_BYTES], Error> {
    let mut b = [0u8; SECRET_BYTES];
    // SAFETY: getrandom writes at most `b.len()` bytes into `b`.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    if n != b.len() as isize {
        return Err(Error::invalid(
            format!("getrandom failed: {}", std::io::Error::last_os_error()),
            "run ctl on a host whose kernel has an entropy source (Linux >= 3.17)",
        ));
    }
    Ok(b)
}

/// The keys as a table, without their secrets.
pub fn render(keys: &FleetKeys, now_unix_s: u64) -> String {
    let when = |s: u64| {
        let c = civil_utc(s as i64);
        format!("{:04}-{:02}-{:02} {:02}:{:02}:{:02}Z", c.year, c.month, c.day, c.hour, c.minute, c.second)
    };
    let sending = keys.send_key(now_unix_s).map(|k| k.id);
    let mut out = String::from("id   send from              accept until           now\n");
    let mut sorted: Vec<_> = keys.keys.iter().collect();
    sorted.sort_by_key(|k| k.send_from_unix_s);
    for k in sorted {
        let state = if sending == Some(k.id) {
            "sending"
        } else if !k.accepted_at(now_unix_s) {
            "expired"
        } else if k.send_from_unix_s > now_unix_s {
            "accepted, sent later"
        } else {
            "accepted (grace)"
        };
        let until = k.accept_until_unix_s.map_or_else(|| "-".to_owned(), when);
        let _ = writeln!(out, "{:<4} {:<22} {:<22} {state}", k.id, when(k.send_from_unix_s), until);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotate_creates_a_private_file_and_the_next_rotation_overlaps_it() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let first = rotate(dir.path(), 1_000, 0).expect("first");
        let mode = std::fs::metadata(&first.path).expect("stat").permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let second = rotate(dir.path(), 2_000, 300).expect("second");
        let keys = FleetKeys::load(&second.path).expect("valid");
        assert_eq!(keys.keys.len(), 2);
        assert_eq!(keys.send_key(2_000).map(|k| k.id), Some(first.id));
        assert_eq!(keys.send_key(2_300).map(|k| k.id), Some(second.id));
        let table = render(&keys, 2_000);
        assert!(table.contains("sending") && table.contains("accepted, sent later"), "{table}");
        assert!(!table.contains(&keys.keys[0].secret), "no secret in the table");
    }
}
