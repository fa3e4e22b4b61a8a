// stoker/fields.h: typed fields. A loader given FieldSpecs decodes each
// sample's fields on its own threads (without the GIL in Python) and hands
// them over per batch, beside the transformed images.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "stoker/augment.h"
#include "stoker/status.h"
#include "stoker/tensor.h"

namespace stoker {

enum class FieldKind : std::uint8_t {
  kImage,   // JPEG, PNG, WebP or TIFF -> uint8 [H, W, C] (uint16 for mode "I;16"), stoker/decode.h's DecodeImage
  kInt,     // a decimal integer stored as text (.cls, .id) -> int64 scalar
  kFloat,   // a number stored as text -> float64 scalar
  kArray,   // NumPy .npy -> its dtype and shape (DecodeNpy); a TIFF -> its samples (DecodeArray)
  kText,    // UTF-8 text (checked) -> bytes
  kJson,    // JSON (checked to parse) -> its text
  kBytes,   // anything -> its bytes, as stored
  kCustom,  // a decoder of your own, by FieldSpec::decoder (stoker/field_extension.h)
  // Targets (.npy, or JSON nested lists of numbers) that move with the
  // transformed image when FieldSpec::follows is set:
  kBoxes,      // float32 [N, 4] in FieldSpec::box_format; moved boxes enclose their moved corners
  kKeypoints,  // float32 [N, 2], [N, K, 2] or [N, K, 3] (x, y[, visibility: not moved])
  kMask,       // a label map (PNG, ... decoded as "L") -> uint8 [H, W], moved with nearest sampling
};
[[nodiscard]] std::string_view FieldKindName(FieldKind kind);  // "image", "int", ...
// The kind WebDataset's conventions give a key, by its last extension:
// jpg, jpeg, png, webp, tif, tiff, ppm, pgm -> image; npy -> array; json -> json; txt -> text;
// cls, id, idx, index, label -> int; anything else bytes. What `stoker
// inspect` shows, and a starting point for specs.
[[nodiscard]] FieldKind ConventionalFieldKind(std::string_view key);
// Whether a key's last extension is tif or tiff (any case): an image field
// that an Array spec may also read, as the TIFF's samples.
[[nodiscard]] bool IsTiffKey(std::string_view key);
// Whether an Array spec may read an image field of this key, as its samples
// stored: a TIFF (tif, tiff) or a PNG (png; a 16-bit depth map, a label map).
[[nodiscard]] bool ArrayReadsImageKey(std::string_view key);

struct FieldSpec {
  std::string name;  // what the batch calls it
  FieldKind kind = FieldKind::kBytes;
  // WebDataset keys (extensions, e.g. "jpg", "seg.png"); the first one a
  // sample has is decoded.
  std::vector<std::string> keys;
  // A sample without any of the keys: an absent value instead of an error
  // (Corruption naming the sample, skippable under CorruptPolicy::kSkip).
  bool optional = false;
  std::string mode = "RGB";  // kImage: "RGB", "L", "RGBA" or "I;16"
  // kImage: cropped, resized and normalised by LoaderOptions::transform into
  // Batch::images() (at most one such field); otherwise decoded whole.
  bool transformed = false;
  // kCustom: the name of a decoder a loaded extension registered.
  std::string decoder;
  // kBoxes, kKeypoints, kMask, kArray: moved with the transformed image
  // (every crop, flip, rotation, affine and resize it gets), clamped to it
  // (boxes: one left without area is dropped, with its label). Needs a
  // transformed image field. A mask or an array is that image's size
  // ([H, W], or with bands where `array_layout` says) and moves with
  // nearest-neighbour sampling; such an array takes no array_transform.
  bool follows = false;
  std::string box_format = "xyxy";  // kBoxes: "xyxy", "xywh" or "cxcywh" (output in the same format)
  // kBoxes: the name of another field (an Array, one label per box along
  // its first dimension) whose entries are dropped with their boxes.
  std::string labels;
  // kMask, and a kArray that follows: the value of pixels moved in from
  // outside the image, in the field's element type (InvalidArgument when
  // that type cannot hold it: a fraction or out of range for integers).
  double fill = 0;
  // kMask: "L" (8-bit labels), "I;16" (16-bit, e.g. instance ids) or "RGB"
  // (labels coded as colours, e.g. COCO panoptic): uint8 [H, W], uint16
  // [H, W] or uint8 [H, W, 3].
  std::string mask_mode = "L";
  // kArray: steps applied to each array on the loader's threads, in order:
  // RandomCrop (no padding), CenterCrop, RandomHorizontalFlip,
  // RandomVerticalFlip, Normalize (mean and std: one value, or one a band;
  // to float32). The array's height and width (for these steps and for
  // `follows`) are where `array_layout` says: "HWC" ([H, W] or [H, W, C])
  // or "CHW". Draws are the sample's:
  // arrays of one size given the same steps get the same crop and flips.
  std::vector<TransformStep> array_transform;
  std::string array_layout = "HWC";
};

// One sample's decoded field.
struct FieldValue {
  bool present = false;
  HostTensor tensor;  // kImage, kInt, kFloat, kArray
  std::string bytes;  // kText, kJson, kBytes
};

// Loads a shared library of field decoders (stoker/field_extension.h) and
// registers them by name for FieldKind::kCustom. Loading the same path
// again is a no-op. InvalidArgument for a library without the entry point,
// a decoder of another version, or a name another library registered;
// NotFound when the file does not load. Thread-safe.
[[nodiscard]] Status LoadFieldExtension(const std::string& path);
// The names registered so far.
[[nodiscard]] std::vector<std::string> FieldExtensionDecoders();

}  // namespace stoker
