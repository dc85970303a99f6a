//! A live push as `analyze live` receives it: any datagram reaching its port. CRC32C covers the
//! whole push, so each input also runs with its length and CRC made right (and unsealed), for
//! the fuzzer to reach rkyv's validation and the summary's own checks. What decodes re-encodes
//! into pushes that decode to the same keys, cells and names; a push sealed with the key is
//! taken under it only with that key's valid MAC.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rocemesh_formats::live::{
    HEADER_BYTES, Keys, MAC_BYTES, MAX_PATHS_PER_PUSH, Name, Received, Seal, Sender, decode, encode,
};

const SECRET: [u8; 32] = [0x42; 32];

fn fixed(data: &[u8]) -> Option<Vec<u8>> {
    if data.len() < HEADER_BYTES {
        return None;
    }
    let mut b = data.to_vec();
    b[5] = 0;
    b[10] &= 1;
    b[11] = 0;
    let body = (b.len() - HEADER_BYTES) as u32;
    b[12..16].copy_from_slice(&body.to_le_bytes());
    let crc = crc32c::crc32c_append(crc32c::crc32c(&b[..36]), &b[HEADER_BYTES..]);
    b[36..40].copy_from_slice(&crc.to_le_bytes());
    Some(b)
}

fn round_trip(r: &Received) {
    let p = &r.push;
    let sender = Sender { host: p.host.clone(), rnic: p.rnic.clone(), tor: p.tor.clone(), agent_epoch: 1 };
    let name_of = |id: u32| p.names.iter().find(|n| n.id == id).cloned();
    let mut out = Vec::new();
    if encode(&sender, &mut 0, 0, r.header.last, &p.summary, &p.paths, &name_of, None, &mut out).is_err() {
        return;
    }
    let (mut keys, mut cells, mut names, mut traces) = (Vec::new(), Vec::new(), Vec::<Name>::new(), Vec::new());
    for d in &out {
        let again = decode(d, &Keys::Unchecked).expect("a push re-encoded decodes");
        let s = again.push.summary;
        for k in &s.keys {
            let c = &s.cells[k.cells_start as usize..(k.cells_start + k.cells_len) as usize];
            cells.extend_from_slice(c);
            keys.push((k.prober, k.target, k.flow_label, k.counts));
        }
        names.extend(again.push.names);
        traces.extend(again.push.paths);
    }
    assert_eq!(traces, p.paths[..p.paths.len().min(MAX_PATHS_PER_PUSH)], "the traces go with the first part");
    let want: Vec<_> = p.summary.keys.iter().map(|k| (k.prober, k.target, k.flow_label, k.counts)).collect();
    assert_eq!(keys, want, "the parts' keys are the push's");
    assert_eq!(cells, p.summary.cells, "the parts' cells are the push's");
    assert!(names.iter().all(|n| p.names.contains(n)), "a part names an id the push did not");
}

fuzz_target!(|data: &[u8]| {
    let key = Seal { id: 7, secret: SECRET };
    let holds = |id: u8| (id == 7).then(|| key.clone());
    if let Ok(r) = decode(data, &Keys::Checked(&holds)) {
        // Taken under the key: the last MAC_BYTES are that key's MAC of the rest.
        let covered = data.len() - MAC_BYTES;
        assert_eq!(&data[covered..], blake3::keyed_hash(&SECRET, &data[..covered]).as_bytes(), "a bad seal taken");
        round_trip(&r);
    }
    if let Some(b) = fixed(data)
        && let Ok(r) = decode(&b, &Keys::Unchecked)
    {
        round_trip(&r);
    }
});
