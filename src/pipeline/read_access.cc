#include "pipeline/read_access.h"

#include <fmt/format.h>

#include "stoker/byte_size.h"

namespace stoker::pipeline {

ReadAccessChoice ChooseReadAccess(KernelReadahead option, Order order, bool shard_files, std::uint64_t shard_bytes,
                                  const std::optional<io::PageCacheRoom>& room, std::uint64_t loader_bytes) {
  ReadAccessChoice choice;
  if (!shard_files) return choice;
  switch (option) {
    case KernelReadahead::kOn:
      choice.note = "kernel read-ahead on for the shards (kernel_readahead=on)";
      return choice;
    case KernelReadahead::kOff:
      choice.pattern = AccessPattern::kRandom;
      choice.note = "kernel read-ahead off for the shards (kernel_readahead=off)";
      return choice;
    case KernelReadahead::kAuto:
      break;
  }
  if (order != Order::kShuffle) {
    choice.note = "kernel read-ahead on for the shards: this order reads them shard by shard";
    return choice;
  }
  if (!room) {
    choice.note = "kernel read-ahead on for the shards: the page cache's room is unknown";
    return choice;
  }
  const std::uint64_t room_bytes = room->bytes > loader_bytes ? room->bytes - loader_bytes : 0;
  const std::string why =
      fmt::format("{}: {}{}", FormatBytes(room_bytes), room->limited_by,
                  loader_bytes ? fmt::format(", less {} of batch buffers", FormatBytes(loader_bytes)) : std::string());
  if (shard_bytes <= room_bytes) {
    choice.note = fmt::format("kernel read-ahead on for the shards: they ({}) fit the page cache ({})",
                              FormatBytes(shard_bytes), why);
    return choice;
  }
  choice.pattern = AccessPattern::kRandom;
  choice.note = fmt::format(
      "kernel read-ahead off for the shards: a global shuffle over {} of shards, more than the page cache can hold "
      "({}), reads each sample where it lies; what the kernel read ahead would be evicted before use",
      FormatBytes(shard_bytes), why);
  return choice;
}

}  // namespace stoker::pipeline
