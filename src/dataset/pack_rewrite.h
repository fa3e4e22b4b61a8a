// The seam through which pack changes field payloads on their way into the
// shards (re-encoding images at pack time lives in a layer above: the
// dataset layer does not decode images).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
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

// Reads payloads it may not change (`stoker index`: the shards stay as they
// are). Called from one thread.
class PayloadCheck {
 public:
  virtual ~PayloadCheck() = default;
  // kUnchanged when `bytes` pass, kKeptAsItIs when they fail but are kept as
  // asked; an error naming what is wrong (the caller adds where).
  [[nodiscard]] virtual Result<Rewritten> Check(const PackedField& field, std::span<const std::byte> bytes) const = 0;
  // What was kept, as JSON for the index's note (empty: nothing), and the
  // count and first few named ("<key>, field '<name>': <why>").
  [[nodiscard]] virtual std::string Note() const = 0;
  [[nodiscard]] virtual std::uint64_t kept() const = 0;
  [[nodiscard]] virtual std::vector<std::string> named() const = 0;
};

// Pack() with a rewriter (nullptr: none).
[[nodiscard]] Result<PackSummary> PackWith(const std::string& source, const std::string& out_dir,
                                           const PackOptions& options, const FieldRewriter* rewriter);

}  // namespace stoker::pack_internal
