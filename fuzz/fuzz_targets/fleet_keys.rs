//! The fleet key file: pushed by `ctl` to every agent, which reloads it on every change.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rocemesh_formats::keys::FleetKeys;

fuzz_target!(|data: &[u8]| {
    let Some(parsed) = rocemesh_fuzz::toml_round_trip(data, FleetKeys::parse, FleetKeys::to_toml_string) else {
        return;
    };
    // Every key of an accepted file has a usable secret: the agent skips none silently.
    assert!(parsed.keys.iter().all(|k| k.secret_bytes().is_some()), "an accepted key without a secret");
});
