//! Host values as the device stores them: little-endian bytes of bf16, f32 and i32 arrays,
//! for uploads (weights, constants, per-step metadata), checkpoints and read-backs.
//!
//! Invariant: the host is little-endian (a compile error otherwise), so a bf16 slice's memory
//! is already its device bytes and can be lent without a copy.

#[cfg(not(target_endian = "little"))]
compile_error!("solder's hosts are little-endian");

/// A bf16 slice's bytes, borrowed (little-endian, as the device stores them).
pub(crate) fn bf16_bytes(values: &[half::bf16]) -> &[u8] {
    // SAFETY: bf16 is a plain 2-byte value with no padding and no invalid bit patterns; the
    // length covers exactly the slice, and u8 has alignment 1.
    unsafe {
        std::slice::from_raw_parts(values.as_ptr() as *const u8, std::mem::size_of_val(values))
    }
}

/// The little-endian bytes of f32 values.
pub(crate) fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// f32 values from little-endian bytes (a trailing partial value is dropped).
pub(crate) fn f32s_from_bytes(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// Writes i32 values little-endian at the start of `out`, which holds at least
/// `4 * values.len()` bytes.
pub(crate) fn put_i32s(out: &mut [u8], values: &[i32]) {
    debug_assert!(
        out.len() >= 4 * values.len(),
        "{} bytes for {} i32s",
        out.len(),
        values.len()
    );
    for (slot, value) in out.chunks_exact_mut(4).zip(values) {
        slot.copy_from_slice(&value.to_le_bytes());
    }
}

/// The alignment of every region and buffer of the workspace, in bytes.
pub const ALIGN: usize = 256;

/// `bytes` rounded up to the next `ALIGN` boundary.
pub(crate) fn align(bytes: usize) -> usize {
    bytes.div_ceil(ALIGN) * ALIGN
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_round_trip_through_their_bytes() {
        let values = [half::bf16::from_f32(1.5), half::bf16::from_f32(-2.0)];
        assert_eq!(bf16_bytes(&values), [0xc0, 0x3f, 0x00, 0xc0]);
        let floats = [0.25f32, -7.0, f32::MAX];
        assert_eq!(f32s_from_bytes(&f32_bytes(&floats)), floats);
        let mut out = [0xffu8; 12];
        put_i32s(&mut out, &[1, -2]);
        assert_eq!(
            out,
            [1, 0, 0, 0, 0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]
        );
    }
}
