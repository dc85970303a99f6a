//! Deterministic pseudo-randomness for pinglist generation.
//!
//! Written out here rather than taken from `rand`: the output of `ctl gen-pinglists` must be
//! byte-identical for a seed across ctl builds (so that a regenerated list only differs where
//! the inventory changed), and `rand` does not promise a stable stream across versions.

/// SplitMix64 (Steele, Lea, Flood 2014): one u64 of state, passes BigCrush, trivially seekable.
#[derive(Debug, Clone)]
pub(crate) struct SplitMix64(u64);

impl SplitMix64 {
    pub(crate) fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix(self.0)
    }

    /// Uniform in `0..n` (Lemire's multiply-shift; the bias for the n used here, far below
    /// 2^32, is under 2^-32).
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }
}

/// SplitMix64's finaliser: a bijective avalanche of one u64.
pub(crate) fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A seed derived from `parts`, so that independent decisions (a ToR ring, one pair's flow
/// labels) draw from independent streams and do not shift when unrelated parts change.
pub(crate) fn derive(parts: &[u64]) -> u64 {
    parts.iter().fold(0x6A09_E667_F3BC_C908, |h, &p| mix(h ^ mix(p)))
}

/// [`derive`] one part at a time, so that a prefix shared by millions of derivations (seed,
/// tag) is folded once: `Derivation::new(&[a, b]).then_mixed(mix(c)).value() == derive(&[a, b, c])`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Derivation(u64);

impl Derivation {
    pub(crate) fn new(parts: &[u64]) -> Self {
        Derivation(derive(parts))
    }

    /// Appends a part given as `mix(part)`, precomputed by the caller.
    pub(crate) fn then_mixed(self, mixed_part: u64) -> Self {
        Derivation(mix(self.0 ^ mixed_part))
    }

    pub(crate) fn value(self) -> u64 {
        self.0
    }
}

/// FNV-1a of a name, to key streams by entity names rather than by positions in the inventory
/// (adding a host must not reshuffle the labels of every other pair).
pub(crate) fn name_hash(name: &str) -> u64 {
    name.bytes().fold(0xCBF2_9CE4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01B3))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stream_is_pinned() {
        // Reference values of SplitMix64 seeded with 0; a change here changes every pinglist.
        let mut r = SplitMix64::new(0);
        assert_eq!(r.next_u64(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(r.next_u64(), 0x6E78_9E6A_A1B9_65F4);
        assert_eq!(name_hash(""), 0xCBF2_9CE4_8422_2325);
        assert_eq!(name_hash("a"), 0xAF63_DC4C_8601_EC8C);
    }

    #[test]
    fn a_derivation_in_steps_is_the_derivation() {
        for parts in [&[][..], &[1], &[7, 3, 9], &[u64::MAX, 0, 5, 0x1234_5678_9ABC_DEF0, 42]] {
            for split in 0..=parts.len() {
                let stepped =
                    parts[split..].iter().fold(Derivation::new(&parts[..split]), |d, &p| d.then_mixed(mix(p)));
                assert_eq!(stepped.value(), derive(parts), "{parts:?} split at {split}");
            }
        }
    }

    #[test]
    fn below_stays_in_range_and_reaches_both_ends() {
        let mut r = SplitMix64::new(7);
        let draws: Vec<u64> = (0..10_000).map(|_| r.below(5)).collect();
        assert!(draws.iter().all(|&d| d < 5));
        assert!(draws.contains(&0) && draws.contains(&4));
    }
}
