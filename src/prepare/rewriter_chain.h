// Several pack-time rewriters as one (the FieldRewriter seam takes one):
// each runs on what the one before it left.
#pragma once

#include <string>
#include <vector>

#include "dataset/pack_rewrite.h"

namespace stoker::prepare {

// Holds pointers: the rewriters (none null) must outlive the chain.
class RewriterChain final : public pack_internal::FieldRewriter {
 public:
  explicit RewriterChain(std::vector<const pack_internal::FieldRewriter*> rewriters)
      : rewriters_(std::move(rewriters)) {}

  // kReplaced when any rewriter replaced the bytes; the first error, or a
  // rewriter's kKeptAsItIs, ends the chain there.
  [[nodiscard]] Result<pack_internal::Rewritten> Rewrite(const pack_internal::PackedField& field,
                                                         std::vector<std::byte>& bytes,
                                                         SeekableTable& restarts) const override;
  // The rewriters' notes (JSON objects) merged into one object, a later
  // rewriter's entry replacing an earlier one's of the same name; empty when
  // none has a note.
  [[nodiscard]] std::string Note() const override;
  // Each rewriter's, in order.
  void Report(PackSummary& summary) const override;

 private:
  std::vector<const pack_internal::FieldRewriter*> rewriters_;
};

}  // namespace stoker::prepare
