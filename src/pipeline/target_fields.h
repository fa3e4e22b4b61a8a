// Fields that follow the transformed image: decoders for boxes, keypoints
// and masks (registered in field_decoders.cc), and TargetFollower, which
// moves a sample's targets the way its image was moved (the image's
// SampleGeometry), drops boxes left without area with their labels, and
// converts the boxes back to their format.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "pipeline/field_decoders.h"
#include "stoker/fields.h"
#include "transform/image.h"
#include "transform/targets.h"

namespace stoker::pipeline {

Status DecodeBoxesField(std::span<const std::byte> bytes, const FieldSpec& spec, const FieldDecodeOptions& options,
                        FieldValue* out);
Status DecodeKeypointsField(std::span<const std::byte> bytes, const FieldSpec& spec, const FieldDecodeOptions& options,
                            FieldValue* out);
Status DecodeMaskField(std::span<const std::byte> bytes, const FieldSpec& spec, const FieldDecodeOptions& options,
                       FieldValue* out);

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
                             std::size_t index, transform::Image& scratch_a, transform::Image& scratch_b) const;

 private:
  struct Follower {
    std::size_t field = 0;
    FieldKind kind = FieldKind::kBoxes;
    std::string name, format;
    std::optional<std::size_t> labels;  // the labels field's column
    std::uint8_t fill = 0;
  };
  std::vector<Follower> followers_;
};

}  // namespace stoker::pipeline
