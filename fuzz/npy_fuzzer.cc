// Fuzzes the .npy parser: magic, version, header length, the header's
// dictionary literal, dtype strings, shapes whose product overflows, data
// whose size disagrees with the header, Fortran-order copies.
#include <cstddef>
#include <cstdint>
#include <span>

#include "stoker/decode.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  (void)stoker::DecodeNpy(std::span<const std::byte>(reinterpret_cast<const std::byte*>(data), size));
  return 0;
}
