#include "transform/warp_avx2.h"

#include <cstring>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

namespace stoker::transform {
namespace {

// Stores 8 gathered pixels (each in an int32 lane, C bytes of it used) as
// 8 * C contiguous bytes, writing no byte past them.
template <int C>
__attribute__((target("avx2"))) inline void StorePixels8(__m256i lanes, std::uint8_t* out) {
  if constexpr (C == 4) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), lanes);
  } else if constexpr (C == 3) {
    // Each 128-bit half's 4 pixels as 12 bytes, then the halves' 3 dwords side by side: 24 bytes.
    const __m256i packed =
        _mm256_shuffle_epi8(lanes, _mm256_setr_epi8(0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1, 0, 1, 2, 4,
                                                    5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1));
    const __m256i joined = _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 1, 2, 4, 5, 6, 3, 7));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm256_castsi256_si128(joined));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(out + 16), _mm256_extracti128_si256(joined, 1));
  } else {
    static_assert(C == 1);
    const __m256i packed =
        _mm256_shuffle_epi8(lanes, _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 4,
                                                    8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1));
    const __m256i joined = _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 1, 1, 1, 1, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(out), _mm256_castsi256_si128(joined));
  }
}

// FixedRunAvx2 (the header) for C channels.
template <int C>
__attribute__((target("avx2"))) int FixedRun(const std::uint8_t* in, std::int32_t in_offset, std::int32_t in_stride,
                                             std::int32_t xx, std::int32_t yy, std::int32_t dx, std::int32_t dy, int n,
                                             std::uint8_t* out) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  __m256i vx = _mm256_add_epi32(_mm256_set1_epi32(xx), _mm256_mullo_epi32(lane, _mm256_set1_epi32(dx)));
  __m256i vy = _mm256_add_epi32(_mm256_set1_epi32(yy), _mm256_mullo_epi32(lane, _mm256_set1_epi32(dy)));
  const __m256i step_x = _mm256_slli_epi32(_mm256_set1_epi32(dx), 3);
  const __m256i step_y = _mm256_slli_epi32(_mm256_set1_epi32(dy), 3);
  const __m256i stride = _mm256_set1_epi32(in_stride), base = _mm256_set1_epi32(in_offset);
  int done = 0;
  for (; done + 8 <= n; done += 8, out += 8 * C) {
    const __m256i xi = _mm256_srai_epi32(vx, 16), yi = _mm256_srai_epi32(vy, 16);
    __m256i column;
    if constexpr (C == 1) {
      column = xi;
    } else if constexpr (C == 3) {
      column = _mm256_add_epi32(xi, _mm256_slli_epi32(xi, 1));
    } else {
      column = _mm256_slli_epi32(xi, 2);
    }
    const __m256i offset = _mm256_add_epi32(_mm256_add_epi32(base, _mm256_mullo_epi32(yi, stride)), column);
    StorePixels8<C>(_mm256_i32gather_epi32(reinterpret_cast<const int*>(in), offset, 1), out);
    vx = _mm256_add_epi32(vx, step_x);
    vy = _mm256_add_epi32(vy, step_y);
  }
  return done;
}
// A tap's 4 bytes (its 3 channels and one more) as int32 lanes.
__attribute__((target("avx2"))) inline __m128i LoadTap(const std::uint8_t* p) {
  std::int32_t v;
  std::memcpy(&v, p, 4);
  return _mm_cvtepu8_epi32(_mm_cvtsi32_si128(v));
}

}  // namespace

__attribute__((target("avx2"))) int FixedRunAvx2(int channels, const std::uint8_t* in, std::int32_t in_offset,
                                                 std::int32_t in_stride, std::int32_t xx, std::int32_t yy,
                                                 std::int32_t dx, std::int32_t dy, int n, std::uint8_t* out) {
  switch (channels) {
    case 1:
      return FixedRun<1>(in, in_offset, in_stride, xx, yy, dx, dy, n, out);
    case 3:
      return FixedRun<3>(in, in_offset, in_stride, xx, yy, dx, dy, n, out);
    case 4:
      return FixedRun<4>(in, in_offset, in_stride, xx, yy, dx, dy, n, out);
    default:
      return 0;
  }
}

__attribute__((target("avx2"))) void BilinearPixel3(const std::uint8_t* a, const std::uint8_t* b, const std::uint8_t* c,
                                                    const std::uint8_t* d, double dx, double dy, std::uint8_t* out) {
  const __m128i ia = LoadTap(a), ib = LoadTap(b), ic = LoadTap(c), id = LoadTap(d);
  const __m256d vdx = _mm256_set1_pd(dx);
  const __m256d v1 =
      _mm256_add_pd(_mm256_cvtepi32_pd(ia), _mm256_mul_pd(_mm256_cvtepi32_pd(_mm_sub_epi32(ib, ia)), vdx));
  const __m256d v2 =
      _mm256_add_pd(_mm256_cvtepi32_pd(ic), _mm256_mul_pd(_mm256_cvtepi32_pd(_mm_sub_epi32(id, ic)), vdx));
  const __m256d v = _mm256_add_pd(v1, _mm256_mul_pd(_mm256_sub_pd(v2, v1), _mm256_set1_pd(dy)));
  // Truncation, as the scalar cast; the values are in [0, 255].
  const __m128i lanes = _mm256_cvttpd_epi32(v);
  const auto packed = static_cast<std::uint32_t>(_mm_cvtsi128_si32(
      _mm_shuffle_epi8(lanes, _mm_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1))));
  out[0] = static_cast<std::uint8_t>(packed);
  out[1] = static_cast<std::uint8_t>(packed >> 8);
  out[2] = static_cast<std::uint8_t>(packed >> 16);
}

}  // namespace stoker::transform

#endif
