// The names of field kinds and WebDataset's naming convention for them
// (stoker/fields.h): here, below the dataset layer, because pack and the
// index record kinds as well as the loader reading them.
#include <cctype>
#include <string>

#include "stoker/fields.h"

namespace stoker {

std::string_view FieldKindName(FieldKind kind) {
  switch (kind) {
    case FieldKind::kImage:
      return "image";
    case FieldKind::kInt:
      return "int";
    case FieldKind::kFloat:
      return "float";
    case FieldKind::kArray:
      return "array";
    case FieldKind::kText:
      return "text";
    case FieldKind::kJson:
      return "json";
    case FieldKind::kBytes:
      return "bytes";
    case FieldKind::kCustom:
      return "custom";
    case FieldKind::kBoxes:
      return "boxes";
    case FieldKind::kKeypoints:
      return "keypoints";
    case FieldKind::kMask:
      return "mask";
  }
  return "?";
}

namespace {

// The last extension, lower-cased (the whole key when it has no dot).
std::string LastExtension(std::string_view key) {
  const auto dot = key.rfind('.');
  std::string ext(dot == std::string_view::npos ? key : key.substr(dot + 1));
  for (char& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return ext;
}

}  // namespace

bool IsTiffKey(std::string_view key) {
  const std::string ext = LastExtension(key);
  return ext == "tif" || ext == "tiff";
}

bool ArrayReadsImageKey(std::string_view key) {
  return IsTiffKey(key) || LastExtension(key) == "png";
}

FieldKind ConventionalFieldKind(std::string_view key) {
  const std::string ext = LastExtension(key);
  if (ext == "jpg" || ext == "jpeg" || ext == "png" || ext == "webp" || ext == "tif" || ext == "tiff" || ext == "ppm" ||
      ext == "pgm" || ext == "bmp")
    return FieldKind::kImage;
  if (ext == "npy") return FieldKind::kArray;
  if (ext == "json") return FieldKind::kJson;
  if (ext == "txt") return FieldKind::kText;
  if (ext == "cls" || ext == "id" || ext == "idx" || ext == "index" || ext == "label") return FieldKind::kInt;
  return FieldKind::kBytes;
}

}  // namespace stoker
