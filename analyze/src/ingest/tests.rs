use super::{columns::*, model::*, plan::*};

#[test]
fn ranges_hold_whole_windows_up_to_the_budget() {
    let w = 30_000_000_000u64;
    let plan = |counts: &[(u64, u64)]| Plan {
        ds: Dataset::default(),
        files: Vec::new(),
        fields: Fields::Report,
        unknown_ids: Vec::new(),
        window_ns: w,
        carried: Vec::new(),
        per_window: counts.iter().copied().collect(),
        read_records: 0,
        indexed: false,
        traces: None,
    };
    // 10 and 11 fit in 10 records; 12 holds 20 alone (a window is never split); 13 is empty.
    let p = plan(&[(10, 5), (11, 5), (12, 20), (14, 1)]);
    assert_eq!(p.ranges(10), vec![(10 * w, 12 * w), (12 * w, 13 * w), (14 * w, 15 * w)]);
    assert_eq!(p.ranges(1 << 20), vec![(10 * w, 15 * w)]);
    // A T1 at the top of the clock (a corrupt record) ends its range at u64::MAX, included.
    let top = u64::MAX / w;
    assert_eq!(plan(&[(top, 1)]).ranges(10), vec![(top * w, u64::MAX)]);
    assert!(within(u64::MAX, top * w, u64::MAX) && !within(5, 6, 9) && within(8, 6, 9) && !within(9, 6, 9));
}

#[test]
fn a_path_that_changed_is_the_one_in_force_at_the_time_asked() {
    // A prober restarted at t = 100 s: its label 7 left from a new port, over another spine.
    // Reproduces the Clos run in which every window before the restart voted on the new path.
    let mut ds = Dataset::default();
    let key = (0, 1, 7);
    ds.paths.insert(key, vec![0, 3, 2]);
    ds.path_changes.insert(key, vec![(10_000_000_000, vec![0, 1, 2]), (100_000_000_000, vec![0, 3, 2])]);
    assert_eq!(ds.path_at(&key, 5_000_000_000), Some(&vec![0, 1, 2]), "before the first trace: the first");
    assert_eq!(ds.path_at(&key, 99_999_999_999), Some(&vec![0, 1, 2]));
    assert_eq!(ds.path_at(&key, 100_000_000_000), Some(&vec![0, 3, 2]));
    assert_eq!(ds.path_at(&key, u64::MAX), Some(&vec![0, 3, 2]));
    // A key that never changed is its one path; an untraced one has none.
    ds.paths.insert((1, 0, 7), vec![2, 1, 0]);
    assert_eq!(ds.path_at(&(1, 0, 7), 0), Some(&vec![2, 1, 0]));
    assert_eq!(ds.path_at(&(5, 0, 7), 0), None);
}
