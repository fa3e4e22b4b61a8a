#include "codec/image_decode.h"

#include <cstring>

#include <fmt/format.h>

#include "codec/bmp.h"
#include "codec/netpbm.h"
#include "codec/png.h"
#include "codec/tiff.h"
#include "codec/webp.h"

namespace stoker::codec {

std::optional<ImageFormat> DetectImageFormat(std::span<const std::byte> data) {
  const auto* b = reinterpret_cast<const unsigned char*>(data.data());
  if (data.size() >= 3 && b[0] == 0xFF && b[1] == 0xD8 && b[2] == 0xFF) return ImageFormat::kJpeg;
  if (data.size() >= 8 && std::memcmp(b, "\x89PNG\r\n\x1a\n", 8) == 0) return ImageFormat::kPng;
  if (data.size() >= 12 && std::memcmp(b, "RIFF", 4) == 0 && std::memcmp(b + 8, "WEBP", 4) == 0)
    return ImageFormat::kWebp;
  if (data.size() >= 4 && (std::memcmp(b, "II*\0", 4) == 0 || std::memcmp(b, "MM\0*", 4) == 0 ||
                           std::memcmp(b, "II+\0", 4) == 0 || std::memcmp(b, "MM\0+", 4) == 0))  // BigTIFF too
    return ImageFormat::kTiff;
  if (IsNetpbm(data)) return ImageFormat::kNetpbm;
  if (IsBmp(data)) return ImageFormat::kBmp;
  return std::nullopt;
}

std::string_view ImageFormatName(ImageFormat format) {
  switch (format) {
    case ImageFormat::kJpeg:
      return "JPEG";
    case ImageFormat::kPng:
      return "PNG";
    case ImageFormat::kWebp:
      return "WebP";
    case ImageFormat::kTiff:
      return "TIFF";
    case ImageFormat::kNetpbm:
      return "PGM/PPM";
    case ImageFormat::kBmp:
      return "BMP";
  }
  return "?";
}

namespace {

Status Unknown(std::span<const std::byte> data) {
  if (auto other = OtherImageFormat(data))
    return Status::Unimplemented(fmt::format(
        "a {} image: stoker decodes JPEG, PNG, WebP, TIFF, PGM, PPM and BMP (convert it before packing)", *other));
  if (data.size() >= 2 && data[0] == std::byte{'P'} && data[1] >= std::byte{'1'} && data[1] <= std::byte{'4'})
    return NetpbmSize(data).status();  // a plain or bitmap Netpbm form, named
  return Status::Corruption("not an image: neither JPEG, PNG, WebP, TIFF, PGM, PPM nor BMP by its first bytes");
}

}  // namespace

std::string_view ImageFieldExtension(std::span<const std::byte> data) {
  const auto format = DetectImageFormat(data);
  if (!format) return {};
  switch (*format) {
    case ImageFormat::kJpeg:
      return "jpg";
    case ImageFormat::kPng:
      return "png";
    case ImageFormat::kWebp:
      return "webp";
    case ImageFormat::kTiff:
      return "tif";
    case ImageFormat::kNetpbm:  // IsNetpbm: "P5" or "P6"
      return data[1] == std::byte{'5'} ? "pgm" : "ppm";
    case ImageFormat::kBmp:
      return "bmp";
  }
  return {};
}

Result<ImageSize> ImageFileSize(std::span<const std::byte> data) {
  const auto format = DetectImageFormat(data);
  if (!format) return Unknown(data);
  switch (*format) {
    case ImageFormat::kJpeg:
      return JpegSize(data);
    case ImageFormat::kPng:
      return PngSize(data);
    case ImageFormat::kWebp:
      return WebpSize(data);
    case ImageFormat::kTiff:
      return TiffSize(data);
    case ImageFormat::kNetpbm:
      return NetpbmSize(data);
    case ImageFormat::kBmp:
      return BmpSize(data);
  }
  return Status::Internal("unreachable");
}

Status CheckImageHeader(std::span<const std::byte> data) {
  if (data.empty()) return Status::Corruption("0 bytes, not an image");
  return ImageFileSize(data).status();
}

Status DecodeImageFile(std::span<const std::byte> data, std::uint64_t max_pixels, SourceImage* out) {
  const auto format = DetectImageFormat(data);
  if (!format) return Unknown(data);
  switch (*format) {
    case ImageFormat::kPng:
      return DecodePng(data, max_pixels, out);
    case ImageFormat::kWebp:
      return DecodeWebp(data, max_pixels, out);
    case ImageFormat::kTiff:
      return DecodeTiff(data, max_pixels, out);
    case ImageFormat::kNetpbm:
      return DecodeNetpbm(data, max_pixels, out);
    case ImageFormat::kBmp:
      return DecodeBmp(data, max_pixels, out);
    case ImageFormat::kJpeg: {
      auto size = JpegSize(data);
      if (!size.ok()) return size.status();
      STOKER_RETURN_IF_ERROR(CheckPixelLimit("JPEG", static_cast<std::uint64_t>(size->width),
                                             static_cast<std::uint64_t>(size->height), max_pixels));
      DecodedRegion region;
      region.pixels.swap(out->data);  // reuse the buffer
      Status s = DecodeJpeg(data, Roi{}, 1, region);
      out->data.swap(region.pixels);
      if (!s.ok()) return s;
      out->mode = SourceMode::kRGB;
      out->width = region.width;
      out->height = region.height;
      out->transparency = {};
      out->format = "JPEG";
      return Status::Ok();
    }
  }
  return Status::Internal("unreachable");
}

Status DecodeImageAs(std::span<const std::byte> data, ColorMode mode, std::uint64_t max_pixels, SourceImage* scratch,
                     Pixels* out) {
  if (Status s = DecodeImageFile(data, max_pixels, scratch); !s.ok()) return s;
  return ConvertToMode(*scratch, mode, out);
}

Status DecodeImageTensor(std::span<const std::byte> data, ColorMode mode, std::uint64_t max_pixels, SourceImage* source,
                         Pixels* pixels, HostTensor* out) {
  STOKER_RETURN_IF_ERROR(DecodeImageAs(data, mode, max_pixels, source, pixels));
  out->type = pixels->bytes_per_channel == 2 ? ElementType::kUInt16 : ElementType::kUInt8;
  out->shape = {pixels->height, pixels->width, pixels->channels};
  out->data.resize(pixels->data.size());
  std::memcpy(out->data.data(), pixels->data.data(), pixels->data.size());
  return Status::Ok();
}

}  // namespace stoker::codec
