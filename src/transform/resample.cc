#include "transform/resample.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>

#include "stoker/pillow.h"
#include "transform/cpu_features.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace stoker {
namespace transform {
namespace {

constexpr int kPrecisionBits = 32 - 8 - 2;  // as Pillow's Resample.c

double Triangle(double x) {
  x = std::fabs(x);
  return x < 1.0 ? 1.0 - x : 0.0;
}

// Pillow's bicubic_filter (a = -0.5).
double Bicubic(double x) {
  constexpr double a = -0.5;
  if (x < 0.0) x = -x;
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
  if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
  return 0.0;
}

// Pillow's precompute_coeffs + normalize_coeffs_8bpc. Returns the kernel size;
// bounds holds (xmin, count) per output pixel.
int PrecomputeCoeffs(int in_size, double in0, double in1, int out_size, ResampleFilter filter, std::vector<int>& bounds,
                     std::vector<std::int32_t>& coeffs) {
  const bool cubic = filter == ResampleFilter::kBicubic;
  const double scale = (in1 - in0) / out_size;
  const double filterscale = std::max(scale, 1.0);
  const double support = (cubic ? 2.0 : 1.0) * filterscale;
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
      const double at = (x + xmin - center + 0.5) * ss;
      const double w = cubic ? Bicubic(at) : Triangle(at);
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

// Two output pixels per 256-bit register, two taps per multiply: each
// coefficient k (0 to 2^22) is split into 11-bit halves, k = kh * 2^11 + kl,
// so that pixel x coefficient products fit 16-bit multiply-adds
// (_mm256_madd_epi16 sums a tap pair per channel); the sums recombine to
// exactly Pillow's 32-bit arithmetic. Pixels whose taps reach the row's
// end go through the SSE4.1 path, which never reads past the row.
constexpr int kSplitBits = 11;

// The coefficients as the AVX2 pass reads them: per output pixel pair and
// tap pair, the low and high halves, each as 8 int16 pairs (4 per pixel).
void SplitCoefficients(const std::int32_t* coeffs, int ksize, int out_w, std::vector<std::int32_t>& split) {
  const int pairs = (ksize + 1) / 2;
  split.assign(static_cast<std::size_t>((out_w + 1) / 2) * pairs * 16, 0);
  auto coefficient = [&](int xx, int x) -> std::int32_t {
    return xx < out_w && x < ksize ? coeffs[static_cast<std::size_t>(xx) * ksize + x] : 0;
  };
  for (int i = 0; i < (out_w + 1) / 2; ++i)
    for (int j = 0; j < pairs; ++j) {
      std::int32_t* lo = split.data() + (static_cast<std::size_t>(i) * pairs + j) * 16;
      std::int32_t* hi = lo + 8;
      for (int half = 0; half < 2; ++half) {
        const std::int32_t a = coefficient(2 * i + half, 2 * j), b = coefficient(2 * i + half, 2 * j + 1);
        const std::uint32_t l = static_cast<std::uint32_t>(a & ((1 << kSplitBits) - 1)) |
                                static_cast<std::uint32_t>(b & ((1 << kSplitBits) - 1)) << 16;
        const std::uint32_t h =
            static_cast<std::uint32_t>(a >> kSplitBits) | static_cast<std::uint32_t>(b >> kSplitBits) << 16;
        for (int c = 0; c < 4; ++c) {
          lo[4 * half + c] = static_cast<std::int32_t>(l);
          hi[4 * half + c] = static_cast<std::int32_t>(h);
        }
      }
    }
}

// Whether the split form is exact: every coefficient in 0 .. 2^22 (the
// triangle filter's are; the bicubic's negative lobes take the SSE4.1
// pass), so that each half fits an int16.
bool SplitIsExact(const std::vector<std::int32_t>& coeffs) {
  return std::all_of(coeffs.begin(), coeffs.end(), [](std::int32_t k) { return k >= 0 && k <= (1 << kPrecisionBits); });
}

// What the AVX2 pass reads for each output pixel pair (2i, 2i + 1), the
// same for every row, so worked out once per resample: the two pixels'
// first source bytes, the tap pairs to read (weights past a pixel's own
// taps are zero), and whether an 8-byte load at the last tap pair would
// pass the row's end (such pairs take the SSE4.1 pass). An odd last pixel
// has no pair: the SSE4.1 pass writes it.
using PairPlan = ResampleScratch::PairPlan;

void PlanPairs(const int* bounds, int width, int out_w, std::vector<PairPlan>& plan) {
  plan.resize(static_cast<std::size_t>(out_w / 2));
  for (int i = 0; i < out_w / 2; ++i) {
    const int xmin0 = bounds[4 * i], xmax0 = bounds[4 * i + 1];
    const int xmin1 = bounds[4 * i + 2], xmax1 = bounds[4 * i + 3];
    const int n = (std::max(xmax0, xmax1) + 1) / 2;
    // An 8-byte load at tap 2j reads pixels 2j, 2j + 1 and two bytes of 2j + 2.
    plan[static_cast<std::size_t>(i)] = {xmin0 * 3, xmin1 * 3, n, std::max(xmin0, xmin1) + 2 * n + 1 > width};
  }
}

// The sums of a pixel pair, shifted back from fixed point: int32 lanes
// (A.r A.g A.b 0 | B.r B.g B.b 0).
__attribute__((target("avx2"), always_inline)) inline __m256i PairSums(const std::uint8_t* line, const PairPlan& pp,
                                                                       const std::int32_t* k) {
  // (r0 r1 g0 g1 b0 b1) of two neighbouring RGB pixels, widened to int16.
  const __m128i order = _mm_setr_epi8(0, 3, 1, 4, 2, 5, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
  const std::uint8_t* p0 = line + pp.offset0;
  const std::uint8_t* p1 = line + pp.offset1;
  __m256i lo = _mm256_setzero_si256(), hi = _mm256_setzero_si256();
  for (int j = 0; j < pp.taps; ++j) {
    const __m128i a = _mm_shuffle_epi8(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p0 + 6 * j)), order);
    const __m128i b = _mm_shuffle_epi8(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p1 + 6 * j)), order);
    const __m256i px = _mm256_cvtepu8_epi16(_mm_unpacklo_epi64(a, b));
    lo = _mm256_add_epi32(lo, _mm256_madd_epi16(px, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(k + 16 * j))));
    hi = _mm256_add_epi32(hi,
                          _mm256_madd_epi16(px, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(k + 16 * j + 8))));
  }
  __m256i acc = _mm256_add_epi32(_mm256_slli_epi32(hi, kSplitBits), lo);
  acc = _mm256_add_epi32(acc, _mm256_set1_epi32(1 << (kPrecisionBits - 1)));
  return _mm256_srai_epi32(acc, kPrecisionBits);
}

__attribute__((target("avx2"))) void HorizontalPassAvx2(const std::uint8_t* line, int width, const int* bounds,
                                                        const std::int32_t* coeffs, const std::int32_t* split,
                                                        const PairPlan* plan, int ksize, int out_w, std::uint8_t* dst) {
  const int pairs = (ksize + 1) / 2;
  auto sse41 = [&](int xx, int count) {
    HorizontalPassSse41(line, width, bounds + 2 * xx, coeffs + static_cast<std::size_t>(xx) * ksize, ksize, count,
                        dst + 3 * xx);
  };
  int xx = 0;
  // Four pixels (two pairs) at a time: one pack and one store for both.
  for (; xx + 3 < out_w; xx += 4) {
    const PairPlan& first = plan[xx / 2];
    const PairPlan& second = plan[xx / 2 + 1];
    if (first.near_end || second.near_end) break;  // the pairs below handle the row's end
    const __m256i a = PairSums(line, first, split + static_cast<std::size_t>(xx / 2) * pairs * 16);
    const __m256i b = PairSums(line, second, split + static_cast<std::size_t>(xx / 2 + 1) * pairs * 16);
    // Saturating packs clamp to 0-255 as Pillow does. Within 128-bit halves: dwords (P0 P2 | P1 P3), each
    // a pixel's r g b 0; the permute orders them P0 P1 P2 P3 and the shuffle drops the zero bytes.
    const __m256i words = _mm256_packs_epi32(a, b);
    const __m256i bytes = _mm256_packus_epi16(words, words);
    const __m128i four =
        _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 0, 0, 0, 0)));
    const __m128i rgb = _mm_shuffle_epi8(four, _mm_setr_epi8(0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(dst + 3 * xx), rgb);
    const std::int32_t last = _mm_cvtsi128_si32(_mm_srli_si128(rgb, 8));
    std::memcpy(dst + 3 * xx + 8, &last, 4);
  }
  for (; xx + 1 < out_w; xx += 2) {
    const PairPlan& pair = plan[xx / 2];
    if (pair.near_end) {
      sse41(xx, 2);
      continue;
    }
    const __m256i acc = PairSums(line, pair, split + static_cast<std::size_t>(xx / 2) * pairs * 16);
    const __m256i words = _mm256_packs_epi32(acc, acc);
    const __m256i bytes = _mm256_packus_epi16(words, words);
    const __m256i both = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 0, 0, 0, 0, 0, 0));
    const __m128i rgb = _mm_shuffle_epi8(_mm256_castsi256_si128(both),
                                         _mm_setr_epi8(0, 1, 2, 4, 5, 6, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1));
    // 6 bytes: 4 and 2.
    const std::int32_t head = _mm_cvtsi128_si32(rgb);
    const std::int16_t tail = static_cast<std::int16_t>(_mm_extract_epi16(rgb, 2));
    std::memcpy(dst + 3 * xx, &head, 4);
    std::memcpy(dst + 3 * xx + 4, &tail, 2);
  }
  if (xx < out_w) sse41(xx, out_w - xx);
}
#endif

HorizontalPass HorizontalPassFor() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  static const bool sse41 = __builtin_cpu_supports("sse4.1");
  if (sse41) return HorizontalPassSse41;
#endif
  return HorizontalPassScalar;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
// The vertical pass's first `chunks` * 32 bytes of each output row, with
// the accumulators in registers across the taps (the scalar loop keeps them
// in memory): the same int32 products and sums, the same shift, and the
// saturating packs clamp to 0-255 as std::clamp does.
__attribute__((target("avx2"))) void VerticalChunksAvx2(const std::uint8_t* base, std::size_t stride,
                                                        const std::vector<int>& vbounds, int row_offset,
                                                        const std::vector<std::int32_t>& vcoeffs, int vk, int out_h,
                                                        std::size_t chunks, std::uint8_t* dst, std::size_t dst_stride) {
  const __m256i rounding = _mm256_set1_epi32(1 << (kPrecisionBits - 1));
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int yy = 0; yy < out_h; ++yy) {
    const int ymin = vbounds[static_cast<std::size_t>(yy) * 2] - row_offset;
    const int ymax = vbounds[static_cast<std::size_t>(yy) * 2 + 1];
    const std::int32_t* k = vcoeffs.data() + static_cast<std::size_t>(yy) * vk;
    const std::uint8_t* first = base + static_cast<std::size_t>(ymin) * stride;
    std::uint8_t* out = dst + static_cast<std::size_t>(yy) * dst_stride;
    for (std::size_t chunk = 0; chunk < chunks; ++chunk) {
      __m256i acc0 = rounding, acc1 = rounding, acc2 = rounding, acc3 = rounding;
      const std::uint8_t* row = first + 32 * chunk;
      for (int y = 0; y < ymax; ++y, row += stride) {
        const __m256i weight = _mm256_set1_epi32(k[y]);
        const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row));
        const __m128i low = _mm256_castsi256_si128(bytes), high = _mm256_extracti128_si256(bytes, 1);
        acc0 = _mm256_add_epi32(acc0, _mm256_mullo_epi32(_mm256_cvtepu8_epi32(low), weight));
        acc1 = _mm256_add_epi32(acc1, _mm256_mullo_epi32(_mm256_cvtepu8_epi32(_mm_srli_si128(low, 8)), weight));
        acc2 = _mm256_add_epi32(acc2, _mm256_mullo_epi32(_mm256_cvtepu8_epi32(high), weight));
        acc3 = _mm256_add_epi32(acc3, _mm256_mullo_epi32(_mm256_cvtepu8_epi32(_mm_srli_si128(high, 8)), weight));
      }
      acc0 = _mm256_srai_epi32(acc0, kPrecisionBits);
      acc1 = _mm256_srai_epi32(acc1, kPrecisionBits);
      acc2 = _mm256_srai_epi32(acc2, kPrecisionBits);
      acc3 = _mm256_srai_epi32(acc3, kPrecisionBits);
      // Packs work within 128-bit halves: bytes come out as 4-byte groups 0 2 4 6 | 1 3 5 7; the permute
      // puts them back in order.
      const __m256i bytes = _mm256_packus_epi16(_mm256_packs_epi32(acc0, acc1), _mm256_packs_epi32(acc2, acc3));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 32 * chunk), _mm256_permutevar8x32_epi32(bytes, order));
    }
  }
}
#endif

// The vertical pass: output row yy of `dst` (rows `dst_stride` bytes apart)
// weighs rows vbounds[2 yy] - row_offset, ... of `base` (rows `stride`
// bytes apart), `row_bytes` bytes of each.
STOKER_SIMD_CLONES void VerticalPass(const std::uint8_t* base, std::size_t stride, std::size_t row_bytes,
                                     const std::vector<int>& vbounds, int row_offset,
                                     const std::vector<std::int32_t>& vcoeffs, int vk, int out_h, std::uint8_t* dst,
                                     std::size_t dst_stride, std::vector<std::int32_t>& accumulator) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  if (HasAvx2()) {
    const std::size_t done = row_bytes / 32 * 32;  // bytes of each row the vector path writes
    VerticalChunksAvx2(base, stride, vbounds, row_offset, vcoeffs, vk, out_h, row_bytes / 32, dst, dst_stride);
    if (done == row_bytes) return;
    base += done;
    dst += done;
    row_bytes -= done;
  }
#endif
  accumulator.resize(row_bytes);
  for (int yy = 0; yy < out_h; ++yy) {
    const int ymin = vbounds[static_cast<std::size_t>(yy) * 2] - row_offset;
    const int ymax = vbounds[static_cast<std::size_t>(yy) * 2 + 1];
    const std::int32_t* k = vcoeffs.data() + static_cast<std::size_t>(yy) * vk;
    std::uint8_t* out = dst + static_cast<std::size_t>(yy) * dst_stride;
    // Row-wise accumulation: contiguous, and the compiler vectorises it.
    std::fill(accumulator.begin(), accumulator.end(), 1 << (kPrecisionBits - 1));
    for (int y = 0; y < ymax; ++y) {
      const std::uint8_t* row = base + static_cast<std::size_t>(ymin + y) * stride;
      const std::int32_t weight = k[y];
      std::int32_t* acc = accumulator.data();
      for (std::size_t c = 0; c < row_bytes; ++c) acc[c] += row[c] * weight;
    }
    const std::int32_t* acc = accumulator.data();
    for (std::size_t c = 0; c < row_bytes; ++c)  // branch-free so that it vectorises
      out[c] = static_cast<std::uint8_t>(std::clamp(acc[c] >> kPrecisionBits, 0, 255));
  }
}

// The horizontal pass over `rows` lines of `width` pixels (`stride` bytes
// apart) into rows of out_w pixels (`dst_stride` bytes apart), writing no
// byte past a row's last pixel.
void HorizontalPassRows(const std::uint8_t* lines, std::size_t stride, int width, int rows, int hk, int out_w,
                        std::uint8_t* dst, std::size_t dst_stride, ResampleScratch& scratch) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  if (HasAvx2() && SplitIsExact(scratch.coeffs)) {
    SplitCoefficients(scratch.coeffs.data(), hk, out_w, scratch.split);
    PlanPairs(scratch.bounds.data(), width, out_w, scratch.pair_plan);
    for (int r = 0; r < rows; ++r)
      HorizontalPassAvx2(lines + static_cast<std::size_t>(r) * stride, width, scratch.bounds.data(),
                         scratch.coeffs.data(), scratch.split.data(), scratch.pair_plan.data(), hk, out_w,
                         dst + static_cast<std::size_t>(r) * dst_stride);
    return;
  }
#endif
  HorizontalPass hpass = HorizontalPassFor();
  for (int r = 0; r < rows; ++r)
    hpass(lines + static_cast<std::size_t>(r) * stride, width, scratch.bounds.data(), scratch.coeffs.data(), hk, out_w,
          dst + static_cast<std::size_t>(r) * dst_stride);
}

std::atomic<PillowResizeOrder> pillow_resize_order{PillowResizeOrder::kPillow13};

// Pillow 13's ImagingResampleInner: the vertical pass goes first when the
// height shrinks by more than twice as many pixels as the width.
bool VerticalPassFirst(int in_w, int in_h, int out_w, int out_h) {
  if (pillow_resize_order.load(std::memory_order_relaxed) != PillowResizeOrder::kPillow13) return false;
  const int shrink_h = in_h - out_h, shrink_w = in_w - out_w;
  return shrink_h > 0 && shrink_h > shrink_w * 2;
}

}  // namespace

bool Resample(const ImageView& src, double x0, double y0, double x1, double y1, int out_w, int out_h, std::uint8_t* out,
              ResampleScratch& scratch, ResampleFilter filter) {
  if (out_w <= 0 || out_h <= 0 || !(x1 > x0) || !(y1 > y0) || x0 < 0 || y0 < 0 || x1 > src.width || y1 > src.height)
    return false;
  std::vector<int>& vbounds = scratch.vbounds;
  std::vector<std::int32_t>& vcoeffs = scratch.vcoeffs;
  const int vk = PrecomputeCoeffs(src.height, y0, y1, out_h, filter, vbounds, vcoeffs);
  const int hk = PrecomputeCoeffs(src.width, x0, x1, out_w, filter, scratch.bounds, scratch.coeffs);
  const std::size_t out_row = static_cast<std::size_t>(out_w) * 3;
  // The image Pillow resizes is the box (torchvision crops, then resizes).
  if (VerticalPassFirst(static_cast<int>(std::lround(x1 - x0)), static_cast<int>(std::lround(y1 - y0)), out_w, out_h)) {
    // Vertical pass over the columns the horizontal pass will read.
    const int col_first = scratch.bounds[0];
    const int col_last = scratch.bounds[static_cast<std::size_t>(out_w - 1) * 2] +
                         scratch.bounds[static_cast<std::size_t>(out_w - 1) * 2 + 1];
    const int cols = std::max(1, col_last - col_first);
    for (int xx = 0; xx < out_w; ++xx) scratch.bounds[static_cast<std::size_t>(xx) * 2] -= col_first;
    const std::size_t temp_row = static_cast<std::size_t>(cols) * 3;
    scratch.temp.resize(static_cast<std::size_t>(out_h) * temp_row);
    VerticalPass(src.data + static_cast<std::size_t>(col_first) * 3, src.stride, temp_row, vbounds, 0, vcoeffs, vk,
                 out_h, scratch.temp.data(), temp_row, scratch.accumulator);
    HorizontalPassRows(scratch.temp.data(), temp_row, cols, out_h, hk, out_w, out, out_row, scratch);
    return true;
  }
  // Horizontal pass over the rows the vertical pass will need.
  const int row_first = vbounds[0];
  const int row_last =
      vbounds[static_cast<std::size_t>(out_h - 1) * 2] + vbounds[static_cast<std::size_t>(out_h - 1) * 2 + 1];
  const int rows = std::max(0, row_last - row_first);
  scratch.temp.resize(static_cast<std::size_t>(rows) * out_row);
  HorizontalPassRows(src.data + static_cast<std::size_t>(row_first) * src.stride, src.stride, src.width, rows, hk,
                     out_w, scratch.temp.data(), out_row, scratch);
  VerticalPass(scratch.temp.data(), out_row, out_row, vbounds, row_first, vcoeffs, vk, out_h, out, out_row,
               scratch.accumulator);
  return true;
}

}  // namespace transform

void SetPillowResizeOrder(PillowResizeOrder order) {
  transform::pillow_resize_order.store(order, std::memory_order_relaxed);
}

PillowResizeOrder GetPillowResizeOrder() {
  return transform::pillow_resize_order.load(std::memory_order_relaxed);
}

}  // namespace stoker
