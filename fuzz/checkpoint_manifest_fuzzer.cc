// Fuzzes the checkpoint manifest decoders: whatever DecodeManifest accepts
// must encode and decode again to the same content (the user document and a
// sharded checkpoint's "sharded" member, cut out of the text without a
// parse, verbatim); a "sharded" member the layout decoder accepts (its
// pieces tiling every tensor) must round-trip too; and a rank's part
// manifest decodes or fails cleanly.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "checkpoint/manifest.h"
#include "checkpoint/sharded_manifest.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  (void)stoker::checkpoint::DecodeRankPart(text, "fuzz/rank-00000.json");
  auto manifest = stoker::checkpoint::DecodeManifest(text, "fuzz/manifest.json");
  if (!manifest.ok()) return 0;
  if (!manifest->sharded_json.empty()) {
    auto layout = stoker::checkpoint::DecodeShardedLayout(manifest->sharded_json, "fuzz/manifest.json");
    if (layout.ok()) {
      auto relayout = stoker::checkpoint::DecodeShardedLayout(stoker::checkpoint::EncodeShardedLayout(*layout),
                                                              "re-encoded layout");
      if (!relayout.ok() || relayout->tensors.size() != layout->tensors.size() || relayout->blocks != layout->blocks ||
          relayout->world_size != layout->world_size)
        std::abort();
    }
  }
  auto encoded = stoker::checkpoint::EncodeManifest(*manifest);
  if (!encoded.ok()) return 0;  // e.g. strings that are not valid UTF-8
  auto again = stoker::checkpoint::DecodeManifest(*encoded, "re-encoded");
  if (!again.ok() || again->step != manifest->step || again->files.size() != manifest->files.size() ||
      again->extras.metadata != manifest->extras.metadata || again->extras.rng_states != manifest->extras.rng_states ||
      again->extras.user_json != manifest->extras.user_json || again->sharded_json != manifest->sharded_json)
    std::abort();
  return 0;
}
