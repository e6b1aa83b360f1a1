//! `Rng`: the per-sequence pseudo-random generator — xoshiro256** (Blackman and Vigna), its
//! 256-bit state seeded from one `u64` by SplitMix64, as the reference `xoshiro256starstar.c`
//! recommends.
//!
//! Invariant: the stream is a function of the seed alone, on every platform: only wrapping
//! integer arithmetic, and `uniform` takes the top 53 bits of a draw, exactly representable
//! in an f64, so no rounding mode or libm enters.

/// SplitMix64's step (Vigna's `splitmix64.c`): advances `state` and returns its next output.
pub fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// xoshiro256**: a fast 256-bit generator with a period of 2^256 − 1, good enough for
/// sampling (it passes BigCrush); not a cryptographic generator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rng {
    state: [u64; 4],
}

impl Rng {
    /// The generator whose state is SplitMix64's first four outputs from `seed`. SplitMix64
    /// never yields four zero words in a row, so the state is never the all-zero fixed point.
    pub fn seeded(seed: u64) -> Rng {
        let mut mix = seed;
        let state = [
            splitmix64(&mut mix),
            splitmix64(&mut mix),
            splitmix64(&mut mix),
            splitmix64(&mut mix),
        ];
        Rng { state }
    }

    /// The generator at a raw state (reference vectors, saved streams); `None` for the
    /// all-zero state, which xoshiro never leaves.
    pub fn from_state(state: [u64; 4]) -> Option<Rng> {
        (state != [0; 4]).then_some(Rng { state })
    }

    /// The raw state, to save a stream and resume it with `from_state`.
    pub fn state(&self) -> [u64; 4] {
        self.state
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.state;
        let result = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// A uniform f64 in [0, 1): the top 53 bits of a draw times 2^-53, every value a multiple
    /// of 2^-53 and exact.
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix64_matches_the_published_outputs() {
        // Seed 1234567: the outputs Vigna's splitmix64.c prints (also Rosetta Code's).
        let mut state = 1_234_567;
        let expected = [
            6457827717110365317,
            3203168211198807973,
            9817491932198370423,
            4593380528125082431,
            16408922859458223821,
        ];
        for value in expected {
            assert_eq!(splitmix64(&mut state), value);
        }
        let mut zero = 0;
        assert_eq!(splitmix64(&mut zero), 0xe220_a839_7b1d_cdaf);
    }

    #[test]
    fn xoshiro256starstar_matches_the_reference_outputs() {
        // State {1, 2, 3, 4}: the reference implementation's outputs (rand_xoshiro's test).
        let mut rng = Rng::from_state([1, 2, 3, 4]).unwrap();
        let expected = [
            11520,
            0,
            1509978240,
            1215971899390074240,
            1216172134540287360,
            607988272756665600,
            16172922978634559625,
            8476171486693032832,
            10595114339597558777,
            2904607092377533576,
        ];
        for value in expected {
            assert_eq!(rng.next_u64(), value);
        }
    }

    #[test]
    fn the_zero_state_is_refused_and_seeds_differ() {
        assert!(Rng::from_state([0; 4]).is_none());
        let (mut a, mut b, mut c) = (Rng::seeded(7), Rng::seeded(7), Rng::seeded(8));
        let first: Vec<u64> = (0..64).map(|_| a.next_u64()).collect();
        assert_eq!(first, (0..64).map(|_| b.next_u64()).collect::<Vec<_>>());
        assert_ne!(first, (0..64).map(|_| c.next_u64()).collect::<Vec<_>>());
    }

    #[test]
    fn uniform_is_the_top_53_bits() {
        let mut rng = Rng::seeded(3);
        let mut twin = rng.clone();
        for _ in 0..1000 {
            let u = rng.uniform();
            assert!((0.0..1.0).contains(&u));
            assert_eq!(u, (twin.next_u64() >> 11) as f64 / 9_007_199_254_740_992.0);
        }
        // The largest draw maps below 1: (2^53 − 1) / 2^53.
        let top = (u64::MAX >> 11) as f64 * (1.0 / (1u64 << 53) as f64);
        assert!(top < 1.0);
    }
}
