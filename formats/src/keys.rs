//! The fleet key file: the secrets that authenticate every probe and ACK (issue 21).
//!
//! `ctl keys rotate` writes it next to the pinglists, `ctl push-pinglist` copies it to every
//! host beside its pinglist, and the agent reloads it when it changes, as it does the pinglist.
//! The file holds at most [`MAX_KEYS`] keys, each with the time agents start sending with it
//! and, once a newer key replaces it, the time they stop accepting it:
//!
//! ```toml
//! version = 1
//!
//! [[key]]
//! id = 7                                   # carried in every packet: which key made its MAC
//! secret = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
//! send_from_unix_s = 1764000000            # agents send with the newest key whose time has come
//! accept_until_unix_s = 1764000900         # accepted until then (absent: while in the file)
//!
//! [[key]]
//! id = 8
//! secret = "60303ae22b998861bce3b28f33eec1be758a213c86c93c076dbe9f558c11c752"
//! send_from_unix_s = 1764000600
//! ```
//!
//! Rotation without a probing gap follows from the two times: every key in the file is
//! accepted from the moment the file arrives, whether or not its sending time has come, so a
//! new key is accepted everywhere before anyone sends with it as long as the push reaches every
//! host within the grace period; and the old key stays accepted for a grace period after the
//! new one takes over. Both rely on the hosts' clocks agreeing to within that grace, which the
//! probes' replay window (the agent's `[auth] window_ms`) needs anyway.
//!
//! The file is a secret: [`FleetKeys::load`] refuses one that others can read or its group can
//! change (0600, or 0640 with the agent's group: `ctl push-pinglist` installs it so).

use std::collections::HashMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

pub use crate::tomlfile::FileError;
use crate::tomlfile::{self, Document, FieldPath, VersionGate};

/// The key file format version this build reads and writes.
pub const VERSION: i64 = 1;
/// The file's name beside a pinglist: in ctl's pinglist directory and on every host.
pub const FILE_NAME: &str = "fleet-keys.toml";
/// Keys one file holds at most: the one in force, the one rotating in, and old ones in their
/// grace period. A bound so that a receiver's lookup is a short scan.
pub const MAX_KEYS: usize = 4;
/// Bytes of a secret (BLAKE3's key size).
pub const SECRET_BYTES: usize = 32;

const GATE: VersionGate<'static> = VersionGate {
    format: "fleet key file",
    supported: VERSION,
    mismatch_fix: "write the file with a ctl of the same release as the agent (`ctl keys rotate`)",
};

/// The whole file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FleetKeys {
    /// Format version, [`VERSION`].
    pub version: i64,
    /// The keys, in any order.
    #[serde(rename = "key", default)]
    pub keys: Vec<FleetKey>,
}

/// One key.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FleetKey {
    /// Carried in every packet so that a receiver finds the key without trying each; unique
    /// within the file.
    pub id: u8,
    /// [`SECRET_BYTES`] random bytes as 64 hex digits.
    pub secret: String,
    /// Agents send with the newest key whose `send_from_unix_s` has passed.
    pub send_from_unix_s: u64,
    /// Agents stop accepting this key at this time; absent: accepted while it is in the file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accept_until_unix_s: Option<u64>,
}

impl std::fmt::Debug for FleetKey {
    // Never the secret: keys end up in logs through `{:?}`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FleetKey")
            .field("id", &self.id)
            .field("send_from_unix_s", &self.send_from_unix_s)
            .field("accept_until_unix_s", &self.accept_until_unix_s)
            .finish_non_exhaustive()
    }
}

impl FleetKey {
    /// The secret's bytes. Only valid on a key of a file that [`FleetKeys::parse`] accepted
    /// (or one [`FleetKey::new`] made); anything else gives `None`.
    pub fn secret_bytes(&self) -> Option<[u8; SECRET_BYTES]> {
        decode_hex(&self.secret)
    }

    /// A key with `secret`, sent from `send_from_unix_s`.
    pub fn new(id: u8, secret: [u8; SECRET_BYTES], send_from_unix_s: u64) -> Self {
        let mut hex = String::with_capacity(2 * SECRET_BYTES);
        for b in secret {
            hex.push_str(&format!("{b:02x}"));
        }
        FleetKey { id, secret: hex, send_from_unix_s, accept_until_unix_s: None }
    }

    /// Whether a receiver accepts this key at `now_unix_s`.
    pub fn accepted_at(&self, now_unix_s: u64) -> bool {
        self.accept_until_unix_s.is_none_or(|until| now_unix_s < until)
    }
}

fn decode_hex(s: &str) -> Option<[u8; SECRET_BYTES]> {
    let b = s.as_bytes();
    if b.len() != 2 * SECRET_BYTES {
        return None;
    }
    let nibble = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    };
    let mut out = [0u8; SECRET_BYTES];
    for (i, o) in out.iter_mut().enumerate() {
        *o = (nibble(b[2 * i])? << 4) | nibble(b[2 * i + 1])?;
    }
    Some(out)
}

/// Why `ctl keys rotate` could not add a key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RotateError {
    /// The file would hold more than [`MAX_KEYS`] keys still accepted.
    #[error(
        "the key file already holds {MAX_KEYS} keys that are still accepted (the oldest until unix time {until}); \
         rotating again before then would drop a key some agents may still send with (wait until then, \
         or rotate with a shorter --grace-s)"
    )]
    TooManyKeys {
        /// When the oldest accepted key expires.
        until: u64,
    },
}

impl FleetKeys {
    /// An empty file.
    pub fn new() -> Self {
        FleetKeys { version: VERSION, keys: Vec::new() }
    }

    /// Reads and validates the key file at `path`, refusing one that others can read or write or
    /// its group can write.
    pub fn load(path: impl AsRef<Path>) -> Result<FleetKeys, FileError> {
        Self::read(path).map(|(_, keys)| keys)
    }

    /// [`FleetKeys::load`], with the file's text as it is on disk (what `ctl push-pinglist`
    /// copies to the hosts, read once with the keys it holds).
    pub fn read(path: impl AsRef<Path>) -> Result<(String, FleetKeys), FileError> {
        let path = path.as_ref();
        let text = read_private(path)?;
        let keys = Self::parse(&text, path)?;
        Ok((text, keys))
    }

    /// Parses and validates `text`; `path` is only used in errors.
    pub fn parse(text: &str, path: &Path) -> Result<FleetKeys, FileError> {
        let mut doc = Document::parse(path, text, &GATE)?;
        let keys: FleetKeys = doc.deserialize()?;
        keys.validate(&doc)?;
        Ok(keys)
    }

    /// The file's text; [`FleetKeys::parse`] reads it back unchanged.
    pub fn to_toml_string(&self) -> Result<String, toml::ser::Error> {
        let mut out = String::from("# rocemesh fleet keys (`ctl keys rotate`). SECRET: keep this file mode 0600.\n");
        out.push_str(&toml::to_string(self)?);
        Ok(out)
    }

    /// The key agents send with at `now_unix_s`: the newest whose sending time has come and
    /// that is still accepted. `None`: send unauthenticated packets (no key in force yet).
    pub fn send_key(&self, now_unix_s: u64) -> Option<&FleetKey> {
        self.keys
            .iter()
            .filter(|k| k.send_from_unix_s <= now_unix_s && k.accepted_at(now_unix_s))
            .max_by_key(|k| (k.send_from_unix_s, k.id))
    }

    /// Adds a new key with `secret`, sent from `now_unix_s + grace_s`; the keys in force until
    /// then stay accepted for `grace_s` after it, and keys whose acceptance has ended are
    /// dropped. Returns the new key's id.
    pub fn rotate(&mut self, now_unix_s: u64, grace_s: u64, secret: [u8; SECRET_BYTES]) -> Result<u8, RotateError> {
        self.keys.retain(|k| k.accepted_at(now_unix_s));
        let send_from = now_unix_s.saturating_add(grace_s);
        if self.keys.len() >= MAX_KEYS {
            let until = self.keys.iter().filter_map(|k| k.accept_until_unix_s).min().unwrap_or(u64::MAX);
            return Err(RotateError::TooManyKeys { until });
        }
        // Every key without an end gets one: a grace period after the new key takes over.
        for k in &mut self.keys {
            if k.accept_until_unix_s.is_none() {
                k.accept_until_unix_s = Some(send_from.saturating_add(grace_s));
            }
        }
        let newest = self.keys.iter().max_by_key(|k| k.send_from_unix_s).map_or(0, |k| k.id);
        let mut id = newest.wrapping_add(1);
        while self.keys.iter().any(|k| k.id == id) {
            id = id.wrapping_add(1);
        }
        self.keys.push(FleetKey::new(id, secret, send_from));
        Ok(id)
    }

    fn validate(&self, doc: &Document<'_>) -> Result<(), FileError> {
        let root = FieldPath::root();
        if self.keys.is_empty() {
            return Err(doc.error(
                &root.key("key"),
                "the key file has no key",
                "create one with `ctl keys rotate`, or remove `[auth] keys` from the agent's config",
            ));
        }
        if self.keys.len() > MAX_KEYS {
            return Err(doc.error(
                &root.key("key").index(MAX_KEYS),
                format!("{} keys; the file holds at most {MAX_KEYS}", self.keys.len()),
                "drop the keys whose accept_until_unix_s has passed (`ctl keys rotate` does)",
            ));
        }
        let mut seen: HashMap<u8, usize> = HashMap::new();
        for (i, k) in self.keys.iter().enumerate() {
            let path = root.key("key").index(i);
            if let Some(first) = seen.insert(k.id, i) {
                return Err(doc.error(
                    &path.key("id"),
                    format!("key id {} is also the id of key[{first}]", k.id),
                    "give every key its own id (`ctl keys rotate` does)",
                ));
            }
            match k.secret_bytes() {
                None => {
                    return Err(doc.error(
                        &path.key("secret"),
                        format!("the secret is not {} hex digits", 2 * SECRET_BYTES),
                        "write 32 random bytes as 64 hex digits (`ctl keys rotate` makes one)",
                    ));
                }
                Some(s) if s == [0; SECRET_BYTES] => {
                    return Err(doc.error(
                        &path.key("secret"),
                        "the secret is all zeros",
                        "use 32 random bytes (`ctl keys rotate` makes one)",
                    ));
                }
                Some(_) => {}
            }
            if k.accept_until_unix_s.is_some_and(|u| u <= k.send_from_unix_s) {
                return Err(doc.error(
                    &path.key("accept_until_unix_s"),
                    "accept_until_unix_s is not after send_from_unix_s: the key would never be used",
                    "make accept_until_unix_s later than send_from_unix_s, or drop the key",
                ));
            }
        }
        Ok(())
    }
}

impl Default for FleetKeys {
    fn default() -> Self {
        Self::new()
    }
}

/// The text of the key file at `path`, refusing one that others may read or write, its group
/// write, or a user other than this process's or root own: a secret readable by every user of
/// a training node would let any of them forge probes, and its owner can rewrite the fleet's
/// keys. Group read is allowed so that a root-owned file can be read by the agent's group
/// (`/etc/rocemesh` is root:rocemesh). Owner and mode are those of the file opened and read
/// (`fstat` on its descriptor), so a file swapped between the check and the read is not read.
fn read_private(path: &Path) -> Result<String, FileError> {
    use std::io::Read;
    use std::os::unix::fs::MetadataExt;
    let mut file = std::fs::File::open(path).map_err(|e| tomlfile::read_error(path, &e))?;
    let meta = file.metadata().map_err(|e| tomlfile::read_error(path, &e))?;
    check_private(path, meta.mode(), meta.uid(), geteuid())?;
    let mut text = String::new();
    file.read_to_string(&mut text).map_err(|e| tomlfile::read_error(path, &e))?;
    Ok(text)
}

fn geteuid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// The checks of [`read_private`] on a file of `mode` owned by `uid`, read by `euid`.
fn check_private(path: &Path, mode: u32, uid: u32, euid: u32) -> Result<(), FileError> {
    let mode = mode & 0o777;
    if mode & 0o027 != 0 {
        return Err(FileError::new(
            path,
            None,
            "",
            format!("the key file is mode {mode:04o}: other users can read or change the fleet's secret"),
            format!("chmod 600 {} (owned by the agent's user), or 640 with the agent's group", path.display()),
        ));
    }
    if uid != euid && uid != 0 {
        return Err(FileError::new(
            path,
            None,
            "",
            format!(
                "the key file is owned by uid {uid}, neither this process's user ({euid}) nor root: that user can rewrite the fleet's keys"
            ),
            format!("chown root {} (or to the user the agent runs as)", path.display()),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: [u8; 32] = [0x11; 32];
    const B: [u8; 32] = [0x22; 32];

    fn parse(text: &str) -> Result<FleetKeys, FileError> {
        FleetKeys::parse(text, Path::new("fleet-keys.toml"))
    }

    #[test]
    fn the_documented_example_parses_and_round_trips() {
        let text = crate::tomlfile::testing::doc_example(include_str!("keys.rs"));
        let keys = parse(&text).expect("the module docs' example");
        assert_eq!(keys.keys.len(), 2);
        assert_eq!(keys.send_key(1_764_000_599).map(|k| k.id), Some(7));
        assert_eq!(keys.send_key(1_764_000_600).map(|k| k.id), Some(8));
        assert_eq!(parse(&keys.to_toml_string().expect("toml")).expect("round trip"), keys);
    }

    #[test]
    fn rotation_overlaps_old_and_new_keys_by_the_grace_period() {
        let mut keys = FleetKeys::new();
        let first = keys.rotate(1000, 0, A).expect("first key");
        assert_eq!(keys.send_key(1000).map(|k| k.id), Some(first));
        let second = keys.rotate(5000, 600, B).expect("second key");
        assert_ne!(first, second);
        // Until the new key's time, the old one is sent; the new one is already accepted.
        assert_eq!(keys.send_key(5599).map(|k| k.id), Some(first));
        assert_eq!(keys.send_key(5600).map(|k| k.id), Some(second));
        let old = keys.keys.iter().find(|k| k.id == first).expect("old key");
        assert!(old.accepted_at(6199) && !old.accepted_at(6200));
        // The old key is dropped by the next rotation once its grace is over.
        keys.rotate(7000, 600, A).expect("third key");
        assert!(keys.keys.iter().all(|k| k.id != first));
        assert_eq!(parse(&keys.to_toml_string().expect("toml")).expect("valid"), keys);
    }

    #[test]
    fn rotating_faster_than_keys_expire_is_refused() {
        let mut keys = FleetKeys::new();
        for i in 0..MAX_KEYS as u64 {
            keys.rotate(100 + i, 3600, A).expect("room");
        }
        assert!(matches!(keys.rotate(200, 3600, B), Err(RotateError::TooManyKeys { .. })));
    }

    #[test]
    fn bad_files_name_the_field_and_the_fix() {
        let key = |id: u8, secret: &str| format!("[[key]]\nid = {id}\nsecret = \"{secret}\"\nsend_from_unix_s = 1\n");
        let good = "ab".repeat(32);
        let e = parse("version = 1\n").expect_err("no key");
        assert!(e.to_string().contains("no key"), "{e}");
        let e = parse(&format!("version = 1\n{}{}", key(1, &good), key(1, &good))).expect_err("dup id");
        assert_eq!(e.field, "key[1].id");
        let e = parse(&format!("version = 1\n{}", key(1, "abc"))).expect_err("short secret");
        assert_eq!((e.field.as_str(), e.line), ("key[0].secret", Some(4)));
        let e = parse(&format!("version = 1\n{}", key(1, &"00".repeat(32)))).expect_err("zero secret");
        assert!(e.problem.contains("all zeros"));
        let e = parse(&format!("version = 1\n{}accept_until_unix_s = 1\n", key(1, &good))).expect_err("until");
        assert_eq!(e.field, "key[0].accept_until_unix_s");
        let e = parse(&format!("version = 2\n{}", key(1, &good))).expect_err("version");
        assert!(e.to_string().contains("version"), "{e}");
    }

    /// A key file of one key in `dir`, mode `mode`; its path and keys.
    fn key_file(dir: &Path, mode: u32) -> (std::path::PathBuf, FleetKeys) {
        use std::os::unix::fs::PermissionsExt;
        let path = dir.join(FILE_NAME);
        let mut keys = FleetKeys::new();
        keys.rotate(1, 0, A).expect("key");
        std::fs::write(&path, keys.to_toml_string().expect("toml")).expect("write");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).expect("chmod");
        (path, keys)
    }

    #[test]
    fn a_key_file_others_can_read_is_refused_with_the_chmod_that_fixes_it() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let (path, keys) = key_file(dir.path(), 0o644);
        let e = FleetKeys::load(&path).expect_err("world-readable");
        assert!(e.fix.starts_with("chmod 600"), "{e}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o660)).expect("chmod");
        assert!(FleetKeys::load(&path).is_err(), "group-writable");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).expect("chmod");
        assert_eq!(FleetKeys::load(&path).expect("group-readable"), keys);
    }

    /// A 0600 file owned by another user (who could rewrite the fleet's keys) is refused with
    /// the chown that fixes it; root's and this user's own are taken.
    #[test]
    fn a_key_file_owned_by_another_user_is_refused_with_the_chown_that_fixes_it() {
        let p = Path::new("/etc/rocemesh/fleet-keys.toml");
        let e = check_private(p, 0o100600, 1001, 1000).expect_err("another user's");
        assert!(e.problem.contains("owned by uid 1001") && e.fix.starts_with("chown root"), "{e}");
        assert!(check_private(p, 0o100600, 1000, 1000).is_ok(), "its own user's");
        assert!(check_private(p, 0o100640, 0, 1000).is_ok(), "root's, group-readable");
        assert!(check_private(p, 0o100600, 0, 0).is_ok());
    }

    /// The same on a real file, checked on the descriptor that is read (chown needs root).
    #[test]
    #[ignore = "needs root: chowns a file to another user"]
    fn loading_a_key_file_owned_by_another_user_fails() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (path, keys) = key_file(dir.path(), 0o600);
        assert_eq!(FleetKeys::load(&path).expect("root's own"), keys);
        std::os::unix::fs::chown(&path, Some(65534), None).expect("chown to nobody");
        let e = FleetKeys::load(&path).expect_err("nobody's");
        assert!(e.problem.contains("owned by uid 65534"), "{e}");
    }

    #[test]
    fn debug_output_never_shows_the_secret() {
        let k = FleetKey::new(3, A, 0);
        assert!(!format!("{k:?}").contains("1111"));
    }
}
