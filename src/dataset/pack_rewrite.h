// The seam through which pack changes field payloads on their way into the
// shards (re-encoding images at pack time lives in a layer above: the
// dataset layer does not decode images).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "stoker/fields.h"
#include "stoker/pack.h"
#include "stoker/seekable.h"
#include "stoker/status.h"

namespace stoker::pack_internal {

// The field a rewriter is handed, as pack will store it.
struct PackedField {
  std::string_view sample_key;
  std::string_view name;  // "jpg", "mask.png"
  FieldKind kind;         // what the index will record
};

// What a rewriter did with a payload.
enum class Rewritten : std::uint8_t {
  kUnchanged,
  kReplaced,
  kKeptAsItIs,  // unchanged, and no later rewriter may touch it (a bad image kept on request)
};

class FieldRewriter {
 public:
  virtual ~FieldRewriter() = default;
  // May replace `bytes`, the payload of `field`, and says what it did. It
  // may also give the payload a restart table (a seekable JPEG's, with its
  // geometry, recorded in the index; `restarts` arrives empty).
  // Called from pack's reader threads at once. Errors name what is wrong
  // with the payload (pack adds the sample, its origin and the field).
  [[nodiscard]] virtual Result<Rewritten> Rewrite(const PackedField& field, std::vector<std::byte>& bytes,
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
