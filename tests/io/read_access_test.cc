// The kernel's read-ahead policy (LoaderOptions::kernel_readahead,
// TokenLoaderOptions::kernel_readahead): kAuto switches it off only for
// reads at random over more than the page cache's room; on and off are
// obeyed; files read whole are left alone.
#include "io/read_access.h"

#include <gtest/gtest.h>

namespace stoker::io {
namespace {

const PageCacheRoom kRoom{400ull << 20, "memory cgroup /job: limit 512.0 MiB, 112.0 MiB anonymous"};

TEST(ReadAccess, AutoReadsAtRandomOnlyForAGlobalShuffleOverShardsLargerThanTheRoom) {
  auto larger = ChooseReadAccess(KernelReadahead::kAuto, true, "by shard", true, "shards", 500ull << 20, kRoom, 0);
  EXPECT_EQ(larger.pattern, AccessPattern::kRandom);
  EXPECT_EQ(larger.note,
            "kernel read-ahead off for the shards: a global shuffle over 500.0 MiB of shards, more than the page cache "
            "can hold (400.0 MiB: memory cgroup /job: limit 512.0 MiB, 112.0 MiB anonymous), reads at random places, "
            "and what the kernel read ahead around them would be evicted before use");
  auto fits = ChooseReadAccess(KernelReadahead::kAuto, true, "by shard", true, "shards", 400ull << 20, kRoom, 0);
  EXPECT_EQ(fits.pattern, AccessPattern::kNormal);
  EXPECT_NE(fits.note.find("they (400.0 MiB) fit the page cache (400.0 MiB"), std::string::npos) << fits.note;
  // The loader's own buffers, allocated after the room was measured, come off it.
  auto crowded =
      ChooseReadAccess(KernelReadahead::kAuto, true, "by shard", true, "shards", 400ull << 20, kRoom, 1 << 20);
  EXPECT_EQ(crowded.pattern, AccessPattern::kRandom);
  EXPECT_NE(crowded.note.find("(399.0 MiB: memory cgroup /job: limit 512.0 MiB, 112.0 MiB anonymous, less 1.0 MiB of "
                              "batch buffers)"),
            std::string::npos)
      << crowded.note;
  // Orders that read shard by shard keep it, whatever the sizes.
  {
    auto by_shard = ChooseReadAccess(KernelReadahead::kAuto, false, "this order reads them shard by shard", true,
                                     "shards", 500ull << 20, kRoom, 0);
    EXPECT_EQ(by_shard.pattern, AccessPattern::kNormal);
    EXPECT_NE(by_shard.note.find("shard by shard"), std::string::npos);
  }
  // An unknown room keeps the kernel's default.
  EXPECT_EQ(
      ChooseReadAccess(KernelReadahead::kAuto, true, "by shard", true, "shards", 500ull << 20, std::nullopt, 0).pattern,
      AccessPattern::kNormal);
}

TEST(ReadAccess, OnAndOffAreObeyedAndLooseFilesAreLeftAlone) {
  EXPECT_EQ(ChooseReadAccess(KernelReadahead::kOff, false, "by shard", true, "shards", 1, kRoom, 0).pattern,
            AccessPattern::kRandom);
  EXPECT_EQ(ChooseReadAccess(KernelReadahead::kOn, true, "by shard", true, "shards", 500ull << 20, kRoom, 0).pattern,
            AccessPattern::kNormal);
  for (KernelReadahead option : {KernelReadahead::kAuto, KernelReadahead::kOff}) {
    auto loose = ChooseReadAccess(option, true, "by shard", false, "shards", 500ull << 20, kRoom, 0);
    EXPECT_EQ(loose.pattern, AccessPattern::kNormal);
    EXPECT_TRUE(loose.note.empty());
  }
  EXPECT_EQ(ChooseReadAccess(KernelReadahead::kOff, true, "", true, "token files", 1, kRoom, 0).note,
            "kernel read-ahead off for the token files (kernel_readahead=off)");
}

}  // namespace
}  // namespace stoker::io
