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

#include "share/ledger_host_pids.h"
#include "share/pinned_limits.h"
#include "share/share_config.h"
#include "single_threaded.h"

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

TEST_F(LedgerTest, AProcessKilledWithWorkRunningStopsStandingInTheWayWithinASecond) {
  // A process that gave its turn back with work still running, then died,
  // left its tenant "using" the device: nobody else could borrow it. Dead
  // slots are no longer swept at every arrival (that cost an agent serving
  // a thousand processes 6.5 ms each), but at most a second apart.
  const std::uint64_t period = 100'000'000;
  std::uint64_t now = 1'000'000'000, until = 0;
  auto me = Open("stays", kNoQuota, 50);
  const pid_t child = ::fork();
  if (child == 0) {
    std::string error;
    std::unique_ptr<Ledger> l(Ledger::Open(path_, &error));
    if (!l || !l->Register("dies", 50, &error) || l->Device(kUuid, 16ull << 30) != 0) ::_exit(1);
    if (!l->AcquireDevice(0, now, period, &until, true)) ::_exit(2);
    l->ReleaseDevice(0, now + 1'000'000, period, /*work_running=*/true);
    ::_exit(0);  // its work never reported done
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_EQ(status, 0);
  now += 10 * period;  // its last wish is long past; the work it left is not
  ASSERT_TRUE(me->AcquireDevice(0, now, period, &until, true));
  EXPECT_FALSE(me->ExtendTurn(0, until, period, true, &until)) << "its tenant was swept at once";
  me->ReleaseDevice(0, until, period);
  ::usleep(1'100'000);
  now = until + period;
  ASSERT_TRUE(me->AcquireDevice(0, now, period, &until, true));  // sweeps: due
  EXPECT_TRUE(me->ExtendTurn(0, until, period, true, &until)) << "a dead process still stands in the way";
  EXPECT_EQ(Read().tenants.size(), 1u);
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

// Two tenants both want device `d` all the time, in steps of 0.1 ms from
// `*now` (advanced), with 100 ms periods: each takes its turn, then waits.
// Tenant a's part of the time the device was held.
double ContendedShare(Ledger* a, Ledger* b, int d, std::uint64_t* now) {
  const std::uint64_t period = 100'000'000, step_ns = 100'000;
  std::uint64_t held[2] = {};
  Ledger* ledgers[2] = {a, b};
  for (int step = 0; step < 100'000; ++step, *now += step_ns) {
    for (int t = 0; t < 2; ++t) {
      std::uint64_t until = 0;
      if (ledgers[t]->HoldsDevice(d) || ledgers[t]->AcquireDevice(d, *now, period, &until)) {
        if (*now >= ledgers[t]->HoldUntil(d)) {
          ledgers[t]->ReleaseDevice(d, *now, period);
        } else {
          held[t] += step_ns;
        }
      }
    }
  }
  return static_cast<double>(held[0]) / static_cast<double>(held[0] + held[1]);
}

TEST_F(LedgerTest, TheComputeScheduleGivesEachTenantItsShareOfTheTime) {
  STOKER_SKIP_UNDER_TSAN_SINGLE_THREADED();
  auto a = Open("a", kNoQuota, 30), b = Open("b", kNoQuota, 70);
  const std::uint64_t period = 100'000'000, ms = 1'000'000;
  std::uint64_t now = 1'000'000'000;
  const double share_a = ContendedShare(a.get(), b.get(), 0, &now);
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
  // Lending (the default): alone, it has the device whenever it wants it.
  std::uint64_t lent = 0;
  const std::uint64_t lent_start = now;
  for (int step = 0; step < 50'000; ++step, now += ms / 10) {
    std::uint64_t until = 0;
    if (a->HoldsDevice(0) || a->AcquireDevice(0, now, period, &until, /*work_conserving=*/true)) {
      if (now >= a->HoldUntil(0) && !a->ExtendTurn(0, now, period, true, &until))
        a->ReleaseDevice(0, now, period);
      else
        lent += ms / 10;
    }
  }
  EXPECT_GT(static_cast<double>(lent) / static_cast<double>(now - lent_start), 0.99);
}

// Two tenants both want device 0 all the time for 10 s (0.1 ms steps from
// `*now`, advanced), each lending or strict: the time each held it, as a
// fraction of the whole.
struct HeldParts {
  double a, b;
};
HeldParts BothAlwaysWant(Ledger* a, Ledger* b, bool a_lends, bool b_lends, std::uint64_t* now) {
  const std::uint64_t period = 100'000'000, step_ns = 100'000;
  std::uint64_t held[2] = {};
  Ledger* ledgers[2] = {a, b};
  const bool lends[2] = {a_lends, b_lends};
  const std::uint64_t start = *now;
  for (int step = 0; step < 100'000; ++step, *now += step_ns) {
    for (int t = 0; t < 2; ++t) {
      std::uint64_t until = 0;
      Ledger* l = ledgers[t];
      if (l->HoldsDevice(0) || l->AcquireDevice(0, *now, period, &until, lends[t])) {
        if (*now >= l->HoldUntil(0) && !l->ExtendTurn(0, *now, period, lends[t], &until))
          l->ReleaseDevice(0, *now, period);
        else
          held[t] += step_ns;
      }
    }
  }
  const auto total = static_cast<double>(*now - start);
  return {static_cast<double>(held[0]) / total, static_cast<double>(held[1]) / total};
}

TEST_F(LedgerTest, TimeNoShareReservesGoesToTheTenantsThatWantItInProportionToTheirShares) {
  STOKER_SKIP_UNDER_TSAN_SINGLE_THREADED();
  // 20% and 40%: 40% of the device is nobody's. Before, both always
  // wanting it, neither could borrow it while the other wanted it, and it
  // sat idle 40% of the time. Lending (the default), they now split the
  // rest 1:2.
  auto a = Open("a", kNoQuota, 20), b = Open("b", kNoQuota, 40);
  std::uint64_t now = 1'000'000'000;
  const HeldParts lent = BothAlwaysWant(a.get(), b.get(), /*a_lends=*/true, /*b_lends=*/true, &now);
  std::printf("[ schedule ] lending: a (20%%) %.1f%%, b (40%%) %.1f%%, idle %.1f%%\n", lent.a * 100, lent.b * 100,
              (1 - lent.a - lent.b) * 100);
  EXPECT_GT(lent.a + lent.b, 0.97);
  EXPECT_NEAR(lent.a, 1.0 / 3, 0.03);
  EXPECT_NEAR(lent.b, 2.0 / 3, 0.03);
  // Strict (STOKER_GPU_COMPUTE_STRICT=1): each held to its share, the rest
  // left idle.
  const HeldParts strict = BothAlwaysWant(a.get(), b.get(), false, false, &now);
  std::printf("[ schedule ] strict: a (20%%) %.1f%%, b (40%%) %.1f%%\n", strict.a * 100, strict.b * 100);
  EXPECT_NEAR(strict.a, 0.20, 0.02);
  EXPECT_NEAR(strict.b, 0.40, 0.02);
  // A strict tenant keeps to its share; the lending one takes the rest.
  const HeldParts mixed = BothAlwaysWant(a.get(), b.get(), /*a_lends=*/false, /*b_lends=*/true, &now);
  std::printf("[ schedule ] a strict (20%%) %.1f%%, b lending (40%%) %.1f%%\n", mixed.a * 100, mixed.b * 100);
  EXPECT_NEAR(mixed.a, 0.20, 0.02);
  EXPECT_GT(mixed.a + mixed.b, 0.97);
  // Shares that add up to 100% or more are kept as they are.
  auto c = Open("c", kNoQuota, 70);
  a.reset();
  const HeldParts full = BothAlwaysWant(b.get(), c.get(), true, true, &now);
  std::printf("[ schedule ] b (40%%) %.1f%%, c (70%%) %.1f%%\n", full.a * 100, full.b * 100);
  EXPECT_NEAR(full.a / (full.a + full.b), 40.0 / 110, 0.03);
  EXPECT_GT(full.a + full.b, 0.97);
}

TEST_F(LedgerTest, ATenantWithoutAShareTakesTurnsForWhatTheSharesLeave) {
  STOKER_SKIP_UNDER_TSAN_SINGLE_THREADED();
  // Before, a tenant without a share was not in the schedule: its launches
  // went over the others' turns. Now it takes turns while a tenant with a
  // share wants the device, for the time the shares leave.
  const std::uint64_t period = 100'000'000;
  auto a = Open("a", kNoQuota, 30), z = Open("z", kNoQuota, 0);
  std::uint64_t now = 1'000'000'000;
  EXPECT_FALSE(z->SharesWant(0, now, period)) << "no tenant with a share has asked yet";
  const HeldParts parts = BothAlwaysWant(a.get(), z.get(), true, true, &now);
  std::printf("[ schedule ] a (30%%) %.1f%%, z (no share) %.1f%%\n", parts.a * 100, parts.b * 100);
  EXPECT_NEAR(parts.a, 0.30, 0.02);
  EXPECT_NEAR(parts.b, 0.70, 0.03);
  EXPECT_TRUE(z->SharesWant(0, now, period));
  EXPECT_FALSE(z->SharesWant(0, now + 2 * period, period)) << "a's wish is a period old: z launches freely again";
  // Shares that fill the device leave it nothing while they want it.
  auto b = Open("b", kNoQuota, 70);
  const std::uint64_t start = now;
  std::uint64_t z_held = 0, until = 0;
  Ledger* ledgers[3] = {a.get(), b.get(), z.get()};
  for (int step = 0; step < 50'000; ++step, now += 100'000) {
    for (int t = 0; t < 3; ++t) {
      Ledger* l = ledgers[t];
      if (l->HoldsDevice(0) || l->AcquireDevice(0, now, period, &until, true)) {
        if (now >= l->HoldUntil(0) && !l->ExtendTurn(0, now, period, true, &until))
          l->ReleaseDevice(0, now, period);
        else if (t == 2)
          z_held += 100'000;
      }
    }
  }
  std::printf("[ schedule ] beside 30%% and 70%%, z held the device %.1f%% of the time\n",
              100.0 * static_cast<double>(z_held) / static_cast<double>(now - start));
  EXPECT_LT(static_cast<double>(z_held) / static_cast<double>(now - start), 0.02);
}

TEST_F(LedgerTest, ATenantsShareCanDifferByCard) {
  STOKER_SKIP_UNDER_TSAN_SINGLE_THREADED();
  // Tenant a: 70% by default, 30% on card 1 (a grant of different parts of
  // two cards). Beside b at 70% on card 1, a gets 30% of card 1's time.
  const std::uint8_t uuid1[16] = {0xbb, 1};
  std::string error;
  std::unique_ptr<Ledger> a(Ledger::Open(path_, &error)), b(Ledger::Open(path_, &error));
  ASSERT_TRUE(a && b) << error;
  ASSERT_TRUE(a->Register("a", 70, &error)) << error;
  ASSERT_TRUE(b->Register("b", 70, &error)) << error;
  ASSERT_EQ(a->Device(kUuid, 16ull << 30), 0);
  ASSERT_EQ(a->Device(uuid1, 16ull << 30), 1);
  ASSERT_EQ(b->Device(uuid1, 16ull << 30), 1);
  ASSERT_TRUE(a->SetComputeShare(1, 30, &error)) << error;
  ASSERT_TRUE(b->SetComputeShare(1, 70, &error)) << error;
  // Another process of a asking a different share there is refused, naming both.
  std::unique_ptr<Ledger> a2(Ledger::Open(path_, &error));
  ASSERT_TRUE(a2 && a2->Register("a", 70, &error)) << error;
  EXPECT_FALSE(a2->SetComputeShare(1, 50, &error));
  EXPECT_NE(error.find("compute share of 30% on GPU-bb010000"), std::string::npos) << error;
  EXPECT_NE(error.find("asks for 50%"), std::string::npos) << error;
  EXPECT_TRUE(a2->SetComputeShare(1, 30, &error)) << error;
  a2.reset();
  std::uint64_t now = 1'000'000'000;
  const double share_a = ContendedShare(a.get(), b.get(), 1, &now);
  std::printf("[ schedule ] tenant a (30%% on card 1, 70%% elsewhere) held card 1 %.1f%% of the contended time\n",
              share_a * 100);
  EXPECT_NEAR(share_a, 0.30, 0.02);
  const LedgerReport r = Read();
  ASSERT_EQ(r.tenants.size(), 2u);
  EXPECT_EQ(r.tenants[0].compute_share, 70u);
  EXPECT_EQ(r.tenants[0].compute_shares, (std::vector<std::uint32_t>{70, 30}));
}

TEST_F(LedgerTest, AnAgentRecordsAProcesssNodePidOnItsSlotOnly) {
  auto me = Open("t", kNoQuota);
  EXPECT_EQ(me->HostPid(), 0);
  std::string error;
  std::unique_ptr<Ledger> agent(Ledger::Open(path_, &error));
  ASSERT_TRUE(agent) << error;
  EXPECT_FALSE(agent->RecordHostPid(::getpid() + 1, 4242)) << "no slot has that PID";
  EXPECT_TRUE(agent->RecordHostPid(::getpid(), 4242));
  EXPECT_EQ(me->HostPid(), 4242);
  // Two slots with one PID (processes of two PID namespaces sharing the
  // ledger): which is which cannot be told, so neither is written.
  auto other = Open("u", kNoQuota);
  EXPECT_FALSE(agent->RecordHostPid(::getpid(), 777));
  EXPECT_EQ(me->HostPid(), 4242);
  EXPECT_EQ(other->HostPid(), 0);
  // The agent's own slot (not registered) is never a match.
  EXPECT_EQ(InnermostPid(::getpid()), ::getpid()) << "this test runs in the node's PID namespace";
  EXPECT_EQ(RecordHostPids({::getpid()}), 0u) << "a process in the caller's namespace needs no telling";
}

TEST_F(LedgerTest, OverrunsArePaidForButNotTheTenantsOwnWaitAndDebtIsBounded) {
  auto a = Open("a", kNoQuota, 50), b = Open("b", kNoQuota, 50);
  const std::uint64_t period = 100'000'000, ms = 1'000'000;
  std::uint64_t t = 1'000'000'000, until = 0;
  ASSERT_TRUE(a->AcquireDevice(0, t, period, &until));
  // a gives its turn back at +5 ms with work still queued (a collective
  // waiting for a peer that cannot launch before a's next turn); b holds
  // the device from then to +60 ms while a waits; a's work ends at +70 ms.
  a->ReleaseDevice(0, t + 5 * ms, period, /*work_running=*/true);
  const std::uint64_t waited_at_release = a->WaitedNs(t + 5 * ms);
  ASSERT_TRUE(b->AcquireDevice(0, t + 5 * ms, period, &until));
  EXPECT_FALSE(a->AcquireDevice(0, t + 10 * ms, period, &until));
  b->ReleaseDevice(0, t + 60 * ms, period);
  ASSERT_TRUE(a->HoldsDevice(0));
  EXPECT_EQ(a->WaitedNs(t + 60 * ms) - waited_at_release, 50 * ms);
  a->ChargeOverrun(0, t + 5 * ms, t + 70 * ms, waited_at_release, period);
  // Charged 65 - 50 = 15 ms of overrun besides its 5 ms turn: 30 ms left of
  // its 50 ms window (plus what it earned meanwhile, capped at the window).
  a->ReleaseDevice(0, t + 70 * ms, period);
  EXPECT_EQ(a->BudgetWait(0, t + 70 * ms, period), 0u) << "the wait for its own turn was charged as device time";
  // A debt, however large, is paid back in bounded time (10 s of overrun
  // at 50%: at most StuckAfter, 1 s, of debt, paid in 2 s).
  a->ChargeOverrun(0, t + 100 * ms, t + 10'100 * ms, a->WaitedNs(t + 100 * ms), period);
  EXPECT_LE(a->BudgetWait(0, t + 10'100 * ms, period), 2'010 * ms);
  EXPECT_GT(a->BudgetWait(0, t + 10'100 * ms, period), 1'900 * ms);
}

TEST_F(LedgerTest, ATenantsTurnCoversAllItsDevicesSoNoTwoTenantsWaitOnEachOther) {
  // Two jobs, each with a process on card 0 and one on card 1 (NCCL-style:
  // a step needs both). Whatever order they ask in, each turn goes to one
  // job on both cards: never job A on one card and job B on the other.
  const std::uint8_t uuid1[16] = {0xbb, 1};
  std::string error;
  std::unique_ptr<Ledger> procs[2][2];
  for (int job = 0; job < 2; ++job)
    for (int card = 0; card < 2; ++card) {
      procs[job][card].reset(Ledger::Open(path_, &error));
      ASSERT_TRUE(procs[job][card]) << error;
      ASSERT_TRUE(procs[job][card]->Register(job == 0 ? "a" : "b", 50, &error)) << error;
      ASSERT_EQ(procs[job][card]->Device(kUuid, 16ull << 30), 0);
      ASSERT_EQ(procs[job][card]->Device(uuid1, 16ull << 30), 1);
    }
  const std::uint64_t period = 100'000'000, ms = 1'000'000;
  std::uint64_t now = 1'000'000'000, until = 0;
  // Each process has launched on its card once (its tenant's devices known).
  for (int job = 0; job < 2; ++job)
    for (int card = 0; card < 2; ++card) {
      (void)procs[job][card]->AcquireDevice(card, now, period, &until);
      now += ms;
    }
  int both = 0, split = 0;
  for (int step = 0; step < 2000; ++step, now += ms / 2) {
    // The two cards' holders, from what each process sees.
    const int holder0 = procs[0][0]->HoldsDevice(0) ? 0 : procs[1][0]->HoldsDevice(0) ? 1 : -1;
    const int holder1 = procs[0][1]->HoldsDevice(1) ? 0 : procs[1][1]->HoldsDevice(1) ? 1 : -1;
    if (holder0 >= 0 && holder1 >= 0) (holder0 == holder1 ? both : split)++;
    // Card 1's process of job B asks first every other step; turns end on time.
    for (int k = 0; k < 4; ++k) {
      const int job = (step % 2 == 0) ? k / 2 : 1 - k / 2, card = k % 2;
      Ledger& l = *procs[job][card];
      if (l.HoldsDevice(card)) {
        if (now >= l.HoldUntil(card)) l.ReleaseDevice(card, now, period);
      } else {
        (void)l.AcquireDevice(card, now, period, &until);
      }
    }
  }
  std::printf("[ gang ] steps with one job on both cards: %d, with the jobs split over the cards: %d\n", both, split);
  EXPECT_EQ(split, 0);
  EXPECT_GT(both, 1000);
}

// Whether every tenant's charge is the sum of its processes' (what a repair
// restores, and what must hold after any repair).
bool TenantsAddUp(const LedgerReport& r) {
  for (const auto& t : r.tenants) {
    std::vector<std::uint64_t> sum(t.charged.size(), 0);
    for (const auto& p : t.processes)
      for (std::size_t d = 0; d < sum.size() && d < p.charged.size(); ++d) sum[d] += p.charged[d];
    if (sum != t.charged) return false;
  }
  return true;
}

TEST_F(LedgerTest, AStoppedHolderIsFencedOutAndOthersGoOnWithinTheBound) {
  auto me = Open("t", 1000 * kMiB);
  int to_child[2], from_child[2];
  ASSERT_EQ(::pipe(to_child), 0);
  ASSERT_EQ(::pipe(from_child), 0);
  const pid_t child = ::fork();
  if (child == 0) {
    std::string error;
    Ledger* l = Ledger::Open(path_, &error);
    if (l == nullptr || !l->Register("t", 0, &error)) _exit(3);
    const int d = l->Device(kUuid, 16ull << 30);
    if (!l->Charge(d, 200 * kMiB)) _exit(4);
    l->LockAndAbandonForTest();  // inside its critical section...
    (void)::write(from_child[1], "x", 1);
    ::raise(SIGSTOP);  // ...and stopped there, as by SIGSTOP, a freezer or a debugger
    char c;
    if (::read(to_child[0], &c, 1) != 1) _exit(5);
    l->UnlockForTest();  // resumed: finds itself fenced out, flags a repair
    const bool charged = l->Charge(d, 100 * kMiB);
    (void)::write(from_child[1], charged ? "y" : "n", 1);
    for (;;) ::pause();
  }
  char c;
  ASSERT_EQ(::read(from_child[0], &c, 1), 1);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, WUNTRACED), child);
  ASSERT_TRUE(WIFSTOPPED(status));
  const auto start = std::chrono::steady_clock::now();
  EXPECT_TRUE(me->Charge(0, 500 * kMiB));
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  std::printf("[ fence ] a holder stopped inside the lock held others up %.0f ms (bound %.0f ms)\n", ms,
              kLockBoundNs / 1e6);
  EXPECT_GE(ms, kLockBoundNs / 1e6 * 0.9);
  EXPECT_LT(ms, kLockBoundNs / 1e6 + 2000);
  // While it stays stopped nobody waits on it again.
  const auto again = std::chrono::steady_clock::now();
  me->Uncharge(0, 500 * kMiB);
  const double again_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - again).count();
  EXPECT_LT(again_ms, 100);
  LedgerReport r = Read();
  EXPECT_EQ(r.fences, 1u);
  EXPECT_TRUE(TenantsAddUp(r));
  EXPECT_EQ(me->TenantCharged(0), 200 * kMiB);  // the stopped process still holds its memory
  // Resumed, it neither releases the lock it lost nor leaves the ledger inconsistent.
  ::kill(child, SIGCONT);
  ASSERT_EQ(::write(to_child[1], "go", 1), 1);
  ASSERT_EQ(::read(from_child[0], &c, 1), 1);
  EXPECT_EQ(c, 'y');
  EXPECT_EQ(me->TenantCharged(0), 300 * kMiB);
  r = Read();
  EXPECT_TRUE(TenantsAddUp(r));
  EXPECT_GE(r.repairs, 2u);  // the fence, and the flag the resumed holder left
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  for (int fd : {to_child[0], to_child[1], from_child[0], from_child[1]}) ::close(fd);
}

TEST_F(LedgerTest, TenantsGoOnPastAProcessStoppedAtAnyMoment) {
  // A process of tenant "busy" charges and uncharges in a loop; it is
  // stopped at random moments, sometimes inside the lock. Tenant "other"
  // keeps charging meanwhile: its longest wait stays near the bound, and
  // the ledger adds up after every stop.
  constexpr std::uint64_t kBound = 100'000'000;
  Ledger::SetLockBoundForTest(kBound);
  auto other = Open("other", 1000 * kMiB);
  const pid_t busy = ::fork();
  if (busy == 0) {
    std::string error;
    Ledger* l = Ledger::Open(path_, &error);
    if (l == nullptr || !l->Register("busy", 0, &error)) _exit(3);
    const int d = l->Device(kUuid, 16ull << 30);
    for (;;) {
      if (l->Charge(d, kMiB)) l->Uncharge(d, kMiB);
    }
  }
  std::uint64_t seed = 12345;
  auto next = [&] { return seed = seed * 6364136223846793005ull + 1442695040888963407ull; };
  double worst_ms = 0;
  for (int stop = 0; stop < 20; ++stop) {
    std::this_thread::sleep_for(std::chrono::microseconds(next() >> 54));  // 0-1 ms
    ::kill(busy, SIGSTOP);
    const auto stopped = std::chrono::steady_clock::now();
    while (std::chrono::steady_clock::now() - stopped < std::chrono::milliseconds(300)) {
      const auto t0 = std::chrono::steady_clock::now();
      ASSERT_TRUE(other->Charge(0, kMiB));
      other->Uncharge(0, kMiB);
      worst_ms =
          std::max(worst_ms, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    ::kill(busy, SIGCONT);
    // A holder fenced inside its critical section finishes it when it
    // wakes (a write to its tenant's total the fence already rebuilt), then
    // flags a repair that the next taker of the lock makes: the ledger adds
    // up again once the woken process has run on (under ASan, a Read right
    // after SIGCONT once came between the two).
    bool adds_up = false;
    for (int look = 0; look < 100 && !adds_up; ++look) {
      adds_up = TenantsAddUp(Read());
      if (!adds_up) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_TRUE(adds_up) << "after stop " << stop;
  }
  ::kill(busy, SIGKILL);
  ::waitpid(busy, nullptr, 0);
  const LedgerReport r = Read();
  std::printf(
      "[ fence ] 20 stops at random moments: %llu fenced inside the lock; the other tenant's longest wait "
      "%.0f ms (bound %.0f ms)\n",
      static_cast<unsigned long long>(r.fences), worst_ms, kBound / 1e6);
  EXPECT_LT(worst_ms, kBound / 1e6 + 1000);
  EXPECT_TRUE(TenantsAddUp(r));
  Ledger::SetLockBoundForTest(kLockBoundNs);
}

TEST_F(LedgerTest, EightyTenantsShareANode) {
  std::vector<std::unique_ptr<Ledger>> tenants;
  for (int t = 0; t < 80; ++t) {
    tenants.push_back(Open("pod-" + std::to_string(t), 200 * kMiB));
    ASSERT_TRUE(tenants.back()->Charge(0, 150 * kMiB)) << t;
    EXPECT_FALSE(tenants.back()->Charge(0, 100 * kMiB)) << t;
  }
  const LedgerReport r = Read();
  EXPECT_EQ(r.tenants.size(), 80u);
  EXPECT_TRUE(TenantsAddUp(r));
}

TEST_F(LedgerTest, ALockOnlyProcessTakesASlotButNoTenant) {
  // `stoker gpu ls` and a process that has not registered yet hold a slot
  // (the lock's owner) without appearing as a process of any tenant.
  std::string error;
  std::unique_ptr<Ledger> reader(Ledger::Open(path_, &error));
  ASSERT_TRUE(reader) << error;
  EXPECT_GE(reader->slot(), 0);
  auto a = Open("a", 100 * kMiB);
  EXPECT_NE(a->slot(), reader->slot());
  const LedgerReport r = Read();
  ASSERT_EQ(r.tenants.size(), 1u);
  EXPECT_EQ(r.tenants[0].processes.size(), 1u);
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
  EXPECT_EQ(c->ledger_path, std::string(kDefaultStateDir) + "/ledger-uid" + std::to_string(::getuid()));
  EXPECT_EQ(c->turns_path, std::string(kDefaultStateDir) + "/turns");
  EXPECT_TRUE(c->ledger_in_state_dir && c->turns_in_state_dir);
  // A ledger named by hand holds the compute schedule too, unless turns are named.
  c = parse({{"STOKER_GPU_LEDGER", "/run/x/ledger"}}, &error);
  ASSERT_TRUE(c) << error;
  EXPECT_EQ(c->turns_path, "/run/x/ledger");
  EXPECT_FALSE(c->ledger_in_state_dir || c->turns_in_state_dir);
  c = parse({{"STOKER_GPU_DIR", "/run/stoker"}, {"STOKER_GPU_TURNS", "/run/t"}}, &error);
  ASSERT_TRUE(c) << error;
  EXPECT_EQ(c->ledger_path, "/run/stoker/ledger-uid" + std::to_string(::getuid()));
  EXPECT_EQ(c->turns_path, "/run/t");
  // Compute shares per device: an ordinal's over a card's (by UUID, any
  // case) over the one for every device.
  c = parse({{"STOKER_GPU_COMPUTE_SHARE", "40"},
             {"STOKER_GPU_COMPUTE_SHARE_2", "10"},
             {"STOKER_GPU_COMPUTE_SHARES", "GPU-aa:30, gpu-BB:50"}},
            &error);
  ASSERT_TRUE(c) << error;
  EXPECT_TRUE(c->HasComputeShare());
  EXPECT_EQ(c->ShareFor(0, "GPU-AA"), 30u);
  EXPECT_EQ(c->ShareFor(1, "GPU-bb"), 50u);
  EXPECT_EQ(c->ShareFor(2, "GPU-aa"), 10u);
  EXPECT_EQ(c->ShareFor(3, "GPU-cc"), 40u);
  c = parse({{"STOKER_GPU_COMPUTE_SHARES", "GPU-aa:30"}}, &error);
  ASSERT_TRUE(c) << error;
  EXPECT_TRUE(c->HasComputeShare());
  EXPECT_EQ(c->ShareFor(0, "GPU-cc"), 0u) << "no share on a card not named";
  EXPECT_FALSE(parse({}, &error)->HasComputeShare());
  for (auto [name, value, says] : std::vector<std::tuple<const char*, const char*, const char*>>{
           {"STOKER_GPU_COMPUTE_SHARE_1", "101", "STOKER_GPU_COMPUTE_SHARE_1='101' must be a whole percentage"},
           {"STOKER_GPU_COMPUTE_SHARES", "GPU-aa", "'GPU-aa' is not CARD:PERCENT"},
           {"STOKER_GPU_COMPUTE_SHARES", "GPU-aa:30,", "'' is not CARD:PERCENT"},
           {"STOKER_GPU_COMPUTE_SHARES", ":30", "':30' is not CARD:PERCENT"},
           {"STOKER_GPU_COMPUTE_SHARES", "GPU-aa:0", "'GPU-aa:0' is not CARD:PERCENT"},
           {"STOKER_GPU_COMPUTE_SHARES", "GPU-aa:30,gpu-AA:20", "names card gpu-AA twice"}}) {
    error.clear();
    EXPECT_FALSE(parse({{name, value}}, &error)) << name << "=" << value;
    EXPECT_NE(error.find(says), std::string::npos) << error;
  }
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

TEST(PinnedLimits, TheFileWinsAndTheEnvironmentMayOnlyTighten) {
  char dir_template[] = "/tmp/stoker-pinned-XXXXXX";
  const std::string dir = ::mkdtemp(dir_template);  // 0700, ours
  const std::string path = dir + "/gpu-limits";
  auto write = [&](const std::string& text, mode_t mode) {
    FILE* f = std::fopen(path.c_str(), "w");
    std::fputs(text.c_str(), f);
    std::fclose(f);
    ::chmod(path.c_str(), mode);
  };
  auto effective = [&](std::vector<std::pair<const char*, const char*>> env, std::string* error) {
    ShareConfig c;
    const bool ok = EffectiveShareConfig(
        [&](const char* name) -> const char* {
          for (auto& [k, v] : env)
            if (std::strcmp(k, name) == 0) return v;
          return nullptr;
        },
        path, &c, error);
    return ok ? std::optional<ShareConfig>(c) : std::nullopt;
  };
  std::string error;
  // No file: the environment, as before.
  auto c = effective({{"STOKER_GPU_MEMORY_LIMIT", "64GiB"}}, &error);
  ASSERT_TRUE(c) << error;
  EXPECT_EQ(c->LimitFor(0), 64ull << 30);
  EXPECT_TRUE(c->pinned_from.empty());
  if (::geteuid() != 0) GTEST_SKIP() << "a trusted file must be root's";
  write(
      "# pinned by the operator\nSTOKER_GPU_MEMORY_LIMIT=1GiB\nSTOKER_GPU_TENANT = "
      "pinned\n\nSTOKER_GPU_COMPUTE_SHARE=30\n",
      0644);
  // Cleared: the file alone holds the process.
  c = effective({}, &error);
  ASSERT_TRUE(c) << error;
  EXPECT_EQ(c->LimitFor(0), 1ull << 30);
  EXPECT_EQ(c->tenant, "pinned");
  EXPECT_EQ(c->compute_share, 30u);
  EXPECT_EQ(c->pinned_from, path);
  // Asking for more changes nothing; asking for less is granted.
  c = effective(
      {{"STOKER_GPU_MEMORY_LIMIT", "64GiB"}, {"STOKER_GPU_TENANT", "mine"}, {"STOKER_GPU_COMPUTE_SHARE", "90"}},
      &error);
  ASSERT_TRUE(c) << error;
  EXPECT_EQ(c->LimitFor(0), 1ull << 30);
  EXPECT_EQ(c->tenant, "pinned");
  EXPECT_EQ(c->compute_share, 30u);
  c = effective({{"STOKER_GPU_MEMORY_LIMIT_1", "512MiB"}, {"STOKER_GPU_COMPUTE_SHARE", "10"}}, &error);
  ASSERT_TRUE(c) << error;
  EXPECT_EQ(c->LimitFor(0), 1ull << 30);
  EXPECT_EQ(c->LimitFor(1), 512ull << 20);
  EXPECT_EQ(c->compute_share, 10u);
  // Files in gpu-limits.d/ apply too (the device plugin mounts one per resource).
  const std::string dot_d = path + ".d";
  ASSERT_EQ(::mkdir(dot_d.c_str(), 0755), 0);
  {
    FILE* f = std::fopen((dot_d + "/compute").c_str(), "w");
    std::fputs("STOKER_GPU_COMPUTE_SHARE=20\nSTOKER_GPU_TURNS_TENANT=pod-a\n", f);
    std::fclose(f);
  }
  c = effective({{"STOKER_GPU_COMPUTE_SHARE", "90"}}, &error);
  ASSERT_TRUE(c) << error;
  EXPECT_EQ(c->compute_share, 20u);
  EXPECT_EQ(c->turns_tenant, "pod-a");
  EXPECT_EQ(c->LimitFor(0), 1ull << 30);
  EXPECT_EQ(c->pinned_from, path + ", " + dot_d + "/compute");
  // Per-card shares pinned (the device plugin's grant over two cards): the
  // environment may lower a card's, by ordinal, card or for all, never raise it.
  {
    FILE* f = std::fopen((dot_d + "/compute").c_str(), "w");
    std::fputs("STOKER_GPU_COMPUTE_SHARE=20\nSTOKER_GPU_COMPUTE_SHARES=GPU-aa:40,GPU-bb:20\n", f);
    std::fclose(f);
  }
  c = effective({{"STOKER_GPU_COMPUTE_SHARE_0", "90"}, {"STOKER_GPU_COMPUTE_SHARES", "GPU-bb:100"}}, &error);
  ASSERT_TRUE(c) << error;
  EXPECT_EQ(c->ShareFor(0, "GPU-aa"), 40u);
  EXPECT_EQ(c->ShareFor(1, "GPU-bb"), 20u);
  EXPECT_EQ(c->ShareFor(2, "GPU-cc"), 20u);
  c = effective({{"STOKER_GPU_COMPUTE_SHARE_0", "10"}, {"STOKER_GPU_COMPUTE_SHARE", "15"}}, &error);
  ASSERT_TRUE(c) << error;
  EXPECT_EQ(c->ShareFor(0, "GPU-aa"), 10u);
  EXPECT_EQ(c->ShareFor(1, "GPU-bb"), 15u);
  ::unlink((dot_d + "/compute").c_str());
  ::rmdir(dot_d.c_str());
  // A file others could write, or one that does not parse, stops the process.
  write("STOKER_GPU_MEMORY_LIMIT=1GiB\n", 0666);
  EXPECT_FALSE(effective({}, &error));
  EXPECT_NE(error.find("are not to be trusted"), std::string::npos) << error;
  write("STOKER_GPU_MEMORY_LIMIT=1GiB\nLD_PRELOAD=/tmp/evil.so\n", 0644);
  EXPECT_FALSE(effective({}, &error));
  EXPECT_NE(error.find("line 2: 'LD_PRELOAD=/tmp/evil.so' is not KEY=VALUE"), std::string::npos) << error;
  write("STOKER_GPU_MEMORY_LIMIT=lots\n", 0644);
  EXPECT_FALSE(effective({}, &error));
  EXPECT_NE(error.find(path), std::string::npos) << error;
  ::unlink(path.c_str());
  ::rmdir(dir.c_str());
}

}  // namespace
}  // namespace stoker::share
