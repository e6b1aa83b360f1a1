// Host-emulation shim for <cuda_bf16.h>: the bf16 type and the conversions solder's kernels
// use, defined in cuda_emu.hpp (which must come first). Never the real CUDA header: the
// emulation needs no CUDA toolkit.
#pragma once
#include "cuda_emu.hpp"
