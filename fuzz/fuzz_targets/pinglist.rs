//! Pinglists: written by `ctl`, pushed to every agent, which loads them at start and on every change.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rocemesh_formats::pinglist::Pinglist;

fuzz_target!(|data: &[u8]| {
    rocemesh_fuzz::toml_round_trip(data, Pinglist::parse, Pinglist::to_toml_string);
});
