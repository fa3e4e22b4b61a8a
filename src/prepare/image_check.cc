#include "prepare/image_check.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "codec/image_decode.h"
#include "format/index_note.h"

namespace stoker::prepare {

static_assert(kBadImagesNamed == index_format::kBadImagesNamedInNote, "a merge names as many as a pack");

Result<pack_internal::Rewritten> ImageHeaderCheck::Rewrite(const pack_internal::PackedField& field,
                                                           std::vector<std::byte>& bytes, SeekableTable&) const {
  return Check(field, bytes);
}

Result<pack_internal::Rewritten> ImageHeaderCheck::Check(const pack_internal::PackedField& field,
                                                         std::span<const std::byte> bytes) const {
  using pack_internal::Rewritten;
  if (field.kind != FieldKind::kImage) return Rewritten::kUnchanged;  // masks are recorded as images
  const Status bad = codec::CheckImageHeader(bytes);
  if (bad.ok()) return Rewritten::kUnchanged;
  return Bad(field, bad);
}

Result<pack_internal::Rewritten> ImageHeaderCheck::Bad(const pack_internal::PackedField& field,
                                                       const Status& bad) const {
  if (!keep_bad_images_)
    return Status(bad.code(), fmt::format("{} (fix or remove it; {} keeps such images as they are, counted and named)",
                                          bad.message(), keep_hint_));
  kept_.fetch_add(1, std::memory_order_relaxed);
  std::string name = fmt::format("{}, field '{}'", field.sample_key, field.name);
  MutexLock lock(mu_);
  if (named_.size() < kBadImagesListed || name < named_.rbegin()->first) {
    named_.emplace(std::move(name), bad.message());
    if (named_.size() > kBadImagesListed) named_.erase(std::prev(named_.end()));
  }
  return pack_internal::Rewritten::kKeptAsItIs;
}

std::string ImageHeaderCheck::Note() const {
  if (kept_.load() == 0) return {};
  nlohmann::ordered_json named = nlohmann::ordered_json::object();
  {
    MutexLock lock(mu_);
    for (const auto& [name, why] : named_) {
      if (named.size() == kBadImagesNamed) break;
      named[name] = why;
    }
  }
  nlohmann::ordered_json note = {{"bad_images", {{"kept", kept_.load()}, {"named", std::move(named)}}}};
  // Keys are input: invalid UTF-8 is replaced, never an exception.
  return note.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::vector<std::string> ImageHeaderCheck::named() const {
  std::vector<std::string> out;
  MutexLock lock(mu_);
  for (const auto& [name, why] : named_) out.push_back(fmt::format("{}: {}", name, why));
  return out;
}

void ImageHeaderCheck::Report(PackSummary& summary) const {
  summary.bad_images_kept = kept();
  summary.bad_images_named = named();
}

}  // namespace stoker::prepare
