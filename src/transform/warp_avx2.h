// The warp engines' AVX2 inner loops (warp.cc), apart from the engines:
// each computes exactly what the engine's scalar loop does, in vector lanes.
// Callers check HasAvx2() first; built on x86-64 with GCC or Clang only.
#pragma once

#include <cstdint>

namespace stoker::transform {

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
// affine_fixed's positions for `n` pixels of a row whose every position
// falls inside the input, 8 at a time: lane k of a block holds the block's
// xx + k * dx, which the scalar loop reaches by adding dx k times (int32
// arithmetic wraps the same either way), floored by the same arithmetic
// shift, and each pixel is gathered as 4 bytes at `in` + its offset (the
// caller keeps every offset + 4 inside the buffer). `channels` is 1, 3 or 4.
// Returns how many pixels it drew (a multiple of 8; 0 for other channel
// counts); the scalar loop draws the rest.
__attribute__((target("avx2"))) int FixedRunAvx2(int channels, const std::uint8_t* in, std::int32_t in_offset,
                                                 std::int32_t in_stride, std::int32_t xx, std::int32_t yy,
                                                 std::int32_t dx, std::int32_t dy, int n, std::uint8_t* out);

// One bilinear pixel of a 3-channel image, its channels in the lanes of AVX
// doubles: per channel the same int difference, products and sums as the
// scalar loop in AffineBilinear, in the same order (no FMA: the target is
// avx2 alone), so the bytes are that loop's. `a`, `b` are the taps left and
// right on the upper row, `c`, `d` on the lower one (the upper ones again
// where there is none: the scalar loop's v2 = v1). Each tap is read as 4
// bytes, the fourth not used: the caller keeps them inside the buffer.
__attribute__((target("avx2"))) void BilinearPixel3(const std::uint8_t* a, const std::uint8_t* b, const std::uint8_t* c,
                                                    const std::uint8_t* d, double dx, double dy, std::uint8_t* out);
#endif

}  // namespace stoker::transform
