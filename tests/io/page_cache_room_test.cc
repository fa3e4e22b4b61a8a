// The page cache's room (io/page_cache_room.h): MemAvailable, tightened by
// each memory cgroup's limit less its anonymous memory (v1's hierarchical
// limit, v2's memory.max of the cgroup and every parent), read from the
// real files' layout under a fake root; and the POSIX file's read-ahead
// advice reaching the kernel.
#include "io/page_cache_room.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <linux/magic.h>

#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "test_util.h"

namespace stoker::io {
namespace {

using testing::TempDir;
using testing::WriteFile;

constexpr char kMeminfo[] =
    "MemTotal:       24683784 kB\n"
    "MemFree:        21846652 kB\n"
    "MemAvailableX:  1 kB\n"
    "MemAvailable:   24187520 kB\n"
    "Buffers:          123 kB\n";

TEST(PageCacheRoom, WithoutALimitingCgroupItIsMemAvailable) {
  const auto room = PageCacheRoomFrom(kMeminfo, {});
  ASSERT_TRUE(room);
  EXPECT_EQ(room->bytes, 24187520ull * 1024);
  EXPECT_EQ(room->limited_by, "MemAvailable (/proc/meminfo)");
  // v1's "no limit" (2^63 rounded to a page) and v2's "max" limit nothing.
  const std::vector<CgroupMemoryFiles> unlimited = {
      {"/a", false, "", "cache 5\nhierarchical_memory_limit 9223372036854771712\ntotal_rss 1863680\n"},
      {"/b", true, "max\n", "anon 100\n"}};
  EXPECT_EQ(PageCacheRoomFrom(kMeminfo, unlimited)->bytes, 24187520ull * 1024);
  EXPECT_FALSE(PageCacheRoomFrom("MemTotal: 5 kB\n", {}));
}

TEST(PageCacheRoom, ACgroupLimitLessItsAnonymousMemoryIsTheRoom) {
  const std::vector<CgroupMemoryFiles> v1 = {
      {"/jobs/a", false, "", "rss 1\ntotal_rss 104857600\nhierarchical_memory_limit 398458880\n"}};
  const auto room = PageCacheRoomFrom(kMeminfo, v1);
  ASSERT_TRUE(room);
  EXPECT_EQ(room->bytes, 398458880ull - 104857600ull);
  EXPECT_EQ(room->limited_by, "memory cgroup /jobs/a: limit 380.0 MiB, 100.0 MiB anonymous");
  // v2: the tightest level wins, a parent's included; anonymous memory
  // over the limit leaves no room, not a wrapped-around one.
  const std::vector<CgroupMemoryFiles> v2 = {{"/k/pod/c", true, "1073741824\n", "anon 52428800\nfile 9\n"},
                                             {"/k/pod", true, "536870912\n", "anon 104857600\n"},
                                             {"/k", true, "max\n", "anon 7\n"}};
  EXPECT_EQ(PageCacheRoomFrom(kMeminfo, v2)->bytes, 536870912ull - 104857600ull);
  EXPECT_EQ(PageCacheRoomFrom(kMeminfo, v2)->limited_by, "memory cgroup /k/pod: limit 512.0 MiB, 100.0 MiB anonymous");
  const std::vector<CgroupMemoryFiles> full = {{"/x", true, "1000\n", "anon 5000\n"}};
  EXPECT_EQ(PageCacheRoomFrom(kMeminfo, full)->bytes, 0u);
  // Garbage limits are ignored rather than believed.
  const std::vector<CgroupMemoryFiles> garbage = {{"/g", true, "lots\n", "anon 1\n"},
                                                  {"/h", false, "", "hierarchical_memory_limit -5\n"}};
  EXPECT_EQ(PageCacheRoomFrom(kMeminfo, garbage)->bytes, 24187520ull * 1024);
}

TEST(PageCacheRoom, ReadFromAMachinesFilesForCgroupV1AndV2) {
  TempDir v1;
  WriteFile(v1 / "proc/meminfo", kMeminfo);
  WriteFile(v1 / "proc/self/cgroup", "9:systemd:/\n4:memory:/process_api/x\n1:cpu,cpuacct:/\n0::/\n");
  WriteFile(v1 / "sys/fs/cgroup/memory/process_api/x/memory.stat",
            "cache 3137536\nrss 1\nhierarchical_memory_limit 419430400\ntotal_cache 3137536\ntotal_rss 20971520\n");
  auto room = ReadPageCacheRoom(*FileSystem::Default(), v1.path());
  ASSERT_TRUE(room);
  EXPECT_EQ(room->bytes, 419430400ull - 20971520ull);
  EXPECT_EQ(room->limited_by, "memory cgroup /process_api/x: limit 400.0 MiB, 20.0 MiB anonymous");

  TempDir v2;
  WriteFile(v2 / "proc/meminfo", kMeminfo);
  WriteFile(v2 / "proc/self/cgroup", "0::/kubepods/pod1/ctr\n");
  WriteFile(v2 / "sys/fs/cgroup/kubepods/pod1/ctr/memory.max", "max\n");
  WriteFile(v2 / "sys/fs/cgroup/kubepods/pod1/ctr/memory.stat", "anon 1048576\n");
  WriteFile(v2 / "sys/fs/cgroup/kubepods/pod1/memory.max", "2147483648\n");
  WriteFile(v2 / "sys/fs/cgroup/kubepods/pod1/memory.stat", "anon 1073741824\n");
  room = ReadPageCacheRoom(*FileSystem::Default(), v2.path());
  ASSERT_TRUE(room);
  EXPECT_EQ(room->bytes, 1073741824ull);
  EXPECT_EQ(room->limited_by, "memory cgroup /kubepods/pod1: limit 2.0 GiB, 1.0 GiB anonymous");

  TempDir nothing;
  EXPECT_FALSE(ReadPageCacheRoom(*FileSystem::Default(), nothing.path()));
  // This machine's own files give some room.
  EXPECT_TRUE(ReadPageCacheRoom(*FileSystem::Default()));
}

// What posix_fadvise(RANDOM) changes: a small read of an uncached file
// brings in only its own pages, where the default read-ahead brings more.
// Skipped where the file's pages cannot be evicted (tmpfs).
TEST(PosixFile, RandomAccessAdviceLeavesOutTheKernelsReadAhead) {
  TempDir dir;
  const std::string path = dir / "data.bin";
  WriteFile(path, std::string(4 << 20, 'x'));
  struct statfs fs_info {};
  ASSERT_EQ(::statfs(path.c_str(), &fs_info), 0);
  if (fs_info.f_type == TMPFS_MAGIC) GTEST_SKIP() << "tmpfs keeps every page in memory";
  const long page = ::sysconf(_SC_PAGESIZE);
  auto resident_pages = [&]() {
    const int fd = ::open(path.c_str(), O_RDONLY);
    void* map = ::mmap(nullptr, 4 << 20, PROT_READ, MAP_SHARED, fd, 0);
    std::vector<unsigned char> in((4 << 20) / page);
    EXPECT_EQ(::mincore(map, 4 << 20, in.data()), 0);
    ::munmap(map, 4 << 20);
    ::close(fd);
    std::size_t n = 0;
    for (unsigned char c : in) n += c & 1;
    return n;
  };
  auto read_a_page_after_evicting = [&](std::optional<AccessPattern> advice) {
    const int fd = ::open(path.c_str(), O_RDONLY);
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
    if (resident_pages() != 0) return std::size_t{SIZE_MAX};
    auto file = FileSystem::Default()->OpenForRead(path);
    EXPECT_TRUE(file.ok());
    if (advice) {
      EXPECT_TRUE((*file)->AdviseAccess(*advice).ok());
    }
    std::vector<std::byte> out(static_cast<std::size_t>(page));
    EXPECT_TRUE((*file)->ReadExactAt(0, out).ok());  // a file's start: the kernel reads ahead at once
    return resident_pages();
  };
  const std::size_t plain = read_a_page_after_evicting(std::nullopt);
  if (plain == SIZE_MAX) GTEST_SKIP() << "this file system does not drop clean pages on request";
  if (plain <= 1) GTEST_SKIP() << "this device reads nothing ahead (read_ahead_kb 0)";
  EXPECT_EQ(read_a_page_after_evicting(AccessPattern::kRandom), 1u) << "read ahead by default: " << plain << " pages";
  EXPECT_GT(read_a_page_after_evicting(AccessPattern::kNormal), 1u);
}

// The same for a mapping (madvise MADV_RANDOM): a page fault reads its
// page, not the kernel's read-around.
TEST(PosixFile, RandomAccessAdviceOnAMappingFaultsInOnlyThePageTouched) {
  TempDir dir;
  const std::string path = dir / "data.bin";
  constexpr std::size_t kSize = 4 << 20;
  WriteFile(path, std::string(kSize, 'x'));
  struct statfs fs_info {};
  ASSERT_EQ(::statfs(path.c_str(), &fs_info), 0);
  if (fs_info.f_type == TMPFS_MAGIC) GTEST_SKIP() << "tmpfs keeps every page in memory";
  const long page = ::sysconf(_SC_PAGESIZE);
  auto cached_after_a_touch = [&](std::optional<AccessPattern> advice) -> std::optional<std::size_t> {
    const int fd = ::open(path.c_str(), O_RDONLY);
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
    auto mapped = FileSystem::Default()->Map(path);
    EXPECT_TRUE(mapped.ok());
    if (advice) {
      EXPECT_TRUE((*mapped)->AdviseAccess(*advice).ok());
    }
    const auto data = (*mapped)->data();
    std::vector<unsigned char> in(kSize / static_cast<std::size_t>(page));
    void* base = const_cast<std::byte*>(data.data());
    EXPECT_EQ(::mincore(base, kSize, in.data()), 0);
    for (unsigned char c : in)
      if (c & 1) return std::nullopt;  // not evicted
    volatile std::byte touched = data[kSize / 2];
    (void)touched;
    EXPECT_EQ(::mincore(base, kSize, in.data()), 0);
    std::size_t n = 0;
    for (unsigned char c : in) n += c & 1;
    return n;
  };
  const auto plain = cached_after_a_touch(std::nullopt);
  if (!plain) GTEST_SKIP() << "this file system does not drop clean pages on request";
  if (*plain <= 1) GTEST_SKIP() << "this device reads nothing around a fault (read_ahead_kb 0)";
  EXPECT_EQ(cached_after_a_touch(AccessPattern::kRandom), 1u) << "read around by default: " << *plain << " pages";
  EXPECT_GT(*cached_after_a_touch(AccessPattern::kNormal), 1u);
}

}  // namespace
}  // namespace stoker::io
