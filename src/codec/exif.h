// The EXIF orientation of a JPEG: which way the camera held the picture, so
// that re-encoding can apply it to the pixels (the re-encoded file carries
// no EXIF). A pure parser over untrusted bytes (fuzzed).
#pragma once

#include <span>

namespace stoker::codec {

// 1-8 as TIFF defines it (1: as stored; 6: rotate 90 degrees clockwise to
// view; ...), or 1 when the JPEG has no EXIF block, no orientation tag, or
// an unreadable one: a damaged EXIF block never makes a good image unusable.
// Reads only the markers before the first scan.
[[nodiscard]] int JpegExifOrientation(std::span<const std::byte> jpeg);

}  // namespace stoker::codec
