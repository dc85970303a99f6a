//! What the live analyzer shows outside its JSON lines: one [`View`], rebuilt after each tick
//! that changed something and swapped in whole, that `/metrics` and the page render. The
//! analyzer never waits on a reader: readers clone an `Arc` of the latest view.

use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use serde::Serialize;

/// Connections that ended in an error (counted by [`super::serve`], rendered by
/// [`super::metrics`]): malformed or timed out, refused busy, or gone before
/// their answer was taken (`rocemesh_live_http_errors_total`). One process-wide count.
pub(super) static HTTP_ERRORS: AtomicU64 = AtomicU64::new(0);

/// Windows the view keeps (the page's heatmap columns and window table rows).
pub const VIEW_WINDOWS: usize = 24;

/// A snapshot of the live state.
#[derive(Debug, Clone, Default, Serialize)]
pub struct View {
    /// The analyzer's start and this view's time, Unix ns (this machine's clock).
    pub started_unix_ns: u64,
    pub now_unix_ns: u64,
    /// The summary window and the deadline after its end, ns.
    pub window_ns: u64,
    pub deadline_ns: u64,
    /// Findings open now, the oldest first.
    pub open: Vec<OpenView>,
    /// The last [`VIEW_WINDOWS`] windows localised, the oldest first.
    pub windows: Vec<WindowView>,
    /// The heatmap's rows: every ToR known, sorted by name.
    pub tors: Vec<String>,
    /// RNICs the inventory or a push named.
    pub rnics_known: usize,
    /// Pushes received and taken, refused by reason (`problem` lines' reasons).
    pub received: u64,
    pub taken: u64,
    pub refused: BTreeMap<String, u64>,
    /// JSON lines that could not be written (a full disk, a closed pipe): counted, not retried.
    pub lines_lost: u64,
    /// Pushes waiting to be taken, and the most that may wait (beyond it the socket's buffer
    /// holds them, then the kernel drops them).
    pub queued: usize,
    pub queue_capacity: usize,
    /// With `--prometheus`: the switch-counter answers by verdict, and `failed`, `dropped`.
    pub switch_checks: Option<BTreeMap<String, u64>>,
}

/// One open finding.
#[derive(Debug, Clone, Serialize)]
pub struct OpenView {
    /// rnic, tor, link, spine or host.
    pub kind: String,
    pub entity: String,
    /// The window it was first blamed in, and the last, Unix ns (window starts).
    pub since_ns: u64,
    pub last_blamed_ns: u64,
    /// Windows that blamed it.
    pub windows: u64,
    /// The last blaming window's score (the bad share of the probes crossing it) and evidence.
    pub score: f64,
    pub evidence: String,
    /// With `--prometheus`: what the switches' counters did over its first window.
    pub switches: Option<String>,
}

/// One localised window.
#[derive(Debug, Clone, Serialize)]
pub struct WindowView {
    pub start_ns: u64,
    /// Every RNIC expected pushed all of it.
    pub complete: bool,
    /// Localised this long after its end, ms.
    pub after_end_ms: u64,
    /// How long its localisation took, ms.
    pub localise_ms: u64,
    pub rnics_heard: usize,
    /// Expected RNICs that pushed none or part of it; the first few named.
    pub rnics_missing: usize,
    pub missing: Vec<String>,
    pub probes: u64,
    /// Per ToR of [`View::tors`] (same order): probes toward RNICs under it, and of those
    /// lost (no ACK1): the heatmap's cell.
    pub tor_probes: Vec<u64>,
    pub tor_lost: Vec<u64>,
    /// Findings open after it.
    pub open: usize,
}

/// Where the analyzer puts its latest view and readers take it.
#[derive(Debug, Clone, Default)]
pub struct Shared(Arc<Mutex<Arc<View>>>);

impl Shared {
    /// The latest view (a cheap clone of an `Arc`).
    pub fn get(&self) -> Arc<View> {
        match self.0.lock() {
            Ok(v) => Arc::clone(&v),
            Err(poisoned) => Arc::clone(&poisoned.into_inner()),
        }
    }

    /// Swaps in a new view.
    pub fn set(&self, view: View) {
        let view = Arc::new(view);
        match self.0.lock() {
            Ok(mut v) => *v = view,
            Err(poisoned) => *poisoned.into_inner() = view,
        }
    }
}
