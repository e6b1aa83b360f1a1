//! The transforms from logits to the distribution a token is drawn from, in the order vLLM's
//! sampler and Hugging Face's `generate` apply them: temperature, then top-k, then top-p
//! (each over what the previous one left), then a softmax over what remains. Also `greedy`
//! (the arg-max), `draw` (one token from weights) and `exp_nonpositive`.
//!
//! Non-finite logits: NaN is never in the support; -inf has probability 0; +inf logits, when
//! there are any, share all the mass equally (the limit of the softmax); a row with nothing
//! but -inf and NaN is refused (`SamplingError::NoFiniteLogit`).
//!
//! Invariant: same logits and transforms, same bits, on every platform: the arithmetic is
//! IEEE basic operations in f64 (`exp_nonpositive` instead of libm's `exp`), sums run in
//! index order, and top-p walks the tokens by weight, ties lowest index first.

use super::rng::Rng;
use super::SamplingError;

/// The arg-max token (the lowest index among equal maxima; NaN never wins).
pub fn greedy(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in logits.iter().enumerate() {
        if v > logits[best] || logits[best].is_nan() && !v.is_nan() {
            best = i;
        }
    }
    best as u32
}

/// The checked sampled transforms: temperature > 0 (0 is greedy and never gets here),
/// `top_k` 0 for off, `top_p` in (0, 1] with 1 for off.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Transforms {
    pub temperature: f64,
    pub top_k: usize,
    pub top_p: f64,
}

/// The row's support before any transform: `Err` when every logit is -inf or NaN.
fn check_row(logits: &[f32]) -> Result<(), SamplingError> {
    if logits.is_empty() {
        return Err(SamplingError::EmptyVocabulary);
    }
    if logits.iter().all(|v| v.is_nan() || *v == f32::NEG_INFINITY) {
        return Err(SamplingError::NoFiniteLogit {
            vocab: logits.len(),
        });
    }
    Ok(())
}

/// The greedy distribution: all the mass on `greedy(logits)`.
pub(crate) fn greedy_probs(logits: &[f32]) -> Result<Vec<f64>, SamplingError> {
    check_row(logits)?;
    let mut probs = vec![0.0; logits.len()];
    probs[greedy(logits) as usize] = 1.0;
    Ok(probs)
}

/// The unnormalised weights after the transforms: 0 outside the support, `exp((l − max) / T)`
/// inside it (1 for each +inf logit when there are any). At least one weight is positive.
pub(crate) fn weights(logits: &[f32], t: &Transforms) -> Result<Vec<f64>, SamplingError> {
    check_row(logits)?;
    let has_pos_inf = logits.contains(&f32::INFINITY);
    // The candidates: the +inf logits if any, else every finite one (NaN and -inf never).
    let in_support = |v: f32| {
        if has_pos_inf {
            v == f32::INFINITY
        } else {
            v.is_finite()
        }
    };
    let mut support: Vec<usize> = (0..logits.len())
        .filter(|&i| in_support(logits[i]))
        .collect();

    // Top-k: keep every token whose logit is at least the k-th largest, ties at the boundary
    // included (as both vLLM and HF do); temperature > 0 does not change the order.
    if t.top_k > 0 && t.top_k < support.len() {
        let mut sorted: Vec<f32> = support.iter().map(|&i| logits[i]).collect();
        sorted.sort_by(|a, b| b.total_cmp(a));
        let kth = sorted[t.top_k - 1];
        support.retain(|&i| logits[i] >= kth);
    }

    let mut weights = vec![0.0f64; logits.len()];
    if has_pos_inf {
        for &i in &support {
            weights[i] = 1.0;
        }
    } else {
        let max = support
            .iter()
            .map(|&i| f64::from(logits[i]))
            .fold(f64::NEG_INFINITY, f64::max);
        for &i in &support {
            // (l − max) / T ≤ 0; a tiny T sends it to -inf, whose weight is 0, never NaN.
            weights[i] = exp_nonpositive((f64::from(logits[i]) - max) / t.temperature);
        }
    }

    // Top-p: the smallest set of the heaviest tokens whose mass reaches top_p of the whole
    // (a token stays while the mass before it is below top_p), so the heaviest always stays.
    if t.top_p < 1.0 {
        let total = sum_in_order(&weights);
        let mut by_weight = support.clone();
        by_weight.sort_by(|&a, &b| weights[b].total_cmp(&weights[a]).then(a.cmp(&b)));
        let mut before = 0.0;
        let mut cut = by_weight.len();
        for (rank, &i) in by_weight.iter().enumerate() {
            if before >= t.top_p * total {
                cut = rank;
                break;
            }
            before += weights[i];
        }
        for &i in &by_weight[cut..] {
            weights[i] = 0.0;
        }
    }
    Ok(weights)
}

/// Weights divided by their sum: a distribution summing to 1 within rounding.
pub(crate) fn normalise(mut weights: Vec<f64>) -> Vec<f64> {
    let total = sum_in_order(&weights);
    for w in &mut weights {
        *w /= total;
    }
    weights
}

/// The sum in index order (the one summation order every caller uses).
pub(crate) fn sum_in_order(values: &[f64]) -> f64 {
    values.iter().sum()
}

/// One token drawn with probability proportional to `weights` (non-negative, some positive):
/// the first index whose running sum exceeds `u · total`, so a zero weight is never drawn.
pub(crate) fn draw(weights: &[f64], rng: &mut Rng) -> u32 {
    let target = rng.uniform() * sum_in_order(weights);
    let mut running = 0.0;
    let mut last_positive = 0;
    for (i, &w) in weights.iter().enumerate() {
        if w > 0.0 {
            running += w;
            last_positive = i;
            if running > target {
                return i as u32;
            }
        }
    }
    // Rounding can leave the running sum a hair under `u · total`: the last token with mass.
    last_positive as u32
}

/// e^x for x ≤ 0 (0 below −746 and at −inf), from IEEE basic operations alone, so the bits
/// are the same on every platform (libm's `exp` is not specified to the bit). Reduction
/// x = k·ln2 + r with fdlibm's split ln2 (k·LN2_HI exact for |k| < 2^11), |r| ≤ ln2/2, then
/// the Taylor series to r^13 (truncation below 1e-17 relative), then scaling by 2^k; within
/// a few ulp of the exact value for normal results.
pub(crate) fn exp_nonpositive(x: f64) -> f64 {
    // fdlibm's ln2_hi (low 32 bits zero) and ln2_lo, by their bits.
    const LN2_HI: f64 = f64::from_bits(0x3fe6_2e42_fee0_0000);
    const LN2_LO: f64 = f64::from_bits(0x3dea_39ef_3579_3c76);
    const LOG2_E: f64 = std::f64::consts::LOG2_E;
    if x.is_nan() {
        return f64::NAN;
    }
    if x < -746.0 {
        return 0.0;
    }
    let k = (x * LOG2_E).round();
    let r = (x - k * LN2_HI) - k * LN2_LO;
    // Horner's form of Σ r^n / n! for n ≤ 13: 1 + r(1 + r/2(1 + r/3(…(1 + r/13)))).
    let mut poly = 1.0;
    for n in (1..=13).rev() {
        poly = 1.0 + r / f64::from(n) * poly;
    }
    let k = k as i64;
    let pow2 = |e: i64| f64::from_bits(((e + 1023) as u64) << 52);
    if k >= -1022 {
        poly * pow2(k)
    } else {
        // A subnormal result: scale in two normal steps.
        poly * pow2(k + 200) * pow2(-200)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_nonpositive_is_within_a_few_ulp_of_exp() {
        let mut x = 0.0f64;
        while x > -708.0 {
            let (ours, libm) = (exp_nonpositive(x), x.exp());
            let ulp = f64::EPSILON * libm;
            assert!(
                (ours - libm).abs() <= 4.0 * ulp,
                "exp({x}) = {ours}, libm {libm}"
            );
            x -= 0.0137;
        }
        assert_eq!(exp_nonpositive(0.0), 1.0);
        assert_eq!(exp_nonpositive(-0.0), 1.0);
        assert_eq!(exp_nonpositive(f64::NEG_INFINITY), 0.0);
        assert_eq!(exp_nonpositive(-800.0), 0.0);
        let tiny = exp_nonpositive(-740.0);
        assert!(tiny > 0.0 && (tiny - (-740.0f64).exp()).abs() <= 1e-321);
    }

    #[test]
    fn draw_never_picks_a_zero_weight() {
        let mut rng = Rng::seeded(11);
        let weights = [0.0, 3.0, 0.0, 1.0, 0.0];
        for _ in 0..10_000 {
            let pick = draw(&weights, &mut rng) as usize;
            assert!(weights[pick] > 0.0, "picked {pick}");
        }
    }
}
