//! The tiled dots the projections use give the bits of `dot_bf16`, for every length (tails
//! included) and on whichever path (AVX2 or portable) this machine takes.

use half::bf16;
use solder_model_layers::numerics::{dot_1x4, dot_4x1, dot_bf16, to_f32};
use solder_model_layers::weights::SplitMix64;

fn random(rng: &mut SplitMix64, n: usize) -> Vec<bf16> {
    (0..n)
        .map(|_| bf16::from_f32(rng.uniform() * 3.0))
        .collect()
}

#[test]
fn tiled_dots_equal_dot_bf16_bit_for_bit() {
    let mut rng = SplitMix64(42);
    for len in [1, 7, 15, 16, 17, 31, 32, 33, 100, 255, 256, 1000, 2048] {
        let xs: Vec<Vec<bf16>> = (0..4).map(|_| random(&mut rng, len)).collect();
        let ws: Vec<Vec<bf16>> = (0..4).map(|_| random(&mut rng, len)).collect();
        let xf: Vec<Vec<f32>> = xs
            .iter()
            .map(|x| x.iter().map(|v| to_f32(*v)).collect())
            .collect();
        let one = dot_1x4(&xf[0], [&ws[0], &ws[1], &ws[2], &ws[3]]);
        for c in 0..4 {
            assert_eq!(
                one[c].to_bits(),
                dot_bf16(&xs[0], &ws[c]).to_bits(),
                "1x4 len {len} col {c}"
            );
        }
        let four = dot_4x1([&xf[0], &xf[1], &xf[2], &xf[3]], &ws[0]);
        for r in 0..4 {
            assert_eq!(
                four[r].to_bits(),
                dot_bf16(&xs[r], &ws[0]).to_bits(),
                "4x1 len {len} row {r}"
            );
        }
    }
}
