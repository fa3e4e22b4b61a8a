// Pillow's per-pixel colour arithmetic, written once for the CPU steps
// (transform/color.cc) and the GPU's augmentation kernels and their CPU
// twin (device/augment_math.h): luma, ImagingBlend's float blend, and the
// hue shift through rgb2hsv / hsv2rgb. Plain C++17 with no stoker headers
// but core/half.h (nvcc compiles it), so both evaluate the same operations
// in the same order.
#pragma once

#include <cstdint>

#include "core/half.h"  // STOKER_HOST_DEVICE

namespace stoker::transform {

// Pillow's luma (ITU-R 601-2 in its integer form).
STOKER_HOST_DEVICE inline std::uint8_t PillowLuma(const std::uint8_t* rgb) {
  return static_cast<std::uint8_t>((rgb[0] * 19595u + rgb[1] * 38470u + rgb[2] * 7471u + 0x8000u) >> 16);
}

STOKER_HOST_DEVICE inline std::uint8_t Clip8(int v) {
  return static_cast<std::uint8_t>(v < 0 ? 0 : (v > 255 ? 255 : v));
}

// ImagingBlend(degenerate, image, alpha) for one value: alpha is a C float
// and so is the arithmetic; truncated when interpolating (alpha in [0, 1]),
// clipped when extrapolating. alpha 1 keeps the value, 0 gives the
// degenerate one (Pillow copies the images).
STOKER_HOST_DEVICE inline std::uint8_t BlendTo(int degenerate, int value, float alpha) {
  if (alpha == 1.0f) return static_cast<std::uint8_t>(value);
  if (alpha == 0.0f) return static_cast<std::uint8_t>(degenerate);
  const float v = static_cast<float>(degenerate) + alpha * static_cast<float>(value - degenerate);
  if (alpha >= 0 && alpha <= 1.0f) return static_cast<std::uint8_t>(v);
  if (!(v > 0.0f)) return 0;  // also NaN (an infinite factor times 0): defined, as a value
  if (v >= 255.0f) return 255;
  return static_cast<std::uint8_t>(v);
}

// C's round() (half away from zero) of a value >= 0 below 2^31, without
// a library call: the fraction x - trunc(x) is exact.
STOKER_HOST_DEVICE inline double RoundNonNegative(double x) {
  const auto t = static_cast<double>(static_cast<std::int32_t>(x));
  return t + static_cast<double>(x - t >= 0.5);  // no branch: colours do not predict it
}

// Pillow's rgb2hsv_row for one pixel: its hue and saturation bytes (value
// is the largest channel); 0 and 0 for grey. Float and double mixed exactly
// as there.
STOKER_HOST_DEVICE inline void PillowHueSaturation(std::uint8_t r, std::uint8_t g, std::uint8_t b, std::uint8_t& h8,
                                                   std::uint8_t& s8) {
  const std::uint8_t maxc = r > g ? (r > b ? r : b) : (g > b ? g : b);
  const std::uint8_t minc = r < g ? (r < b ? r : b) : (g < b ? g : b);
  h8 = 0;
  s8 = 0;
  if (minc == maxc) return;
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
  // fmod(h / 6.0 + 1.0, 1.0): the argument is in [5/6, 11/6], where fmod
  // is the exact subtraction of 1 from values >= 1.
  double x = h / 6.0 + 1.0;
  if (x >= 1.0) x -= 1.0;
  h = static_cast<float>(x);
  h8 = Clip8(static_cast<int>(h * 255.0));
  s8 = Clip8(static_cast<int>(s * 255.0));
}

// hsv2rgb's terms that depend on the hue alone (sector i, fraction f), on
// the saturation alone (fs) and on saturation and value (up), for tables.
STOKER_HOST_DEVICE inline int PillowHueSector(std::uint8_t hue) {
  return static_cast<int>(static_cast<float>(hue) * 6.0 / 255.0);  // floor() of a value >= 0 is its truncation
}
STOKER_HOST_DEVICE inline float PillowHueFraction(std::uint8_t hue) {
  return static_cast<float>(static_cast<float>(hue) * 6.0 / 255.0 - static_cast<float>(PillowHueSector(hue)));
}
STOKER_HOST_DEVICE inline float PillowSaturationFraction(std::uint8_t s8) {
  return static_cast<float>(static_cast<float>(s8) / 255.0);
}
STOKER_HOST_DEVICE inline std::uint8_t PillowHsvP(std::uint8_t v, float fs) {
  return Clip8(static_cast<int>(RoundNonNegative(static_cast<float>(v) * (1.0 - fs))));
}
STOKER_HOST_DEVICE inline std::uint8_t PillowHsvQ(std::uint8_t v, float fs, float f) {
  return Clip8(static_cast<int>(RoundNonNegative(static_cast<float>(v) * (1.0 - fs * f))));
}
STOKER_HOST_DEVICE inline std::uint8_t PillowHsvT(std::uint8_t v, float fs, float f) {
  return Clip8(static_cast<int>(RoundNonNegative(static_cast<float>(v) * (1.0 - fs * (1.0 - f)))));
}

// Pillow's hsv2rgb for one pixel of saturation s8 > 0, given its hue's
// sector and fraction, fs and p (the functions above), written to `p`.
STOKER_HOST_DEVICE inline void PillowHsvToRgb(int i, float f, float fs, std::uint8_t v, std::uint8_t up,
                                              std::uint8_t* p) {
  const std::uint8_t uq = PillowHsvQ(v, fs, f), ut = PillowHsvT(v, fs, f);
  switch (i % 6) {
    case 0:
      p[0] = v, p[1] = ut, p[2] = up;
      break;
    case 1:
      p[0] = uq, p[1] = v, p[2] = up;
      break;
    case 2:
      p[0] = up, p[1] = v, p[2] = ut;
      break;
    case 3:
      p[0] = up, p[1] = uq, p[2] = v;
      break;
    case 4:
      p[0] = ut, p[1] = up, p[2] = v;
      break;
    default:
      p[0] = v, p[1] = up, p[2] = uq;
      break;
  }
}

// Pillow's rgb2hsv_row for one pixel, its hue shifted by `shift` (mod 256),
// and hsv2rgb back, in place. (AdjustHue on the CPU takes the same terms
// from tables: transform/color.cc.)
STOKER_HOST_DEVICE inline void ShiftHue(std::uint8_t* p, std::uint8_t shift) {
  const std::uint8_t r = p[0], g = p[1], b = p[2];
  const std::uint8_t v = r > g ? (r > b ? r : b) : (g > b ? g : b);
  std::uint8_t h8, s8;
  PillowHueSaturation(r, g, b, h8, s8);
  if (s8 == 0) {
    p[0] = p[1] = p[2] = v;
    return;
  }
  const auto hue = static_cast<std::uint8_t>(h8 + shift);
  const float fs = PillowSaturationFraction(s8);
  PillowHsvToRgb(PillowHueSector(hue), PillowHueFraction(hue), fs, v, PillowHsvP(v, fs), p);
}

}  // namespace stoker::transform
