// What the CPU runs, asked once: the transform layer builds for baseline
// x86-64 and picks its vector paths at run time.
#pragma once

namespace stoker::transform {

[[nodiscard]] inline bool HasAvx2() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  static const bool avx2 = __builtin_cpu_supports("avx2");
  return avx2;
#else
  return false;
#endif
}

}  // namespace stoker::transform
