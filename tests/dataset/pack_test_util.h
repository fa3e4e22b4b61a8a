// What the pack and dataset tests share: a small ImageFolder tree (packed
// into small shards), and a dataset's keys in index order.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "stoker/dataset.h"
#include "stoker/pack.h"
#include "test_util.h"

namespace stoker::testing {

// classes: cat (3 images), dog (2 images, one in a sub-folder).
inline void MakeImageFolder(const std::string& root) {
  WriteFile(root + "/cat/1.jpg", FakeImage("jpg", 3000, 1));
  WriteFile(root + "/cat/2.jpeg", FakeImage("jpeg", 700, 2));
  WriteFile(root + "/cat/img.v2.png", FakeImage("png", 1500, 3));
  WriteFile(root + "/dog/a.jpg", FakeImage("jpg", 5000, 4));
  WriteFile(root + "/dog/sub/b.JPG", FakeImage("jpg", 100, 5));
}

inline std::vector<std::string> Keys(const Dataset& d) {
  std::vector<std::string> keys;
  for (std::uint64_t i = 0; i < d.num_samples(); ++i) keys.emplace_back(d.Sample(i)->key);
  return keys;
}

// MakeImageFolder(`dir`/src) packed into `dir`/`out` in shards of about
// 8 KiB: three or more shards for its five samples.
inline Result<PackSummary> PackInSmallShards(const TempDir& dir, const std::string& out) {
  MakeImageFolder(dir / "src");
  PackOptions small;
  small.target_shard_bytes = 8192;
  return Pack(dir / "src", dir / out, small);
}

}  // namespace stoker::testing
