//! The segment reader on open (`.rseg`) segments, as agents leave them and `analyze` reads them,
//! and `seal` on whatever the reader accepts.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rocemesh_fuzz::segment::{check_open, fix_checksums, self_check};

fuzz_target!(init: self_check(), |data: &[u8]| {
    check_open(data);
    // Past the checksums: the same bytes with every checksum made right.
    let mut fixed = data.to_vec();
    fix_checksums(&mut fixed);
    if fixed != data {
        check_open(&fixed);
    }
});
