// Fuzzes the Megatron .idx reader over arbitrary bytes (the .bin's size from
// the first 8 bytes), and reads every sequence and boundary of what opens:
// each must lie inside the .bin the view was checked against.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "format/megatron_index.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace mm = stoker::megatron;
  if (size < 8) return 0;
  std::uint64_t bin_size = 0;
  std::memcpy(&bin_size, data, 8);
  bin_size %= std::uint64_t{1} << 40;
  const std::vector<std::byte> idx(reinterpret_cast<const std::byte*>(data + 8),
                                   reinterpret_cast<const std::byte*>(data + size));
  auto view = mm::IndexView::Open(idx, "fuzz.idx", bin_size);
  if (!view.ok()) return 0;
  const std::uint64_t token = mm::TokenSize(view->token_type());
  std::uint64_t tokens = 0;
  for (std::uint64_t i = 0; i < view->num_sequences(); ++i) {
    const auto length = static_cast<std::uint64_t>(view->length(i));
    const auto pointer = static_cast<std::uint64_t>(view->pointer(i));
    if (pointer + length * token > bin_size) __builtin_trap();
    tokens += length;
  }
  if (tokens != view->total_tokens()) __builtin_trap();
  for (std::uint64_t d = 0; d < view->num_documents(); ++d)
    if (view->boundary(d) > view->boundary(d + 1)) __builtin_trap();
  return 0;
}
