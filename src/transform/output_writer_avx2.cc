#include "transform/output_writer_avx2.h"

#include <cstddef>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

namespace stoker::transform {
namespace {

// Eight bytes of a block of 8 RGB pixels (24 bytes, loaded as 16 + 8):
// the two shuffles whose results, or-ed, put source byte `bytes[i]` in
// byte i.
struct Shuffle {
  __m128i first, second;
};

__attribute__((target("avx2"))) Shuffle MakeShuffle(const int (&bytes)[8]) {
  alignas(16) std::int8_t a[16], b[16];
  for (int i = 0; i < 16; ++i) a[i] = b[i] = -1;  // -1: a zero byte
  for (int i = 0; i < 8; ++i) {
    if (bytes[i] < 16)
      a[i] = static_cast<std::int8_t>(bytes[i]);
    else
      b[i] = static_cast<std::int8_t>(bytes[i] - 16);
  }
  return {_mm_load_si128(reinterpret_cast<const __m128i*>(a)), _mm_load_si128(reinterpret_cast<const __m128i*>(b))};
}

__attribute__((target("avx2"), always_inline)) inline __m128i Apply(const Shuffle& s, __m128i lo, __m128i hi) {
  return _mm_or_si128(_mm_shuffle_epi8(lo, s.first), _mm_shuffle_epi8(hi, s.second));
}

// Planar: channel c of the 8 pixels, in reverse pixel order when flipped.
__attribute__((target("avx2"))) void ChannelShuffles(bool flip, Shuffle (&out)[3]) {
  for (int c = 0; c < 3; ++c) {
    int bytes[8];
    for (int i = 0; i < 8; ++i) bytes[i] = 3 * (flip ? 7 - i : i) + c;
    out[c] = MakeShuffle(bytes);
  }
}

// Interleaved: the 24 bytes in output order as three groups of 8, the
// pixels reversed when flipped (each pixel's channels stay in order).
__attribute__((target("avx2"))) void GroupShuffles(bool flip, Shuffle (&out)[3]) {
  for (int g = 0; g < 3; ++g) {
    int bytes[8];
    for (int i = 0; i < 8; ++i) {
      const int j = 8 * g + i;  // output byte of the block
      bytes[i] = flip ? 3 * (7 - j / 3) + j % 3 : j;
    }
    out[g] = MakeShuffle(bytes);
  }
}

// Stores 8 output elements at element index `at` of `dst` from the 8 bytes
// in the low half of `bytes`: as they are (uint8), or v / 255, less `mean`,
// over `sd` (lane by lane), in the output's float format.
template <PlaneFormat F>
__attribute__((target("avx2,f16c"), always_inline)) inline void Store8(__m128i bytes, __m256 mean, __m256 sd,
                                                                       bool normalize, void* dst, std::size_t at) {
  if constexpr (F == PlaneFormat::kUint8) {
    _mm_storel_epi64(reinterpret_cast<__m128i*>(static_cast<std::uint8_t*>(dst) + at), bytes);
  } else {
    __m256 v = _mm256_div_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes)), _mm256_set1_ps(255.0f));
    if (normalize) v = _mm256_div_ps(_mm256_sub_ps(v, mean), sd);
    if constexpr (F == PlaneFormat::kFloat32) {
      _mm256_storeu_ps(static_cast<float*>(dst) + at, v);
    } else if constexpr (F == PlaneFormat::kFloat16) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(static_cast<std::uint16_t*>(dst) + at),
                       _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    } else {
      // Round to nearest even on the top 16 bits (the values are finite: no NaN case).
      const __m256i bits = _mm256_castps_si256(v);
      const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
      const __m256i top =
          _mm256_srli_epi32(_mm256_add_epi32(bits, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), odd)), 16);
      // 8 values in 16 bits: pack each half (lanes 0-3 | 4-7), then the halves' low quadwords together.
      const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(top, top), 0x08);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(static_cast<std::uint16_t*>(dst) + at),
                       _mm256_castsi256_si128(packed));
    }
  }
}

template <PlaneFormat F>
__attribute__((target("avx2,f16c"))) void Planes(const PlaneConstants& k, const std::uint8_t* rgb, int out_w, int out_h,
                                                 int blocks, bool flip, void* dst) {
  const std::size_t plane = static_cast<std::size_t>(out_w) * static_cast<std::size_t>(out_h);
  Shuffle shuffles[3];
  ChannelShuffles(flip, shuffles);
  __m256 mean[3], sd[3];
  for (int c = 0; c < 3; ++c) {
    mean[c] = _mm256_set1_ps(k.mean[c]);
    sd[c] = _mm256_set1_ps(k.std[c]);
  }
  for (int y = 0; y < out_h; ++y) {
    const std::uint8_t* row = rgb + static_cast<std::size_t>(y) * out_w * 3;
    const std::size_t row_start = static_cast<std::size_t>(y) * out_w;
    for (int block = 0; block < blocks; ++block) {
      const int x = 8 * block;
      const int source = flip ? out_w - 8 - x : x;  // the 8 source pixels, reversed by the shuffles when flipped
      const __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 3 * source));
      const __m128i hi = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + 3 * source + 16));
      for (int c = 0; c < 3; ++c) {
        Store8<F>(Apply(shuffles[c], lo, hi), mean[c], sd[c], k.normalize, dst,
                  c * plane + row_start + static_cast<std::size_t>(x));
      }
    }
  }
}

template <PlaneFormat F>
__attribute__((target("avx2,f16c"))) void Interleaved(const PlaneConstants& k, const std::uint8_t* rgb, int out_w,
                                                      int out_h, int blocks, bool flip, void* dst) {
  Shuffle shuffles[3];
  GroupShuffles(flip, shuffles);
  // Element j of a block is channel j % 3: the three groups' constants.
  __m256 mean[3], sd[3];
  for (int g = 0; g < 3; ++g) {
    alignas(32) float m[8], d[8];
    for (int i = 0; i < 8; ++i) {
      m[i] = k.mean[(8 * g + i) % 3];
      d[i] = k.std[(8 * g + i) % 3];
    }
    mean[g] = _mm256_load_ps(m);
    sd[g] = _mm256_load_ps(d);
  }
  for (int y = 0; y < out_h; ++y) {
    const std::uint8_t* row = rgb + static_cast<std::size_t>(y) * out_w * 3;
    const std::size_t row_start = static_cast<std::size_t>(y) * out_w * 3;
    for (int block = 0; block < blocks; ++block) {
      const int x = 8 * block;
      const int source = flip ? out_w - 8 - x : x;
      const __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 3 * source));
      const __m128i hi = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + 3 * source + 16));
      for (int g = 0; g < 3; ++g) {
        Store8<F>(Apply(shuffles[g], lo, hi), mean[g], sd[g], k.normalize, dst,
                  row_start + 3 * static_cast<std::size_t>(x) + 8 * g);
      }
    }
  }
}

template <PlaneFormat F>
void Rows(bool planar, const PlaneConstants& k, const std::uint8_t* rgb, int out_w, int out_h, int blocks, bool flip,
          void* dst) {
  if (planar)
    Planes<F>(k, rgb, out_w, out_h, blocks, flip, dst);
  else
    Interleaved<F>(k, rgb, out_w, out_h, blocks, flip, dst);
}

}  // namespace

void WriteRowsAvx2(PlaneFormat format, bool planar, const PlaneConstants& k, const std::uint8_t* rgb, int out_w,
                   int out_h, int blocks, bool flip, void* dst) {
  switch (format) {
    case PlaneFormat::kUint8:
      return Rows<PlaneFormat::kUint8>(planar, k, rgb, out_w, out_h, blocks, flip, dst);
    case PlaneFormat::kFloat32:
      return Rows<PlaneFormat::kFloat32>(planar, k, rgb, out_w, out_h, blocks, flip, dst);
    case PlaneFormat::kFloat16:
      return Rows<PlaneFormat::kFloat16>(planar, k, rgb, out_w, out_h, blocks, flip, dst);
    case PlaneFormat::kBFloat16:
      return Rows<PlaneFormat::kBFloat16>(planar, k, rgb, out_w, out_h, blocks, flip, dst);
  }
}

}  // namespace stoker::transform
#endif
