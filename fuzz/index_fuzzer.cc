// Fuzzes the index reader: Open() and every record access over arbitrary bytes.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "format/index_format.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  // Copy into 8-aligned memory, as an mmap would be.
  std::vector<std::uint64_t> aligned((size + 7) / 8);
  if (size > 0) std::memcpy(aligned.data(), data, size);
  std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(aligned.data()), size);
  auto view = stoker::index_format::IndexView::Open(bytes, "fuzz.stoker");
  if (!view.ok()) return 0;
  for (std::uint64_t i = 0; i < view->num_samples() && i < 10000; ++i) {
    auto rec = view->record(i);
    if (!rec.ok()) continue;
    for (std::size_t f = 0; f < view->field_names().size(); ++f) (void)rec->field(f);
    volatile char sink = rec->key.empty() ? 0 : rec->key.back();  // the key must be readable
    (void)sink;
  }
  return 0;
}
