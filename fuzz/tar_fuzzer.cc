// Fuzzes the tar reader and WebDataset grouping over arbitrary bytes.
#include <cstddef>
#include <cstdint>
#include <span>

#include "format/tar.h"
#include "format/webdataset.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  stoker::tar::Reader reader(bytes, "fuzz.tar");
  for (int i = 0; i < 100000; ++i) {
    auto next = reader.Next();
    if (!next.ok() || !next->has_value()) break;
    const auto& m = **next;
    // Every member returned must lie inside the archive.
    if (m.data_offset > size || m.size > size - m.data_offset) __builtin_trap();
  }
  (void)stoker::wds::ForEachSample(
      bytes, "fuzz.tar", [](const stoker::wds::TarSample&) { return stoker::Status::Ok(); },
      [size](const stoker::wds::SkippedMember& m) {
        if (m.header_offset >= size) __builtin_trap();  // a skipped member lies inside the archive too
      });
  return 0;
}
