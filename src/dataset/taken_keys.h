// The sample keys a writer has taken, so that a key given twice is refused,
// without a copy of every key in memory: a 64-bit hash of each key and the
// sample that took it, 16 bytes in an open-addressing table, and on a hash
// match the key read back from where the writer keeps it (its index
// builder) and compared. Keys with the same hash (among 10 M keys, a pair
// does in about 3 writers of a million) each keep a slot, so no repeat goes
// unnoticed. The table is
// 256 tables by the hash's top byte, each grown on its own, so growing never
// holds two copies of the whole (about 25 bytes a key in all, against about
// 50 for a std::unordered_map).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "stoker/status.h"

namespace stoker::pack_internal {

class TakenKeys {
 public:
  using Hash = std::uint64_t (*)(std::string_view key);
  // The writer's key of a sample it holds (read back from its store).
  using KeyOf = std::function<Result<std::string>(std::uint64_t sample)>;

  // `hash`: XXH3-64 by default; tests give a poor one to make keys collide.
  explicit TakenKeys(Hash hash = nullptr);

  // The sample that took `key`, if one did; key_of's error, if it fails.
  [[nodiscard]] Result<std::optional<std::uint64_t>> Find(std::string_view key, const KeyOf& key_of) const;
  // Records `key` as taken by `sample`; the caller Finds it first.
  void Add(std::string_view key, std::uint64_t sample);

  [[nodiscard]] std::uint64_t size() const;
  // Bytes the tables hold.
  [[nodiscard]] std::uint64_t table_bytes() const;

 private:
  struct Slot {
    std::uint64_t hash = 0;  // 0: empty (a key hashing to 0 is stored as 1)
    std::uint64_t sample = 0;
  };
  using Table = std::vector<Slot>;  // a power of two slots, or none
  [[nodiscard]] std::uint64_t SlotHash(std::string_view key) const;
  static std::size_t Home(const Table& table, std::uint64_t hash);
  static void Insert(Table& table, Slot slot);
  static void Grow(Table& table);

  Hash hash_;
  std::array<Table, 256> tables_;
  std::array<std::uint32_t, 256> used_{};
};

}  // namespace stoker::pack_internal
