#include "transform/color.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace stoker::transform {
namespace {

std::uint8_t Clip8(int v) {
  return static_cast<std::uint8_t>(v < 0 ? 0 : (v > 255 ? 255 : v));
}

// ImagingBlend(degenerate, image, alpha) for one value; alpha is a C float
// and so is the arithmetic, as in Pillow.
inline std::uint8_t BlendValue(int degenerate, int value, float alpha, bool interpolate) {
  const float v = static_cast<float>(degenerate) + alpha * static_cast<float>(value - degenerate);
  if (interpolate) return static_cast<std::uint8_t>(v);
  if (v <= 0.0f) return 0;
  if (v >= 255.0f) return 255;
  return static_cast<std::uint8_t>(v);
}

// Blends every value of `image` with a degenerate image given per pixel by
// `degenerate(pixel, channel)`.
template <typename Degenerate>
void Blend(Image& image, double factor, Degenerate degenerate) {
  const float alpha = static_cast<float>(factor);
  if (alpha == 1.0f) return;  // Pillow copies the image itself
  const bool interpolate = alpha >= 0 && alpha <= 1.0f;
  const int c = image.channels;
  const std::size_t n = static_cast<std::size_t>(image.width) * image.height;
  std::uint8_t* p = image.pixels.data();
  for (std::size_t i = 0; i < n; ++i, p += c) {
    std::uint8_t base[3];
    for (int b = 0; b < c; ++b) base[b] = degenerate(p, b);
    for (int b = 0; b < c; ++b) p[b] = alpha == 0.0f ? base[b] : BlendValue(base[b], p[b], alpha, interpolate);
  }
}

// Pillow's rgb2hsv_row (float and double mixed exactly as there).
void RgbToHsv(const std::uint8_t* in, std::uint8_t* out) {
  const std::uint8_t r = in[0], g = in[1], b = in[2];
  const std::uint8_t maxc = std::max(r, std::max(g, b));
  const std::uint8_t minc = std::min(r, std::min(g, b));
  std::uint8_t uh = 0, us = 0;
  if (minc != maxc) {
    const float cr = static_cast<float>(maxc - minc);
    const float s = cr / static_cast<float>(maxc);
    const float rc = static_cast<float>(maxc - r) / cr;
    const float gc = static_cast<float>(maxc - g) / cr;
    const float bc = static_cast<float>(maxc - b) / cr;
    float h;
    if (r == maxc) {
      h = bc - gc;
    } else if (g == maxc) {
      h = static_cast<float>(2.0 + rc - bc);
    } else {
      h = static_cast<float>(4.0 + gc - rc);
    }
    h = static_cast<float>(std::fmod((h / 6.0 + 1.0), 1.0));
    uh = Clip8(static_cast<int>(h * 255.0));
    us = Clip8(static_cast<int>(s * 255.0));
  }
  out[0] = uh;
  out[1] = us;
  out[2] = maxc;
}

// Pillow's hsv2rgb.
void HsvToRgb(const std::uint8_t* in, std::uint8_t* out) {
  const std::uint8_t h = in[0], s = in[1], v = in[2];
  if (s == 0) {
    out[0] = out[1] = out[2] = v;
    return;
  }
  const int i = static_cast<int>(std::floor(static_cast<float>(h) * 6.0 / 255.0));
  const float f = static_cast<float>(static_cast<float>(h) * 6.0 / 255.0 - static_cast<float>(i));
  const float fs = static_cast<float>(static_cast<float>(s) / 255.0);
  const std::uint8_t up = Clip8(static_cast<int>(std::round(static_cast<float>(v) * (1.0 - fs))));
  const std::uint8_t uq = Clip8(static_cast<int>(std::round(static_cast<float>(v) * (1.0 - fs * f))));
  const std::uint8_t ut = Clip8(static_cast<int>(std::round(static_cast<float>(v) * (1.0 - fs * (1.0 - f)))));
  switch (i % 6) {
    case 0:
      out[0] = v, out[1] = ut, out[2] = up;
      break;
    case 1:
      out[0] = uq, out[1] = v, out[2] = up;
      break;
    case 2:
      out[0] = up, out[1] = v, out[2] = ut;
      break;
    case 3:
      out[0] = up, out[1] = uq, out[2] = v;
      break;
    case 4:
      out[0] = ut, out[1] = up, out[2] = v;
      break;
    default:
      out[0] = v, out[1] = up, out[2] = uq;
      break;
  }
}

}  // namespace

void AdjustBrightness(Image& image, double factor) {
  Blend(image, factor, [](const std::uint8_t*, int) -> std::uint8_t { return 0; });
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
  Blend(image, factor, [mean](const std::uint8_t*, int) { return mean; });
}

void AdjustSaturation(Image& image, double factor) {
  if (image.channels != 3) return;
  Blend(image, factor, [](const std::uint8_t* p, int) { return Luma(p); });
}

void AdjustHue(Image& image, double hue_factor) {
  if (image.channels != 3) return;
  // np.uint8(hue_factor * 255): truncation toward zero, then modulo 256.
  const auto shift = static_cast<std::uint8_t>(static_cast<int>(hue_factor * 255));
  const std::size_t n = static_cast<std::size_t>(image.width) * image.height;
  std::uint8_t* p = image.pixels.data();
  for (std::size_t i = 0; i < n; ++i, p += 3) {
    std::uint8_t hsv[3];
    RgbToHsv(p, hsv);
    hsv[0] = static_cast<std::uint8_t>(hsv[0] + shift);
    HsvToRgb(hsv, p);
  }
}

void ToGrayscale(Image& image) {
  if (image.channels != 3) return;
  const std::size_t n = static_cast<std::size_t>(image.width) * image.height;
  std::uint8_t* p = image.pixels.data();
  for (std::size_t i = 0; i < n; ++i, p += 3) p[0] = p[1] = p[2] = Luma(p);
}

}  // namespace stoker::transform
