//! The append path must not allocate once a segment is open: proved with a counting allocator.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};

use rocemesh_formats::segment::WriteMode;

struct Counting;
static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// Only the measuring thread's allocations count: the test harness's own threads allocate
    /// when they please (1 run in 6 saw 4 of theirs inside the measured span).
    static COUNTED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

fn count() {
    if COUNTED.with(std::cell::Cell::get) {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
    }
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
    // Both modes in one test: the counter is process-wide, so tests must not run concurrently.
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
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    COUNTED.with(|c| c.set(true));
    // 100 chunks, including short flushed ones, all inside the open segment.
    for i in 4096..4096 + 409_600 {
        w.append(&common::rec(i)).expect("append");
        if i % 50_000 == 0 {
            w.flush().expect("flush");
        }
    }
    COUNTED.with(|c| c.set(false));
    let after = ALLOCATIONS.load(Ordering::Relaxed);
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
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    COUNTED.with(|c| c.set(true));
    for n in 2..1_000 {
        update(n);
    }
    COUNTED.with(|c| c.set(false));
    assert_eq!(ALLOCATIONS.load(Ordering::Relaxed) - before, 0, "allocations in view updates");
    assert_eq!(r.version(), 999);
}
