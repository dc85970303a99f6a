//! The record the BPF program sends through the ring buffer, and its pure decoder.
//!
//! Owns the user-space side of the layout in `src/bpf/rdma_qp.h`. The offsets are not written
//! here: build.rs generates them from the header's `#define RQ_*` lines, and the BPF program
//! static-asserts its struct against the same lines, so the C and Rust sides share one source.
//! The tests below add a third check: a record laid out field by field in the C declaration
//! order, with C's alignment rules, lands exactly on those offsets.

use thiserror::Error;

/// The header's constants (`RQ_VERSION`, `RQ_OFF_*`, ...), without their `RQ_` prefix.
#[allow(dead_code)] // The flags and sizes are used by the tests and the tracer only.
pub(crate) mod layout {
    include!(concat!(env!("OUT_DIR"), "/rdma_qp_consts.rs"));
}

use layout as l;

// The BPF program writes the record in the host's byte order; decode() reads little-endian.
// rocemesh runs on x86_64 and aarch64 hosts: refuse to build where the two would disagree.
const _: () = assert!(cfg!(target_endian = "little"), "rocemesh-bpf decodes little-endian records");

/// What happened to the QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QpEventKind {
    /// The QP reached Ready To Receive: its peer (GID and QP number) is now fixed.
    Rtr,
    /// The QP is being destroyed (explicitly, or because its process exited).
    Destroyed,
}

/// One QP transition seen in the kernel.
///
/// Which fields are meaningful depends on [`kind`](Self::kind) and on the flags: on
/// [`QpEventKind::Destroyed`] the remote side and the GRH fields are zero and both `has_*`
/// flags are false.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QpEvent {
    pub kind: QpEventKind,
    /// CLOCK_MONOTONIC time of the event, ns (`bpf_ktime_get_ns`).
    pub time_mono_ns: u64,
    /// Process (thread group) id of the caller; on process exit, the exiting process.
    pub pid: u32,
    /// The caller's command name (at most 15 bytes), NUL-trimmed, invalid UTF-8 replaced.
    pub comm: String,
    /// RDMA device name, e.g. `mlx5_0` or `rxe0`.
    pub device: String,
    /// RDMA port number, 1-based.
    pub port: u32,
    /// This QP's number.
    pub local_qpn: u32,
    /// The peer QP's number (`dest_qp_num`); 0 on destroy.
    pub remote_qpn: u32,
    /// Source GID (for RoCEv2 over IPv4, `::ffff:a.b.c.d`); all zero if the QP has none.
    pub local_gid: [u8; 16],
    /// Destination GID; valid only if `has_av`.
    pub remote_gid: [u8; 16],
    /// GRH flow label as requested (20 bits); 0 asks the driver to derive one, see
    /// [`effective_flow_label`](crate::effective_flow_label).
    pub flow_label: u32,
    /// GRH traffic class: on RoCEv2, the IP TOS byte (DSCP << 2 | ECN).
    pub traffic_class: u8,
    /// GRH hop limit.
    pub hop_limit: u8,
    /// `enum ib_qp_type`: 2 RC, 3 UC, 9 XRC initiator, 10 XRC target.
    pub qp_type: u8,
    /// The RTR transition carried an address vector (`IB_QP_AV`) with a GRH (always so on
    /// RoCE), so `remote_gid`, `flow_label`, `traffic_class` and `hop_limit` are valid. Without
    /// an AV the kernel keeps an earlier one, if any, which the hook cannot see: the path is
    /// unknown. Always false on destroy.
    pub has_av: bool,
}

/// Why a ring buffer record could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DecodeError {
    #[error("QP event record truncated: {len} bytes, need at least {want}")]
    Truncated { len: usize, want: usize },
    #[error(
        "QP event record has version {found}, this build reads version {}: the BPF object and \
         the decoder come from different builds",
        l::VERSION
    )]
    Version { found: u16 },
    #[error("QP event record declares {found} bytes, version {} records have {want}", l::VERSION)]
    Size { found: u16, want: usize },
    #[error("QP event record of unknown kind {found} (known: {} RTR, {} destroy)", l::KIND_RTR, l::KIND_DESTROY)]
    Kind { found: u8 },
}

/// Decodes one ring buffer record.
///
/// Pure: reads little-endian fields at the shared header's offsets. Accepts records longer
/// than a record (`RQ_EVENT_SIZE`, 160 bytes): the ring buffer rounds lengths up to 8 bytes,
/// and the excess is ignored.
pub fn decode(bytes: &[u8]) -> Result<QpEvent, DecodeError> {
    // Version and size first, so a record from another build is named as such rather than
    // as truncated.
    let head =
        bytes.get(..l::OFF_SIZE + 2).ok_or(DecodeError::Truncated { len: bytes.len(), want: l::OFF_SIZE + 2 })?;
    let version = u16::from_le_bytes([head[l::OFF_VERSION], head[l::OFF_VERSION + 1]]);
    if usize::from(version) != l::VERSION {
        return Err(DecodeError::Version { found: version });
    }
    let size = u16::from_le_bytes([head[l::OFF_SIZE], head[l::OFF_SIZE + 1]]);
    if usize::from(size) != l::EVENT_SIZE {
        return Err(DecodeError::Size { found: size, want: l::EVENT_SIZE });
    }
    let rec: &[u8; l::EVENT_SIZE] = bytes
        .get(..l::EVENT_SIZE)
        .and_then(|r| r.try_into().ok())
        .ok_or(DecodeError::Truncated { len: bytes.len(), want: l::EVENT_SIZE })?;

    let kind = match usize::from(rec[l::OFF_KIND]) {
        l::KIND_RTR => QpEventKind::Rtr,
        l::KIND_DESTROY => QpEventKind::Destroyed,
        _ => {
            return Err(DecodeError::Kind { found: rec[l::OFF_KIND] });
        }
    };
    let flags = usize::from(rec[l::OFF_FLAGS]);
    let rtr = kind == QpEventKind::Rtr;
    Ok(QpEvent {
        kind,
        time_mono_ns: u64::from_le_bytes(field(rec, l::OFF_TIME_MONO_NS)),
        pid: u32_at(rec, l::OFF_PID),
        comm: c_string(&field::<{ l::COMM_LEN }>(rec, l::OFF_COMM)),
        device: c_string(&field::<{ l::DEVICE_LEN }>(rec, l::OFF_DEVICE)),
        port: u32_at(rec, l::OFF_PORT),
        local_qpn: u32_at(rec, l::OFF_LOCAL_QPN),
        remote_qpn: u32_at(rec, l::OFF_REMOTE_QPN),
        local_gid: field(rec, l::OFF_LOCAL_GID),
        remote_gid: field(rec, l::OFF_REMOTE_GID),
        flow_label: u32_at(rec, l::OFF_FLOW_LABEL),
        traffic_class: rec[l::OFF_TRAFFIC_CLASS],
        hop_limit: rec[l::OFF_HOP_LIMIT],
        qp_type: rec[l::OFF_QP_TYPE],
        // The record keeps the two apart (and the modify's attr_mask) for debugging; the path
        // is known only with both.
        has_av: rtr && flags & (l::FLAG_NO_AV | l::FLAG_NO_GRH) == 0,
    })
}

/// `N` bytes at `off`. The offsets are constants within the record (the layout tests cover
/// every one), so the slice is always in bounds.
fn field<const N: usize>(rec: &[u8; l::EVENT_SIZE], off: usize) -> [u8; N] {
    let mut out = [0; N];
    out.copy_from_slice(&rec[off..off + N]);
    out
}

fn u32_at(rec: &[u8; l::EVENT_SIZE], off: usize) -> u32 {
    u32::from_le_bytes(field(rec, off))
}

/// A NUL-padded C string as UTF-8, lossily: comm and device names are whatever the kernel holds.
fn c_string(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Lays a record out as a C compiler would lay out `struct rq_event`: fields appended in
    /// declaration order, each aligned to its size, checking every offset against the header.
    struct CRecord(Vec<u8>);

    impl CRecord {
        fn put(&mut self, off: usize, align: usize, bytes: &[u8]) {
            while !self.0.len().is_multiple_of(align) {
                self.0.push(0);
            }
            assert_eq!(self.0.len(), off, "C layout and header offset disagree");
            self.0.extend_from_slice(bytes);
        }
    }

    /// Encodes `ev` the way the BPF program does (test-only: production never encodes).
    pub(crate) fn encode(ev: &QpEvent) -> Vec<u8> {
        let kind = match ev.kind {
            QpEventKind::Rtr => l::KIND_RTR,
            QpEventKind::Destroyed => l::KIND_DESTROY,
        } as u8;
        let mut flags = 0;
        if ev.kind == QpEventKind::Rtr && !ev.has_av {
            flags |= l::FLAG_NO_AV;
        }
        if ev.local_gid == [0; 16] {
            flags |= l::FLAG_NO_SGID;
        }
        let mut comm = [0u8; l::COMM_LEN];
        comm[..ev.comm.len()].copy_from_slice(ev.comm.as_bytes());
        let mut device = [0u8; l::DEVICE_LEN];
        device[..ev.device.len()].copy_from_slice(ev.device.as_bytes());

        let mut r = CRecord(Vec::new());
        r.put(l::OFF_VERSION, 2, &(l::VERSION as u16).to_le_bytes());
        r.put(l::OFF_SIZE, 2, &(l::EVENT_SIZE as u16).to_le_bytes());
        r.put(l::OFF_KIND, 1, &[kind]);
        r.put(l::OFF_FLAGS, 1, &[flags as u8]);
        r.put(l::OFF_QP_TYPE, 1, &[ev.qp_type]);
        r.put(l::OFF_TRAFFIC_CLASS, 1, &[ev.traffic_class]);
        r.put(l::OFF_TIME_MONO_NS, 8, &ev.time_mono_ns.to_le_bytes());
        r.put(l::OFF_PID, 4, &ev.pid.to_le_bytes());
        r.put(l::OFF_PORT, 4, &ev.port.to_le_bytes());
        r.put(l::OFF_LOCAL_QPN, 4, &ev.local_qpn.to_le_bytes());
        r.put(l::OFF_REMOTE_QPN, 4, &ev.remote_qpn.to_le_bytes());
        r.put(l::OFF_FLOW_LABEL, 4, &ev.flow_label.to_le_bytes());
        r.put(l::OFF_ATTR_MASK, 4, &0x0012_1981u32.to_le_bytes()); // STATE|AV|PORT|DEST_QPN|...
        r.put(l::OFF_HOP_LIMIT, 1, &[ev.hop_limit]);
        r.put(l::OFF_HOP_LIMIT + 1, 1, &[0; 7]); // pad[7]
        r.put(l::OFF_LOCAL_GID, 1, &ev.local_gid);
        r.put(l::OFF_REMOTE_GID, 1, &ev.remote_gid);
        r.put(l::OFF_COMM, 1, &comm);
        r.put(l::OFF_DEVICE, 1, &device);
        // The struct's alignment is its largest member's (the u64): the size rounds up to 8.
        while !r.0.len().is_multiple_of(8) {
            r.0.push(0);
        }
        assert_eq!(r.0.len(), l::EVENT_SIZE, "C layout and RQ_EVENT_SIZE disagree");
        r.0
    }

    pub(crate) fn sample() -> QpEvent {
        QpEvent {
            kind: QpEventKind::Rtr,
            time_mono_ns: 0x0102_0304_0506_0708,
            pid: 4242,
            comm: "all_reduce_perf".into(),
            device: "mlx5_bond_0".into(),
            port: 1,
            local_qpn: 0x00_1234,
            remote_qpn: 0xab_cdef,
            local_gid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 1],
            remote_gid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 1, 2],
            flow_label: 0x5_4321,
            traffic_class: 106,
            hop_limit: 64,
            qp_type: 2,
            has_av: true,
        }
    }

    #[test]
    fn round_trip() {
        let ev = sample();
        assert_eq!(decode(&encode(&ev)), Ok(ev));
    }

    #[test]
    fn round_trip_destroy_and_flags() {
        let destroy = QpEvent {
            kind: QpEventKind::Destroyed,
            remote_qpn: 0,
            remote_gid: [0; 16],
            flow_label: 0,
            traffic_class: 0,
            hop_limit: 0,
            has_av: false,
            ..sample()
        };
        assert_eq!(decode(&encode(&destroy)).as_ref(), Ok(&destroy));
        let no_av = QpEvent { has_av: false, ..sample() };
        assert_eq!(decode(&encode(&no_av)).as_ref(), Ok(&no_av));
        // An AV without a GRH: no GIDs either.
        let mut rec = encode(&sample());
        rec[l::OFF_FLAGS] |= l::FLAG_NO_GRH as u8;
        assert!(!decode(&rec).unwrap().has_av);
    }

    #[test]
    fn full_length_strings_need_no_nul() {
        let ev = QpEvent { comm: "x".repeat(l::COMM_LEN), device: "d".repeat(l::DEVICE_LEN), ..sample() };
        assert_eq!(decode(&encode(&ev)), Ok(ev));
    }

    #[test]
    fn truncated_at_every_length() {
        let rec = encode(&sample());
        for len in 0..rec.len() {
            let want = if len < 4 { 4 } else { l::EVENT_SIZE };
            assert_eq!(decode(&rec[..len]), Err(DecodeError::Truncated { len, want }), "len {len}");
        }
    }

    #[test]
    fn accepts_trailing_bytes() {
        // Ring buffer records come rounded up to 8 bytes; a later version may also append.
        let mut rec = encode(&sample());
        rec.extend_from_slice(&[0xee; 8]);
        assert_eq!(decode(&rec), Ok(sample()));
    }

    #[test]
    fn refuses_other_versions_and_sizes() {
        let mut rec = encode(&sample());
        rec[l::OFF_VERSION..l::OFF_VERSION + 2].copy_from_slice(&2u16.to_le_bytes());
        let err = decode(&rec).unwrap_err();
        assert_eq!(err, DecodeError::Version { found: 2 });
        assert!(err.to_string().contains("version 2"), "{err}");
        // A record from another version is named as such even when it is short.
        assert_eq!(decode(&rec[..8]), Err(DecodeError::Version { found: 2 }));

        let mut rec = encode(&sample());
        rec[l::OFF_SIZE..l::OFF_SIZE + 2].copy_from_slice(&168u16.to_le_bytes());
        let err = decode(&rec).unwrap_err();
        assert_eq!(err, DecodeError::Size { found: 168, want: l::EVENT_SIZE });
        assert!(err.to_string().contains("168"), "{err}");
    }

    #[test]
    fn refuses_unknown_kinds() {
        for kind in [0u8, 3, 0xff] {
            let mut rec = encode(&sample());
            rec[l::OFF_KIND] = kind;
            let err = decode(&rec).unwrap_err();
            assert_eq!(err, DecodeError::Kind { found: kind });
            assert!(err.to_string().contains(&format!("kind {kind}")), "{err}");
        }
    }

    #[test]
    fn non_utf8_names_are_replaced_not_refused() {
        let mut rec = encode(&sample());
        rec[l::OFF_COMM..l::OFF_COMM + 4].copy_from_slice(&[b'a', 0xff, 0xfe, b'b']);
        rec[l::OFF_COMM + 4] = 0;
        rec[l::OFF_DEVICE] = 0xc3; // a lone UTF-8 lead byte
        let ev = decode(&rec).unwrap();
        assert_eq!(ev.comm, "a\u{fffd}\u{fffd}b");
        assert!(ev.device.starts_with('\u{fffd}'), "{:?}", ev.device);
    }

    #[test]
    fn header_constants_are_consistent() {
        assert_eq!(l::GID_LEN, 16);
        assert_eq!(l::EVENT_SIZE % 8, 0);
        assert_eq!(l::OFF_DEVICE + l::DEVICE_LEN, l::EVENT_SIZE);
        // 160 B + the ring's 8 B header: the sizing note in rdma_qp.bpf.c counts 3120 records.
        assert_eq!(l::RINGBUF_BYTES / (l::EVENT_SIZE + 8), 3120);
        assert!(l::RINGBUF_BYTES.is_power_of_two());
    }
}
