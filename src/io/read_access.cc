#include "io/read_access.h"

#include <fmt/format.h>

#include "stoker/byte_size.h"

namespace stoker::io {

ReadAccessChoice ChooseReadAccess(KernelReadahead option, bool random_reads, std::string_view ordered_reason,
                                  bool applies, std::string_view what, std::uint64_t bytes,
                                  const std::optional<PageCacheRoom>& room, std::uint64_t reader_bytes) {
  ReadAccessChoice choice;
  if (!applies) return choice;
  switch (option) {
    case KernelReadahead::kOn:
      choice.note = fmt::format("kernel read-ahead on for the {} (kernel_readahead=on)", what);
      return choice;
    case KernelReadahead::kOff:
      choice.pattern = AccessPattern::kRandom;
      choice.note = fmt::format("kernel read-ahead off for the {} (kernel_readahead=off)", what);
      return choice;
    case KernelReadahead::kAuto:
      break;
  }
  if (!random_reads) {
    choice.note = fmt::format("kernel read-ahead on for the {}: {}", what, ordered_reason);
    return choice;
  }
  if (!room) {
    choice.note = fmt::format("kernel read-ahead on for the {}: the page cache's room is unknown", what);
    return choice;
  }
  const std::uint64_t room_bytes = room->bytes > reader_bytes ? room->bytes - reader_bytes : 0;
  const std::string why =
      fmt::format("{}: {}{}", FormatBytes(room_bytes), room->limited_by,
                  reader_bytes ? fmt::format(", less {} of batch buffers", FormatBytes(reader_bytes)) : std::string());
  if (bytes <= room_bytes) {
    choice.note = fmt::format("kernel read-ahead on for the {}: they ({}) fit the page cache ({})", what,
                              FormatBytes(bytes), why);
    return choice;
  }
  choice.pattern = AccessPattern::kRandom;
  choice.note = fmt::format(
      "kernel read-ahead off for the {}: a global shuffle over {} of {}, more than the page cache can hold ({}), "
      "reads at random places, and what the kernel read ahead around them would be evicted before use",
      what, FormatBytes(bytes), what, why);
  return choice;
}

}  // namespace stoker::io
