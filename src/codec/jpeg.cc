#include "codec/jpeg.h"

#include <algorithm>
#include <csetjmp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string_view>

#include <fmt/format.h>

#include "codec/jpeg_huffman.h"
#include "codec/jpeg_internal.h"

namespace stoker::codec {
namespace {

using jpeg_internal::Compressor;
using jpeg_internal::Decompressor;
using jpeg_internal::ErrorManager;
using jpeg_internal::FastHuffmanDecoder;

// Adobe CMYK JPEGs store inverted values.
void CmykToRgb(const std::uint8_t* cmyk, std::uint8_t* rgb, int width) {
  for (int x = 0; x < width; ++x) {
    const unsigned k = cmyk[4 * x + 3];
    rgb[3 * x + 0] = static_cast<std::uint8_t>(cmyk[4 * x + 0] * k / 255);
    rgb[3 * x + 1] = static_cast<std::uint8_t>(cmyk[4 * x + 1] * k / 255);
    rgb[3 * x + 2] = static_cast<std::uint8_t>(cmyk[4 * x + 2] * k / 255);
  }
}

// The body that runs under setjmp; returns false with err->message set.
// `fast`, when given, takes libjpeg's place as the Huffman decoder where it
// can (`installed` says whether it did).
bool DecodeImpl(jpeg_decompress_struct* cinfo, ErrorManager* err, std::span<const std::byte> jpeg, Roi roi, int scale,
                DecodedRegion* out, std::vector<std::uint8_t>* cmyk_row, FastHuffmanDecoder* fast, bool* installed) {
  if (setjmp(err->jump)) return false;
  jpeg_mem_src(cinfo, reinterpret_cast<const unsigned char*>(jpeg.data()), static_cast<unsigned long>(jpeg.size()));
  jpeg_read_header(cinfo, TRUE);
  const bool cmyk = cinfo->jpeg_color_space == JCS_CMYK || cinfo->jpeg_color_space == JCS_YCCK;
  cinfo->out_color_space = cmyk ? JCS_CMYK : JCS_RGB;
  cinfo->scale_num = 1;
  cinfo->scale_denom = static_cast<unsigned>(scale);
  cinfo->dct_method = JDCT_ISLOW;
  out->full = {static_cast<int>(cinfo->image_width), static_cast<int>(cinfo->image_height)};
  jpeg_start_decompress(cinfo);
  if (fast != nullptr) *installed = fast->Install(cinfo);
  const int w = static_cast<int>(cinfo->output_width), h = static_cast<int>(cinfo->output_height);
  if (roi.width <= 0 || roi.height <= 0) roi = {0, 0, out->full.width, out->full.height};
  // The requested box in scaled coordinates, rounded outwards.
  int x0 = std::clamp(roi.x / scale, 0, w);
  int y0 = std::clamp(roi.y / scale, 0, h);
  int x1 = std::clamp((roi.x + roi.width + scale - 1) / scale, x0, w);
  int y1 = std::clamp((roi.y + roi.height + scale - 1) / scale, y0, h);
  JDIMENSION xoff = static_cast<JDIMENSION>(x0), cw = static_cast<JDIMENSION>(x1 - x0);
  if (cw == 0 || y1 == y0) {
    std::snprintf(err->message, sizeof(err->message), "empty region of interest");
    jpeg_abort_decompress(cinfo);
    return false;
  }
  if (cw < static_cast<JDIMENSION>(w)) jpeg_crop_scanline(cinfo, &xoff, &cw);  // widens to iMCU bounds
  out->width = static_cast<int>(cw);
  out->height = y1 - y0;
  out->origin_x = static_cast<int>(xoff) * scale;
  out->origin_y = y0 * scale;
  out->scale = scale;
  out->pixels.resize(static_cast<std::size_t>(out->width) * out->height * 3);
  if (y0 > 0) jpeg_skip_scanlines(cinfo, static_cast<JDIMENSION>(y0));
  if (cmyk) cmyk_row->resize(static_cast<std::size_t>(out->width) * 4);
  for (int row = 0; row < out->height; ++row) {
    std::uint8_t* dst = out->pixels.data() + static_cast<std::size_t>(row) * out->width * 3;
    JSAMPROW line = cmyk ? cmyk_row->data() : dst;
    if (jpeg_read_scanlines(cinfo, &line, 1) != 1) {
      std::snprintf(err->message, sizeof(err->message), "decoder returned no row %d", y0 + row);
      jpeg_abort_decompress(cinfo);
      return false;
    }
    if (cmyk) CmykToRgb(cmyk_row->data(), dst, out->width);
  }
  // Rows below the region are not decoded.
  jpeg_abort_decompress(cinfo);
  return true;
}

}  // namespace

std::optional<std::string_view> OtherImageFormat(std::span<const std::byte> data) {
  auto starts = [&](std::string_view magic, std::size_t at = 0) {
    return data.size() >= at + magic.size() && std::memcmp(data.data() + at, magic.data(), magic.size()) == 0;
  };
  if (starts("\x89PNG\r\n\x1a\n")) return "PNG";
  if (starts("RIFF") && starts("WEBP", 8)) return "WebP";
  if (starts("GIF87a") || starts("GIF89a")) return "GIF";
  if (starts("BM")) return "BMP";
  if (starts(std::string_view("II*\0", 4)) || starts(std::string_view("MM\0*", 4))) return "TIFF";
  if (starts("P5") || starts("P6")) return "PGM/PPM";
  return std::nullopt;
}

Result<ImageSize> JpegSize(std::span<const std::byte> jpeg) {
  if (auto format = OtherImageFormat(jpeg))
    return Status::Unimplemented(fmt::format(
        "a {} image, not a JPEG: stoker's loader decodes JPEG, PNG, WebP, TIFF, PGM, PPM and BMP (convert the "
        "images before packing)",
        *format));
  Decompressor d;
  if (!d.created) return d.CreationError();
  if (setjmp(d.err.jump)) return Status::Corruption(fmt::format("not a decodable JPEG: {}", d.err.message));
  jpeg_mem_src(&d.cinfo, reinterpret_cast<const unsigned char*>(jpeg.data()), static_cast<unsigned long>(jpeg.size()));
  jpeg_read_header(&d.cinfo, TRUE);
  return ImageSize{static_cast<int>(d.cinfo.image_width), static_cast<int>(d.cinfo.image_height)};
}

Status DecodeJpeg(std::span<const std::byte> jpeg, Roi roi, int scale, DecodedRegion& out) {
  return jpeg_internal::DecodeJpegUsing(jpeg, roi, scale, out, !jpeg_internal::FastHuffmanDisabled());
}

Status jpeg_internal::DecodeJpegUsing(std::span<const std::byte> jpeg, Roi roi, int scale, DecodedRegion& out,
                                      bool fast_huffman, bool* fast_decoded) {
  if (fast_decoded != nullptr) *fast_decoded = false;
  if (scale != 1 && scale != 2 && scale != 4 && scale != 8)
    return Status::InvalidArgument(fmt::format("JPEG scale 1/{} is not supported (1, 2, 4 or 8)", scale));
  if (jpeg.empty()) return Status::Corruption("not a decodable JPEG: empty data");
  std::vector<std::uint8_t> cmyk_row;
  if (fast_huffman) {
    FastHuffmanDecoder* fast = &jpeg_internal::ThreadFastHuffmanDecoder();
    Decompressor d;
    if (!d.created) return d.CreationError();
    bool installed = false;
    if (DecodeImpl(&d.cinfo, &d.err, jpeg, roi, scale, &out, &cmyk_row, fast, &installed)) {
      if (fast_decoded != nullptr) *fast_decoded = installed;
      return Status::Ok();
    }
    // Data the fast decoder took and then gave up on: libjpeg's own decoder
    // decides. Any other failure (a bad header, before it was installed) is
    // libjpeg's already.
    if (!installed || !fast->gave_up())
      return Status::Corruption(fmt::format("not a decodable JPEG: {}", d.err.message));
  }
  Decompressor d;
  if (!d.created) return d.CreationError();
  if (!DecodeImpl(&d.cinfo, &d.err, jpeg, roi, scale, &out, &cmyk_row, nullptr, nullptr))
    return Status::Corruption(fmt::format("not a decodable JPEG: {}", d.err.message));
  return Status::Ok();
}

namespace {

bool EncodeImpl(Compressor* c, const std::uint8_t* rgb, int width, int height, int quality) {
  if (setjmp(c->err.jump)) return false;
  jpeg_mem_dest(&c->cinfo, &c->buffer, &c->size);
  c->cinfo.image_width = static_cast<JDIMENSION>(width);
  c->cinfo.image_height = static_cast<JDIMENSION>(height);
  c->cinfo.input_components = 3;
  c->cinfo.in_color_space = JCS_RGB;
  jpeg_set_defaults(&c->cinfo);  // YCbCr, 2x2 luma sampling (4:2:0)
  jpeg_set_quality(&c->cinfo, quality, TRUE);
  c->cinfo.dct_method = JDCT_ISLOW;
  c->cinfo.optimize_coding = TRUE;
  jpeg_start_compress(&c->cinfo, TRUE);
  while (c->cinfo.next_scanline < c->cinfo.image_height) {
    JSAMPROW row = const_cast<JSAMPROW>(rgb + std::size_t{c->cinfo.next_scanline} * width * 3);
    jpeg_write_scanlines(&c->cinfo, &row, 1);
  }
  jpeg_finish_compress(&c->cinfo);
  return true;
}

}  // namespace

Result<std::vector<std::byte>> EncodeJpegRgb(const std::uint8_t* rgb, int width, int height, int quality) {
  if (width <= 0 || height <= 0 || width > 65500 || height > 65500)
    return Status::InvalidArgument(fmt::format("cannot encode a {}x{} JPEG (1 to 65500 pixels a side)", width, height));
  if (quality < 1 || quality > 100)
    return Status::InvalidArgument(fmt::format("JPEG quality {} is outside 1-100", quality));
  Compressor c;
  if (!c.created) return Status::Internal(fmt::format("libjpeg could not be initialised: {}", c.err.message));
  if (!EncodeImpl(&c, rgb, width, height, quality))
    return Status::Internal(fmt::format("JPEG encoding failed: {}", c.err.message));
  const auto* begin = reinterpret_cast<const std::byte*>(c.buffer);
  return std::vector<std::byte>(begin, begin + c.size);
}

}  // namespace stoker::codec
