//! A disk that cannot take a new segment: an error naming the file and the limit, records
//! counted as dropped, no SIGBUS and no panic; the writer resumes when space comes back.
//! RLIMIT_FSIZE stands in for a full disk (both make the reservation of a new segment fail),
//! in a test binary of its own because the limit is process-wide.

mod common;

fn set_fsize(bytes: u64) {
    let lim = libc::rlimit { rlim_cur: bytes as libc::rlim_t, rlim_max: libc::RLIM_INFINITY };
    // SAFETY: plain syscall with a valid struct.
    let rc = unsafe { libc::setrlimit(libc::RLIMIT_FSIZE, &lim) };
    assert_eq!(rc, 0, "setrlimit: {}", std::io::Error::last_os_error());
}

#[test]
fn no_room_for_a_segment_is_a_clear_error_and_the_writer_recovers() {
    // Exceeding the limit would otherwise kill the process with SIGXFSZ.
    // SAFETY: ignoring a signal is always sound.
    unsafe { libc::signal(libc::SIGXFSZ, libc::SIG_IGN) };
    let dir = tempfile::tempdir().expect("tempdir");
    let mut w = common::writer(dir.path(), 64, 2 << 20);
    set_fsize(1 << 20);
    for i in 0..63 {
        w.append(&common::rec(i)).expect("buffered");
    }
    let e = w.append(&common::rec(63)).expect_err("no room");
    let msg = e.to_string();
    assert!(msg.contains(&dir.path().display().to_string()) && msg.contains("reserve 2 MiB"), "{msg}");
    assert!(msg.contains("ulimit -f"), "names the limit to raise: {msg}");
    assert_eq!(w.stats().records_dropped, 64);
    assert!(common::files(dir.path(), ".rseg").is_empty(), "the failed file is removed, not left half-made");

    set_fsize(u64::MAX);
    for i in 64..200 {
        w.append(&common::rec(i)).expect("append after space came back");
    }
    let closed = w.finish().expect("finish");
    let r = rocemesh_formats::segment::SegmentReader::open(&closed[0]).expect("open");
    assert_eq!(common::records_of(&r), (64..200).map(common::rec).collect::<Vec<_>>());

    // A write that fails in the middle of an open segment (the limit drops below its write
    // position): the writer closes that segment with what it holds and starts a new one once
    // writing works again. (One test, because the limit is process-wide.)
    let dir = tempfile::tempdir().expect("tempdir");
    let mut w = common::writer(dir.path(), 64, 2 << 20);
    for i in 0..640 {
        w.append(&common::rec(i)).expect("append");
    }
    set_fsize(20_000);
    for i in 640..703 {
        w.append(&common::rec(i)).expect("buffered");
    }
    let e = w.append(&common::rec(703)).expect_err("write beyond the limit");
    assert!(e.to_string().contains("write frame"), "{e}");
    assert_eq!((w.stats().write_errors, w.stats().records_dropped), (1, 64));
    assert_eq!(w.current_path(), None, "the failing segment is closed, not written into again");
    set_fsize(u64::MAX);
    for i in 704..800 {
        w.append(&common::rec(i)).expect("append after the limit is lifted");
    }
    let closed = w.finish().expect("finish");
    assert_eq!(closed.len(), 2);
    let mut seen = Vec::new();
    for p in &closed {
        let r = rocemesh_formats::segment::SegmentReader::open(p).expect("open");
        assert!(r.is_closed() && r.damage().is_empty(), "{:?}", r.damage());
        seen.extend(common::records_of(&r));
    }
    assert_eq!(seen, (0..640).chain(704..800).map(common::rec).collect::<Vec<_>>());
}
