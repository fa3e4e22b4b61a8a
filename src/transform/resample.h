// Bilinear and bicubic resampling with Pillow's semantics (Image.resize,
// which torchvision uses for PIL images): a filter widened by the downscale
// factor (antialiasing), separable, 8-bit fixed-point arithmetic with
// rounding, uint8 between the passes, in the order of the Pillow release
// chosen with SetPillowResizeOrder (stoker/pillow.h).
#pragma once

#include <cstdint>
#include <vector>

// On x86-64 with GCC, hot loops are also compiled for AVX2 and picked at run
// time (function multiversioning); other builds use the baseline code.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__) && \
    !defined(__SANITIZE_THREAD__)
#define STOKER_SIMD_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define STOKER_SIMD_CLONES
#endif

namespace stoker::transform {

// An RGB image view: `height` rows of `width` pixels, `stride` bytes apart.
struct ImageView {
  const std::uint8_t* data = nullptr;
  int width = 0;
  int height = 0;
  std::size_t stride = 0;
};

// Reusable scratch so that per-sample resampling does not allocate.
struct ResampleScratch {
  std::vector<std::int32_t> coeffs, vcoeffs;
  std::vector<std::int32_t> split;  // coeffs in the AVX2 pass's layout
  // The AVX2 horizontal pass's reads per output pixel pair (resample.cc's PlanPairs), the same for every row.
  struct PairPlan {
    std::int32_t offset0, offset1, taps;
    bool near_end;
  };
  std::vector<PairPlan> pair_plan;
  std::vector<int> bounds, vbounds;
  std::vector<std::uint8_t> temp;
  std::vector<std::int32_t> accumulator;
};

// Pillow's resampling filters (Image.resize's BILINEAR and BICUBIC: the
// triangle of support 1, the cubic convolution with a = -0.5 of support 2).
enum class ResampleFilter : std::uint8_t { kBilinear, kBicubic };

// Resamples the box [x0, x1) x [y0, y1) of `src` (float coordinates, as
// Pillow's `box` argument) to out_w x out_h RGB pixels, written to `out`
// with rows of out_w * 3 bytes, with Pillow's fixed-point arithmetic.
// Filter taps are clipped to `src`'s bounds. Any reduction works (the
// filter widens with it, as Pillow's). Returns false (writing nothing) when
// the box is empty or lies outside `src`.
[[nodiscard]] bool Resample(const ImageView& src, double x0, double y0, double x1, double y1, int out_w, int out_h,
                            std::uint8_t* out, ResampleScratch& scratch, ResampleFilter filter);
[[nodiscard]] inline bool ResampleBilinear(const ImageView& src, double x0, double y0, double x1, double y1, int out_w,
                                           int out_h, std::uint8_t* out, ResampleScratch& scratch) {
  return Resample(src, x0, y0, x1, y1, out_w, out_h, out, scratch, ResampleFilter::kBilinear);
}

}  // namespace stoker::transform
