// Fields that follow the transformed image: decoders for boxes, keypoints
// and masks (arrays that follow are decoded as arrays) (registered in field_decoders.cc), and TargetFollower, which
// moves a sample's targets the way its image was moved (the image's
// SampleGeometry), drops boxes left without area with their labels, and
// converts the boxes back to their format.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "codec/pixels.h"
#include "pipeline/field_decoders.h"
#include "stoker/fields.h"
#include "transform/follow_raster.h"
#include "transform/targets.h"

namespace stoker::pipeline {

Status DecodeBoxesField(std::span<const std::byte> bytes, const FieldSpec& spec, const FieldDecodeOptions& options,
                        FieldValue* out);
Status DecodeKeypointsField(std::span<const std::byte> bytes, const FieldSpec& spec, const FieldDecodeOptions& options,
                            FieldValue* out);
Status DecodeMaskField(std::span<const std::byte> bytes, const FieldSpec& spec, const FieldDecodeOptions& options,
                       FieldValue* out);
// A mask's mode ("L", "I;16" or "RGB"; nullopt for any other) and the
// element type it decodes to.
[[nodiscard]] std::optional<codec::ColorMode> MaskColorMode(std::string_view mode);
[[nodiscard]] ElementType MaskElementType(codec::ColorMode mode);

class TargetFollower {
 public:
  // Refuses followers without a transformed image, an unknown box format,
  // and a labels field that is not an Array field of this loader.
  [[nodiscard]] static Result<TargetFollower> Create(const std::vector<FieldSpec>& specs, bool has_transformed_image);
  [[nodiscard]] bool empty() const { return followers_.empty(); }
  // Moves the targets at place `index` of `columns` (decoded fields, in the
  // specs' order). Errors are Corruption (a mask of another size, labels
  // that do not match the boxes); the caller names the sample.
  [[nodiscard]] Status Apply(const transform::SampleGeometry& geometry, std::vector<std::vector<FieldValue>>& columns,
                             std::size_t index, transform::RasterScratch& scratch) const;

 private:
  struct Follower {
    std::size_t field = 0;
    FieldKind kind = FieldKind::kBoxes;
    std::string name, format;
    std::optional<std::size_t> labels;  // the labels field's column
    double fill = 0;
    std::string layout;  // a mask's or array's ("HWC" or "CHW")
  };
  std::vector<Follower> followers_;
};

}  // namespace stoker::pipeline
