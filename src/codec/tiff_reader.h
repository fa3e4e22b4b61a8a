// libtiff over bytes in memory, shared by the image decoder (tiff.cc) and
// the array decoder (tiff_array.cc): a client "file" that maps the bytes,
// errors collected rather than printed, allocations bounded, and the raw
// samples of one directory read as stored.
#pragma once

#include <tiffio.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "stoker/status.h"

namespace stoker::codec::tiff_internal {

// The bytes libtiff reads (kept alive by the caller while the handle is).
struct Source {
  std::span<const std::byte> data;
  toff_t at = 0;
  std::string error;  // libtiff's first error message for this file
};

struct CloseTiff {
  void operator()(TIFF* t) const { TIFFClose(t); }
};
using TiffHandle = std::unique_ptr<TIFF, CloseTiff>;

// Opens `source` with errors collected into it; no single allocation of
// libtiff's over `max_alloc` bytes (a header's claims are checked against
// it before they are believed). Corruption when it does not open.
[[nodiscard]] Result<TiffHandle> Open(Source& source, tmsize_t max_alloc);

// A tag's value, or libtiff's default for it, or `fallback`.
template <typename T>
T Tag(TIFF* tif, ttag_t tag, T fallback) {
  T value = fallback;
  if (TIFFGetFieldDefaulted(tif, tag, &value) != 1) return fallback;
  return value;
}

// SampleFormat's meaning, for messages: "unsigned", "signed",
// "floating-point", "untyped (void)", "complex" or "complex floating-point".
[[nodiscard]] std::string_view SampleFormatName(std::uint16_t format);

// Corruption: "TIFF: <what> (<libtiff's message>)".
[[nodiscard]] Status Damaged(const Source& source, std::string_view what);

// The current directory's samples as stored, unpacked by libtiff's codec
// (in host byte order): `planes` planes (1 when contiguous) of `height` rows
// of `row_bytes` each, a pixel taking `pixel_bits` of a plane's row, written
// to `out` (planes * height * row_bytes bytes, every one written).
[[nodiscard]] Status ReadRaw(TIFF* tif, const Source& source, std::uint32_t width, std::uint32_t height,
                             std::uint16_t planes, std::size_t row_bytes, std::size_t pixel_bits, std::uint8_t* out);

}  // namespace stoker::codec::tiff_internal
