// Fuzzes the checkpoint manifest decoder: whatever it accepts must encode and
// decode again to the same content (the user document, cut out of the text
// without a parse, verbatim).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "checkpoint/manifest.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto manifest = stoker::checkpoint::DecodeManifest(text, "fuzz/manifest.json");
  if (!manifest.ok()) return 0;
  auto encoded = stoker::checkpoint::EncodeManifest(*manifest);
  if (!encoded.ok()) return 0;  // e.g. strings that are not valid UTF-8
  auto again = stoker::checkpoint::DecodeManifest(*encoded, "re-encoded");
  if (!again.ok() || again->step != manifest->step || again->files.size() != manifest->files.size() ||
      again->extras.metadata != manifest->extras.metadata || again->extras.rng_states != manifest->extras.rng_states ||
      again->extras.user_json != manifest->extras.user_json)
    std::abort();
  return 0;
}
