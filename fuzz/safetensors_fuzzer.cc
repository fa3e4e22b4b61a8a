// Fuzzes the strict safetensors parser. A file it accepts must satisfy the
// format's invariants, and its header must re-encode into a file that parses
// to the same tensors.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "checkpoint/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  auto bytes = std::as_bytes(std::span(data, size));
  auto parsed = stoker::safetensors::Parse(bytes, "fuzz.safetensors");
  if (!parsed.ok()) return 0;
  std::uint64_t covered = 0;
  for (const auto& t : parsed->tensors) {
    if (t.begin != covered) std::abort();  // contiguous, no holes or overlaps
    auto need = stoker::safetensors::TensorBytes(t.dtype, t.shape);
    if (!need.ok() || *need != t.end - t.begin) std::abort();
    covered = t.end;
  }
  if (parsed->data_offset + covered != size) std::abort();
  auto header = stoker::safetensors::EncodeHeader(parsed->tensors, parsed->metadata);
  if (!header.ok()) return 0;  // e.g. a tensor name that is not valid UTF-8
  std::string again = *header;
  again.append(reinterpret_cast<const char*>(data) + parsed->data_offset, size - parsed->data_offset);
  auto reparsed = stoker::safetensors::Parse(std::as_bytes(std::span(again)), "re-encoded");
  if (!reparsed.ok() || reparsed->tensors.size() != parsed->tensors.size() || reparsed->metadata != parsed->metadata)
    std::abort();
  return 0;
}
