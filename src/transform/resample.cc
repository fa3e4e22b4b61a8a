#include "transform/resample.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace stoker::transform {
namespace {

constexpr int kPrecisionBits = 32 - 8 - 2;  // as Pillow's Resample.c

double Triangle(double x) {
  x = std::fabs(x);
  return x < 1.0 ? 1.0 - x : 0.0;
}

// Pillow's precompute_coeffs + normalize_coeffs_8bpc. Returns the kernel size;
// bounds holds (xmin, count) per output pixel.
int PrecomputeCoeffs(int in_size, double in0, double in1, int out_size, std::vector<int>& bounds,
                     std::vector<std::int32_t>& coeffs) {
  const double scale = (in1 - in0) / out_size;
  const double filterscale = std::max(scale, 1.0);
  const double support = 1.0 * filterscale;
  const int ksize = static_cast<int>(std::ceil(support)) * 2 + 1;
  bounds.resize(static_cast<std::size_t>(out_size) * 2);
  coeffs.assign(static_cast<std::size_t>(out_size) * ksize, 0);
  // The filter's weights for one output pixel (at most ksize of them); any
  // downscale factor works, as in Pillow.
  thread_local std::vector<double> weights;
  weights.resize(static_cast<std::size_t>(ksize));
  double* k = weights.data();
  for (int xx = 0; xx < out_size; ++xx) {
    const double center = in0 + (xx + 0.5) * scale;
    const double ss = 1.0 / filterscale;
    int xmin = static_cast<int>(center - support + 0.5);
    if (xmin < 0) xmin = 0;
    int xmax = static_cast<int>(center + support + 0.5);
    if (xmax > in_size) xmax = in_size;
    xmax -= xmin;
    double ww = 0.0;
    int x = 0;
    for (; x < xmax; ++x) {
      const double w = Triangle((x + xmin - center + 0.5) * ss);
      k[x] = w;
      ww += w;
    }
    for (x = 0; x < xmax; ++x) {
      const double w = ww != 0.0 ? k[x] / ww : 0.0;
      // Pillow rounds half away from zero.
      const double fixed = w * (1 << kPrecisionBits);
      coeffs[static_cast<std::size_t>(xx) * ksize + x] =
          static_cast<std::int32_t>(fixed < 0 ? std::trunc(fixed - 0.5) : std::trunc(fixed + 0.5));
    }
    bounds[static_cast<std::size_t>(xx) * 2] = xmin;
    bounds[static_cast<std::size_t>(xx) * 2 + 1] = xmax;
  }
  return ksize;
}

// One row of the horizontal pass: out_w RGB pixels from `line`.
using HorizontalPass = void (*)(const std::uint8_t* line, int width, const int* bounds, const std::int32_t* coeffs,
                                int ksize, int out_w, std::uint8_t* dst);

void HorizontalPassScalar(const std::uint8_t* line, int, const int* bounds, const std::int32_t* coeffs, int ksize,
                          int out_w, std::uint8_t* dst) {
  for (int xx = 0; xx < out_w; ++xx) {
    const int xmin = bounds[2 * xx], xmax = bounds[2 * xx + 1];
    const std::int32_t* k = coeffs + static_cast<std::size_t>(xx) * ksize;
    // 255 * 2^22 plus the rounding term fits in int32, as in Pillow.
    std::int32_t s0 = 1 << (kPrecisionBits - 1), s1 = s0, s2 = s0;
    const std::uint8_t* p = line + static_cast<std::size_t>(xmin) * 3;
    for (int x = 0; x < xmax; ++x) {
      s0 += p[3 * x + 0] * k[x];
      s1 += p[3 * x + 1] * k[x];
      s2 += p[3 * x + 2] * k[x];
    }
    dst[3 * xx + 0] = static_cast<std::uint8_t>(std::clamp(s0 >> kPrecisionBits, 0, 255));
    dst[3 * xx + 1] = static_cast<std::uint8_t>(std::clamp(s1 >> kPrecisionBits, 0, 255));
    dst[3 * xx + 2] = static_cast<std::uint8_t>(std::clamp(s2 >> kPrecisionBits, 0, 255));
  }
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
// The same arithmetic, exactly, with the three channels of a pixel in one
// SSE4.1 register: one widening load, multiply and add per tap.
__attribute__((target("sse4.1"))) void HorizontalPassSse41(const std::uint8_t* line, int width, const int* bounds,
                                                           const std::int32_t* coeffs, int ksize, int out_w,
                                                           std::uint8_t* dst) {
  for (int xx = 0; xx < out_w; ++xx) {
    const int xmin = bounds[2 * xx], xmax = bounds[2 * xx + 1];
    const std::int32_t* k = coeffs + static_cast<std::size_t>(xx) * ksize;
    __m128i acc = _mm_set1_epi32(1 << (kPrecisionBits - 1));
    int x = 0;
    // A 4-byte load reads one byte past the pixel: stop before the row's last pixel.
    const int safe = std::min(xmax, width - 1 - xmin);
    for (; x < safe; ++x) {
      std::int32_t four;
      std::memcpy(&four, line + static_cast<std::size_t>(xmin + x) * 3, 4);
      const __m128i px = _mm_cvtepu8_epi32(_mm_cvtsi32_si128(four));
      acc = _mm_add_epi32(acc, _mm_mullo_epi32(px, _mm_set1_epi32(k[x])));
    }
    alignas(16) std::int32_t s[4];
    _mm_store_si128(reinterpret_cast<__m128i*>(s), acc);
    for (; x < xmax; ++x) {
      const std::uint8_t* p = line + static_cast<std::size_t>(xmin + x) * 3;
      s[0] += p[0] * k[x];
      s[1] += p[1] * k[x];
      s[2] += p[2] * k[x];
    }
    dst[3 * xx + 0] = static_cast<std::uint8_t>(std::clamp(s[0] >> kPrecisionBits, 0, 255));
    dst[3 * xx + 1] = static_cast<std::uint8_t>(std::clamp(s[1] >> kPrecisionBits, 0, 255));
    dst[3 * xx + 2] = static_cast<std::uint8_t>(std::clamp(s[2] >> kPrecisionBits, 0, 255));
  }
}

// Two output pixels per 256-bit register (three channels each, one lane
// idle), same integer arithmetic. Pixels whose taps reach the row's last
// pixel go through the SSE4.1 path, which never reads past the row.
__attribute__((target("avx2"))) void HorizontalPassAvx2(const std::uint8_t* line, int width, const int* bounds,
                                                        const std::int32_t* coeffs, int ksize, int out_w,
                                                        std::uint8_t* dst) {
  int xx = 0;
  for (; xx + 1 < out_w; xx += 2) {
    const int xmin0 = bounds[2 * xx], xmax0 = bounds[2 * xx + 1];
    const int xmin1 = bounds[2 * xx + 2], xmax1 = bounds[2 * xx + 3];
    const int n = std::max(xmax0, xmax1);  // weights past a pixel's own taps are zero
    if (xmin0 + n > width - 1 || xmin1 + n > width - 1) {
      HorizontalPassSse41(line, width, bounds + 2 * xx, coeffs + static_cast<std::size_t>(xx) * ksize, ksize, 2,
                          dst + 3 * xx);
      continue;
    }
    const std::int32_t* k0 = coeffs + static_cast<std::size_t>(xx) * ksize;
    const std::int32_t* k1 = k0 + ksize;
    const std::uint8_t* p0 = line + static_cast<std::size_t>(xmin0) * 3;
    const std::uint8_t* p1 = line + static_cast<std::size_t>(xmin1) * 3;
    __m256i acc = _mm256_set1_epi32(1 << (kPrecisionBits - 1));
    for (int x = 0; x < n; ++x) {
      std::int32_t a, b;
      std::memcpy(&a, p0 + 3 * x, 4);
      std::memcpy(&b, p1 + 3 * x, 4);
      const __m256i px = _mm256_cvtepu8_epi32(_mm_unpacklo_epi32(_mm_cvtsi32_si128(a), _mm_cvtsi32_si128(b)));
      const __m256i w = _mm256_setr_epi32(k0[x], k0[x], k0[x], k0[x], k1[x], k1[x], k1[x], k1[x]);
      acc = _mm256_add_epi32(acc, _mm256_mullo_epi32(px, w));
    }
    acc = _mm256_srai_epi32(acc, kPrecisionBits);
    acc = _mm256_max_epi32(_mm256_min_epi32(acc, _mm256_set1_epi32(255)), _mm256_setzero_si256());
    alignas(32) std::int32_t out[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(out), acc);
    std::uint8_t* d = dst + 3 * xx;
    d[0] = static_cast<std::uint8_t>(out[0]);
    d[1] = static_cast<std::uint8_t>(out[1]);
    d[2] = static_cast<std::uint8_t>(out[2]);
    d[3] = static_cast<std::uint8_t>(out[4]);
    d[4] = static_cast<std::uint8_t>(out[5]);
    d[5] = static_cast<std::uint8_t>(out[6]);
  }
  if (xx < out_w) {
    HorizontalPassSse41(line, width, bounds + 2 * xx, coeffs + static_cast<std::size_t>(xx) * ksize, ksize, out_w - xx,
                        dst + 3 * xx);
  }
}
#endif

HorizontalPass HorizontalPassFor() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  static const bool avx2 = __builtin_cpu_supports("avx2");
  static const bool sse41 = __builtin_cpu_supports("sse4.1");
  if (avx2) return HorizontalPassAvx2;
  if (sse41) return HorizontalPassSse41;
#endif
  return HorizontalPassScalar;
}

}  // namespace

STOKER_SIMD_CLONES bool ResampleBilinear(const ImageView& src, double x0, double y0, double x1, double y1, int out_w,
                                         int out_h, std::uint8_t* out, ResampleScratch& scratch) {
  if (out_w <= 0 || out_h <= 0 || !(x1 > x0) || !(y1 > y0) || x0 < 0 || y0 < 0 || x1 > src.width || y1 > src.height)
    return false;
  // Horizontal pass over the rows the vertical pass will need.
  std::vector<int>& vbounds = scratch.vbounds;
  std::vector<std::int32_t>& vcoeffs = scratch.vcoeffs;
  const int vk = PrecomputeCoeffs(src.height, y0, y1, out_h, vbounds, vcoeffs);
  const int row_first = vbounds[0];
  const int row_last =
      vbounds[static_cast<std::size_t>(out_h - 1) * 2] + vbounds[static_cast<std::size_t>(out_h - 1) * 2 + 1];
  const int rows = std::max(0, row_last - row_first);

  const int hk = PrecomputeCoeffs(src.width, x0, x1, out_w, scratch.bounds, scratch.coeffs);
  scratch.temp.resize(static_cast<std::size_t>(rows) * out_w * 3);
  HorizontalPass hpass = HorizontalPassFor();
  for (int r = 0; r < rows; ++r) {
    const std::uint8_t* line = src.data + static_cast<std::size_t>(row_first + r) * src.stride;
    hpass(line, src.width, scratch.bounds.data(), scratch.coeffs.data(), hk, out_w,
          scratch.temp.data() + static_cast<std::size_t>(r) * out_w * 3);
  }
  // Vertical pass.
  const std::size_t row_bytes = static_cast<std::size_t>(out_w) * 3;
  scratch.accumulator.resize(row_bytes);
  for (int yy = 0; yy < out_h; ++yy) {
    const int ymin = vbounds[static_cast<std::size_t>(yy) * 2] - row_first;
    const int ymax = vbounds[static_cast<std::size_t>(yy) * 2 + 1];
    const std::int32_t* k = vcoeffs.data() + static_cast<std::size_t>(yy) * vk;
    std::uint8_t* dst = out + static_cast<std::size_t>(yy) * row_bytes;
    // Row-wise accumulation: contiguous, and the compiler vectorises it.
    std::fill(scratch.accumulator.begin(), scratch.accumulator.end(), 1 << (kPrecisionBits - 1));
    for (int y = 0; y < ymax; ++y) {
      const std::uint8_t* row = scratch.temp.data() + static_cast<std::size_t>(ymin + y) * row_bytes;
      const std::int32_t weight = k[y];
      std::int32_t* acc = scratch.accumulator.data();
      for (std::size_t c = 0; c < row_bytes; ++c) acc[c] += row[c] * weight;
    }
    const std::int32_t* acc = scratch.accumulator.data();
    for (std::size_t c = 0; c < row_bytes; ++c)  // branch-free so that it vectorises
      dst[c] = static_cast<std::uint8_t>(std::clamp(acc[c] >> kPrecisionBits, 0, 255));
  }
  return true;
}

}  // namespace stoker::transform
