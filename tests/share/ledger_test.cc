// The GPU ledger on its own: admission, dead processes, a holder killed
// inside the critical section, the compute schedule, the configuration.
#include "share/ledger.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "share/share_config.h"

namespace stoker::share {
namespace {

constexpr std::uint64_t kMiB = 1ull << 20;
const std::uint8_t kUuid[16] = {0xaa, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};

class LedgerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = "/dev/shm/stoker-ledger-test-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name();
    ::unlink(path_.c_str());
  }
  void TearDown() override { ::unlink(path_.c_str()); }

  std::unique_ptr<Ledger> Open(const std::string& tenant, std::uint64_t quota, std::uint32_t share = 0) {
    std::string error;
    std::unique_ptr<Ledger> l(Ledger::Open(path_, &error));
    EXPECT_TRUE(l) << error;
    EXPECT_TRUE(l->Register(tenant, share, &error)) << error;
    const int d = l->Device(kUuid, 16ull << 30);
    EXPECT_EQ(d, 0);
    if (quota != kNoQuota) {
      EXPECT_TRUE(l->SetQuota(d, quota, &error)) << error;
    }
    return l;
  }
  LedgerReport Read() {
    LedgerReport r;
    std::string error;
    EXPECT_TRUE(Ledger::Report(path_, &r, &error)) << error;
    return r;
  }

  std::string path_;
};

TEST_F(LedgerTest, AdmissionHoldsEveryProcessOfATenantToItsQuota) {
  auto a = Open("t", 1000 * kMiB), b = Open("t", 1000 * kMiB), other = Open("u", 100 * kMiB);
  EXPECT_TRUE(a->Charge(0, 600 * kMiB));
  EXPECT_FALSE(b->Charge(0, 500 * kMiB));  // 1100 > 1000 for tenant t
  EXPECT_TRUE(b->Charge(0, 400 * kMiB));
  EXPECT_FALSE(a->Charge(0, 1));
  EXPECT_TRUE(other->Charge(0, 100 * kMiB));  // another tenant, its own quota
  a->Uncharge(0, 600 * kMiB);
  EXPECT_TRUE(b->Charge(0, 600 * kMiB));
  EXPECT_EQ(b->TenantCharged(0), 1000 * kMiB);
  const LedgerReport r = Read();
  ASSERT_EQ(r.tenants.size(), 2u);
  EXPECT_EQ(r.tenants[0].processes.size(), 2u);
  EXPECT_EQ(r.tenants[0].processes[1].oom_refusals, 1u);
  std::string error;
  EXPECT_FALSE(a->SetQuota(0, 5 * kMiB, &error));  // processes of a tenant must agree
  EXPECT_NE(error.find("all processes of a tenant must agree"), std::string::npos) << error;
}

TEST_F(LedgerTest, ThreadsRacingForTheLastBytesNeverPassTheQuota) {
  std::vector<std::unique_ptr<Ledger>> ledgers;
  for (int i = 0; i < 8; ++i) ledgers.push_back(Open("race", 1000 * kMiB));
  std::atomic<bool> over{false};
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i)
    threads.emplace_back([&, i] {
      for (int round = 0; round < 2000; ++round) {
        if (ledgers[i]->Charge(0, 300 * kMiB)) {
          if (ledgers[i]->TenantCharged(0) > 1000 * kMiB) over = true;
          ledgers[i]->Uncharge(0, 300 * kMiB);
        }
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_FALSE(over);
  EXPECT_EQ(ledgers[0]->TenantCharged(0), 0u);
}

// A child that charges and dies (exit without unregistering, or SIGKILL).
pid_t ChildHolding(const std::string& path, std::uint64_t bytes, bool hold_lock, int* ready_fd) {
  int pipe_fds[2];
  EXPECT_EQ(::pipe(pipe_fds), 0);
  const pid_t pid = ::fork();
  if (pid == 0) {
    std::string error;
    Ledger* l = Ledger::Open(path, &error);
    if (l == nullptr || !l->Register("t", 0, &error)) _exit(3);
    const int d = l->Device(kUuid, 16ull << 30);
    if (!l->Charge(d, bytes)) _exit(4);
    if (hold_lock) l->LockAndAbandonForTest();
    (void)::write(pipe_fds[1], "x", 1);
    for (;;) ::pause();
  }
  ::close(pipe_fds[1]);
  *ready_fd = pipe_fds[0];
  char c;
  EXPECT_EQ(::read(pipe_fds[0], &c, 1), 1);
  return pid;
}

TEST_F(LedgerTest, AKilledProcessesChargeIsReclaimedWhenSomeoneNeedsTheRoom) {
  auto me = Open("t", 1000 * kMiB);
  int fd = -1;
  const pid_t child = ChildHolding(path_, 900 * kMiB, /*hold_lock=*/false, &fd);
  EXPECT_FALSE(me->Charge(0, 500 * kMiB));
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_TRUE(me->Charge(0, 500 * kMiB));
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  std::printf("[ reclaim ] a killed process's 900 MiB were charged again after %.3f ms\n", ms);
  EXPECT_EQ(me->TenantCharged(0), 500 * kMiB);
  ::close(fd);
}

TEST_F(LedgerTest, AProcessKilledHoldingTheLockLeavesAConsistentLedger) {
  auto me = Open("t", 1000 * kMiB);
  ASSERT_TRUE(me->Charge(0, 50 * kMiB));
  int fd = -1;
  const pid_t child = ChildHolding(path_, 900 * kMiB, /*hold_lock=*/true, &fd);
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  // The next holder finds the lock's owner dead, rebuilds the tenants'
  // charges from the live slots, and goes on at once.
  const auto start = std::chrono::steady_clock::now();
  EXPECT_TRUE(me->Charge(0, 900 * kMiB));
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  std::printf("[ reclaim ] after a lock holder was killed, the next charge took %.3f ms\n", ms);
  EXPECT_EQ(me->TenantCharged(0), 950 * kMiB);
  const LedgerReport r = Read();
  EXPECT_EQ(r.repairs, 1u);
  ASSERT_EQ(r.tenants.size(), 1u);
  EXPECT_EQ(r.tenants[0].processes.size(), 1u);
  ::close(fd);
}

TEST_F(LedgerTest, LivenessIsTheSlotsLockNotItsPid) {
  auto me = Open("t", 1000 * kMiB);
  // A slot that names a live pid (our parent) but that no process holds,
  // as after pid reuse: it is a dead process's.
  {
    const int fd = ::open(path_.c_str(), O_RDWR);
    auto* layout =
        static_cast<LedgerLayout*>(::mmap(nullptr, sizeof(LedgerLayout), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
    LedgerSlot& ghost = layout->slots[kMaxSlots - 1];
    ghost.pid = static_cast<std::int32_t>(::getppid());
    ghost.tenant = layout->slots[me->slot()].tenant;
    ghost.in_use = 1;
    ghost.charged[0] = 800 * kMiB;
    layout->tenants[ghost.tenant].charged[0] += 800 * kMiB;
    ::munmap(layout, sizeof(LedgerLayout));
    ::close(fd);
  }
  EXPECT_TRUE(me->Charge(0, 900 * kMiB));
  EXPECT_EQ(Read().tenants[0].processes.size(), 1u);
}

TEST_F(LedgerTest, ABadFileIsNamedAndRefused) {
  {
    const int fd = ::open(path_.c_str(), O_RDWR | O_CREAT, 0600);
    ASSERT_EQ(::write(fd,
                      "not a ledger, but long enough to be read as one: 0123456789012345678901234567890123456789"
                      "0123456789012345678901234567890123456789",
                      128),
              128);
    ::close(fd);
  }
  std::string error;
  EXPECT_EQ(Ledger::Open(path_, &error), nullptr);
  EXPECT_NE(error.find(path_), std::string::npos) << error;
  EXPECT_NE(error.find("not a stoker GPU ledger"), std::string::npos) << error;
}

TEST_F(LedgerTest, TheComputeScheduleGivesEachTenantItsShareOfTheTime) {
  auto a = Open("a", kNoQuota, 30), b = Open("b", kNoQuota, 70);
  const std::uint64_t period = 100'000'000, ms = 1'000'000;
  // Both want the device all the time; each takes its turn, then waits.
  std::uint64_t held[2] = {}, now = 1'000'000'000;
  Ledger* ledgers[2] = {a.get(), b.get()};
  for (int step = 0; step < 100'000; ++step, now += ms / 10) {
    for (int t = 0; t < 2; ++t) {
      std::uint64_t until = 0;
      if (ledgers[t]->HoldsDevice(0) || ledgers[t]->AcquireDevice(0, now, period, &until)) {
        if (now >= ledgers[t]->HoldUntil(0)) {
          ledgers[t]->ReleaseDevice(0, now, period);
        } else {
          held[t] += ms / 10;
        }
      }
    }
  }
  const double share_a = static_cast<double>(held[0]) / static_cast<double>(held[0] + held[1]);
  std::printf("[ schedule ] tenant a (30%%) held the device %.1f%% of the contended time\n", share_a * 100);
  EXPECT_NEAR(share_a, 0.30, 0.02);
  // Alone, a tenant is still held to its share (a limit, not a priority).
  b.reset();
  std::uint64_t alone = 0;
  const std::uint64_t start = now;
  for (int step = 0; step < 50'000; ++step, now += ms / 10) {
    std::uint64_t until = 0;
    if (a->HoldsDevice(0) || a->AcquireDevice(0, now, period, &until)) {
      if (now >= a->HoldUntil(0))
        a->ReleaseDevice(0, now, period);
      else
        alone += ms / 10;
    }
  }
  EXPECT_NEAR(static_cast<double>(alone) / static_cast<double>(now - start), 0.30, 0.02);
}

TEST(ShareConfig, ValuesAreCheckedWithTheVariableNamed) {
  auto parse = [](std::vector<std::pair<const char*, const char*>> env, std::string* error) {
    ShareConfig c;
    const bool ok = ParseShareConfig(
        [&](const char* name) -> const char* {
          for (auto& [k, v] : env)
            if (std::strcmp(k, name) == 0) return v;
          return nullptr;
        },
        &c, error);
    return ok ? std::optional<ShareConfig>(c) : std::nullopt;
  };
  std::string error;
  auto c = parse({{"STOKER_GPU_MEMORY_LIMIT", "20GiB"},
                  {"STOKER_GPU_MEMORY_LIMIT_1", "8GiB"},
                  {"STOKER_GPU_COMPUTE_SHARE", "30"},
                  {"STOKER_GPU_TENANT", "team-a"}},
                 &error);
  ASSERT_TRUE(c) << error;
  EXPECT_EQ(c->LimitFor(0), 20ull << 30);
  EXPECT_EQ(c->LimitFor(1), 8ull << 30);
  EXPECT_EQ(c->compute_share, 30u);
  EXPECT_EQ(c->tenant, "team-a");
  EXPECT_EQ(c->ledger_path, kDefaultLedgerPath);
  for (auto [name, value, says] : std::vector<std::tuple<const char*, const char*, const char*>>{
           {"STOKER_GPU_MEMORY_LIMIT", "lots", "STOKER_GPU_MEMORY_LIMIT='lots' is not a memory size"},
           {"STOKER_GPU_MEMORY_LIMIT_0", "0", "STOKER_GPU_MEMORY_LIMIT_0='0' is not a memory size"},
           {"STOKER_GPU_COMPUTE_SHARE", "0", "from 1 to 100"},
           {"STOKER_GPU_COMPUTE_SHARE", "150", "from 1 to 100"},
           {"STOKER_GPU_COMPUTE_SHARE", "3.5", "from 1 to 100"},
           {"STOKER_GPU_TENANT", "a b", "STOKER_GPU_TENANT='a b'"},
           {"STOKER_GPU_LEDGER", "relative", "absolute path"}}) {
    error.clear();
    EXPECT_FALSE(parse({{name, value}}, &error)) << name << "=" << value;
    EXPECT_NE(error.find(says), std::string::npos) << error;
  }
}

}  // namespace
}  // namespace stoker::share
