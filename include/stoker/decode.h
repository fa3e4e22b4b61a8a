// stoker/decode.h: one field's bytes to values, as the loader decodes them.
// For tests, tools, and code that reads a sample on its own.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "stoker/status.h"
#include "stoker/tensor.h"

namespace stoker {

// PIL's limit (2 x Image.MAX_IMAGE_PIXELS), as TransformOptions::max_pixels.
inline constexpr std::uint64_t kDefaultMaxImagePixels = 178'956'970;

// A JPEG, PNG, WebP or TIFF (told by its first bytes; a TIFF's first page)
// decoded whole to `mode`, with exactly the pixels of Pillow's
// `Image.open(f).convert(mode)`: "RGB", "L", "RGBA" (uint8, shape
// [H, W, C]) or "I;16" (uint16 [H, W, 1], for grayscale images; 16-bit
// PNGs and TIFFs keep all their bits). EXIF orientation is not applied
// (neither does Image.open). Corruption for a damaged image or one of more
// than `max_pixels` pixels (0: no limit), checked before decoding;
// Unimplemented for another format (GIF, BMP, animated WebP) or a TIFF of
// samples Pillow has no such mode for (float, signed, CMYK, premultiplied
// alpha); InvalidArgument for an unknown mode.
[[nodiscard]] Result<HostTensor> DecodeImage(std::span<const std::byte> data, std::string_view mode = "RGB",
                                             std::uint64_t max_pixels = kDefaultMaxImagePixels);

// What pack and DatasetWriter check of every image field: not empty, a
// format stoker decodes told by its first bytes (JPEG, PNG, WebP, TIFF,
// PGM/PPM, BMP), a header that reads. Corruption naming what is wrong, or
// Unimplemented for a format stoker does not decode (GIF, ...). Reads the
// header only: damage past it shows when the pixels are decoded.
[[nodiscard]] Status CheckImageHeader(std::span<const std::byte> data);

// The field extension an image of a format stoker decodes is stored under,
// told by its first bytes as CheckImageHeader tells it: "jpg", "png",
// "webp", "tif", "pgm" or "ppm" (binary Netpbm), "bmp"; empty for anything
// else. What pack names an image whose file or column says nothing of it.
[[nodiscard]] std::string_view ImageFieldExtension(std::span<const std::byte> data);

// A NumPy .npy array (format 1.0-3.0; bool, int, uint and float dtypes in
// either byte order, C or Fortran order) in C order and host byte order.
// Corruption for a malformed header or data of another size than the
// header says; Unimplemented for object (pickled), structured, complex,
// string and datetime arrays.
[[nodiscard]] Result<HostTensor> DecodeNpy(std::span<const std::byte> data);

// What a stoker.Array field decodes: an .npy as DecodeNpy does, or a TIFF
// (told by its first bytes) as its samples are stored, as tifffile.imread
// gives them: 8- to 64-bit unsigned, signed or float samples, any number a
// pixel; shape [H, W], [H, W, S] contiguous or [S, H, W] planar, with a
// leading page axis for several full-resolution pages of one shape
// (overviews and masks skipped). A TIFF's pixels over all pages may be at
// most `max_pixels` (0: no limit) and its decoded bytes 4 x max_pixels.
// Corruption for damaged data; Unimplemented, by name, for samples it does
// not load (1- to 4-bit, complex, subsampled YCbCr). A PNG gives its samples
// as stored too: [H, W] gray or palette indices, [H, W, 2|3|4] with alpha
// or colour, uint16 at 16 bits (a depth map), 1- to 4-bit values unscaled.
[[nodiscard]] Result<HostTensor> DecodeArray(std::span<const std::byte> data,
                                             std::uint64_t max_pixels = kDefaultMaxImagePixels);

}  // namespace stoker
