//! The segment reader on sealed (`.rseg.zst`) segments, as `ctl collect` fetches them from
//! every host and `analyze` reads them.
//!
//! An input that starts with the zstd magic is a sealed file as it is (hostile and truncated
//! compressed data); any other input is the decompressed content, which gets its checksums
//! made right and is compressed as `seal` does, so that the mutations reach the validation
//! behind the decompression instead of dying in the zstd decoder.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rocemesh_fuzz::segment::{ZSTD_MAGIC, check_sealed, compress, fix_checksums, self_check};

fuzz_target!(init: self_check(), |data: &[u8]| {
    if data.starts_with(&ZSTD_MAGIC) {
        check_sealed(data);
    } else {
        let mut fixed = data.to_vec();
        fix_checksums(&mut fixed);
        check_sealed(&compress(&fixed));
    }
});
