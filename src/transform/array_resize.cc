#include "transform/array_resize.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>

#include <fmt/format.h>

#include "core/half.h"
#include "transform/cpu_features.h"
#include "transform/warp.h"

namespace stoker::transform {
namespace {

// The nearest source of each of `out` positions over `in` (torch's rule).
std::vector<std::int64_t> NearestIndices(std::int64_t in, std::int64_t out) {
  std::vector<std::int64_t> index(static_cast<std::size_t>(out));
  const float scale = static_cast<float>(in) / static_cast<float>(out);
  for (std::int64_t i = 0; i < out; ++i) index[static_cast<std::size_t>(i)] = TorchNearestSource(i, scale, in);
  return index;
}

void ResizeNearestBytes(HostTensor& t, ArrayGeometry& g, std::int64_t height, std::int64_t width,
                        std::vector<std::byte>& scratch) {
  const auto ys = NearestIndices(g.height, height), xs = NearestIndices(g.width, width);
  ArrayGeometry out = g;
  out.height = height;
  out.width = width;
  const std::size_t run = g.run();
  scratch.resize(out.row_bytes() * static_cast<std::size_t>(out.rows()));
  std::byte* to = scratch.data();
  const std::size_t out_row = out.row_bytes();
  for (std::int64_t p = 0; p < g.planes(); ++p)
    for (std::int64_t y = 0; y < height; ++y, to += out_row) {
      if (y > 0 && ys[static_cast<std::size_t>(y)] == ys[static_cast<std::size_t>(y - 1)]) {
        std::memcpy(to, to - out_row, out_row);  // the row above again (upsampling)
        continue;
      }
      const std::byte* row =
          t.data.data() + static_cast<std::size_t>(p * g.height + ys[static_cast<std::size_t>(y)]) * g.row_bytes();
      std::byte* o = to;
      for (std::int64_t x = 0; x < width; ++x, o += run)
        std::memcpy(o, row + static_cast<std::size_t>(xs[static_cast<std::size_t>(x)]) * run, run);
    }
  t.data.swap(scratch);
  g = out;
  SetArrayShape(t, g);
}

// One output position's taps: the first input index and normalised weights.
template <typename F>
struct Taps {
  std::vector<std::int64_t> first;
  std::vector<std::int64_t> count;
  std::vector<F> weights;  // `max_taps` a position
  std::int64_t max_taps = 0;
};

// torch's _compute_indices_weights_aa for the bilinear filter, in F.
template <typename F>
Taps<F> AntialiasTaps(std::int64_t in, std::int64_t out) {
  Taps<F> taps;
  const F scale = static_cast<F>(in) / static_cast<F>(out);
  const F support = scale >= F(1) ? scale : F(1);
  const F invscale = scale >= F(1) ? F(1) / scale : F(1);
  taps.max_taps = static_cast<std::int64_t>(std::ceil(support)) * 2 + 1;
  taps.first.resize(static_cast<std::size_t>(out));
  taps.count.resize(static_cast<std::size_t>(out));
  taps.weights.assign(static_cast<std::size_t>(out * taps.max_taps), F(0));
  for (std::int64_t i = 0; i < out; ++i) {
    const F center = scale * (static_cast<F>(i) + F(0.5));
    const std::int64_t xmin = std::max(static_cast<std::int64_t>(center - support + F(0.5)), std::int64_t{0});
    const std::int64_t xsize =
        std::min(std::min(static_cast<std::int64_t>(center + support + F(0.5)), in) - xmin, taps.max_taps);
    F* w = taps.weights.data() + i * taps.max_taps;
    F total = 0;
    for (std::int64_t j = 0; j < xsize; ++j) {
      F x = (static_cast<F>(j + xmin) - center + F(0.5)) * invscale;
      x = x < F(0) ? -x : x;
      w[j] = x < F(1) ? F(1) - x : F(0);
      total += w[j];
    }
    if (total != F(0))
      for (std::int64_t j = 0; j < xsize; ++j) w[j] /= total;
    taps.first[static_cast<std::size_t>(i)] = xmin;
    taps.count[static_cast<std::size_t>(i)] = std::max<std::int64_t>(xsize, 0);
  }
  return taps;
}

template <typename T>
T FromFloat(double v) {
  if constexpr (std::is_floating_point_v<T>) {
    return static_cast<T>(v);
  } else {
    // torch.round (half to even), then a cast. A filter of non-negative
    // weights summing to 1 stays within the values' range, but float32
    // rounds large 32- and 64-bit values past it: those are clamped.
    v = std::nearbyint(v);
    if (!(v >= static_cast<double>(std::numeric_limits<T>::min()))) return std::numeric_limits<T>::min();
    if (v >= std::ldexp(1.0, std::numeric_limits<T>::digits)) return std::numeric_limits<T>::max();
    return static_cast<T>(v);
  }
}

// The filter passes over one plane of `c` interleaved values, width first,
// then height, as torch's separable kernel; each tap after the first a
// fused multiply-add, as torch's AVX2 kernels compute them (with a separate
// multiply and add, one in 200 large int32 values rounds apart). `mul_add`
// is that fused operation: an instruction where the CPU has FMA, libm's
// (exact, slower) where it has not.
template <typename T, typename F, typename MulAdd>
[[gnu::always_inline]] inline void FilterPlane(const Taps<F>& tx, const Taps<F>& ty, const F* source, F* across,
                                               std::int64_t in_height, std::int64_t in_width, std::int64_t height,
                                               std::int64_t width, std::int64_t c, std::byte* to, MulAdd mul_add) {
  for (std::int64_t y = 0; y < in_height; ++y)
    for (std::int64_t x = 0; x < width; ++x) {
      const F* w = tx.weights.data() + x * tx.max_taps;
      const std::int64_t taps = tx.count[static_cast<std::size_t>(x)];
      const F* s = source + (y * in_width + tx.first[static_cast<std::size_t>(x)]) * c;
      F* o = across + (y * width + x) * c;
      for (std::int64_t b = 0; b < c; ++b) {
        F t = s[b] * w[0];
        for (std::int64_t j = 1; j < taps; ++j) t = mul_add(s[j * c + b], w[j], t);
        o[b] = t;
      }
    }
  for (std::int64_t y = 0; y < height; ++y) {
    const F* w = ty.weights.data() + y * ty.max_taps;
    const std::int64_t taps = ty.count[static_cast<std::size_t>(y)];
    const F* s = across + ty.first[static_cast<std::size_t>(y)] * width * c;
    for (std::int64_t i = 0; i < width * c; ++i) {
      F t = s[i] * w[0];
      for (std::int64_t j = 1; j < taps; ++j) t = mul_add(s[j * width * c + i], w[j], t);
      const T v = FromFloat<T>(static_cast<double>(t));
      std::memcpy(to + static_cast<std::size_t>(y * width * c + i) * sizeof(T), &v, sizeof(T));
    }
  }
}

template <typename T, typename F>
void FilterPlaneLibm(const Taps<F>& tx, const Taps<F>& ty, const F* source, F* across, std::int64_t in_height,
                     std::int64_t in_width, std::int64_t height, std::int64_t width, std::int64_t c, std::byte* to) {
  FilterPlane<T, F>(tx, ty, source, across, in_height, in_width, height, width, c, to,
                    [](F a, F b, F acc) { return std::fma(a, b, acc); });
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
// Inlined into FilterPlaneFma, the builtins become vfmadd instructions.
struct BuiltinFma {
  [[gnu::always_inline]] float operator()(float a, float b, float acc) const { return __builtin_fmaf(a, b, acc); }
  [[gnu::always_inline]] double operator()(double a, double b, double acc) const { return __builtin_fma(a, b, acc); }
};

template <typename T, typename F>
[[gnu::target("fma")]] void FilterPlaneFma(const Taps<F>& tx, const Taps<F>& ty, const F* source, F* across,
                                           std::int64_t in_height, std::int64_t in_width, std::int64_t height,
                                           std::int64_t width, std::int64_t c, std::byte* to) {
  FilterPlane<T, F>(tx, ty, source, across, in_height, in_width, height, width, c, to, BuiltinFma{});
}
#endif

// Separable antialiased bilinear on planes of `bands` interleaved values
// (HWC: one plane of `bands`; CHW: `bands` planes of 1), in F.
template <typename T, typename F>
void ResizeBilinearTyped(const HostTensor& in, const ArrayGeometry& g, std::int64_t height, std::int64_t width,
                         std::vector<std::byte>& out_bytes) {
  const auto tx = AntialiasTaps<F>(g.width, width), ty = AntialiasTaps<F>(g.height, height);
  const std::int64_t c = g.bands_first ? 1 : g.bands;  // values a pixel within a plane
  const std::size_t in_plane = static_cast<std::size_t>(g.height * g.width * c);
  const std::size_t out_plane = static_cast<std::size_t>(height * width * c);
  out_bytes.resize(out_plane * static_cast<std::size_t>(g.planes()) * sizeof(T));
  std::vector<F> source(in_plane), across(static_cast<std::size_t>(g.height * width * c));
  for (std::int64_t p = 0; p < g.planes(); ++p) {
    const std::byte* from = in.data.data() + static_cast<std::size_t>(p) * in_plane * sizeof(T);
    for (std::size_t i = 0; i < in_plane; ++i) {
      T v;
      std::memcpy(&v, from + i * sizeof(T), sizeof(T));
      source[i] = static_cast<F>(v);
    }
    std::byte* to = out_bytes.data() + static_cast<std::size_t>(p) * out_plane * sizeof(T);
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    if (HasFma()) {
      FilterPlaneFma<T, F>(tx, ty, source.data(), across.data(), g.height, g.width, height, width, c, to);
      continue;
    }
#endif
    FilterPlaneLibm<T, F>(tx, ty, source.data(), across.data(), g.height, g.width, height, width, c, to);
  }
}

// float16: through float32 both ways.
void ResizeBilinearHalf(const HostTensor& in, const ArrayGeometry& g, std::int64_t height, std::int64_t width,
                        std::vector<std::byte>& out_bytes) {
  HostTensor wide;
  wide.type = ElementType::kFloat32;
  wide.shape = in.shape;
  const std::size_t n = in.data.size() / 2;
  wide.data.resize(n * sizeof(float));
  for (std::size_t i = 0; i < n; ++i) {
    std::uint16_t h;
    std::memcpy(&h, in.data.data() + i * 2, 2);
    const float f = HalfBitsToFloat(h);
    std::memcpy(wide.data.data() + i * sizeof(float), &f, sizeof(float));
  }
  std::vector<std::byte> floats;
  ResizeBilinearTyped<float, float>(wide, g, height, width, floats);
  const std::size_t m = floats.size() / sizeof(float);
  out_bytes.resize(m * 2);
  for (std::size_t i = 0; i < m; ++i) {
    float f;
    std::memcpy(&f, floats.data() + i * sizeof(float), sizeof(float));
    const std::uint16_t h = FloatToHalfBits(f);
    std::memcpy(out_bytes.data() + i * 2, &h, 2);
  }
}

}  // namespace

std::pair<std::int64_t, std::int64_t> ArrayResizeSize(const std::vector<double>& size, std::int64_t height,
                                                      std::int64_t width) {
  if (size.size() == 2) return {static_cast<std::int64_t>(size[0]), static_cast<std::int64_t>(size[1])};
  const auto target = static_cast<std::int64_t>(size.front());
  const std::int64_t shorter = std::min(height, width), longer = std::max(height, width);
  const auto stretched = static_cast<std::int64_t>(static_cast<double>(target * longer) / static_cast<double>(shorter));
  return width <= height ? std::pair{stretched, target} : std::pair{target, stretched};
}

Status ResizeArray(HostTensor& t, ArrayGeometry& g, std::int64_t height, std::int64_t width, bool bilinear,
                   std::vector<std::byte>& scratch) {
  if (height == g.height && width == g.width) return Status::Ok();  // torchvision returns it as it is
  if (!bilinear) {
    ResizeNearestBytes(t, g, height, width, scratch);
    return Status::Ok();
  }
  switch (t.type) {
    case ElementType::kBool:
      return Status::InvalidArgument("an Array's transform: Resize of a bool array is nearest, not bilinear");
    case ElementType::kInt8:
      ResizeBilinearTyped<std::int8_t, float>(t, g, height, width, scratch);
      break;
    case ElementType::kUInt8:
      ResizeBilinearTyped<std::uint8_t, float>(t, g, height, width, scratch);
      break;
    case ElementType::kInt16:
      ResizeBilinearTyped<std::int16_t, float>(t, g, height, width, scratch);
      break;
    case ElementType::kUInt16:
      ResizeBilinearTyped<std::uint16_t, float>(t, g, height, width, scratch);
      break;
    case ElementType::kInt32:
      ResizeBilinearTyped<std::int32_t, float>(t, g, height, width, scratch);
      break;
    case ElementType::kUInt32:
      ResizeBilinearTyped<std::uint32_t, float>(t, g, height, width, scratch);
      break;
    case ElementType::kInt64:
      ResizeBilinearTyped<std::int64_t, float>(t, g, height, width, scratch);
      break;
    case ElementType::kUInt64:
      ResizeBilinearTyped<std::uint64_t, float>(t, g, height, width, scratch);
      break;
    case ElementType::kFloat16:
      ResizeBilinearHalf(t, g, height, width, scratch);
      break;
    case ElementType::kFloat32:
      ResizeBilinearTyped<float, float>(t, g, height, width, scratch);
      break;
    case ElementType::kFloat64:
      ResizeBilinearTyped<double, double>(t, g, height, width, scratch);
      break;
  }
  t.data.swap(scratch);
  g.height = height;
  g.width = width;
  SetArrayShape(t, g);
  return Status::Ok();
}

}  // namespace stoker::transform
