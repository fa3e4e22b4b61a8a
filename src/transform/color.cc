#include "transform/color.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <vector>

namespace stoker::transform {
namespace {

// values[i] = BlendTo(degenerate[i], values[i], alpha) for n values, the
// branches on alpha taken once so that each loop vectorises (the same float
// operations in the same order as BlendTo).
void BlendValues(const std::uint8_t* degenerate, std::uint8_t* values, std::size_t n, float alpha) {
  if (alpha == 1.0f) return;
  if (alpha == 0.0f) {
    std::memcpy(values, degenerate, n);
    return;
  }
  if (alpha >= 0 && alpha <= 1.0f) {
    for (std::size_t i = 0; i < n; ++i) {
      const int d = degenerate[i];
      const float v = static_cast<float>(d) + alpha * static_cast<float>(values[i] - d);
      values[i] = static_cast<std::uint8_t>(v);
    }
    return;
  }
  for (std::size_t i = 0; i < n; ++i) {
    const int d = degenerate[i];
    const float v = static_cast<float>(d) + alpha * static_cast<float>(values[i] - d);
    values[i] = !(v > 0.0f) ? 0 : (v >= 255.0f ? 255 : static_cast<std::uint8_t>(v));
  }
}

// A blend with a constant degenerate value depends on the value alone: one
// lookup table, computed with the same float arithmetic, for the image.
void BlendConstant(Image& image, double factor, std::uint8_t degenerate) {
  const float alpha = static_cast<float>(factor);
  if (alpha == 1.0f) return;
  std::array<std::uint8_t, 256> table{};
  for (int v = 0; v < 256; ++v) table[static_cast<std::size_t>(v)] = BlendTo(degenerate, v, alpha);
  for (auto& v : image.pixels) v = table[v];
}

}  // namespace

void AdjustBrightness(Image& image, double factor) {
  BlendConstant(image, factor, 0);
}

void AdjustContrast(Image& image, double factor) {
  // ImageStat's mean of the "L" image, rounded as int(mean + 0.5).
  std::uint8_t mean = 0;
  if (image.channels == 3 || image.channels == 1) {
    double sum = 0;
    const std::size_t n = static_cast<std::size_t>(image.width) * image.height;
    std::uint64_t histogram[256] = {};
    const std::uint8_t* p = image.pixels.data();
    for (std::size_t i = 0; i < n; ++i, p += image.channels) ++histogram[image.channels == 3 ? Luma(p) : p[0]];
    for (int j = 0; j < 256; ++j) sum += static_cast<double>(j) * static_cast<double>(histogram[j]);
    mean = n == 0 ? 0 : static_cast<std::uint8_t>(static_cast<int>(sum / static_cast<double>(n) + 0.5));
  }
  BlendConstant(image, factor, mean);
}

void AdjustSaturation(Image& image, double factor) {
  if (image.channels != 3) return;
  const float alpha = static_cast<float>(factor);
  if (alpha == 1.0f) return;  // Pillow copies the image itself
  // Row by row: the grey image's row (luma in every channel), then the blend.
  std::vector<std::uint8_t> grey(image.stride());
  for (int y = 0; y < image.height; ++y) {
    std::uint8_t* row = image.row(y);
    for (int x = 0; x < image.width; ++x) {
      const std::uint8_t l = Luma(row + 3 * static_cast<std::size_t>(x));
      grey[3 * static_cast<std::size_t>(x)] = grey[3 * static_cast<std::size_t>(x) + 1] =
          grey[3 * static_cast<std::size_t>(x) + 2] = l;
    }
    BlendValues(grey.data(), row, grey.size(), alpha);
  }
}

namespace {

// ShiftHue with every division taken from tables, filled once by the same
// functions (color_pixel.h), so the result is ShiftHue's for every colour
// (tests/transform: Color.HueTablesGiveTheArithmeticsResultForEveryColour).
// What each term depends on:
// - the hue byte: which channel rgb2hsv finds largest (it tests r, then
//   g), which of the other two is the smallest (the first equal to it),
//   the range (largest - smallest) and the largest minus the remaining one;
// - the saturation byte: the largest channel and the range;
// - hsv2rgb's sector and fraction: the hue; fs: the saturation; p: the
//   value and the saturation.
// The rest of hsv2rgb (two products and roundings) runs per pixel.
class HueTables {
 public:
  static const HueTables& Get() {
    static const HueTables tables;
    return tables;
  }

  void Shift(std::uint8_t* p, std::uint8_t shift) const {
    const std::uint8_t r = p[0], g = p[1], b = p[2];
    const std::uint8_t v = std::max({r, g, b}), minc = std::min({r, g, b});
    if (v == minc) return;  // grey stays itself
    int which = 0, rest = 0;
    Classify(r, g, b, v, minc, which, rest);
    const int range = v - minc;
    const std::uint8_t s8 = saturation_[static_cast<std::size_t>(v) * 256 + range];
    if (s8 == 0) {
      p[0] = p[1] = p[2] = v;
      return;
    }
    const std::uint8_t h8 = hue_[(static_cast<std::size_t>(which) * 256 + range) * 256 + rest];
    const auto hue = static_cast<std::uint8_t>(h8 + shift);
    const float fs = fs_[s8], f = fraction_[hue];
    // PillowHsvToRgb's switch on the sector as a permutation of (v, p, q, t):
    // colours do not predict a branch.
    const std::uint8_t terms[4] = {v, p_[static_cast<std::size_t>(v) * 256 + s8], PillowHsvQ(v, fs, f),
                                   PillowHsvT(v, fs, f)};
    const std::uint8_t* order = kSectorOrder[sector_[hue]];
    p[0] = terms[order[0]];
    p[1] = terms[order[1]];
    p[2] = terms[order[2]];
  }

 private:
  HueTables() : hue_(6 * 256 * 256), saturation_(256 * 256), p_(256 * 256) {
    for (int range = 1; range < 256; ++range) {
      for (int rest = 0; rest <= range; ++rest) {
        // A colour of each kind with this range and rest (largest = range,
        // smallest = 0); the hue depends on nothing else.
        const int m = range - rest;
        const std::uint8_t colours[6][3] = {{U(range), 0, U(m)}, {U(range), U(m), 0}, {0, U(range), U(m)},
                                            {U(m), U(range), 0}, {0, U(m), U(range)}, {U(m), 0, U(range)}};
        for (int kind = 0; kind < 6; ++kind) {
          const std::uint8_t* c = colours[kind];
          int which = 0, got = 0;
          Classify(c[0], c[1], c[2], static_cast<std::uint8_t>(range), 0, which, got);
          if (which != kind || got != rest) continue;  // no colour of this kind has this rest
          std::uint8_t h8 = 0, s8 = 0;
          PillowHueSaturation(c[0], c[1], c[2], h8, s8);
          hue_[(static_cast<std::size_t>(kind) * 256 + range) * 256 + rest] = h8;
        }
      }
      for (int v = range; v < 256; ++v) {
        std::uint8_t h8 = 0, s8 = 0;
        PillowHueSaturation(U(v), U(v - range), U(v - range), h8, s8);
        saturation_[static_cast<std::size_t>(v) * 256 + range] = s8;
      }
    }
    for (int x = 0; x < 256; ++x) {
      sector_[static_cast<std::size_t>(x)] = PillowHueSector(U(x)) % 6;
      fraction_[static_cast<std::size_t>(x)] = PillowHueFraction(U(x));
      fs_[static_cast<std::size_t>(x)] = PillowSaturationFraction(U(x));
    }
    for (int v = 0; v < 256; ++v)
      for (int s8 = 0; s8 < 256; ++s8)
        p_[static_cast<std::size_t>(v) * 256 + s8] = PillowHsvP(U(v), fs_[static_cast<std::size_t>(s8)]);
  }

  static std::uint8_t U(int x) { return static_cast<std::uint8_t>(x); }

  // PillowHsvToRgb's outputs for each sector (i mod 6), as indices into
  // (v, p, q, t).
  static constexpr std::uint8_t kSectorOrder[6][3] = {{0, 3, 1}, {2, 0, 1}, {1, 0, 3}, {1, 2, 0}, {3, 1, 0}, {0, 1, 2}};

  // The kind of colour (0-5) and its rest, as rgb2hsv's tests meet it: the
  // largest is r, else g, else b (kinds 0-1, 2-3, 4-5); of the other two,
  // the first equal to the smallest is the smallest (even kinds), and the
  // rest is the largest minus the remaining one. Selects, not branches.
  static void Classify(std::uint8_t r, std::uint8_t g, std::uint8_t b, std::uint8_t v, std::uint8_t minc, int& which,
                       int& rest) {
    const bool r_max = r == v, g_max = !r_max && g == v, b_max = !r_max && !g_max;
    const int first = r_max ? g : r, second = b_max ? g : b;  // the other two, in rgb order
    const bool first_min = first == minc;
    which = (r_max ? 0 : (g_max ? 2 : 4)) + (first_min ? 0 : 1);
    rest = v - (first_min ? second : first);
  }

  std::vector<std::uint8_t> hue_;         // [kind][range][rest]
  std::vector<std::uint8_t> saturation_;  // [largest][range]
  std::vector<std::uint8_t> p_;           // [value][saturation]
  std::array<int, 256> sector_{};
  std::array<float, 256> fraction_{};
  std::array<float, 256> fs_{};
};

}  // namespace

void AdjustHue(Image& image, double hue_factor) {
  if (image.channels != 3) return;
  // np.uint8(hue_factor * 255): truncation toward zero, then modulo 256.
  const auto shift = static_cast<std::uint8_t>(static_cast<int>(hue_factor * 255));
  const HueTables& tables = HueTables::Get();
  const std::size_t n = static_cast<std::size_t>(image.width) * image.height;
  std::uint8_t* p = image.pixels.data();
  for (std::size_t i = 0; i < n; ++i, p += 3) tables.Shift(p, shift);
}

void ToGrayscale(Image& image) {
  if (image.channels != 3) return;
  const std::size_t n = static_cast<std::size_t>(image.width) * image.height;
  std::uint8_t* p = image.pixels.data();
  for (std::size_t i = 0; i < n; ++i, p += 3) p[0] = p[1] = p[2] = Luma(p);
}

namespace {

// Applies a lookup table per channel (`tables` holds 256 entries per channel).
void ApplyTables(Image& image, const std::vector<std::uint8_t>& tables) {
  const int c = image.channels;
  const std::size_t n = static_cast<std::size_t>(image.width) * image.height;
  std::uint8_t* p = image.pixels.data();
  for (std::size_t i = 0; i < n; ++i, p += c)
    for (int b = 0; b < c; ++b) p[b] = tables[static_cast<std::size_t>(b) * 256 + p[b]];
}

void ApplyTable(Image& image, const std::array<std::uint8_t, 256>& table) {
  for (auto& v : image.pixels) v = table[v];
}

std::vector<std::array<std::uint64_t, 256>> Histograms(const Image& image) {
  std::vector<std::array<std::uint64_t, 256>> h(static_cast<std::size_t>(image.channels));
  for (auto& one : h) one.fill(0);
  const int c = image.channels;
  const std::size_t n = static_cast<std::size_t>(image.width) * image.height;
  const std::uint8_t* p = image.pixels.data();
  for (std::size_t i = 0; i < n; ++i, p += c)
    for (int b = 0; b < c; ++b) ++h[static_cast<std::size_t>(b)][p[b]];
  return h;
}

}  // namespace

void AdjustSharpness(Image& image, double factor, Image& scratch) {
  const float alpha = static_cast<float>(factor);
  if (alpha == 1.0f) return;
  const int W = image.width, H = image.height, c = image.channels;
  scratch = image;  // borders (and images under 3x3) keep their pixels, as Pillow's filter does
  if (W >= 3 && H >= 3) {
    // SMOOTH: (1 1 1 / 1 5 1 / 1 1 1) / 13, offset 0.5 for rounding, rows y+1, y, y-1 in that order.
    const float k1 = 1.0f / 13.0f, k5 = 5.0f / 13.0f;  // Pillow divides the float kernel by the float divisor
    const float k[9] = {k1, k1, k1, k1, k5, k1, k1, k1, k1};
    for (int y = 1; y < H - 1; ++y) {
      const std::uint8_t* below = image.row(y + 1);
      const std::uint8_t* middle = image.row(y);
      const std::uint8_t* above = image.row(y - 1);
      std::uint8_t* out = scratch.row(y);
      for (int i = c; i < (W - 1) * c; ++i) {
        // Pillow's order: offset, then rows y+1, y, y-1, each left, centre, right.
        float ss = 0.5f;
        ss += static_cast<float>(below[i - c]) * k[0] + static_cast<float>(below[i]) * k[1] +
              static_cast<float>(below[i + c]) * k[2];
        ss += static_cast<float>(middle[i - c]) * k[3] + static_cast<float>(middle[i]) * k[4] +
              static_cast<float>(middle[i + c]) * k[5];
        ss += static_cast<float>(above[i - c]) * k[6] + static_cast<float>(above[i]) * k[7] +
              static_cast<float>(above[i + c]) * k[8];
        out[i] = ss <= 0.0f ? 0 : (ss >= 255.0f ? 255 : static_cast<std::uint8_t>(ss));
      }
    }
  }
  // Image.blend(degenerate, image, factor).
  BlendValues(scratch.pixels.data(), image.pixels.data(), image.pixels.size(), alpha);
}

void Posterize(Image& image, int bits) {
  std::array<std::uint8_t, 256> table{};
  const int mask = ~((1 << (8 - std::clamp(bits, 0, 8))) - 1);
  for (int i = 0; i < 256; ++i) table[static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(i & mask);
  ApplyTable(image, table);
}

void Solarize(Image& image, double threshold) {
  std::array<std::uint8_t, 256> table{};
  for (int i = 0; i < 256; ++i)
    table[static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(i < threshold ? i : 255 - i);
  ApplyTable(image, table);
}

void Invert(Image& image) {
  for (auto& v : image.pixels) v = static_cast<std::uint8_t>(255 - v);
}

void AutoContrast(Image& image) {
  const auto histograms = Histograms(image);
  std::vector<std::uint8_t> tables(histograms.size() * 256);
  for (std::size_t b = 0; b < histograms.size(); ++b) {
    const auto& h = histograms[b];
    int lo = 0, hi = 255;
    while (lo < 255 && h[static_cast<std::size_t>(lo)] == 0) ++lo;
    while (hi > 0 && h[static_cast<std::size_t>(hi)] == 0) --hi;
    for (int ix = 0; ix < 256; ++ix) {
      int v = ix;
      if (hi > lo) {
        const double scale = 255.0 / (hi - lo);
        const double offset = -lo * scale;
        v = std::clamp(static_cast<int>(ix * scale + offset), 0, 255);
      }
      tables[b * 256 + static_cast<std::size_t>(ix)] = static_cast<std::uint8_t>(v);
    }
  }
  ApplyTables(image, tables);
}

void Equalize(Image& image) {
  const auto histograms = Histograms(image);
  std::vector<std::uint8_t> tables(histograms.size() * 256);
  for (std::size_t b = 0; b < histograms.size(); ++b) {
    const auto& h = histograms[b];
    std::uint64_t total = 0, last = 0, used = 0;
    for (auto count : h)
      if (count) {
        total += count;
        last = count;
        ++used;
      }
    const std::uint64_t step = used <= 1 ? 0 : (total - last) / 255;
    std::uint64_t n = step / 2;
    for (std::size_t i = 0; i < 256; ++i) {
      tables[b * 256 + i] =
          step == 0 ? static_cast<std::uint8_t>(i) : static_cast<std::uint8_t>(std::min<std::uint64_t>(n / step, 255));
      n += h[i];
    }
  }
  ApplyTables(image, tables);
}

}  // namespace stoker::transform
