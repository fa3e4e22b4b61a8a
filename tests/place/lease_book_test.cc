// The lease file: parse errors named, other versions refused, dead holders'
// leases reclaimed (SIGKILL, pid reuse), concurrent placements from many
// processes never double-booking a card, waiting for room.
#include "place/lease_book.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include "stoker/gpu_place.h"

namespace stoker::place {
namespace {

constexpr std::uint64_t kGiB = std::uint64_t{1} << 30;

class LeaseTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("stoker-leases-" + std::to_string(::getpid()) + "-" +
                                                     ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    options_.leases = (dir_ / "leases.json").string();
    options_.ledger = (dir_ / "ledger").string();
    for (int i = 0; i < 2; ++i) {
      GpuCard c;
      c.index = i;
      c.uuid = "GPU-" + std::to_string(i);
      c.total_bytes = 80 * kGiB;
      c.used_known = true;
      c.numa_node = 0;
      inventory_.cards.push_back(c);
    }
    inventory_.source = "test";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  GpuRequest Memory(std::uint64_t bytes) {
    GpuRequest r;
    r.memory_bytes = bytes;
    return r;
  }
  void Write(const std::string& text) { std::ofstream(options_.leases) << text; }
  std::string Read() {
    std::ifstream in(options_.leases);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }
  // A child that waits to be killed.
  static pid_t Sleeper() {
    const pid_t pid = ::fork();
    if (pid == 0) {
      for (;;) ::pause();
    }
    return pid;
  }
  static void Kill(pid_t pid) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
  }

  std::filesystem::path dir_;
  GpuPlacementOptions options_;
  GpuInventory inventory_;
};

TEST_F(LeaseTest, ALeaseIsRecordedAndReadBack) {
  options_.command = "python train.py";
  auto lease = PlaceGpuRequest(Memory(20 * kGiB), inventory_, options_);
  ASSERT_TRUE(lease.ok()) << lease.error().ToString();
  EXPECT_EQ(lease->pid, ::getpid());
  EXPECT_EQ(lease->pid_start, ProcessStartTime(::getpid()));
  EXPECT_EQ(lease->tenant, "lease-" + lease->id);
  ASSERT_EQ(lease->cards.size(), 1u);
  EXPECT_EQ(lease->cards[0].uuid, "GPU-0");
  auto leases = ReadGpuLeases(options_.leases);
  ASSERT_TRUE(leases.ok());
  ASSERT_EQ(leases->size(), 1u);
  EXPECT_EQ((*leases)[0].command, "python train.py");
  EXPECT_EQ((*leases)[0].cards[0].memory_bytes, 20 * kGiB);
  EXPECT_TRUE(ReleaseGpuLease(lease->id, options_.leases).ok());
  EXPECT_EQ(ReleaseGpuLease(lease->id, options_.leases).code(), StatusCode::kNotFound);
  EXPECT_TRUE(ReadGpuLeases(options_.leases)->empty());
}

TEST_F(LeaseTest, ALeaseWhoseProcessWasKilledIsReclaimed) {
  const pid_t child = Sleeper();
  options_.pid = child;
  ASSERT_TRUE(PlaceGpuRequest(Memory(70 * kGiB), inventory_, options_).ok());
  ASSERT_TRUE(PlaceGpuRequest(Memory(70 * kGiB), inventory_, options_).ok());
  options_.pid = 0;
  EXPECT_EQ(PlaceGpuRequest(Memory(70 * kGiB), inventory_, options_).error().code(), StatusCode::kResourceExhausted);
  Kill(child);
  const auto start = std::chrono::steady_clock::now();
  auto lease = PlaceGpuRequest(Memory(70 * kGiB), inventory_, options_);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(lease.ok()) << lease.error().ToString();
  EXPECT_EQ(ReadGpuLeases(options_.leases)->size(), 1u) << "both of the killed process's leases are gone";
  std::printf("placement after a SIGKILL reclaimed two leases in %.3f ms\n", ms);
}

TEST_F(LeaseTest, ACommandLineThatIsNotUtf8IsRecordedReplaced) {
  options_.command = "python \xff\xfe.py";
  ASSERT_TRUE(PlaceGpuRequest(Memory(kGiB), inventory_, options_).ok());
  auto leases = ReadGpuLeases(options_.leases);
  ASSERT_TRUE(leases.ok()) << leases.error().ToString();
  EXPECT_EQ((*leases)[0].command, "python \xef\xbf\xbd\xef\xbf\xbd.py");
}

TEST_F(LeaseTest, AReusedPidDoesNotKeepADeadLeaseAlive) {
  ASSERT_TRUE(PlaceGpuRequest(Memory(70 * kGiB), inventory_, options_).ok());
  std::string text = Read();
  const std::string start = "\"pid_start\": " + std::to_string(ProcessStartTime(::getpid()));
  const auto at = text.find(start);
  ASSERT_NE(at, std::string::npos) << text;
  text.replace(at, start.size(), "\"pid_start\": 1");  // the lease was another process's with our pid
  Write(text);
  EXPECT_TRUE(ReadGpuLeases(options_.leases)->empty());
}

TEST_F(LeaseTest, BadLeaseFilesAreNamedAndNothingIsLeased) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"not json", "is not a JSON object"},
      {R"({"format": 1, "version": 1, "leases": []})",
       "\"format\": is not \"stoker-gpu-leases\""},  // found by the fuzzer
      {R"({"format":"other","version":1,"leases":[]})", "\"format\": is not \"stoker-gpu-leases\""},
      {R"({"format":"stoker-gpu-leases","version":2,"leases":[]})", "lease file version 2 is not the version 1"},
      {R"({"format":"stoker-gpu-leases","version":1,"leases":{}})", "\"leases\": is not a list"},
      {R"({"format":"stoker-gpu-leases","version":1,"leases":[{"id":"a"}]})", "lease 0: \"tenant\" is not a string"},
      {R"({"format":"stoker-gpu-leases","version":1,"leases":[{"id":"a","tenant":"t","command":"","ledger":"","pid":1,
          "pid_start":1,"created_unix":1,"whole_cards":false,"cards":[{"uuid":"GPU-0","memory_bytes":-5,
          "compute_percent":0}]}]})",
       "lease 0 card 0: \"memory_bytes\" is not a non-negative integer"},
      {R"({"format":"stoker-gpu-leases","version":1,"leases":[{"id":"a","tenant":"t","command":"","ledger":"","pid":1,
          "pid_start":1,"created_unix":1,"whole_cards":false,"cards":[{"uuid":"GPU-0","memory_bytes":5,
          "compute_percent":101}]}]})",
       "\"compute_percent\" is above 100"},
  };
  for (const auto& [text, says] : cases) {
    Write(text);
    auto lease = PlaceGpuRequest(Memory(kGiB), inventory_, options_);
    ASSERT_FALSE(lease.ok()) << text;
    EXPECT_NE(lease.error().message().find(options_.leases), std::string::npos) << lease.error().message();
    EXPECT_NE(lease.error().message().find(says), std::string::npos) << lease.error().message();
    EXPECT_EQ(Read(), text) << "the file is left as it was";
  }
}

TEST_F(LeaseTest, WaitingEndsWhenRoomIsMadeOrTheTimeIsUp) {
  const pid_t child = Sleeper();
  options_.pid = child;
  ASSERT_TRUE(PlaceGpuRequest(Memory(70 * kGiB), inventory_, options_).ok());
  ASSERT_TRUE(PlaceGpuRequest(Memory(70 * kGiB), inventory_, options_).ok());
  options_.pid = 0;
  options_.wait_seconds = 0.3;
  auto late = PlaceGpuRequest(Memory(70 * kGiB), inventory_, options_);
  ASSERT_FALSE(late.ok());
  EXPECT_EQ(late.error().code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(late.error().message().find("GPU-1 (1): 10.0 GiB of 80.0 GiB free"), std::string::npos)
      << late.error().message();
  std::thread killer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    Kill(child);
  });
  options_.wait_seconds = 30;
  auto lease = PlaceGpuRequest(Memory(70 * kGiB), inventory_, options_);
  killer.join();
  EXPECT_TRUE(lease.ok()) << lease.error().ToString();
  // A request that can never fit is not waited for.
  EXPECT_EQ(PlaceGpuRequest(Memory(100 * kGiB), inventory_, options_).error().code(), StatusCode::kInvalidArgument);
}

// 8 processes behind a barrier ask for 30 GiB each on two 80 GiB cards: 4
// fit (2 per card), every round, whatever the interleaving.
TEST_F(LeaseTest, ConcurrentPlacementsFromEightProcessesNeverDoubleBook) {
  for (int round = 0; round < 25; ++round) {
    std::filesystem::remove(options_.leases);
    int go[2], done[2];
    ASSERT_EQ(::pipe(go), 0);
    ASSERT_EQ(::pipe(done), 0);
    std::vector<pid_t> children;
    for (int i = 0; i < 8; ++i) {
      const pid_t pid = ::fork();
      if (pid == 0) {
        ::close(go[1]);
        char c;
        if (::read(go[0], &c, 1) != 0) ::_exit(3);  // the barrier: the parent closes its end
        auto lease = PlaceGpuRequest(Memory(30 * kGiB), inventory_, options_);
        const char result = lease.ok() ? 'y' : (lease.error().code() == StatusCode::kResourceExhausted ? 'n' : 'e');
        if (::write(done[1], &result, 1) != 1) ::_exit(4);
        for (;;) ::pause();  // hold the lease until killed
      }
      children.push_back(pid);
    }
    ::close(go[0]);
    ::close(go[1]);
    std::map<char, int> results;
    for (int i = 0; i < 8; ++i) {
      char c = 0;
      ASSERT_EQ(::read(done[0], &c, 1), 1);
      ++results[c];
    }
    ::close(done[0]);
    ::close(done[1]);
    EXPECT_EQ(results['y'], 4) << "round " << round;
    EXPECT_EQ(results['n'], 4) << "round " << round;
    EXPECT_EQ(results['e'], 0) << "round " << round;
    auto leases = ReadGpuLeases(options_.leases);
    ASSERT_TRUE(leases.ok());
    std::map<std::string, std::uint64_t> per_card;
    for (const auto& l : *leases)
      for (const auto& c : l.cards) per_card[c.uuid] += c.memory_bytes;
    for (const auto& [uuid, bytes] : per_card) EXPECT_LE(bytes, 80 * kGiB) << uuid << " double-booked";
    EXPECT_EQ(leases->size(), 4u);
    for (pid_t pid : children) Kill(pid);
    EXPECT_TRUE(ReadGpuLeases(options_.leases)->empty()) << "every killed holder's lease is reclaimed";
  }
}

}  // namespace
}  // namespace stoker::place
