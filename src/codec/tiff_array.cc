// A TIFF's samples as stored (tiff.h, DecodeTiffArray): what satellite,
// elevation and microscopy data hold, which no image mode can.
#include <cstring>
#include <optional>
#include <string>

#include <fmt/format.h>

#include "codec/tiff.h"
#include "codec/tiff_reader.h"

namespace stoker::codec {
namespace {

using tiff_internal::Damaged;
using tiff_internal::Source;
using tiff_internal::Tag;

// What one page holds; pages stack only when these agree.
struct PageLayout {
  std::uint32_t width = 0, height = 0;
  std::uint16_t samples = 1;  // a pixel
  std::uint16_t planes = 1;   // samples when planar, else 1
  std::uint16_t bits = 8;
  ElementType type = ElementType::kUInt8;

  bool operator==(const PageLayout&) const = default;
  [[nodiscard]] std::string Describe() const {
    return fmt::format("{}x{}, {} {} sample{} a pixel{}", width, height, samples, ElementTypeName(type),
                       samples == 1 ? "" : "s", planes > 1 ? ", planar" : "");
  }
};

Status Refuse(std::string_view what) {
  return Status::Unimplemented(
      fmt::format("TIFF: {}; stoker.Array decodes 8- to 64-bit unsigned, signed and floating-point samples (read "
                  "this one with stoker.Bytes and decode it in map=, e.g. with tifffile)",
                  what));
}

std::optional<ElementType> SampleType(std::uint16_t format, std::uint16_t bits) {
  switch (format) {
    case SAMPLEFORMAT_UINT:
      return bits == 8    ? std::optional(ElementType::kUInt8)
             : bits == 16 ? std::optional(ElementType::kUInt16)
             : bits == 32 ? std::optional(ElementType::kUInt32)
             : bits == 64 ? std::optional(ElementType::kUInt64)
                          : std::nullopt;
    case SAMPLEFORMAT_INT:
      return bits == 8    ? std::optional(ElementType::kInt8)
             : bits == 16 ? std::optional(ElementType::kInt16)
             : bits == 32 ? std::optional(ElementType::kInt32)
             : bits == 64 ? std::optional(ElementType::kInt64)
                          : std::nullopt;
    case SAMPLEFORMAT_IEEEFP:
      return bits == 16   ? std::optional(ElementType::kFloat16)
             : bits == 32 ? std::optional(ElementType::kFloat32)
             : bits == 64 ? std::optional(ElementType::kFloat64)
                          : std::nullopt;
    default:
      return std::nullopt;
  }
}

// The current directory's layout, or why it cannot be an array.
Result<PageLayout> Layout(TIFF* tif, const Source& source) {
  PageLayout page;
  page.width = Tag<std::uint32_t>(tif, TIFFTAG_IMAGEWIDTH, 0);
  page.height = Tag<std::uint32_t>(tif, TIFFTAG_IMAGELENGTH, 0);
  if (page.width == 0 || page.height == 0 || page.width > INT32_MAX || page.height > INT32_MAX)
    return Damaged(source, fmt::format("a size of {}x{}", page.width, page.height));
  page.bits = Tag<std::uint16_t>(tif, TIFFTAG_BITSPERSAMPLE, 1);
  page.samples = Tag<std::uint16_t>(tif, TIFFTAG_SAMPLESPERPIXEL, 1);
  if (page.samples == 0) return Damaged(source, "0 samples a pixel");
  const auto format = Tag<std::uint16_t>(tif, TIFFTAG_SAMPLEFORMAT, SAMPLEFORMAT_UINT);
  const auto planar = Tag<std::uint16_t>(tif, TIFFTAG_PLANARCONFIG, PLANARCONFIG_CONTIG);
  page.planes = planar == PLANARCONFIG_SEPARATE && page.samples > 1 ? page.samples : 1;
  std::uint16_t photometric = PHOTOMETRIC_MINISBLACK;
  TIFFGetField(tif, TIFFTAG_PHOTOMETRIC, &photometric);
  if (photometric == PHOTOMETRIC_YCBCR) {
    if (Tag<std::uint16_t>(tif, TIFFTAG_COMPRESSION, COMPRESSION_NONE) != COMPRESSION_JPEG)
      return Refuse("YCbCr samples outside JPEG compression (subsampled chroma)");
    TIFFSetField(tif, TIFFTAG_JPEGCOLORMODE, JPEGCOLORMODE_RGB);  // as tifffile's JPEG codec gives RGB
  }
  const auto type = SampleType(format, page.bits);
  if (!type) {
    if (page.bits < 8 && format == SAMPLEFORMAT_UINT)
      return Refuse(fmt::format("{}-bit samples (stoker.Image unpacks 1-, 2- and 4-bit grayscale)", page.bits));
    return Refuse(fmt::format("{}-bit {} samples", page.bits, tiff_internal::SampleFormatName(format)));
  }
  page.type = *type;
  return page;
}

}  // namespace

Status DecodeTiffArray(std::span<const std::byte> tiff, std::uint64_t max_pixels, HostTensor* out) {
  Source source{tiff, 0, {}};
  const std::uint64_t max_bytes = max_pixels == 0 ? 0 : 4 * max_pixels;
  // libtiff's own buffers (a compressed strip or tile) are at most what may be decoded.
  const auto max_alloc =
      static_cast<tmsize_t>(max_pixels == 0 ? std::uint64_t{1} << 40 : std::max<std::uint64_t>(64 << 20, max_bytes));
  STOKER_ASSIGN_OR_RETURN(tiff_internal::TiffHandle handle, tiff_internal::Open(source, max_alloc));
  TIFF* tif = handle.get();
  std::optional<PageLayout> first;
  std::uint64_t pages = 0, pixels = 0;
  out->data.clear();
  for (int directory = 0;; ++directory) {
    // Overviews (reduced-resolution copies, as cloud-optimised GeoTIFFs
    // carry) and transparency masks are not the image.
    const auto subfile = Tag<std::uint32_t>(tif, TIFFTAG_SUBFILETYPE, 0);
    if ((subfile & (FILETYPE_REDUCEDIMAGE | FILETYPE_MASK)) == 0) {
      STOKER_ASSIGN_OR_RETURN(PageLayout page, Layout(tif, source));
      if (!first) {
        first = page;
      } else if (!(page == *first)) {
        return Status::Corruption(fmt::format(
            "TIFF: page {} ({}) differs from the first ({}): pages stack only when they agree (read this one with "
            "stoker.Bytes and decode it in map=)",
            pages, page.Describe(), first->Describe()));
      }
      const std::uint64_t page_pixels = std::uint64_t{page.width} * page.height;
      const std::size_t element = ElementSize(page.type);
      const std::uint64_t page_bytes = page_pixels * page.samples * element;
      pixels += page_pixels;
      if (max_pixels != 0 && (pixels > max_pixels || out->data.size() + page_bytes > max_bytes))
        return Status::Corruption(
            fmt::format("TIFF of {}{} is over the limit of {} pixels and {} bytes decoded (a decompression bomb?); "
                        "max_image_pixels raises it",
                        page.Describe(), pages > 0 ? fmt::format(", {} pages so far", pages + 1) : std::string(),
                        max_pixels, max_bytes));
      const std::size_t row_bytes = std::size_t{page.width} * (page.planes == 1 ? page.samples : 1) * element;
      const std::size_t at = out->data.size();
      out->data.resize(at + page_bytes);
      STOKER_RETURN_IF_ERROR(tiff_internal::ReadRaw(tif, source, page.width, page.height, page.planes, row_bytes,
                                                    std::size_t{page.bits} * (page.planes == 1 ? page.samples : 1),
                                                    reinterpret_cast<std::uint8_t*>(out->data.data() + at)));
      ++pages;
    }
    source.error.clear();  // what libtiff said of this page and read on
    if (TIFFReadDirectory(tif) != 1) {
      // The end of the chain, or a directory that does not read.
      if (!source.error.empty()) return Damaged(source, fmt::format("directory {} does not read", directory + 1));
      break;
    }
  }
  if (!first) return Damaged(source, "no full-resolution image (only overviews or masks)");
  out->type = first->type;
  out->shape.clear();
  if (pages > 1) out->shape.push_back(static_cast<std::int64_t>(pages));
  if (first->planes > 1) out->shape.push_back(first->planes);
  out->shape.push_back(first->height);
  out->shape.push_back(first->width);
  if (first->planes == 1 && first->samples > 1) out->shape.push_back(first->samples);
  return Status::Ok();
}

}  // namespace stoker::codec
