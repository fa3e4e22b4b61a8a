// What a JPEG's markers say about how it can be decoded, read before any
// decoding: the coding process (baseline, extended, progressive, lossless,
// arithmetic, hierarchical), precision, components and their sampling, and
// Adobe's colour transform. The GPU decode path plans with it: which
// samples go to the GPU's hardware decoder, which to nvJPEG's GPU decoder,
// and which stay on the CPU (planned in PlanGpuDecode).
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "stoker/status.h"

namespace stoker::codec {

enum class JpegProcess : std::uint8_t {
  kBaseline,      // SOF0
  kExtended,      // SOF1: sequential, Huffman, 8 or 12 bits
  kProgressive,   // SOF2: Huffman
  kLossless,      // SOF3
  kHierarchical,  // SOF5-7 (differential)
  kArithmetic,    // SOF9-11, SOF13-15
};

struct JpegTraits {
  JpegProcess process = JpegProcess::kBaseline;
  int precision = 8;
  int width = 0;
  int height = 0;
  int components = 0;
  // Sampling factors of the components (h, v), the first `components` used.
  int h[4] = {};
  int v[4] = {};
  // Adobe APP14 colour transform: -1 without an Adobe block; 0 (none: RGB
  // or CMYK), 1 (YCbCr), 2 (YCCK).
  int adobe_transform = -1;
};

// Reads the markers up to the frame header (SOF). Corruption naming what is
// wrong for anything that is not a well-formed JPEG header.
[[nodiscard]] Result<JpegTraits> ReadJpegTraits(std::span<const std::byte> jpeg);

// "4:2:0" and the like for 3-component YCbCr; "grey" for 1 component; empty
// for a layout nvJPEG does not name.
[[nodiscard]] std::string_view Subsampling(const JpegTraits& traits);

enum class DecodeRoute : std::uint8_t { kHardware, kGpu, kCpu };

// What the GPU offers (from nvJPEG's backends on the device in use).
struct GpuDecodeCaps {
  bool hardware = false;      // A100/H100/H200 JPEG engines: baseline only
  int hardware_max_side = 0;  // the engines' largest side, as nvJPEG reports it; 0: no limit known
};

struct DecodePlan {
  DecodeRoute route = DecodeRoute::kCpu;
  std::string_view reason;  // why, for kCpu (counted by reason in the loader's stats)
};

// Where a sample decodes: the hardware decoder for baseline (and extended
// 8-bit) Huffman JPEGs in a layout it takes, nvJPEG's GPU decoder for the
// rest of what nvJPEG decodes (progressive, or no hardware), the CPU for
// what it does not (arithmetic coding, lossless, hierarchical, 12-bit,
// CMYK/YCCK, other sampling). nvJPEG's list (its documentation and
// nvjpeg.h): baseline and progressive, 8 bits, Huffman, 1 or 3 channels to
// RGB, 4:4:4, 4:2:2, 4:2:0, 4:4:0, 4:1:1, 4:1:0; the hardware backend takes
// baseline with one scan, and not 4:1:0 or 4:1:1.
[[nodiscard]] DecodePlan PlanGpuDecode(const JpegTraits& traits, const GpuDecodeCaps& caps);

}  // namespace stoker::codec
