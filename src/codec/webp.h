// WebP decoding with libwebp (lossy, lossless, with or without alpha), into
// the mode Pillow opens the file in: RGB, or RGBA when it has alpha.
#pragma once

#include <cstdint>
#include <span>

#include "codec/jpeg.h"
#include "codec/pixels.h"
#include "stoker/status.h"

namespace stoker::codec {

// The header only. Corruption when it is not a WebP.
[[nodiscard]] Result<ImageSize> WebpSize(std::span<const std::byte> webp);

// Decodes a still WebP. Corruption for a damaged or truncated file or more
// than `max_pixels` pixels (0: no limit); Unimplemented for an animation.
[[nodiscard]] Status DecodeWebp(std::span<const std::byte> webp, std::uint64_t max_pixels, SourceImage* out);

}  // namespace stoker::codec
