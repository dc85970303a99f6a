//! Pair counting: the per-(window, prober, target) table every scope rolls up from
//! ([`PairTable`]), the keys that pack a window and ids into one integer ([`KeySpace`]), and the
//! class and timestamp-source bits packed in one byte per record ([`packed`]).

use super::{C_INVALID, C_LOCAL_DROP, C_LOST, C_OK, C_PARTIAL, C_PROBES, C_REFUSED, C_UNREACHABLE, COUNTS};
use crate::probe::Scope;
use crate::probe::{Class, split_unreachable};
use polars::prelude::*;

/// The byte [`prepare`] leaves in place of each record's outcome: its [`Class`] in the low three
/// bits and its timestamp-source code ([`crate::probe::ts_code`]) above them. The source thus
/// costs no column of its own after `prepare`, and the pair count reads it with the class.
pub(super) mod packed {
    use crate::probe::{Class, ts_code};

    const CLASS_MASK: u8 = 0b111;
    const TS_SHIFT: u32 = 3;

    /// The byte of a record.
    #[inline]
    pub fn pack(class: Class, ts_source: u8) -> u8 {
        class as u8 | ts_code(ts_source) << TS_SHIFT
    }

    /// The class's discriminant.
    #[inline]
    pub fn class(b: u8) -> u8 {
        b & CLASS_MASK
    }

    /// Whether the record is an ok sample.
    #[inline]
    pub fn is_ok(b: u8) -> bool {
        b & CLASS_MASK == Class::Ok as u8
    }

    /// The record's timestamp-source bit ([`crate::probe::TsSources`]) if it is an ok sample,
    /// else 0: computed without a branch, on the pair count's hot path.
    #[inline]
    pub fn sample_ts_bit(b: u8) -> u64 {
        u64::from(is_ok(b)) << (b >> TS_SHIFT)
    }
}

/// The slot of a pair-count entry that holds the OR of its ok samples' timestamp-source bits
/// (slots below it count records by class, which stay below it: [`Class::Unknown`] is 6).
pub(super) const TS_SLOT: usize = 7;

/// Sizes of the id spaces packed into group keys: a window index `d` and one or two ids, as
/// `d * n + x` or `(d * n + x) * n + y` ([`KeySpace::keys`]).
#[derive(Debug, Clone, Copy)]
pub(super) struct KeySpace {
    /// RNIC ids, the unknown one included.
    pub(super) rnics: u64,
    /// ToR ids.
    pub(super) tors: u64,
}

/// Record counts per pair key `(d * rnics + prober) * rnics + target` and class: an
/// open-addressing table (linear probing, multiplicative hash), grown at half load.
#[derive(Default)]
pub(super) struct PairTable {
    /// Pair keys, [`PairTable::EMPTY`] in free slots; a power of two long (or empty).
    pub(super) keys: Vec<u64>,
    /// Counts by [`Class`] discriminant, beside `keys`; slot [`TS_SLOT`] is a bitmask, merged
    /// by OR.
    pub(super) counts: Vec<[u64; 8]>,
    pub(super) len: usize,
}

impl PairTable {
    /// No real key: [`prepare`] refuses key spaces beyond 2^61.
    pub(super) const EMPTY: u64 = u64::MAX;

    pub(super) fn slot(&self, key: u64) -> usize {
        let mask = self.keys.len() - 1;
        let mut i = (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) as usize & mask;
        while self.keys[i] != key && self.keys[i] != Self::EMPTY {
            i = (i + 1) & mask;
        }
        i
    }

    pub(super) fn add_counts(&mut self, key: u64, counts: &[u64; 8]) {
        let entry = self.entry(key);
        for (c, n) in entry[..TS_SLOT].iter_mut().zip(counts) {
            *c += n;
        }
        entry[TS_SLOT] |= counts[TS_SLOT];
    }

    pub(super) fn entry(&mut self, key: u64) -> &mut [u64; 8] {
        if 2 * (self.len + 1) > self.keys.len() {
            self.grow();
        }
        let i = self.slot(key);
        if self.keys[i] == Self::EMPTY {
            self.keys[i] = key;
            self.len += 1;
        }
        &mut self.counts[i]
    }

    pub(super) fn grow(&mut self) {
        let size = (self.keys.len() * 2).max(1024);
        let keys = std::mem::replace(&mut self.keys, vec![Self::EMPTY; size]);
        let counts = std::mem::replace(&mut self.counts, vec![[0; 8]; size]);
        self.len = 0;
        for (k, c) in keys.into_iter().zip(counts) {
            if k != Self::EMPTY {
                self.add_counts(k, &c);
            }
        }
    }

    pub(super) fn merge(mut self, other: PairTable) -> PairTable {
        if self.len < other.len {
            return other.merge(self);
        }
        for (k, c) in other.keys.into_iter().zip(other.counts) {
            if k != Self::EMPTY {
                self.add_counts(k, &c);
            }
        }
        self
    }
}

/// Per (window, prober, target): every count, with the unreachable rule applied, from the
/// record counts per pair and class, and the pair's `ts_mask`; and the records of unknown
/// outcome over all pairs.
pub(super) fn pair_counts(table: PairTable, keys: KeySpace) -> PolarsResult<(DataFrame, u64)> {
    let mut pairs: Vec<(u64, [u64; 8])> =
        table.keys.into_iter().zip(table.counts).filter(|(k, _)| *k != PairTable::EMPTY).collect();
    pairs.sort_unstable_by_key(|p| p.0);
    let m = pairs.len();
    let (mut d, mut p, mut t) = (Vec::with_capacity(m), Vec::with_capacity(m), Vec::with_capacity(m));
    let mut ts_mask = Vec::with_capacity(m);
    let mut counts: [Vec<u64>; COUNTS.len()] = Default::default();
    let mut unknown_outcomes = 0;
    for (k, c) in pairs {
        let (window, prober, target) = keys.decode(Scope::Pair, k);
        let (prober, target) = (prober as u32, target as u32);
        d.push(window as u32);
        p.push(prober);
        t.push(target);
        // Only the low bits are ever set (one per timestamp-source code).
        ts_mask.push(c[TS_SLOT] as u8);
        unknown_outcomes += c[Class::Unknown as usize];
        for (v, x) in counts.iter_mut().zip(counts_of(&c)) {
            v.push(x);
        }
    }
    let mut columns = vec![
        UInt32Chunked::from_vec("d".into(), d).into_column(),
        UInt32Chunked::from_vec("prober".into(), p).into_column(),
        UInt32Chunked::from_vec("target".into(), t).into_column(),
    ];
    for (name, v) in COUNTS.iter().zip(counts) {
        columns.push(UInt64Chunked::from_vec((*name).into(), v).into_column());
    }
    columns.push(UInt8Chunked::from_vec("ts_mask".into(), ts_mask).into_column());
    Ok((DataFrame::new(m, columns)?, unknown_outcomes))
}

/// The [`COUNTS`] of one (window, prober, target) from its records per [`Class`] (slots below
/// [`TS_SLOT`]), with the unreachable rule applied.
pub(super) fn counts_of(c: &[u64; 8]) -> [u64; COUNTS.len()] {
    let at = |class: Class| c[class as usize];
    let (lost, unreachable) = split_unreachable(at(Class::Ok), at(Class::Partial), at(Class::Lost));
    let mut row = [0u64; COUNTS.len()];
    row[C_PROBES] = c[..TS_SLOT].iter().sum();
    row[C_OK] = at(Class::Ok);
    row[C_LOST] = lost;
    row[C_PARTIAL] = at(Class::Partial);
    row[C_INVALID] = at(Class::Invalid);
    row[C_REFUSED] = at(Class::Refused);
    row[C_UNREACHABLE] = unreachable;
    row[C_LOCAL_DROP] = at(Class::LocalDrop);
    row
}

impl KeySpace {
    /// The key of the pair (window index `d`, RNICs `p` -> `g`): what the pair table counts by,
    /// in its order, and the `pair` scope's key.
    #[inline]
    pub(super) fn pair(self, d: u64, p: u32, g: u32) -> u64 {
        (d * self.rnics + u64::from(p)) * self.rnics + u64::from(g)
    }

    /// The group key of a record (window index `d`, RNICs `p` -> `g`, whose ToRs `tor` gives)
    /// in `scope`, and for the either-end scopes the key of its second end when the ends differ
    /// (so that a self-probe or a ToR-local record counts once).
    pub(super) fn keys(self, scope: Scope, d: u64, p: u32, g: u32, tor: &[u32]) -> (u64, Option<u64>) {
        let (r, t) = (self.rnics, self.tors);
        let (pt, gt) = (u64::from(tor[p as usize]), u64::from(tor[g as usize]));
        match scope {
            Scope::Cluster => (d, None),
            Scope::Pair => (self.pair(d, p, g), None),
            Scope::TorPair => ((d * t + pt) * t + gt, None),
            Scope::Rnic => (d * r + u64::from(p), (g != p).then_some(d * r + u64::from(g))),
            Scope::Tor => (d * t + pt, (gt != pt).then_some(d * t + gt)),
            Scope::Service => unreachable!("the service scope is not keyed by RNIC ids"),
        }
    }

    /// (d, first id, second id) of a key of `scope`.
    pub(super) fn decode(self, scope: Scope, key: u64) -> (u64, u64, u64) {
        let (r, t) = (self.rnics, self.tors);
        match scope {
            Scope::Cluster => (key, 0, 0),
            Scope::Pair => (key / r / r, key / r % r, key % r),
            Scope::TorPair => (key / t / t, key / t % t, key % t),
            Scope::Rnic => (key / r, key % r, 0),
            Scope::Tor => (key / t, key % t, 0),
            Scope::Service => unreachable!("the service scope is not keyed by RNIC ids"),
        }
    }
}
