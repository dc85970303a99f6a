//! An authenticated agent's receive path: every datagram is parsed and then admitted or refused
//! by `Auth` (key lookup, MAC, window, replay table). Nothing the fuzzer makes without the key
//! may be admitted unless it carries that key's valid MAC, and a second copy never is.
#![no_main]

use std::sync::Mutex;

use libfuzzer_sys::fuzz_target;
use rocemesh_agent::auth::{Auth, AuthParams};
use rocemesh_agent::protocol::{Binding, MacKey, PACKET_BYTES, Packet};
use rocemesh_formats::keys::{FleetKey, FleetKeys};

const SECRET: [u8; 32] = [0x42; 32];
/// The clock the admitter runs at; inputs carry their own sealed time.
const NOW_NS: u64 = 1_800_000_000_000_000_000;
/// The end every input is received at.
const ME: Binding = Binding([9; 16]);

static AUTH: Mutex<Option<Auth>> = Mutex::new(None);

fuzz_target!(|data: &[u8]| {
    let mut guard = AUTH.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let auth = guard.get_or_insert_with(|| {
        let mut keys = FleetKeys::new();
        keys.keys.push(FleetKey::new(7, SECRET, 0));
        let mut a = Auth::new(AuthParams { window_ns: 2_000_000_000, replay_slots: 1 << 16 });
        a.set_keys(&keys, NOW_NS);
        a
    });
    // Inputs that parse may be forged; the first byte also picks "seal it properly" so that the
    // fuzzer reaches the window and replay checks, not only the MAC.
    let mut bytes = data.to_vec();
    if bytes.len() == PACKET_BYTES + 1 && bytes[PACKET_BYTES] & 1 == 1 {
        bytes.truncate(PACKET_BYTES);
        if let Ok((p, Some(seal))) = Packet::parse(&bytes) {
            let mut b = [0u8; PACKET_BYTES];
            p.seal(&mut b, &MacKey::new(7, SECRET), seal.sent_unix_ns, &ME);
            bytes = b.to_vec();
        }
    }
    let Ok((_, seal)) = Packet::parse(&bytes) else { return };
    let admitted = auth.admit(&bytes, seal, NOW_NS, &ME).is_ok();
    if admitted && let Some(s) = seal {
        let b: &[u8; PACKET_BYTES] = bytes.as_slice().try_into().expect("a parsed packet is 64 bytes");
        assert!(MacKey::new(s.key_id, SECRET).verify(b, &ME), "admitted without a valid MAC");
        assert!(auth.admit(&bytes, seal, NOW_NS, &ME).is_err(), "the same packet admitted twice");
    }
});
