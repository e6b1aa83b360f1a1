//! Tensor-core attention of one (row, head) in the order of flash.cu `flash_block`, as the host
//! emulation runs it (`mma.sync` as fused multiply-adds in k order from the accumulator), so the
//! twin of `flash::paged_mma` and the CUDA source agree byte for byte.
//!
//! The order, a function of the row's keys first..len alone: chunks of
//! C = max(256, 32·⌈n / 480⌉) keys at absolute multiples of C (n = len − first: at most 16 touch
//! the row); inside a chunk, 32-key tiles at absolute multiples of 32. Per tile: s_j = (q·k_j,
//! fma in dim order from +0)·scale, -inf outside the chunk; m' = max(m, max s_j);
//! p_j = bf16(exp(s_j − m')); l_t = (p0 + p1) + (p2 + p3) with lane t's partial p_t over keys
//! 8i + 2t, 8i + 2t + 1 (i = 0..3) in order; corr = exp(m − m') (0 while m = -inf);
//! l = fma(l, corr, l_t); o_d = fma(o_d, corr, D_d) with D_d = Σ_j p_j·v_jd by fma from +0 over
//! the tile's 32 keys in order (staged keys outside the row's range enter as 0·v). One chunk:
//! out = bf16(o / l); several: merged in chunk order as attn's splits are (max M,
//! e_z = exp(m_z − M), den = Σ fma(l_z, e_z), num = Σ fma(o_z, e_z)), out = bf16(num / den).
//!
//! Invariant: every float operation and its operands are the kernel's under the emulation;
//! `expf` is glibc's in both.

use std::ops::Range;

use half::bf16;

use super::attention::fmax_nan;
use super::{to_bf16, to_f32};

/// Keys of one staged tile (flash.cu `FLASH_KEYS`).
pub const FLASH_KEYS: usize = 32;
/// Chunks a row's keys are cut into at most (flash.cu `FLASH_SPLITS`).
pub const FLASH_SPLITS: usize = 16;
/// The smallest chunk (flash.cu `FLASH_CHUNK_MIN`).
pub const CHUNK_MIN: usize = 256;
/// A chunk holds at least n / 15 keys, in 32-key tiles (flash.cu `FLASH_CHUNK_DIV`).
pub const CHUNK_DIV: usize = 480;

/// Keys of one chunk for a row attending `n` keys.
pub fn flash_chunk(n: usize) -> usize {
    (n.div_ceil(CHUNK_DIV) * FLASH_KEYS).max(CHUNK_MIN)
}

/// One chunk's online-softmax state.
#[derive(Default)]
struct Partial {
    m: f32,
    l: f32,
    o: Vec<f32>,
}

/// Scratch of `attend_mma`, reused across heads.
#[derive(Default)]
pub struct FlashScratch {
    parts: Vec<Partial>,
    d: Vec<f32>,
    q: Vec<f32>,
    /// A tile's keys widened and transposed: `kt[d·32 + i]` is dim d of the tile's key i.
    kt: Vec<f32>,
}

/// The staged keys and values of one block and kv head, widened to f32 tile by tile as the
/// kernel stages its K and V tiles: built once, read by every (row, head) of the block, instead
/// of each pair widening every tile again (at a 512-row chunk of four query heads per kv head,
/// 2,048 times) and reading each value row from its page. A key or value of a tile that is not
/// staged reads as 0; a staged key outside a row's own range enters that row's dots, whose
/// scores are -inf whatever they hold, and its value enters as 0·v.
pub struct KvTiles {
    /// The first tile's first key (a multiple of `FLASH_KEYS`).
    first: usize,
    head_dim: usize,
    /// Tile t's dim d of its key i at `(t·head_dim + d)·FLASH_KEYS + i` (transposed).
    keys: Vec<f32>,
    /// Tile t's value i, dim d at `(t·FLASH_KEYS + i)·head_dim + d` (as the rows are).
    values: Vec<f32>,
}

impl KvTiles {
    /// Staged keys up to this many f32 (64 MB, and as many for the values) are widened once
    /// for their block; past it (contexts of 100k tokens and more) each (row, head) widens its
    /// tiles as it goes.
    pub const MAX_ELEMS: usize = 1 << 24;

    /// The tiles of the keys `staged` (`key(j)` and `value(j)`: key j's and value j's
    /// `head_dim` values); `None` past `MAX_ELEMS`.
    pub fn new<'k>(
        staged: Range<usize>,
        head_dim: usize,
        key: impl Fn(usize) -> &'k [bf16],
        value: impl Fn(usize) -> &'k [bf16],
    ) -> Option<KvTiles> {
        let first = staged.start / FLASH_KEYS * FLASH_KEYS;
        let tiles = staged.end.saturating_sub(first).div_ceil(FLASH_KEYS);
        let elems = tiles.checked_mul(head_dim * FLASH_KEYS)?;
        if elems > Self::MAX_ELEMS {
            return None;
        }
        let (mut keys, mut values) = (vec![0.0f32; elems], vec![0.0f32; elems]);
        for j in staged {
            let (t, i) = ((j - first) / FLASH_KEYS, (j - first) % FLASH_KEYS);
            let tile = &mut keys[t * head_dim * FLASH_KEYS..][..head_dim * FLASH_KEYS];
            for (d, k) in key(j)[..head_dim].iter().enumerate() {
                tile[d * FLASH_KEYS + i] = to_f32(*k);
            }
            let row = &mut values[(j - first) * head_dim..][..head_dim];
            for (slot, v) in row.iter_mut().zip(&value(j)[..head_dim]) {
                *slot = to_f32(*v);
            }
        }
        Some(KvTiles {
            first,
            head_dim,
            keys,
            values,
        })
    }

    /// The keys of the tile whose first key is `t0`.
    fn keys(&self, t0: usize) -> &[f32] {
        let size = self.head_dim * FLASH_KEYS;
        &self.keys[(t0 - self.first) / FLASH_KEYS * size..][..size]
    }

    /// The values of the tile whose first key is `t0`, a row of `head_dim` a key.
    fn values(&self, t0: usize) -> &[f32] {
        let size = self.head_dim * FLASH_KEYS;
        &self.values[(t0 - self.first) / FLASH_KEYS * size..][..size]
    }
}

/// Where a row's key and value tiles come from: its block's [`KvTiles`], or `key(j)` and
/// `value(j)` read tile by tile (keys widened into the scratch).
pub enum Kv<'t, K, V> {
    Tiles(&'t KvTiles),
    Each(K, V),
}

/// Attention of one query head over keys `keys` (first..len) on the tensor cores' order (see
/// the module doc), stored bf16 in `out` (`head_dim` = `out.len()` values). `staged`: the keys
/// its block stages (a superset of `keys`); `kv` gives a staged key's and value's rows.
pub fn attend_mma<'k, K: Fn(usize) -> &'k [bf16], V: Fn(usize) -> &'k [bf16]>(
    q: &[bf16],
    (keys, staged): (Range<usize>, Range<usize>),
    scale: f32,
    kv: Kv<'_, K, V>,
    scratch: &mut FlashScratch,
    out: &mut [bf16],
) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU supports FMA (checked above).
        return unsafe { attend_mma_fma(q, (keys, staged), scale, kv, scratch, out) };
    }
    attend_mma_body(q, (keys, staged), scale, kv, scratch, out)
}

/// `attend_mma_body` compiled with FMA, so each `mul_add` is one instruction.
///
/// Safety: the CPU must support FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "fma")]
unsafe fn attend_mma_fma<'k, K: Fn(usize) -> &'k [bf16], V: Fn(usize) -> &'k [bf16]>(
    q: &[bf16],
    ranges: (Range<usize>, Range<usize>),
    scale: f32,
    kv: Kv<'_, K, V>,
    scratch: &mut FlashScratch,
    out: &mut [bf16],
) {
    attend_mma_body(q, ranges, scale, kv, scratch, out)
}

#[inline(always)]
fn attend_mma_body<'k, K: Fn(usize) -> &'k [bf16], V: Fn(usize) -> &'k [bf16]>(
    q: &[bf16],
    (keys, staged): (Range<usize>, Range<usize>),
    scale: f32,
    kv: Kv<'_, K, V>,
    scratch: &mut FlashScratch,
    out: &mut [bf16],
) {
    let head_dim = out.len();
    let (first, len) = (keys.start, keys.end);
    if len == 0 {
        out.fill(to_bf16(0.0));
        return;
    }
    let chunk = flash_chunk(len - first);
    let c0 = first / chunk;
    let chunks = (len - 1) / chunk - c0 + 1;
    scratch.q.clear();
    scratch.q.extend(q.iter().map(|v| to_f32(*v)));
    scratch.parts.resize_with(chunks, Partial::default);
    scratch.d.resize(head_dim, 0.0);
    scratch.kt.resize(head_dim * FLASH_KEYS, 0.0);
    let (q, kt) = (&scratch.q, &mut scratch.kt);
    for (z, part) in scratch.parts[..chunks].iter_mut().enumerate() {
        let begin = (c0 + z) * chunk;
        let (a, b) = (first.max(begin), len.min(begin + chunk));
        let (mut m, mut l) = (f32::NEG_INFINITY, 0.0f32);
        part.o.clear();
        part.o.resize(head_dim, 0.0);
        let mut t0 = a / FLASH_KEYS * FLASH_KEYS;
        let kt = &mut *kt;
        while t0 < b {
            // Scores of the row's keys (each key's dot a chain over dims in order; the 32
            // chains side by side), -inf for the others; the tile's max.
            let tile: &[f32] = match &kv {
                Kv::Tiles(tiles) => tiles.keys(t0),
                Kv::Each(key, _) => {
                    for i in 0..FLASH_KEYS {
                        let j = t0 + i;
                        if j >= a && j < b {
                            for (d, k) in key(j).iter().enumerate() {
                                kt[d * FLASH_KEYS + i] = to_f32(*k);
                            }
                        } else {
                            for d in 0..head_dim {
                                kt[d * FLASH_KEYS + i] = 0.0;
                            }
                        }
                    }
                    kt
                }
            };
            let mut dots = [0.0f32; FLASH_KEYS];
            for (x, column) in q.iter().zip(tile.chunks_exact(FLASH_KEYS)) {
                for (dot, k) in dots.iter_mut().zip(column) {
                    *dot = x.mul_add(*k, *dot);
                }
            }
            let mut s = [f32::NEG_INFINITY; FLASH_KEYS];
            for (i, s) in s.iter_mut().enumerate() {
                if (a..b).contains(&(t0 + i)) {
                    *s = dots[i] * scale;
                }
            }
            let m_new = fmax_nan(m, s.iter().fold(f32::NEG_INFINITY, |m, x| fmax_nan(m, *x)));
            let p = s.map(|s| {
                let p = if s == f32::NEG_INFINITY {
                    0.0
                } else {
                    (s - m_new).exp()
                };
                to_f32(to_bf16(p))
            });
            let lane = |t: usize| {
                (0..4).fold(0.0f32, |part, i| {
                    part + p[8 * i + 2 * t] + p[8 * i + 2 * t + 1]
                })
            };
            let l_tile = (lane(0) + lane(1)) + (lane(2) + lane(3));
            let corr = if m == f32::NEG_INFINITY {
                0.0
            } else {
                (m - m_new).exp()
            };
            l = l.mul_add(corr, l_tile);
            // D = P·V over the tile's 32 keys in order (zeros for a key not staged).
            let d = &mut scratch.d;
            d.fill(0.0);
            match &kv {
                Kv::Tiles(tiles) => {
                    for (p, row) in p.iter().zip(tiles.values(t0).chunks_exact(head_dim)) {
                        for (d, v) in d.iter_mut().zip(row) {
                            *d = p.mul_add(*v, *d);
                        }
                    }
                }
                Kv::Each(_, value) => {
                    for (i, p) in p.iter().enumerate() {
                        let j = t0 + i;
                        if staged.contains(&j) {
                            for (d, v) in d.iter_mut().zip(value(j)) {
                                *d = p.mul_add(to_f32(*v), *d);
                            }
                        } else {
                            for d in d.iter_mut() {
                                *d = p.mul_add(0.0, *d);
                            }
                        }
                    }
                }
            }
            for (o, d) in part.o.iter_mut().zip(d.iter()) {
                *o = o.mul_add(corr, *d);
            }
            m = m_new;
            t0 += FLASH_KEYS;
        }
        (part.m, part.l) = (m, l);
    }
    let parts = &scratch.parts[..chunks];
    if chunks == 1 {
        for (o, v) in out.iter_mut().zip(&parts[0].o) {
            *o = to_bf16(*v / parts[0].l);
        }
        return;
    }
    // The chunks merged in chunk order.
    let big = parts
        .iter()
        .fold(f32::NEG_INFINITY, |m, p| fmax_nan(m, p.m));
    let e: Vec<f32> = parts
        .iter()
        .map(|p| {
            if p.m == f32::NEG_INFINITY {
                0.0
            } else {
                (p.m - big).exp()
            }
        })
        .collect();
    let den = parts
        .iter()
        .zip(&e)
        .fold(0.0f32, |den, (p, e)| p.l.mul_add(*e, den));
    for (d, o) in out.iter_mut().enumerate() {
        let num = parts
            .iter()
            .zip(&e)
            .fold(0.0f32, |num, (p, e)| p.o[d].mul_add(*e, num));
        *o = to_bf16(num / den);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_are_tile_multiples_and_at_most_sixteen_touch_a_row() {
        for n in [1usize, 255, 256, 257, 4096, 7200, 7201, 100_000, 131_072] {
            let c = flash_chunk(n);
            assert_eq!(c % FLASH_KEYS, 0, "n {n}");
            assert!(c >= CHUNK_MIN && c * 15 >= n, "n {n}: chunk {c}");
            // Any window of n keys, aligned or not, touches at most 16 chunks.
            for first in [0usize, 1, c - 1, 3 * c + 7] {
                let touched = (first + n - 1) / c - first / c + 1;
                assert!(touched <= FLASH_SPLITS, "n {n} first {first}: {touched}");
            }
        }
    }

    #[test]
    fn a_blocks_shared_key_tiles_give_each_rows_bytes() {
        // Staged keys 3..300 (tiles from 0, the last partial); rows over all of them, a middle
        // range, the last key alone and one key; key 20 holds a NaN: staged but outside three
        // of the rows, whose scores mask it; inside the first, which both paths carry alike.
        let head_dim = 8;
        let staged = 3..300;
        let val = |j: usize, d: usize, salt: f32| {
            bf16::from_f32(((j * 31 + d * 7) as f32 * 0.173 + salt).sin() * 2.0)
        };
        let keys: Vec<Vec<bf16>> = (0..300)
            .map(|j| {
                (0..head_dim)
                    .map(|d| {
                        if j == 20 && d == 3 {
                            bf16::NAN
                        } else {
                            val(j, d, 0.0)
                        }
                    })
                    .collect()
            })
            .collect();
        let values: Vec<Vec<bf16>> = (0..300)
            .map(|j| (0..head_dim).map(|d| val(j, d, 1.3)).collect())
            .collect();
        let q: Vec<bf16> = (0..head_dim).map(|d| val(7, d, 0.4)).collect();
        let key = |j: usize| keys[j].as_slice();
        let value = |j: usize| values[j].as_slice();
        let tiles = KvTiles::new(staged.clone(), head_dim, key, value).unwrap();
        let mut scratch = FlashScratch::default();
        for keys_of_row in [3..300, 40..200, 299..300, 100..101] {
            let (mut shared, mut alone) = (vec![bf16::ZERO; head_dim], vec![bf16::ZERO; head_dim]);
            let ranges = (keys_of_row.clone(), staged.clone());
            // (K and V named through the other arm, as a caller picking at run time does.)
            let tiled = Some(&tiles).map_or(Kv::Each(key, value), Kv::Tiles);
            attend_mma(&q, ranges.clone(), 0.35, tiled, &mut scratch, &mut shared);
            attend_mma(
                &q,
                ranges,
                0.35,
                Kv::Each(key, value),
                &mut scratch,
                &mut alone,
            );
            let bits = |v: &[bf16]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&shared), bits(&alone), "keys {keys_of_row:?}");
            assert_eq!(
                shared.iter().any(|x| x.is_nan()),
                keys_of_row.contains(&20),
                "keys {keys_of_row:?}"
            );
        }
        // Past the bound, no tiles: the row widens its own.
        assert!(KvTiles::new(0..KvTiles::MAX_ELEMS, 2, key, value).is_none());
    }
}
