#include "prepare/rewriter_chain.h"

#include <nlohmann/json.hpp>

namespace stoker::prepare {

Result<pack_internal::Rewritten> RewriterChain::Rewrite(const pack_internal::PackedField& field,
                                                        std::vector<std::byte>& bytes, SeekableTable& restarts) const {
  using pack_internal::Rewritten;
  Rewritten outcome = Rewritten::kUnchanged;
  for (const pack_internal::FieldRewriter* rewriter : rewriters_) {
    STOKER_ASSIGN_OR_RETURN(const Rewritten this_one, rewriter->Rewrite(field, bytes, restarts));
    if (this_one == Rewritten::kKeptAsItIs) return outcome == Rewritten::kReplaced ? outcome : this_one;
    if (this_one == Rewritten::kReplaced) outcome = this_one;
  }
  return outcome;
}

std::string RewriterChain::Note() const {
  nlohmann::ordered_json note = nlohmann::ordered_json::object();
  for (const pack_internal::FieldRewriter* rewriter : rewriters_) {
    const std::string text = rewriter->Note();
    if (text.empty()) continue;
    auto parsed = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (parsed.is_object()) note.update(parsed);
  }
  return note.empty() ? std::string() : note.dump();
}

void RewriterChain::Report(PackSummary& summary) const {
  for (const pack_internal::FieldRewriter* rewriter : rewriters_) rewriter->Report(summary);
}

}  // namespace stoker::prepare
