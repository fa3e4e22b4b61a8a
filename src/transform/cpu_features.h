// What the CPU runs, asked once: the transform layer builds for baseline
// x86-64 and picks its vector paths at run time.
#pragma once

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#endif

namespace stoker::transform {

[[nodiscard]] inline bool HasAvx2() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  static const bool avx2 = __builtin_cpu_supports("avx2");
  return avx2;
#else
  return false;
#endif
}

// Half-precision conversions (F16C: vcvtps2ph). Asked of CPUID directly:
// clang's __builtin_cpu_supports does not know the name. Every CPU with AVX2
// has it; the vector paths that convert to float16 ask both.
[[nodiscard]] inline bool HasF16c() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  static const bool f16c = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
  }();
  return f16c;
#else
  return false;
#endif
}

// Fused multiply-add (FMA3: vfmadd), asked of CPUID as HasF16c is.
[[nodiscard]] inline bool HasFma() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  static const bool fma = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_FMA) != 0;
  }();
  return fma;
#else
  return false;
#endif
}

}  // namespace stoker::transform
