//! A checkpoint's `quantization_config`: which weights are stored quantized, in which format.
//! Only weight-only formats whose arithmetic solder models are accepted; every other method,
//! bit width or activation scheme refuses the load naming the key.

/// How a quantized checkpoint stores its linear weights.
#[derive(Debug, Clone, PartialEq)]
pub enum Quantization {
    /// `quant_method: "fp8"` (Qwen's and DeepSeek's FP8 checkpoints): each quantized linear's
    /// `weight` in F8_E4M3 with `weight_scale_inv` `[ceil(out / block[0]), ceil(in / block[1])]`
    /// (BF16, F16 or F32); `w = weight * weight_scale_inv`. Dynamic activation scheme only (the
    /// activations stay bf16 in solder: weight-only).
    Fp8Block {
        /// `weight_block_size`: `[out, in]`.
        block: [usize; 2],
        /// `modules_to_not_convert`: module-name patterns kept unquantized.
        not_converted: Vec<String>,
    },
    /// `quant_method: "compressed-tensors"` with one `float` 8-bit weight scheme (most FP8
    /// Llama checkpoints): `weight` in F8_E4M3 with `weight_scale` per output channel
    /// (`[out, 1]`) or per tensor (one value); `w = weight * weight_scale`.
    Fp8Compressed {
        strategy: Fp8Strategy,
        /// The config group's `targets` (e.g. `["Linear"]`).
        targets: Vec<String>,
        /// `ignore`: module names or `re:` patterns kept unquantized (e.g. `lm_head`).
        ignore: Vec<String>,
    },
    /// `quant_method: "awq"`, `version: "gemm"`, 4 bits: `qweight` I32 `[in, out / 8]` (AWQ's
    /// interleaved nibble order), `qzeros` I32 `[in / group, out / 8]`, `scales` F16
    /// `[in / group, out]`; `w = (q - z) * s`.
    Awq {
        group_size: usize,
        /// `zero_point`: false stores no zeros (symmetric, z = 8).
        zero_point: bool,
        /// `modules_to_not_convert`.
        not_converted: Vec<String>,
    },
    /// `quant_method: "gptq"`, 4 bits, `desc_act: false`: `qweight` I32 `[in / 8, out]`,
    /// `qzeros` I32 `[in / group, out / 8]` (stored minus one in the GPTQ v1 checkpoint format:
    /// z = stored + 1), `scales` F16 `[in / group, out]`, `g_idx` I32 `[in]` (must be `i / group`);
    /// `w = (q - z) * s`.
    Gptq {
        group_size: usize,
        sym: bool,
        /// `checkpoint_format`: `gptq` (v1, zeros stored minus one, the default) or `gptq_v2`.
        v2: bool,
        /// `modules_to_not_convert` (Optimum's `modules_in_block_to_quantize` inverted is not
        /// modelled: a listed block is refused).
        not_converted: Vec<String>,
    },
}

/// The scale granularity of a compressed-tensors FP8 weight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fp8Strategy {
    /// `weight_scale` `[out, 1]`.
    Channel,
    /// `weight_scale` one value.
    Tensor,
}
