// IEEE binary16 and bfloat16 from and to float, rounding to nearest even:
// the one implementation of these conversions, used by the CPU's output
// writer, the GPU's preprocessing kernel and its CPU twin. Plain C++17 with
// no other includes (nvcc compiles it), identical on host and device.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define STOKER_HOST_DEVICE __host__ __device__
#else
#define STOKER_HOST_DEVICE
#endif

namespace stoker {

STOKER_HOST_DEVICE inline std::uint32_t FloatBits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  std::uint32_t u;
  __builtin_memcpy(&u, &f, 4);
  return u;
#endif
}

STOKER_HOST_DEVICE inline float BitsToFloat(std::uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
#endif
}

STOKER_HOST_DEVICE inline std::uint16_t FloatToBFloat16Bits(float f) {
  std::uint32_t u = FloatBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40);  // NaN stays NaN (quiet)
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}

STOKER_HOST_DEVICE inline std::uint16_t FloatToHalfBits(float f) {
  const std::uint32_t u = FloatBits(f);
  const std::uint32_t sign = (u >> 16) & 0x8000u;
  const std::uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u);   // NaN
  if (abs >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // rounds to infinity (or is one)
  if (abs < 0x38800000u) {                                                    // half subnormal or zero
    if (abs < 0x33000000u) return static_cast<std::uint16_t>(sign);
    // value = mant * 2^(e - 150); a half subnormal counts units of 2^-24.
    const std::uint32_t exp = abs >> 23;
    const std::uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    const std::uint32_t shift = 126 - exp;  // 14..24
    std::uint32_t h = mant >> shift;
    const std::uint32_t rem = mant & ((1u << shift) - 1);
    const std::uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1u))) ++h;
    return static_cast<std::uint16_t>(sign | h);
  }
  std::uint32_t h = (abs >> 13) - (112u << 10);  // rebias exponent 127 -> 15
  const std::uint32_t rem = abs & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return static_cast<std::uint16_t>(sign | h);
}

STOKER_HOST_DEVICE inline float HalfBitsToFloat(std::uint16_t h) {
  const std::uint32_t sign = (static_cast<std::uint32_t>(h) & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  if (exp == 0) {
    const float v = static_cast<float>(mant) * (1.0f / 16777216.0f);  // mant * 2^-24
    return sign ? -v : v;
  }
  if (exp == 31) return BitsToFloat(sign | 0x7f800000u | (mant << 13));
  return BitsToFloat(sign | ((exp + 112) << 23) | (mant << 13));
}

STOKER_HOST_DEVICE inline float BFloat16BitsToFloat(std::uint16_t b) {
  return BitsToFloat(static_cast<std::uint32_t>(b) << 16);
}

}  // namespace stoker
