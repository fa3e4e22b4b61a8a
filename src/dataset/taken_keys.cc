#include "dataset/taken_keys.h"

#include <span>

#include "core/hash.h"

namespace stoker::pack_internal {
namespace {

std::uint64_t Xxh3Key(std::string_view key) {
  return Xxh3(std::span(reinterpret_cast<const std::byte*>(key.data()), key.size()));
}

}  // namespace

// A table's slot for `hash`: its low bits (the top byte chose the table).
std::size_t TakenKeys::Home(const Table& table, std::uint64_t hash) {
  return static_cast<std::size_t>(hash) & (table.size() - 1);
}

TakenKeys::TakenKeys(Hash hash) : hash_(hash != nullptr ? hash : &Xxh3Key) {}

std::uint64_t TakenKeys::SlotHash(std::string_view key) const {
  const std::uint64_t h = hash_(key);
  return h != 0 ? h : 1;
}

Result<std::optional<std::uint64_t>> TakenKeys::Find(std::string_view key, const KeyOf& key_of) const {
  const std::uint64_t hash = SlotHash(key);
  const Table& table = tables_[hash >> 56];
  if (table.empty()) return std::optional<std::uint64_t>();
  // Linear probing: every key with this hash sits between its home slot and
  // the next empty one.
  for (std::size_t i = Home(table, hash);; i = (i + 1) & (table.size() - 1)) {
    const Slot& slot = table[i];
    if (slot.hash == 0) return std::optional<std::uint64_t>();
    if (slot.hash != hash) continue;
    STOKER_ASSIGN_OR_RETURN(const std::string taken, key_of(slot.sample));
    if (taken == key) return std::optional<std::uint64_t>(slot.sample);
  }
}

void TakenKeys::Insert(Table& table, Slot slot) {
  std::size_t i = Home(table, slot.hash);
  while (table[i].hash != 0) i = (i + 1) & (table.size() - 1);
  table[i] = slot;
}

void TakenKeys::Grow(Table& table) {
  Table grown(table.empty() ? 16 : table.size() * 2);
  for (const Slot& slot : table)
    if (slot.hash != 0) Insert(grown, slot);
  table.swap(grown);
}

void TakenKeys::Add(std::string_view key, std::uint64_t sample) {
  const std::uint64_t hash = SlotHash(key);
  const std::size_t which = hash >> 56;
  Table& table = tables_[which];
  // At most 7/8 full: probes stay short with a hash this even.
  if (8 * (std::uint64_t{used_[which]} + 1) > 7 * std::uint64_t{table.size()}) Grow(table);
  Insert(table, {hash, sample});
  ++used_[which];
}

std::uint64_t TakenKeys::size() const {
  std::uint64_t keys = 0;
  for (const std::uint32_t used : used_) keys += used;
  return keys;
}

std::uint64_t TakenKeys::table_bytes() const {
  std::uint64_t bytes = 0;
  for (const Table& table : tables_) bytes += table.capacity() * sizeof(Slot);
  return bytes;
}

}  // namespace stoker::pack_internal
