#include "transform/warp.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numbers>

#include <fmt/format.h>

#include "transform/cpu_features.h"
#include "transform/warp_avx2.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define STOKER_WARP_AVX2 1
#endif

namespace stoker::transform {
namespace {

// Pillow's COORD and FLOOR macros, made safe for values an int cannot hold
// (those are outside any image either way).
int Coord(double v) {
  if (!(v >= 0.0)) return -1;  // NaN too: outside
  if (v >= 2147483647.0) return 2147483647;
  return static_cast<int>(v);
}
int FloorInt(double v) {
  if (std::isnan(v)) return -2147483647;
  if (v < 0.0) return v <= -2147483647.0 ? -2147483647 : static_cast<int>(std::floor(v));
  return v >= 2147483647.0 ? 2147483647 : static_cast<int>(v);
}

void FillImage(Image& out, const Fill& fill) {
  const int c = out.channels;
  if (out.pixels.empty()) return;
  // Channels past the fill's three take 0 (below), so only up to three may be one memset.
  if (c <= 3 && std::all_of(fill.begin(), fill.begin() + c, [&](std::uint8_t v) { return v == fill[0]; })) {
    std::memset(out.pixels.data(), fill[0], out.pixels.size());
    return;
  }
  // One row pixel by pixel, then copies of it.
  std::uint8_t* first = out.row(0);
  for (int x = 0; x < out.width; ++x)
    for (int b = 0; b < c; ++b) first[static_cast<std::size_t>(x) * c + b] = b < 3 ? fill[b] : 0;
  for (int y = 1; y < out.height; ++y) std::memcpy(out.row(y), first, out.stride());
}

// What the engines share: the input (possibly a part of a larger one whose
// top-left is at `ox`, `oy`), the full sizes, and the output region drawn.
struct Job {
  const Image& in;
  int ox, oy;
  Size in_size, out_size;
  Rect rect;
  Image& out;  // rect.width x rect.height

  std::uint8_t* Out(int x, int y) const {
    return out.row(y - rect.y) + static_cast<std::size_t>(x - rect.x) * out.channels;
  }
};

// A job's pixels as plain local values for the nearest engines' inner
// loops: a store through a uint8_t pointer may alias anything the compiler
// cannot prove local, so reading the Images' fields there would reload
// them for every pixel.
template <int C>
struct Pixels {
  const std::uint8_t* in;    // the input part's pixels
  std::ptrdiff_t in_offset;  // of the full input's (0, 0) from `in` (ox, oy: may be negative)
  std::ptrdiff_t in_stride;
  std::uint8_t* out;          // the output region's pixels
  std::ptrdiff_t out_offset;  // of the full output's (0, 0) from `out`
  std::ptrdiff_t out_stride;
  int channels;

  explicit Pixels(const Job& j)
      : in(j.in.pixels.data()),
        in_offset(-(static_cast<std::ptrdiff_t>(j.oy) * static_cast<std::ptrdiff_t>(j.in.stride()) +
                    static_cast<std::ptrdiff_t>(j.ox) * j.in.channels)),
        in_stride(static_cast<std::ptrdiff_t>(j.in.stride())),
        out(j.out.pixels.data()),
        out_offset(-(static_cast<std::ptrdiff_t>(j.rect.y) * static_cast<std::ptrdiff_t>(j.out.stride()) +
                     static_cast<std::ptrdiff_t>(j.rect.x) * j.out.channels)),
        out_stride(static_cast<std::ptrdiff_t>(j.out.stride())),
        channels(j.in.channels) {}
  [[nodiscard]] int c() const { return C > 0 ? C : channels; }
  // The output pixel (x, y), in full-output coordinates inside the region.
  [[nodiscard]] std::uint8_t* Out(int x, int y) const {
    return out + (out_offset + static_cast<std::ptrdiff_t>(y) * out_stride + static_cast<std::ptrdiff_t>(x) * c());
  }
  // Copies input pixel (x, y), in full-input coordinates inside the part held.
  void Copy(int x, int y, std::uint8_t* dst) const {
    CopyPixel<C>(dst,
                 in + (in_offset + static_cast<std::ptrdiff_t>(y) * in_stride + static_cast<std::ptrdiff_t>(x) * c()),
                 channels);
  }
};

// ImagingScaleAffine: no rotation or shear, nearest neighbour. Positions
// accumulate from the first column and row, as in Pillow.
template <int C>
void ScaleAffine(const Job& j, const AffineMatrix& a) {
  const Pixels<C> px(j);
  const int rx = j.rect.x, ry = j.rect.y, rx1 = j.rect.x + j.rect.width, ry1 = j.rect.y + j.rect.height;
  const int in_w = j.in_size.width, in_h = j.in_size.height;
  std::vector<int> xin(static_cast<std::size_t>(rx1), -1);
  double xo = a[2] + a[0] * 0.5;
  double yo = a[5] + a[4] * 0.5;
  for (int x = 0; x < rx1; ++x) {
    const int xi = Coord(xo);
    if (xi >= 0 && xi < in_w) xin[static_cast<std::size_t>(x)] = xi;
    xo += a[0];
  }
  const int* columns = xin.data();
  for (int y = 0; y < ry1; ++y) {
    const int yi = Coord(yo);
    if (y >= ry && yi >= 0 && yi < in_h) {
      std::uint8_t* o = px.Out(rx, y);
      for (int x = rx; x < rx1; ++x, o += px.c()) {
        const int xi = columns[x];
        if (xi >= 0) px.Copy(xi, yi, o);
      }
    }
    yo += a[4];
  }
}

bool CheckFixed(const AffineMatrix& a, int x, int y) {
  return std::fabs(x * a[0] + y * a[1] + a[2]) < 32768.0 && std::fabs(x * a[3] + y * a[4] + a[5]) < 32768.0;
}

// Pillow's int sums step once past the last column, where they can leave
// int32; they wrap there (the value is never used), without UB here.
inline std::int32_t WrappingAdd(std::int32_t a, std::int32_t b) {
  return static_cast<std::int32_t>(static_cast<std::uint32_t>(a) + static_cast<std::uint32_t>(b));
}

// affine_fixed: nearest neighbour in 16.16 fixed point. Pillow adds a0, a3
// per column and a1, a4 per row in ints: starting a region at (x, y) adds
// them x and y times at once, exactly.
template <int C>
void AffineFixed(const Job& j, const AffineMatrix& a) {
  auto fix = [](double v) { return static_cast<std::int64_t>(FloorInt(v * 65536.0 + 0.5)); };
  const std::int64_t a0 = fix(a[0]), a1 = fix(a[1]), a3 = fix(a[3]), a4 = fix(a[4]);
  const std::int64_t a2 = fix(a[2] + a[0] * 0.5 + a[1] * 0.5);
  const std::int64_t a5 = fix(a[5] + a[3] * 0.5 + a[4] * 0.5);
  const Pixels<C> px(j);
  const int rx = j.rect.x, ry = j.rect.y, rx1 = j.rect.x + j.rect.width, ry1 = j.rect.y + j.rect.height;
  const int in_w = j.in_size.width, in_h = j.in_size.height;
  const auto dx = static_cast<std::int32_t>(a0), dy = static_cast<std::int32_t>(a3);
  const auto inside = [&](std::int32_t xx, std::int32_t yy) {
    const int xi = xx >> 16, yi = yy >> 16;  // arithmetic shift: floor, as in Pillow
    return xi >= 0 && xi < in_w && yi >= 0 && yi < in_h;
  };
#ifdef STOKER_WARP_AVX2
  // Offsets are int32 lanes: the input part must be smaller than 2 GiB.
  const bool vector_rows = (C == 1 || C == 3 || C == 4) && HasAvx2() && j.in.pixels.size() >= 4 &&
                           j.in.pixels.size() < (std::size_t{1} << 31);
#endif
  for (int y = ry; y < ry1; ++y) {
    auto xx = static_cast<std::int32_t>(a2 + a1 * y + a0 * rx);
    auto yy = static_cast<std::int32_t>(a5 + a4 * y + a3 * rx);
    std::uint8_t* o = px.Out(rx, y);
    int x = rx;
#ifdef STOKER_WARP_AVX2
    if constexpr (C == 1 || C == 3 || C == 4) {
      if (vector_rows) {
        // The columns whose positions fall inside are one run: xx >> 16 and
        // yy >> 16 each move one way along a row, so each bound holds on an
        // interval of it. Outside the run the output keeps its fill.
        while (x < rx1 && !inside(xx, yy)) {
          ++x;
          o += C;
          xx = WrappingAdd(xx, dx);
          yy = WrappingAdd(yy, dy);
        }
        // A position `column - x` steps of `delta` on from `start` (x's), wrapping as the int32 sums do.
        const auto at = [&](int column, std::int32_t start, std::int32_t delta) {
          return static_cast<std::int32_t>(static_cast<std::uint32_t>(start) +
                                           static_cast<std::uint32_t>(column - x) * static_cast<std::uint32_t>(delta));
        };
        int end = rx1;
        while (end > x && !inside(at(end - 1, xx, dx), at(end - 1, yy, dy))) --end;
        if (end - x >= 8) {
          // Every gathered tap reads 4 bytes, which must stay inside the
          // buffer. Each coordinate moves one way along the run, so its
          // extremes are at the run's ends.
          const std::int64_t x0 = at(x, xx, dx) >> 16, x1 = at(end - 1, xx, dx) >> 16;
          const std::int64_t y0 = at(x, yy, dy) >> 16, y1 = at(end - 1, yy, dy) >> 16;
          const std::int64_t first = px.in_offset + std::min(y0, y1) * px.in_stride + std::min(x0, x1) * C;
          const std::int64_t last = px.in_offset + std::max(y0, y1) * px.in_stride + std::max(x0, x1) * C;
          if (first >= 0 && last + 4 <= static_cast<std::int64_t>(j.in.pixels.size())) {
            const int done = FixedRunAvx2(C, px.in, static_cast<std::int32_t>(px.in_offset),
                                          static_cast<std::int32_t>(px.in_stride), xx, yy, dx, dy, end - x, o);
            xx = at(x + done, xx, dx);
            yy = at(x + done, yy, dy);
            x += done;
            o += static_cast<std::ptrdiff_t>(done) * C;
          }
        }
        for (; x < end; ++x, o += C) {
          px.Copy(xx >> 16, yy >> 16, o);
          xx = WrappingAdd(xx, dx);
          yy = WrappingAdd(yy, dy);
        }
        continue;
      }
    }
#endif
    for (; x < rx1; ++x, o += px.c()) {
      if (inside(xx, yy)) px.Copy(xx >> 16, yy >> 16, o);
      xx = WrappingAdd(xx, dx);
      yy = WrappingAdd(yy, dy);
    }
  }
}

// The floating-point nearest engine, for matrices the fixed point cannot
// hold; positions accumulate from the first column and row, as in Pillow.
template <int C>
void AffineFloat(const Job& j, const AffineMatrix& a) {
  const Pixels<C> px(j);
  const int rx = j.rect.x, ry = j.rect.y, rx1 = j.rect.x + j.rect.width, ry1 = j.rect.y + j.rect.height;
  const int in_w = j.in_size.width, in_h = j.in_size.height;
  double xo = a[2] + a[1] * 0.5 + a[0] * 0.5;
  double yo = a[5] + a[4] * 0.5 + a[3] * 0.5;
  for (int y = 0; y < ry1; ++y) {
    double xx = xo, yy = yo;
    for (int x = 0; x < rx1; ++x) {
      if (y >= ry && x >= rx) {
        const int xi = Coord(xx);
        if (xi >= 0 && xi < in_w) {
          const int yi = Coord(yy);
          if (yi >= 0 && yi < in_h) px.Copy(xi, yi, px.Out(x, y));
        }
      }
      xx += a[0];
      yy += a[3];
    }
    xo += a[1];
    yo += a[4];
  }
}

// ImagingGenericTransform with bilinear_filter8/32RGB (each pixel computed
// on its own, so any region is exact).
void AffineBilinear(const Job& j, const AffineMatrix& a) {
  // Locals, not the Images' fields, in the loop (see Pixels).
  const int c = j.out.channels;
  const int W = j.in_size.width, H = j.in_size.height, ox = j.ox, oy = j.oy;
  const std::uint8_t* in = j.in.pixels.data();
  const auto in_stride = static_cast<std::ptrdiff_t>(j.in.stride());
  const int rx = j.rect.x, ry = j.rect.y, rx1 = j.rect.x + j.rect.width, ry1 = j.rect.y + j.rect.height;
#ifdef STOKER_WARP_AVX2
  const bool vector_pixels = c == 3 && j.in.channels == 3 && HasAvx2() && j.in.pixels.size() >= 4;
  // A tap before it has 4 bytes to read (none without vector pixels: the buffer may be empty).
  const std::uint8_t* vector_end = vector_pixels ? in + (j.in.pixels.size() - 3) : in;
#endif
  for (int y = ry; y < ry1; ++y) {
    std::uint8_t* o = j.Out(rx, y);
    const double yc = y + 0.5;
    for (int x = rx; x < rx1; ++x, o += c) {
      const double xc = x + 0.5;
      double xin = a[0] * xc + a[1] * yc + a[2];
      double yin = a[3] * xc + a[4] * yc + a[5];
      if (!(xin >= 0.0 && xin < W && yin >= 0.0 && yin < H)) continue;  // keeps the fill (NaN too)
      xin -= 0.5;
      yin -= 0.5;
      const int xi = FloorInt(xin), yi = FloorInt(yin);
      const double dx = xin - xi, dy = yin - yi;
      const int x0 = (std::clamp(xi, 0, W - 1) - ox) * c, x1 = (std::clamp(xi + 1, 0, W - 1) - ox) * c;
      const std::uint8_t* r0 = in + (std::clamp(yi, 0, H - 1) - oy) * in_stride;
      const bool has_next = yi + 1 >= 0 && yi + 1 < H;
      const std::uint8_t* r1 = has_next ? in + (yi + 1 - oy) * in_stride : nullptr;
#ifdef STOKER_WARP_AVX2
      // The lower right tap is the last one in memory: 4 bytes there must
      // stay inside the buffer (only the buffer's last pixel does not).
      if (vector_pixels && (has_next ? r1 : r0) + x1 < vector_end) {
        const std::uint8_t* lower = has_next ? r1 : r0;
        BilinearPixel3(r0 + x0, r0 + x1, lower + x0, lower + x1, dx, dy, o);
        continue;
      }
#endif
      for (int b = 0; b < c; ++b) {
        double v1 = r0[x0 + b] + (static_cast<int>(r0[x1 + b]) - static_cast<int>(r0[x0 + b])) * dx;
        double v2 = v1;
        if (has_next) v2 = r1[x0 + b] + (static_cast<int>(r1[x1 + b]) - static_cast<int>(r1[x0 + b])) * dx;
        v1 = v1 + (v2 - v1) * dy;
        o[b] = static_cast<std::uint8_t>(v1);
      }
    }
  }
}

}  // namespace

double RoundDecimal(double x, int ndigits) {
  if (!std::isfinite(x)) return x;
  const std::string text = fmt::format("{:.{}f}", x, ndigits);
  return std::strtod(text.c_str(), nullptr);
}

std::array<double, 2> MapPoint(const AffineMatrix& m, double x, double y) {
  return {m[0] * x + m[1] * y + m[2], m[3] * x + m[4] * y + m[5]};
}

std::optional<AffineMatrix> InvertAffine(const AffineMatrix& m) {
  const double det = m[0] * m[4] - m[1] * m[3];
  if (det == 0 || !std::isfinite(det)) return std::nullopt;
  const double i0 = m[4] / det, i1 = -m[1] / det, i3 = -m[3] / det, i4 = m[0] / det;
  return AffineMatrix{i0, i1, -(i0 * m[2] + i1 * m[5]), i3, i4, -(i3 * m[2] + i4 * m[5])};
}

void MapPointsForward(const AffineMatrix& m, std::span<double> xy) {
  const auto forward = InvertAffine(m);
  if (!forward) return;
  for (std::size_t i = 0; i + 1 < xy.size(); i += 2) {
    const auto p = MapPoint(*forward, xy[i], xy[i + 1]);
    xy[i] = p[0];
    xy[i + 1] = p[1];
  }
}

void ResizeNearest(const Image& in, Size out_size, Image& out) {
  out.Reset(out_size.width, out_size.height, in.channels);
  const float sx = static_cast<float>(in.width) / static_cast<float>(out_size.width);
  const float sy = static_cast<float>(in.height) / static_cast<float>(out_size.height);
  const int c = in.channels;
  std::vector<int> xs(static_cast<std::size_t>(out_size.width));
  for (int x = 0; x < out_size.width; ++x)
    xs[static_cast<std::size_t>(x)] = static_cast<int>(TorchNearestSource(x, sx, in.width));
  for (int y = 0; y < out_size.height; ++y) {
    const auto sy_index = static_cast<int>(TorchNearestSource(y, sy, in.height));
    const std::uint8_t* r = in.row(sy_index);
    std::uint8_t* o = out.row(y);
    DispatchChannels(c, [&](auto channels) {
      for (int x = 0; x < out_size.width; ++x)
        CopyPixel<channels()>(o + static_cast<std::size_t>(x) * c,
                              r + static_cast<std::size_t>(xs[static_cast<std::size_t>(x)]) * c, c);
    });
  }
}

void WarpAffine(const Image& in, const AffineMatrix& m, Interpolation interpolation, const Fill& fill, Size out_size,
                Image& out) {
  WarpAffineRegion(in, 0, 0, in.size(), m, interpolation, fill, out_size, Rect{0, 0, out_size.width, out_size.height},
                   out);
}

void WarpAffineRegion(const Image& in, int in_x, int in_y, Size in_size, const AffineMatrix& m,
                      Interpolation interpolation, const Fill& fill, Size out_size, Rect out_rect, Image& out) {
  out.Reset(out_rect.width, out_rect.height, in.channels);
  FillImage(out, fill);
  if (in_size.width <= 0 || in_size.height <= 0 || out_rect.width <= 0 || out_rect.height <= 0) return;
  const Job job{in, in_x, in_y, in_size, out_size, out_rect, out};
  if (interpolation == Interpolation::kBilinear) {
    AffineBilinear(job, m);
  } else if (m[1] == 0 && m[3] == 0) {
    DispatchChannels(in.channels, [&](auto c) { ScaleAffine<c()>(job, m); });
  } else if (CheckFixed(m, 0, 0) && CheckFixed(m, out_size.width, out_size.height) &&
             CheckFixed(m, 0, out_size.height) && CheckFixed(m, out_size.width, 0)) {
    DispatchChannels(in.channels, [&](auto c) { AffineFixed<c()>(job, m); });
  } else {
    DispatchChannels(in.channels, [&](auto c) { AffineFloat<c()>(job, m); });
  }
}

Rect InputRegion(const AffineMatrix& m, Size in_size, Rect out_rect) {
  double min_x = INFINITY, max_x = -INFINITY, min_y = INFINITY, max_y = -INFINITY;
  for (const double x : {out_rect.x + 0.5, out_rect.x + out_rect.width - 0.5})
    for (const double y : {out_rect.y + 0.5, out_rect.y + out_rect.height - 0.5}) {
      const auto p = MapPoint(m, x, y);
      min_x = std::min(min_x, p[0]);
      max_x = std::max(max_x, p[0]);
      min_y = std::min(min_y, p[1]);
      max_y = std::max(max_y, p[1]);
    }
  // Two pixels of slack: nearest sampling's rounding, bilinear's neighbour.
  const double lo_x = std::max(0.0, std::floor(min_x) - 2),
               hi_x = std::min<double>(in_size.width, std::floor(max_x) + 3);
  const double lo_y = std::max(0.0, std::floor(min_y) - 2),
               hi_y = std::min<double>(in_size.height, std::floor(max_y) + 3);
  if (!(lo_x < hi_x && lo_y < hi_y)) return Rect{0, 0, 0, 0};
  return Rect{static_cast<int>(lo_x), static_cast<int>(lo_y), static_cast<int>(hi_x - lo_x),
              static_cast<int>(hi_y - lo_y)};
}

namespace {

template <int C>
void TransposePixels(const Image& in, Transpose method, Image& out) {
  const int W = in.width, H = in.height, c = C > 0 ? C : in.channels;
  const auto at = [&](int x) { return static_cast<std::size_t>(x) * c; };
  for (int y = 0; y < H; ++y) {
    const std::uint8_t* r = in.row(y);
    switch (method) {
      case Transpose::kFlipTopBottom:
        std::memcpy(out.row(H - 1 - y), r, in.stride());
        break;
      case Transpose::kFlipLeftRight:
      case Transpose::kRotate180: {
        std::uint8_t* o = out.row(method == Transpose::kFlipLeftRight ? y : H - 1 - y);
        for (int x = 0; x < W; ++x) CopyPixel<C>(o + at(W - 1 - x), r + at(x), c);
        break;
      }
      case Transpose::kRotate90:  // counter-clockwise: (x, y) goes to (y, W - 1 - x)
        for (int x = 0; x < W; ++x) CopyPixel<C>(out.row(W - 1 - x) + at(y), r + at(x), c);
        break;
      case Transpose::kRotate270:  // (x, y) goes to (H - 1 - y, x)
        for (int x = 0; x < W; ++x) CopyPixel<C>(out.row(x) + at(H - 1 - y), r + at(x), c);
        break;
    }
  }
}

}  // namespace

void TransposeImage(const Image& in, Transpose method, Image& out) {
  const bool swaps = method == Transpose::kRotate90 || method == Transpose::kRotate270;
  out.Reset(swaps ? in.height : in.width, swaps ? in.width : in.height, in.channels);
  DispatchChannels(in.channels, [&](auto channels) { TransposePixels<channels()>(in, method, out); });
}

RotationPlan PlanRotation(Size in, double angle, bool expand, const std::optional<std::array<double, 2>>& center) {
  const double w = in.width, h = in.height;
  const double cx = center ? (*center)[0] : w / 2.0, cy = center ? (*center)[1] : h / 2.0;
  const double radians = -(angle * (std::numbers::pi / 180.0));
  AffineMatrix m{RoundDecimal(std::cos(radians), 15),  RoundDecimal(std::sin(radians), 15), 0.0,
                 RoundDecimal(-std::sin(radians), 15), RoundDecimal(std::cos(radians), 15), 0.0};
  auto map = [&m](double x, double y) -> std::array<double, 2> {
    return {m[0] * x + m[1] * y + m[2], m[3] * x + m[4] * y + m[5]};
  };
  const auto t = map(-cx, -cy);
  m[2] = t[0] + cx;
  m[5] = t[1] + cy;
  RotationPlan plan{m, in};
  if (expand) {
    double min_x = INFINITY, max_x = -INFINITY, min_y = INFINITY, max_y = -INFINITY;
    for (const auto& [x, y] : std::array<std::array<double, 2>, 4>{{{0, 0}, {w, 0}, {w, h}, {0, h}}}) {
      const auto p = map(x, y);
      min_x = std::min(min_x, p[0]);
      max_x = std::max(max_x, p[0]);
      min_y = std::min(min_y, p[1]);
      max_y = std::max(max_y, p[1]);
    }
    const int nw = static_cast<int>(std::ceil(max_x) - std::floor(min_x));
    const int nh = static_cast<int>(std::ceil(max_y) - std::floor(min_y));
    const auto shift = map(-(nw - w) / 2.0, -(nh - h) / 2.0);
    plan.matrix[2] = shift[0];
    plan.matrix[5] = shift[1];
    plan.size = {nw, nh};
  }
  return plan;
}

void RotateImage(const Image& in, double angle, Interpolation interpolation, bool expand,
                 const std::optional<std::array<double, 2>>& center, const Fill& fill, Image& out) {
  // Python's angle % 360.0 (the result takes the divisor's sign).
  double a = std::fmod(angle, 360.0);
  if (a != 0 && a < 0) a += 360.0;
  if (!center) {
    if (a == 0) {
      out = in;
      return;
    }
    if (a == 180) return TransposeImage(in, Transpose::kRotate180, out);
    if ((a == 90 || a == 270) && (expand || in.width == in.height))
      return TransposeImage(in, a == 90 ? Transpose::kRotate90 : Transpose::kRotate270, out);
  }
  const RotationPlan plan = PlanRotation(in.size(), a, expand, center);
  WarpAffine(in, plan.matrix, interpolation, fill, plan.size, out);
}

AffineMatrix InverseAffineMatrix(std::array<double, 2> center, double angle, std::array<double, 2> translate,
                                 double scale, std::array<double, 2> shear) {
  constexpr double kDegToRad = std::numbers::pi / 180.0;
  const double rot = angle * kDegToRad, sx = shear[0] * kDegToRad, sy = shear[1] * kDegToRad;
  const double cx = center[0], cy = center[1], tx = translate[0], ty = translate[1];
  const double a = std::cos(rot - sy) / std::cos(sy);
  const double b = -std::cos(rot - sy) * std::tan(sx) / std::cos(sy) - std::sin(rot);
  const double c = std::sin(rot - sy) / std::cos(sy);
  const double d = -std::sin(rot - sy) * std::tan(sx) / std::cos(sy) + std::cos(rot);
  AffineMatrix m{d, -b, 0.0, -c, a, 0.0};
  for (double& v : m) v = v / scale;
  m[2] += m[0] * (-cx - tx) + m[1] * (-cy - ty);
  m[5] += m[3] * (-cx - tx) + m[4] * (-cy - ty);
  m[2] += cx;
  m[5] += cy;
  return m;
}

}  // namespace stoker::transform

#undef STOKER_WARP_AVX2  // the file may share a unity build with others
