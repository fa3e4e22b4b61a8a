#include "dataset/taken_keys.h"

#include "core/hash.h"

namespace stoker::pack_internal {
namespace {

std::uint64_t Xxh3Key(std::string_view key) {
  return Xxh3(std::span(reinterpret_cast<const std::byte*>(key.data()), key.size()));
}

}  // namespace

TakenKeys::TakenKeys(Hash hash) : hash_(hash != nullptr ? hash : &Xxh3Key) {}

std::optional<std::uint64_t> TakenKeys::Find(std::string_view key, const KeyOf& key_of) const {
  const auto it = first_by_hash_.find(hash_(key));
  if (it == first_by_hash_.end()) return std::nullopt;
  if (key_of(it->second) == key) return it->second;
  if (const auto c = collided_.find(std::string(key)); c != collided_.end()) return c->second;
  return std::nullopt;
}

void TakenKeys::Add(std::string_view key, std::uint64_t sample) {
  if (!first_by_hash_.emplace(hash_(key), sample).second) collided_.emplace(std::string(key), sample);
}

}  // namespace stoker::pack_internal
