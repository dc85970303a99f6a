//! The append path must not allocate once a segment is open: proved with a counting allocator.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};

use rocemesh_formats::segment::WriteMode;

struct Counting;

thread_local! {
    /// Only the measuring thread's allocations count, and each test thread counts its own: the
    /// test harness's threads allocate when they please (1 run in 6 saw 4 of theirs inside the
    /// measured span), and the tests of this file run at once.
    static COUNTED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    static ALLOCATIONS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

fn count() {
    if COUNTED.with(std::cell::Cell::get) {
        ALLOCATIONS.with(|a| a.set(a.get() + 1));
    }
}

fn allocations() -> u64 {
    ALLOCATIONS.with(std::cell::Cell::get)
}

// SAFETY: forwards to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn appending_and_writing_chunks_does_not_allocate_after_warm_up() {
    for mode in [WriteMode::Pwrite, WriteMode::Mmap] {
        measure(mode);
    }
}

fn measure(mode: WriteMode) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut w = common::writer_in(dir.path(), 4096, 64 << 20, mode);
    // Warm-up: the first chunk opens the segment and writes the dictionary.
    for i in 0..4096 {
        w.append(&common::rec(i)).expect("append");
    }
    let before = allocations();
    COUNTED.with(|c| c.set(true));
    // 100 chunks, including short flushed ones, all inside the open segment.
    for i in 4096..4096 + 409_600 {
        w.append(&common::rec(i)).expect("append");
        if i % 50_000 == 0 {
            w.flush().expect("flush");
        }
    }
    COUNTED.with(|c| c.set(false));
    let after = allocations();
    assert_eq!(w.stats().segments_opened, 1, "the measured span must not include a rotation");
    assert!(w.stats().chunks_written > 100);
    assert_eq!(after - before, 0, "allocations on the append path ({mode:?})");
    w.finish().expect("finish");
}

/// A view update (the shard's, four times a second) allocates nothing either.
#[test]
fn view_updates_do_not_allocate() {
    use rocemesh_formats::view::{Region, STATE_NAMES, Update, Window};
    let r = Region::new(64);
    let tors: Vec<String> = (0..64).map(|i| format!("tor-with-a-long-name-{i}")).collect();
    let windows = vec![Window::default(); 64];
    let counters = [7u64; 30];
    let update = |n: u64| {
        let u = Update {
            updated_unix_ns: n,
            window_ns: 10,
            host: "a-host-name-of-some-length",
            device: "mlx5_0",
            tor: "tor-0",
            state: [n; STATE_NAMES.len()],
            counters: &counters,
            ..Update::default()
        };
        r.update(&u, tors.iter().zip(&windows).map(|(t, w)| (t.as_str(), w, w)));
    };
    update(1);
    let before = allocations();
    COUNTED.with(|c| c.set(true));
    for n in 2..1_000 {
        update(n);
    }
    COUNTED.with(|c| c.set(false));
    assert_eq!(allocations() - before, 0, "allocations in view updates");
    assert_eq!(r.version(), 999);
}

/// With window summaries on, the append path still allocates nothing per probe: a window's
/// summary is built and serialised when it closes, a bounded number of allocations per window
/// whatever the probes in it (here 10,000).
#[test]
fn window_summaries_allocate_per_window_not_per_probe() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = rocemesh_formats::segment::WriterConfig::new(dir.path());
    cfg.chunk_records = 4096;
    cfg.segment_bytes = 64 << 20;
    // Records 10 us apart: 10,000 per 0.1 s window.
    cfg.summary_window_ns = 100_000_000;
    cfg.summary_grace_ns = 20_000_000;
    let id = rocemesh_formats::segment::WriterIdentity { tor: "t0".into(), ..Default::default() };
    let mut w = rocemesh_formats::segment::SegmentWriter::new(cfg, id).expect("writer");
    for t in 0..32 {
        w.endpoint(rocemesh_formats::record::EndpointRole::Rnic, &format!("h{t}/d0"), "t0", [0; 16]);
    }
    // Warm-up: the segment opens, and the open windows' tables reach their size.
    for i in 0..60_000 {
        w.append(&common::rec(i)).expect("append");
    }
    let windows_before = w.stats().summaries_written;
    let before = allocations();
    COUNTED.with(|c| c.set(true));
    for i in 60_000..460_000 {
        w.append(&common::rec(i)).expect("append");
    }
    COUNTED.with(|c| c.set(false));
    let allocations = allocations() - before;
    let windows = w.stats().summaries_written - windows_before;
    assert_eq!(w.stats().segments_opened, 1, "the measured span must not include a rotation");
    assert!(windows >= 39, "{windows} windows closed");
    assert!(allocations <= 32 * windows, "{allocations} allocations for {windows} windows of 10,000 probes");
    w.finish().expect("finish");
}
