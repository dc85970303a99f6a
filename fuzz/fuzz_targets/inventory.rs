//! Inventories: written by operators or `ctl inventory import`, read by `ctl` and `analyze`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rocemesh_formats::inventory::Inventory;

fuzz_target!(|data: &[u8]| {
    rocemesh_fuzz::toml_round_trip(data, Inventory::parse, Inventory::to_toml_string);
});
