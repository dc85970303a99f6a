//! The page's axis of time: loss ratio and RTT p99 per window of the cluster, and of the ToR
//! pairs that lost the most, with the findings drawn as spans on the same axis, so that a reader
//! sees when a fault started, how bad it was, and what localisation named.
//!
//! The series are the report's own per-window rows (cluster and ToR pair scopes), folded as the
//! page's build reads its ranges into at most [`MAX_POINTS`] buckets per series: when the
//! cluster's series would pass that, every series' buckets double (two neighbours merge into
//! their worst), so a bucket shows the worst of its windows whatever the hours read. Memory is
//! at most 32 bytes per bucket per ToR pair with probes, [`MAX_POINTS`] buckets each: it follows
//! the fleet's width, not the hours read. The page embeds [`MAX_PAIR_SERIES`] of the pairs.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::report::{Row, Scope};

/// At most this many ToR pairs' series are embedded: those that lost the most probes.
pub const MAX_PAIR_SERIES: usize = 32;
/// At most this many points per series (about a point per pixel of the chart's width).
pub const MAX_POINTS: usize = 1200;

/// One bucket of one series: its index (bucket start / bucket length), and the worst loss ratio
/// and RTT p99 of its windows.
type Bucket = (u64, Option<f64>, Option<i64>);

/// One series as it is gathered.
#[derive(Clone, Debug, Default)]
struct Series {
    /// Lost probes over every window.
    lost: u64,
    /// By bucket index, ascending.
    buckets: Vec<Bucket>,
}

impl Series {
    fn add(&mut self, index: u64, r: &Row) {
        self.lost += r.lost;
        let b = (index, r.loss_ratio, r.rtt_ns_p99);
        match self.buckets.last() {
            Some(last) if last.0 < index => self.buckets.push(b),
            None => self.buckets.push(b),
            _ => match self.buckets.binary_search_by_key(&index, |x| x.0) {
                Ok(i) => self.buckets[i] = worst(self.buckets[i], b),
                Err(i) => self.buckets.insert(i, b),
            },
        }
    }

    /// Buckets twice as long: neighbours merge into their worst.
    fn coarsen(&mut self) {
        let mut out: Vec<Bucket> = Vec::with_capacity(self.buckets.len() / 2 + 1);
        for &(i, loss, rtt) in &self.buckets {
            let b = (i / 2, loss, rtt);
            match out.last_mut() {
                Some(last) if last.0 == b.0 => *last = worst(*last, b),
                _ => out.push(b),
            }
        }
        self.buckets = out;
    }
}

fn worst(a: Bucket, b: Bucket) -> Bucket {
    (a.0, max_opt(a.1, b.1), max_opt(a.2, b.2))
}

/// Per-window figures of the cluster and of every ToR pair, folded as the page's build reads them.
#[derive(Clone, Debug)]
pub struct Timeline {
    window_ns: u64,
    /// Windows per bucket: a power of two.
    bucket_windows: u64,
    cluster: Series,
    pairs: BTreeMap<String, Series>,
}

impl Timeline {
    /// An empty timeline of windows of `window_ns`.
    pub fn new(window_ns: u64) -> Timeline {
        Timeline { window_ns: window_ns.max(1), bucket_windows: 1, cluster: Series::default(), pairs: BTreeMap::new() }
    }

    /// Folds in what the charts need of per-window `rows` (other scopes are ignored).
    pub fn add(&mut self, rows: &[Row]) {
        let bucket_ns = self.window_ns * self.bucket_windows;
        for r in rows {
            let index = r.window_start_ns / bucket_ns;
            match r.scope {
                Scope::Cluster => self.cluster.add(index, r),
                Scope::TorPair => self.pairs.entry(r.entity.clone()).or_default().add(index, r),
                _ => {}
            }
        }
        // A pair's windows are among the cluster's, so the cluster's series is the longest.
        while self.cluster.buckets.len() > MAX_POINTS {
            self.bucket_windows *= 2;
            self.cluster.coarsen();
            self.pairs.values_mut().for_each(Series::coarsen);
        }
    }

    /// What the page's script draws: the cluster's series, the [`MAX_PAIR_SERIES`] ToR pairs
    /// with the most lost probes (then by name), and how many pairs there were.
    pub fn chart(&self, window_s: u64) -> Chart {
        let bucket_windows = self.bucket_windows;
        let bucket_ns = self.window_ns * bucket_windows;
        let points = |s: &Series| -> Vec<(u64, Option<f64>, Option<f64>)> {
            s.buckets
                .iter()
                .map(|&(i, loss, rtt)| (i * bucket_ns / 1_000_000_000, loss, rtt.map(|ns| ns as f64 / 1000.0)))
                .collect()
        };
        let mut pairs: Vec<(&String, &Series)> = self.pairs.iter().collect();
        pairs.sort_by(|a, b| b.1.lost.cmp(&a.1.lost).then_with(|| a.0.cmp(b.0)));
        Chart {
            window_s,
            bucket_windows,
            cluster: points(&self.cluster),
            pairs: pairs
                .iter()
                .take(MAX_PAIR_SERIES)
                .map(|(name, s)| PairSeries { name: (*name).clone(), lost: s.lost, points: points(s) })
                .collect(),
            pairs_total: self.pairs.len(),
        }
    }
}

fn max_opt<T: PartialOrd + Copy>(a: Option<T>, b: Option<T>) -> Option<T> {
    match (a, b) {
        (Some(x), Some(y)) => Some(if y > x { y } else { x }),
        (x, None) => x,
        (None, y) => y,
    }
}

/// The charts' data, as the page embeds it.
#[derive(Clone, Debug, Serialize)]
pub struct Chart {
    window_s: u64,
    /// Windows per point (1 unless the range has more than [`MAX_POINTS`] windows).
    pub bucket_windows: u64,
    /// [start s, loss ratio, RTT p99 µs] per point.
    cluster: Vec<(u64, Option<f64>, Option<f64>)>,
    pairs: Vec<PairSeries>,
    /// ToR pairs with probes, embedded or not.
    pub pairs_total: usize,
}

impl Chart {
    /// Whether there is anything to draw.
    pub fn is_empty(&self) -> bool {
        self.cluster.is_empty()
    }

    /// ToR pairs embedded.
    pub fn pairs_shown(&self) -> usize {
        self.pairs.len()
    }
}

/// One ToR pair's series, as embedded.
#[derive(Clone, Debug, Serialize)]
struct PairSeries {
    name: String,
    lost: u64,
    points: Vec<(u64, Option<f64>, Option<f64>)>,
}

/// Draws the two charts (loss ratio, RTT p99) from `CHART` and `SPANS`, with the SLA
/// thresholds dashed, the findings as shaded spans labelled by entity, and the ToR pair the
/// reader picks (at first the one that lost the most) drawn over the cluster.
pub const JS: &str = r#"
(function () {
  if (!CHART.cluster.length) return;
  const tip = document.getElementById('tip');
  const sel = document.getElementById('pair');
  for (const p of CHART.pairs) {
    const o = document.createElement('option'); o.value = p.name;
    o.textContent = p.name + ' (' + p.lost + ' lost)'; sel.appendChild(o);
  }
  // The pair that lost the most is drawn from the start, when it lost anything.
  if (CHART.pairs.length && CHART.pairs[0].lost > 0) sel.value = CHART.pairs[0].name;
  const step = CHART.window_s * CHART.bucket_windows;
  const t0 = CHART.cluster[0][0];
  const t1 = Math.max(CHART.cluster[CHART.cluster.length - 1][0] + step,
    ...SPANS.map(s => s.end === null ? 0 : s.end));
  const KIND = {rnic: '#d62728', tor: '#ff7f0e', link: '#9467bd', spine: '#8c564b', host: '#7f7f7f'};
  const W = 960, H = 200, L = 64, R = 40, T = 26, B = 30;
  function utc(s) { return new Date(s * 1000).toISOString().slice(11, 19); }
  function draw(id, idx, scale, unit, sla) {
    const cv = document.getElementById(id);
    cv.width = W; cv.height = H;
    const g = cv.getContext('2d');
    const pair = CHART.pairs.find(p => p.name === sel.value);
    const series = [CHART.cluster].concat(pair ? [pair.points] : []);
    let top = sla * scale * 1.25;
    for (const s of series) for (const p of s) if (p[idx] !== null) top = Math.max(top, p[idx] * scale);
    top = top > 0 ? top * 1.1 : 1;
    const x = t => L + (t - t0) / Math.max(t1 - t0, 1) * (W - L - R);
    const y = v => H - B - v / top * (H - T - B);
    g.fillStyle = '#fff'; g.fillRect(0, 0, W, H);
    for (const s of SPANS) {
      if (s.start >= t1 || (s.end !== null && s.end <= t0)) continue;
      const a = x(Math.max(s.start, t0)), b = x(s.end === null ? t1 : Math.min(s.end, t1));
      g.fillStyle = (KIND[s.kind] || '#1f77b4') + '33'; g.fillRect(a, T, Math.max(b - a, 2), H - T - B);
      g.fillStyle = KIND[s.kind] || '#1f77b4'; g.font = '11px sans-serif'; g.textAlign = 'left';
      g.fillText(s.kind + ' ' + s.entity, a + 2, T - 4);
    }
    g.strokeStyle = '#888'; g.beginPath(); g.moveTo(L, T); g.lineTo(L, H - B); g.lineTo(W - R, H - B); g.stroke();
    g.fillStyle = '#444'; g.font = '11px sans-serif';
    for (let i = 0; i <= 4; i++) {
      const v = top * i / 4; g.textAlign = 'right'; g.fillText(v.toPrecision(3) + unit, L - 4, y(v) + 4);
      const t = t0 + (t1 - t0) * i / 4; g.textAlign = 'center'; g.fillText(utc(t), x(t), H - B + 14);
    }
    g.setLineDash([5, 4]); g.strokeStyle = '#b71c1c'; g.beginPath();
    g.moveTo(L, y(sla * scale)); g.lineTo(W - R, y(sla * scale)); g.stroke(); g.setLineDash([]);
    series.forEach((s, k) => {
      g.strokeStyle = k ? '#e6550d' : '#08519c'; g.fillStyle = g.strokeStyle; g.lineWidth = 1.5;
      g.beginPath(); let on = false;
      for (const p of s) {
        if (p[idx] === null) { on = false; continue; }
        const px = x(p[0] + step / 2), py = y(p[idx] * scale);
        if (on) g.lineTo(px, py); else g.moveTo(px, py); on = true;
      }
      g.stroke();
      if (s.length < 200) for (const p of s) if (p[idx] !== null) g.fillRect(x(p[0] + step / 2) - 2, y(p[idx] * scale) - 2, 4, 4);
    });
    cv.onmousemove = e => {
      const r = cv.getBoundingClientRect(), t = t0 + (e.clientX - r.left - L) / (W - L - R) * (t1 - t0);
      const near = s => s.reduce((b, p) => Math.abs(p[0] + step / 2 - t) < Math.abs(b[0] + step / 2 - t) ? p : b, s[0]);
      const c = near(CHART.cluster);
      let text = utc(c[0]) + ' UTC (' + step + ' s)\ncluster: ' + fmt(c[idx], scale, unit);
      if (pair && pair.points.length) {
        // The pair's point of this bucket, if it was probed in it.
        const p = near(pair.points);
        text += '\n' + pair.name + ': ' + (p[0] === c[0] ? fmt(p[idx], scale, unit) : 'not probed');
      }
      const on = SPANS.filter(s => s.start <= t && (s.end === null || t < s.end)).map(s => s.kind + ' ' + s.entity);
      if (on.length) text += '\nfindings: ' + on.join(', ');
      tip.textContent = text; tip.style.left = (e.clientX + 12) + 'px'; tip.style.top = (e.clientY + 12) + 'px';
      tip.style.display = 'block';
    };
    cv.onmouseleave = () => { tip.style.display = 'none'; };
  }
  function fmt(v, scale, unit) { return v === null ? 'no samples' : (v * scale).toPrecision(3) + unit; }
  function all() {
    draw('time-loss', 1, 100, '%', CHART_SLA.loss);
    draw('time-rtt', 2, 1, ' µs', CHART_SLA.rtt_us);
  }
  sel.onchange = all;
  all();
})();
"#;

#[cfg(test)]
mod tests {
    use super::*;

    fn row(scope: Scope, entity: &str, window: u64, lost: u64, loss: Option<f64>, p99: Option<i64>) -> Row {
        Row { rtt_ns_p99: p99, ..crate::html::tests::row_of(scope, entity, window * 30_000_000_000, lost, loss) }
    }

    #[test]
    fn series_keep_every_window_and_the_worst_pairs_first() {
        let mut t = Timeline::new(30_000_000_000);
        t.add(&[
            row(Scope::Cluster, "cluster", 0, 1, Some(0.01), Some(5_000)),
            row(Scope::TorPair, "t0->t1", 0, 1, Some(0.02), Some(6_000)),
            row(Scope::Rnic, "a/d", 0, 9, Some(0.5), None),
        ]);
        t.add(&[
            row(Scope::Cluster, "cluster", 1, 0, Some(0.0), None),
            row(Scope::TorPair, "t1->t0", 1, 5, Some(0.5), Some(9_000)),
        ]);
        let c = t.chart(30);
        assert_eq!(c.bucket_windows, 1);
        assert_eq!(c.cluster, [(0, Some(0.01), Some(5.0)), (30, Some(0.0), None)]);
        let names: Vec<&str> = c.pairs.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["t1->t0", "t0->t1"], "most lost first; RNIC rows are not series");
        assert_eq!(c.pairs_total, 2);
    }

    #[test]
    fn long_ranges_fold_into_buckets_shown_by_their_worst_window() {
        let mut t = Timeline::new(30_000_000_000);
        let n = MAX_POINTS as u64 * 3 + 1;
        let rows: Vec<Row> = (0..n)
            .map(|w| row(Scope::Cluster, "cluster", w, 0, Some(if w == 7 { 0.3 } else { 0.0 }), Some(w as i64 * 1000)))
            .collect();
        t.add(&rows);
        let c = t.chart(30);
        assert_eq!(c.bucket_windows, 4, "{n} windows in at most {MAX_POINTS} points");
        assert!(c.cluster.len() <= MAX_POINTS);
        assert_eq!(c.cluster[1], (120, Some(0.3), Some(7.0)), "windows 4-7: the worst loss and RTT");
    }

    /// Folding as ranges come in is the fold of the whole: a range at a time gives the same
    /// chart as all rows at once, whenever the buckets doubled.
    #[test]
    fn a_range_at_a_time_gives_the_same_chart() {
        let rows: Vec<Row> = (0..MAX_POINTS as u64 * 5 + 7)
            .flat_map(|w| {
                let loss = Some((w % 97) as f64 / 100.0);
                [
                    row(Scope::Cluster, "cluster", w, w % 3, loss, Some((w % 13) as i64 * 100)),
                    row(Scope::TorPair, if w % 2 == 0 { "a->b" } else { "b->a" }, w, 1, loss, None),
                ]
            })
            .collect();
        let mut whole = Timeline::new(30_000_000_000);
        whole.add(&rows);
        let mut ranged = Timeline::new(30_000_000_000);
        for part in rows.chunks(333) {
            ranged.add(part);
        }
        let json = |t: &Timeline| serde_json::to_string(&t.chart(30)).expect("json");
        assert_eq!(json(&whole), json(&ranged));
        assert_eq!(whole.chart(30).bucket_windows, 8, "6,007 windows in at most {MAX_POINTS} points");
    }

    #[test]
    fn pairs_beyond_the_cap_are_counted_not_embedded() {
        let mut t = Timeline::new(30_000_000_000);
        let rows: Vec<Row> = (0..MAX_PAIR_SERIES as u64 + 5)
            .map(|i| row(Scope::TorPair, &format!("p{i:03}"), 0, i, None, None))
            .collect();
        t.add(&rows);
        t.add(&[row(Scope::Cluster, "cluster", 0, 0, None, None)]);
        let c = t.chart(30);
        assert_eq!((c.pairs_shown(), c.pairs_total), (MAX_PAIR_SERIES, MAX_PAIR_SERIES + 5));
        assert_eq!(c.pairs[0].name, format!("p{:03}", MAX_PAIR_SERIES + 4));
    }
}
