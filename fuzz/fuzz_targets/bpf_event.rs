//! The eBPF QP event decoder: the bytes the kernel's ring buffer hands the tracer.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rocemesh_bpf::{QpEventKind, decode};

fuzz_target!(|data: &[u8]| {
    let Ok(ev) = decode(data) else { return };
    assert!(ev.kind == QpEventKind::Rtr || !ev.has_av, "a destroy event claims an address vector");
    assert!(!ev.comm.contains('\0') && !ev.device.contains('\0'), "NUL left in a name: {ev:?}");
});
