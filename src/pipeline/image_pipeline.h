// One image through the loader's per-sample path: JPEG header, crop box and
// flip from the sample's own random stream, region-of-interest decode (with
// DCT scaling; PNG and WebP are decoded whole), bilinear resample of the
// box, fused write. The Loader runs
// this on every worker thread; TransformImage exposes it for tests and for
// inspecting augmentations.
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "codec/image_decode.h"
#include "codec/jpeg.h"
#include "codec/jpeg_restart.h"
#include "codec/pixels.h"
#include "core/rng.h"
#include "stoker/loader.h"
#include "transform/augmentation.h"
#include "transform/image.h"
#include "transform/resample.h"
#include "transform/transform.h"

namespace stoker {

// Scaled pixels decoded around a region: chroma upsampling at its edge needs
// its neighbours (tests/codec/jpeg_restart_test's
// AMarginOfFourScaledPixelsKeepsTheBoxExact).
inline constexpr int kRegionMargin = 4;

// Corruption when a width x height image has more pixels than t.max_pixels
// (a small file claiming a huge image is a decompression bomb).
[[nodiscard]] Status CheckImagePixels(int width, int height, const TransformOptions& t);

// Per-thread buffers, reused for every sample.
struct ImageScratch {
  codec::DecodedRegion decoded;
  transform::ResampleScratch resample;
  std::vector<std::uint8_t> resized;
  codec::SourceImage source;  // PNG and WebP, decoded whole
  codec::Pixels converted;
  transform::Image image, step_scratch;  // augmentation steps' images
  // Set by the loader when targets follow the image: each sample's
  // transform then records what it did in `geometry`.
  bool record_geometry = false;
  transform::SampleGeometry geometry;
  // Steps before the crop that are warps draw only the crop's part of the
  // image (decoding only the source region they read); false takes the
  // whole image, for tests comparing the two.
  bool draw_parts = true;
  // Set by the loader per sample when the index holds the JPEG's restart
  // table (a seekable pack): region decodes then entropy-decode only the
  // intervals the region covers. `seek_use` says what the last decode did.
  codec::RestartOffsets restarts;
  std::vector<std::uint32_t> restart_table;  // what `restarts` views, decoded from the index
  // Set with `restarts` when the JPEG was read in part (index version 7):
  // the bytes the loader gives are its head, and these its MCU rows from
  // byte `rows_at` on. A region they do not cover sets seek_use to
  // kNeedsWhole and decodes nothing.
  std::span<const std::byte> held_rows;
  std::uint64_t rows_at = 0;
  std::vector<std::byte> seek_stream;
  std::optional<codec::SeekUse> seek_use;
};

// A JPEG's region as codec::DecodeJpeg decodes it, through the restart
// table in scratch.restarts when there is one (scratch.seek_use says how).
[[nodiscard]] Status DecodeJpegRegion(std::span<const std::byte> jpeg, codec::Roi roi, int scale,
                                      ImageScratch& scratch);

// The decoded region of one sample and what the transform does with it: the
// box to resample (in `view`'s pixels, possibly fractional) and the flip.
// `view` points into the scratch's decoded buffer.
struct DecodedCrop {
  transform::ImageView view;
  double x0 = 0, y0 = 0, x1 = 0, y1 = 0;
  bool flip = false;
  TransformTrace trace;
};

// The crop and flip of one sample, from the image's size and the sample's
// random stream: what DecodeCrop decodes, and what the GPU decode path asks
// the kernel to resample from a full decode.
struct CropPlan {
  transform::FloatBox box;  // in full-resolution pixels
  int crop_w = 0, crop_h = 0;
  codec::Roi roi;  // RandomResizedCrop's integer box; empty (width 0) otherwise
  bool flip = false;
};

// The region of a W x H image DecodeCrop decodes for `plan`, with its
// margin, and the DCT scale it decodes at (JPEG only; 1 otherwise). An empty
// roi (width 0): the whole image.
struct RegionToDecode {
  codec::Roi roi;
  int scale = 1;
};
[[nodiscard]] RegionToDecode RegionFor(const CropPlan& plan, int width, int height, const TransformOptions& t,
                                       bool is_jpeg);

// The region of a W x H JPEG that DecodeAndTransform decodes for sample
// `sample`, known before its bytes are read; nullopt where that takes more
// than a planned crop (steps before the crop, no crop stage, no region).
[[nodiscard]] std::optional<codec::Roi> PlannedJpegRegion(int width, int height, const TransformOptions& t,
                                                          const transform::Augmentation& augmentation,
                                                          std::uint64_t seed, std::uint64_t epoch,
                                                          std::uint64_t sample);

// Corruption when the image has more pixels than t.max_pixels. A box or
// flip in `given` is used instead of drawn (InvalidArgument when the box is
// not whole pixels inside the image).
[[nodiscard]] Result<CropPlan> PlanCrop(int width, int height, const TransformOptions& t, std::uint64_t seed,
                                        std::uint64_t epoch, std::uint64_t sample,
                                        const transform::Augmentation::Record* given = nullptr);

// JPEG header -> crop box and flip from the sample's random stream -> ROI
// decode with DCT scaling. Decode errors are Corruption.
[[nodiscard]] Status DecodeCrop(std::span<const std::byte> jpeg, const TransformOptions& t, std::uint64_t seed,
                                std::uint64_t epoch, std::uint64_t sample, ImageScratch& scratch, DecodedCrop& crop,
                                const transform::Augmentation::Record* given = nullptr);
// The crop `plan` makes of an image already in memory (after steps before
// the crop): a RandomResizedCrop's box becomes the view, so the resampler's
// taps stop at its edges as torchvision's crop-then-resize does.
[[nodiscard]] DecodedCrop CropOf(const transform::Image& image, const CropPlan& plan);
// Resamples the crop's box to the output size into scratch.resized (uint8 HWC).
[[nodiscard]] Status ResizeCrop(const DecodedCrop& crop, const TransformOptions& t, ImageScratch& scratch);

// The whole image, decoded to RGB, into scratch.image (steps before the
// crop need all of it). Corruption past t.max_pixels.
[[nodiscard]] Status DecodeWholeImage(std::span<const std::byte> data, const TransformOptions& t,
                                      ImageScratch& scratch);

// Steps before a RandomResizedCrop that are all warps (rotation, affine,
// flips) are drawn from the JPEG header's size, the crop is planned on the
// size they make, and only the source region the warps read for that crop
// is decoded; each warp draws only the part of its output the next one
// (finally the crop) reads. Pixel for pixel what decoding and warping the
// whole image gives (the draws are the same: a pure function of the sample).
struct PartWarpPlan {
  std::vector<StepParams> params;                // per step before the crop
  std::vector<transform::Step::PartWarp> warps;  // per step
  std::vector<transform::Size> sizes;            // the input of each step, then the crop stage's
  CropPlan crop;                                 // on sizes.back()
  std::vector<transform::Rect> regions;          // what each step's input is read for, then the crop's box
  codec::Roi source_roi;                         // regions[0] with the decode margin
};
// Draws the steps from `rng` (the sample's stream) or takes record.replay;
// nullopt when the plan does not apply (the whole image then takes the
// steps): another format, a crop stage other than RandomResizedCrop, a draw
// that is no warp (a rotation by a multiple of 90 degrees), a crop that sees
// only fill.
[[nodiscard]] Result<std::optional<PartWarpPlan>> PlanPartWarps(std::span<const std::byte> data,
                                                                const TransformOptions& t,
                                                                const transform::Augmentation& augmentation,
                                                                std::uint64_t seed, std::uint64_t epoch,
                                                                std::uint64_t sample, Rng& rng,
                                                                const transform::Augmentation::Record& record);
// With the plan's source_roi decoded into scratch.decoded: the warps, into
// scratch.image, which then holds exactly the crop's box.
void DrawPartWarps(const PartWarpPlan& plan, ImageScratch& scratch);
// Reports the plan's draws and geometry into `record` (used, geometry).
void RecordPartWarps(const TransformOptions& t, const transform::Augmentation& augmentation, const PartWarpPlan& plan,
                     const transform::Augmentation::Record& record);

// Writes one transformed image (out: height * width * 3 elements of the
// output dtype, in the output layout). Decode errors are Corruption. Adds
// the time spent decoding and transforming to the counters when given.
// With augmentation steps before the crop (or no crop stage) the image is
// decoded whole; `record` replays or reports the steps' parameters.
[[nodiscard]] Status DecodeAndTransform(std::span<const std::byte> jpeg, const TransformOptions& t,
                                        const transform::OutputWriter& writer,
                                        const transform::Augmentation& augmentation, std::uint64_t seed,
                                        std::uint64_t epoch, std::uint64_t sample, std::byte* out,
                                        ImageScratch& scratch, TransformTrace* trace,
                                        std::atomic<std::uint64_t>* decode_ns, std::atomic<std::uint64_t>* transform_ns,
                                        const transform::Augmentation::Record& record = {});

// The same from RGB pixels already in scratch.image (no decoding).
[[nodiscard]] Status TransformDecoded(const TransformOptions& t, const transform::OutputWriter& writer,
                                      const transform::Augmentation& augmentation, std::uint64_t seed,
                                      std::uint64_t epoch, std::uint64_t sample, std::byte* out, ImageScratch& scratch,
                                      TransformTrace* trace, const transform::Augmentation::Record& record);

}  // namespace stoker
