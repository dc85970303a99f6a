//! Fault scenarios: read by `testbeds simulate` and `testbeds score`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rocemesh_formats::scenario::Scenario;

fuzz_target!(|data: &[u8]| {
    rocemesh_fuzz::toml_round_trip(data, Scenario::parse, Scenario::to_toml_string);
});
