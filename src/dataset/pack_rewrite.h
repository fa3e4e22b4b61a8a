// The seam through which pack changes field payloads on their way into the
// shards (re-encoding images at pack time lives in a layer above: the
// dataset layer does not decode images).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "stoker/pack.h"
#include "stoker/seekable.h"
#include "stoker/status.h"

namespace stoker::pack_internal {

class FieldRewriter {
 public:
  virtual ~FieldRewriter() = default;
  // May replace `bytes`, the payload of field `field` of sample `key`;
  // returns whether it did. It may also give the payload a restart table
  // (a seekable JPEG's, with its geometry, recorded in the index; `restarts`
  // arrives empty).
  // Called from pack's reader threads at once. Errors name what is wrong
  // with the payload (pack adds the sample).
  [[nodiscard]] virtual Result<bool> Rewrite(std::string_view field, std::vector<std::byte>& bytes,
                                             SeekableTable& restarts) const = 0;
  // After the pack: what was done, as JSON for the index's note, and the
  // figures for the summary.
  [[nodiscard]] virtual std::string Note() const = 0;
  virtual void Report(PackSummary& summary) const = 0;
};

// Pack() with a rewriter (nullptr: none).
[[nodiscard]] Result<PackSummary> PackWith(const std::string& source, const std::string& out_dir,
                                           const PackOptions& options, const FieldRewriter* rewriter);

}  // namespace stoker::pack_internal
