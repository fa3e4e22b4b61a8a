// A build without libtiff: every TIFF is refused, saying why.
#include "codec/tiff.h"

namespace stoker::codec {
namespace {

Status NoTiff() {
  return Status::Unimplemented(
      "a TIFF image: this build of stoker has no TIFF support (build it with libtiff-dev installed)");
}

}  // namespace

bool TiffSupported() {
  return false;
}
Result<ImageSize> TiffSize(std::span<const std::byte>) {
  return NoTiff();
}
Status DecodeTiff(std::span<const std::byte>, std::uint64_t, SourceImage*) {
  return NoTiff();
}
Status DecodeTiffArray(std::span<const std::byte>, std::uint64_t, HostTensor*) {
  return NoTiff();
}

}  // namespace stoker::codec
