//! The probe/ACK decoder: every datagram that reaches an agent's port goes through it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rocemesh_agent::protocol::{PACKET_BYTES, Packet};

fuzz_target!(|data: &[u8]| {
    let Ok(packet) = Packet::decode(data) else { return };
    let mut again = [0u8; PACKET_BYTES];
    packet.encode(&mut again);
    assert_eq!(Packet::decode(&again), Ok(packet), "a decoded packet re-encodes to something else");
    // Encode writes zeros where no field is: every other byte it writes after the magic and
    // the version (its own) and before the checksum must be the datagram's, or decode dropped
    // or moved part of a field.
    for i in (5..PACKET_BYTES - 4).filter(|&i| again[i] != 0) {
        assert_eq!(again[i], data[i], "byte {i} of the re-encoded packet differs from the datagram");
    }
});
