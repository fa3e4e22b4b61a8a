#include "codec/jpeg_traits.h"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

namespace stoker::codec {

Result<JpegTraits> ReadJpegTraits(std::span<const std::byte> jpeg) {
  auto byte = [&](std::size_t i) { return static_cast<std::uint8_t>(jpeg[i]); };
  auto corrupt = [](std::string_view what) { return Status::Corruption(fmt::format("not a JPEG: {}", what)); };
  if (jpeg.size() < 4 || byte(0) != 0xFF || byte(1) != 0xD8) return corrupt("no start-of-image marker");
  JpegTraits traits;
  std::size_t at = 2;
  while (true) {
    if (at + 4 > jpeg.size()) return corrupt("the header ends before the frame header");
    if (byte(at) != 0xFF) return corrupt(fmt::format("no marker at byte {}", at));
    const std::uint8_t marker = byte(at + 1);
    if (marker == 0xFF) {
      ++at;
      continue;
    }
    if (marker == 0xD9 || marker == 0xDA) return corrupt("no frame header before the image data");
    if ((marker >= 0xD0 && marker <= 0xD7) || marker == 0x01) {
      at += 2;
      continue;
    }
    const std::size_t length = std::size_t{byte(at + 2)} << 8 | byte(at + 3);
    if (length < 2 || at + 2 + length > jpeg.size())
      return corrupt(fmt::format("marker segment at byte {} runs past the end", at));
    const std::span<const std::byte> payload = jpeg.subspan(at + 4, length - 2);
    if (marker == 0xEE && payload.size() >= 12 && std::memcmp(payload.data(), "Adobe", 5) == 0) {
      traits.adobe_transform = static_cast<int>(payload[11]);
    }
    const bool sof = marker >= 0xC0 && marker <= 0xCF && marker != 0xC4 && marker != 0xC8 && marker != 0xCC;
    if (sof) {
      if (payload.size() < 6) return corrupt("frame header too short");
      if (marker == 0xC0)
        traits.process = JpegProcess::kBaseline;
      else if (marker == 0xC1)
        traits.process = JpegProcess::kExtended;
      else if (marker == 0xC2)
        traits.process = JpegProcess::kProgressive;
      else if (marker == 0xC3)
        traits.process = JpegProcess::kLossless;
      else if (marker >= 0xC5 && marker <= 0xC7)
        traits.process = JpegProcess::kHierarchical;
      else
        traits.process = JpegProcess::kArithmetic;
      auto p = [&](std::size_t i) { return static_cast<int>(static_cast<std::uint8_t>(payload[i])); };
      traits.precision = p(0);
      traits.height = p(1) << 8 | p(2);
      traits.width = p(3) << 8 | p(4);
      traits.components = p(5);
      if (traits.components < 1 || traits.components > 4)
        return corrupt(fmt::format("{} components (1 to 4 expected)", traits.components));
      if (payload.size() < 6 + 3 * static_cast<std::size_t>(traits.components))
        return corrupt("frame header shorter than its components");
      if (traits.width == 0 || traits.height == 0) return corrupt("zero width or height");
      for (int c = 0; c < traits.components; ++c) {
        const int sampling = p(6 + 3 * static_cast<std::size_t>(c) + 1);
        traits.h[c] = sampling >> 4;
        traits.v[c] = sampling & 0xF;
        if (traits.h[c] < 1 || traits.h[c] > 4 || traits.v[c] < 1 || traits.v[c] > 4)
          return corrupt(fmt::format("component {} has sampling factors {}x{}", c, traits.h[c], traits.v[c]));
      }
      return traits;
    }
    at += 2 + length;
  }
}

std::string_view Subsampling(const JpegTraits& t) {
  if (t.components == 1) return "grey";
  if (t.components != 3 || t.h[1] != t.h[2] || t.v[1] != t.v[2] || t.h[1] != 1 || t.v[1] != 1) return {};
  const int h = t.h[0], v = t.v[0];
  if (h == 1 && v == 1) return "4:4:4";
  if (h == 2 && v == 1) return "4:2:2";
  if (h == 2 && v == 2) return "4:2:0";
  if (h == 1 && v == 2) return "4:4:0";
  if (h == 4 && v == 1) return "4:1:1";
  if (h == 4 && v == 2) return "4:1:0";
  return {};
}

DecodePlan PlanGpuDecode(const JpegTraits& t, const GpuDecodeCaps& caps) {
  switch (t.process) {
    case JpegProcess::kArithmetic:
      return {DecodeRoute::kCpu, "arithmetic coding"};
    case JpegProcess::kLossless:
      return {DecodeRoute::kCpu, "lossless JPEG"};
    case JpegProcess::kHierarchical:
      return {DecodeRoute::kCpu, "hierarchical JPEG"};
    default:
      break;
  }
  if (t.precision != 8) return {DecodeRoute::kCpu, "12-bit samples"};
  if (t.components == 4 || t.adobe_transform == 2) return {DecodeRoute::kCpu, "CMYK or YCCK"};
  if (t.components == 3 && t.adobe_transform == 0) return {DecodeRoute::kCpu, "RGB without a colour transform"};
  if (t.components == 2) return {DecodeRoute::kCpu, "two components"};
  if (Subsampling(t).empty()) return {DecodeRoute::kCpu, "chroma sampling nvJPEG does not take"};
  const bool sequential = t.process == JpegProcess::kBaseline || t.process == JpegProcess::kExtended;
  // nvjpeg.h: the hardware backend takes baseline with a single scan, not 4:1:0 or 4:1:1. (A baseline file of
  // several scans is rare and shows only at decode time: nvJPEG's error sends it to the CPU there.)
  const std::string_view sampling = Subsampling(t);
  if (sampling == "4:1:0" || sampling == "4:1:1") return {DecodeRoute::kGpu, {}};
  if (sequential && caps.hardware &&
      (caps.hardware_max_side == 0 || std::max(t.width, t.height) <= caps.hardware_max_side))
    return {DecodeRoute::kHardware, {}};
  return {DecodeRoute::kGpu, {}};
}

}  // namespace stoker::codec
