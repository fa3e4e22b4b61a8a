// Any image a field may hold (JPEG, PNG, WebP, TIFF, PGM/PPM, BMP), told apart by its first
// bytes, decoded whole and converted to the mode asked for. The loader's
// crop-and-resize path keeps its own JPEG decoder (region of interest, DCT
// scaling); this is the path for images handed over at their own size and
// for the formats that have no region-of-interest decoding.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

#include "codec/jpeg.h"
#include "codec/pixels.h"
#include "stoker/status.h"
#include "stoker/tensor.h"

namespace stoker::codec {

enum class ImageFormat : std::uint8_t { kJpeg, kPng, kWebp, kTiff, kNetpbm, kBmp };
[[nodiscard]] std::optional<ImageFormat> DetectImageFormat(std::span<const std::byte> data);
[[nodiscard]] std::string_view ImageFormatName(ImageFormat format);
// The field extension WebDataset's convention gives such a file: jpg, png,
// webp, tif, pgm (P5) or ppm (P6), bmp; empty when DetectImageFormat knows
// none.
[[nodiscard]] std::string_view ImageFieldExtension(std::span<const std::byte> data);

// Width and height from the header. Corruption when it is none of the
// these; Unimplemented, naming it, for another known format (GIF, ...).
[[nodiscard]] Result<ImageSize> ImageFileSize(std::span<const std::byte> data);

// What an image must pass before anything decodes it (stoker/decode.h's
// CheckImageHeader): not empty, a format told by its first bytes, a header
// that reads (ImageFileSize).
[[nodiscard]] Status CheckImageHeader(std::span<const std::byte> data);

// Decodes as the format's own codec does (pixels.h: in the mode Pillow
// opens it in). Errors as DecodePng / DecodeWebp / DecodeTiff / DecodeNetpbm / DecodeBmp /
// DecodeJpeg.
[[nodiscard]] Status DecodeImageFile(std::span<const std::byte> data, std::uint64_t max_pixels, SourceImage* out);

// DecodeImageFile then ConvertToMode.
[[nodiscard]] Status DecodeImageAs(std::span<const std::byte> data, ColorMode mode, std::uint64_t max_pixels,
                                   SourceImage* scratch, Pixels* out);
// DecodeImageAs into a uint8 (uint16 for I;16) [H, W, C] tensor; the
// scratch buffers are reused across calls.
[[nodiscard]] Status DecodeImageTensor(std::span<const std::byte> data, ColorMode mode, std::uint64_t max_pixels,
                                       SourceImage* source, Pixels* pixels, HostTensor* out);

}  // namespace stoker::codec
