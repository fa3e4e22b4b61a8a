#include "prepare/image_check.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "codec/image_decode.h"

namespace stoker::prepare {

Result<pack_internal::Rewritten> ImageHeaderCheck::Rewrite(const pack_internal::PackedField& field,
                                                           std::vector<std::byte>& bytes, SeekableTable&) const {
  using pack_internal::Rewritten;
  if (field.kind != FieldKind::kImage) return Rewritten::kUnchanged;  // masks are recorded as images
  const Status bad = codec::CheckImageHeader(bytes);
  if (bad.ok()) return Rewritten::kUnchanged;
  return Bad(field, bad);
}

Result<pack_internal::Rewritten> ImageHeaderCheck::Bad(const pack_internal::PackedField& field,
                                                       const Status& bad) const {
  if (!keep_bad_images_)
    return Status(bad.code(), fmt::format("{} (fix or remove the file; pack's keep_bad_images, `stoker pack "
                                          "--keep-bad-images`, stores such files as they are, counted and named)",
                                          bad.message()));
  kept_.fetch_add(1, std::memory_order_relaxed);
  std::string name = fmt::format("{}, field '{}'", field.sample_key, field.name);
  MutexLock lock(mu_);
  if (named_.size() < kBadImagesNamed || name < named_.rbegin()->first) {
    named_.emplace(std::move(name), bad.message());
    if (named_.size() > kBadImagesNamed) named_.erase(std::prev(named_.end()));
  }
  return pack_internal::Rewritten::kKeptAsItIs;
}

std::string ImageHeaderCheck::Note() const {
  if (kept_.load() == 0) return {};
  nlohmann::ordered_json named = nlohmann::ordered_json::object();
  {
    MutexLock lock(mu_);
    for (const auto& [name, why] : named_) named[name] = why;
  }
  nlohmann::ordered_json note = {{"bad_images", {{"kept", kept_.load()}, {"named", std::move(named)}}}};
  // Keys are input: invalid UTF-8 is replaced, never an exception.
  return note.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

void ImageHeaderCheck::Report(PackSummary& summary) const {
  summary.bad_images_kept = kept_.load();
  summary.bad_images_named.clear();
  MutexLock lock(mu_);
  for (const auto& [name, why] : named_) summary.bad_images_named.push_back(fmt::format("{}: {}", name, why));
}

}  // namespace stoker::prepare
