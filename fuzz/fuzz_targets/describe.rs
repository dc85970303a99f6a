//! Host descriptions: `agent describe` on every host, read by `ctl inventory import` on the bastion.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rocemesh_formats::describe::HostDescription;

fuzz_target!(|data: &[u8]| {
    rocemesh_fuzz::toml_round_trip(data, HostDescription::parse, HostDescription::to_toml_string);
});
