// The node agent's compute schedule (turns_broker.h) and the processes'
// side of it (brokered_turns.h), in one process: each BrokeredTurns is a
// connection of its own, as each process under the interposer would be.
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "share/brokered_turns.h"
#include "share/ledger.h"
#include "share/turns_broker.h"
#include "share/turns_protocol.h"

namespace stoker::share {
namespace {

constexpr std::uint64_t kPeriodNs = 100'000'000;
constexpr std::uint8_t kCard[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};

std::uint64_t Now() {
  struct timespec ts {};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1'000'000'000ull + static_cast<std::uint64_t>(ts.tv_nsec);
}

class TurnsBrokerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = "/dev/shm/stoker-broker-test-" + std::to_string(::getpid()) + "-" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    ASSERT_EQ(std::system(("rm -rf " + dir_ + " && mkdir -p " + dir_ + "/limits").c_str()), 0);
    options_.turns_path = dir_ + "/turns";
    options_.socket_path = dir_ + "/turns.sock";
    options_.limits_dir = dir_ + "/limits";
    options_.log = [this](const std::string& line) {
      std::lock_guard<std::mutex> lock(log_mu_);  // the broker's thread
      log_.push_back(line);
    };
  }
  void TearDown() override {
    broker_.reset();
    (void)std::system(("rm -rf " + dir_).c_str());
  }
  void StartBroker() {
    std::string error;
    broker_ = TurnsBroker::Start(options_, &error);
    ASSERT_NE(broker_, nullptr) << error;
  }
  std::unique_ptr<BrokeredTurns> Client(const std::string& tenant, std::uint32_t share, std::string* error,
                                        const std::string& proof = "") {
    BrokeredTurns::Options o;
    o.socket_path = options_.socket_path;
    o.turns_path = options_.turns_path;
    o.tenant = tenant;
    o.compute_share = share;
    o.proof_path = proof;
    return std::unique_ptr<BrokeredTurns>(BrokeredTurns::Open(o, error));
  }
  LedgerReport Report() {
    LedgerReport report;
    std::string error;
    EXPECT_TRUE(Ledger::Report(options_.turns_path, &report, &error)) << error;
    return report;
  }
  // Asks for device `d` until granted or `seconds` pass.
  static bool AcquireWithin(BrokeredTurns& turns, int d, double seconds) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    std::uint64_t until = 0;
    while (std::chrono::steady_clock::now() < deadline) {
      if (turns.AcquireDevice(d, Now(), kPeriodNs, &until, true)) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return false;
  }

  std::string dir_;
  TurnsBroker::Options options_;
  std::mutex log_mu_;
  std::vector<std::string> log_;
  std::unique_ptr<TurnsBroker> broker_;
};

TEST_F(TurnsBrokerTest, TheScheduleIsTheAgentsAndNamesCarryTheCallersUid) {
  // A schedule a user made writable by all is taken back.
  {
    LedgerFile shared;
    shared.mode = 0666;
    std::string error;
    std::unique_ptr<Ledger> made(Ledger::Open(options_.turns_path, &error, shared));
    ASSERT_NE(made, nullptr) << error;
  }
  StartBroker();
  struct stat st {};
  ASSERT_EQ(::stat(options_.turns_path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0644u);
  EXPECT_EQ(st.st_uid, ::geteuid());
  EXPECT_TRUE(TurnsAreBrokered(options_.turns_path) || ::geteuid() != 0);
  ASSERT_EQ(::stat(options_.socket_path.c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0666u);

  std::string error;
  auto a = Client("team", 30, &error);
  ASSERT_NE(a, nullptr) << error;
  const int d = a->Device(kCard, 80ull << 30);
  ASSERT_GE(d, 0);
  ASSERT_TRUE(a->SetComputeShare(d, 30, &error)) << error;
  const LedgerReport report = Report();
  ASSERT_EQ(report.tenants.size(), 1u);
  // The uid is the kernel's word: the name a process gives cannot pass for
  // another user's tenant.
  EXPECT_EQ(report.tenants[0].name, "team@uid" + std::to_string(::getuid()));
  ASSERT_EQ(report.tenants[0].processes.size(), 1u);
  EXPECT_EQ(report.tenants[0].processes[0].pid, ::getpid());  // the process it stands for, not the agent
  EXPECT_EQ(broker_->clients(), 1u);

  // A bare name only with the pinned limits file written for it.
  const std::string pinned = options_.limits_dir + "/k8s-0123456789abcdef.compute";
  std::ofstream(pinned) << "STOKER_GPU_COMPUTE_SHARE=50\n";
  auto pod = Client("k8s-0123456789abcdef", 50, &error, pinned);
  ASSERT_NE(pod, nullptr) << error;
  const std::string other = options_.limits_dir + "/k8s-fedcba9876543210.compute";
  std::ofstream(other) << "STOKER_GPU_COMPUTE_SHARE=50\n";
  auto impostor = Client("k8s-0123456789abcdef", 50, &error, other);
  EXPECT_EQ(impostor, nullptr);
  EXPECT_NE(error.find("the pinned limits file this process passed is not tenant 'k8s-0123456789abcdef'"),
            std::string::npos)
      << error;
  auto bad = Client("no spaces", 50, &error);
  EXPECT_EQ(bad, nullptr);
  EXPECT_NE(error.find("tenant 'no spaces' must be 1-63 characters"), std::string::npos) << error;
  std::vector<std::string> names;
  for (const auto& t : Report().tenants) names.push_back(t.name);
  EXPECT_EQ(names.size(), 2u);
  EXPECT_NE(std::find(names.begin(), names.end(), "k8s-0123456789abcdef"), names.end());
  {
    std::lock_guard<std::mutex> lock(log_mu_);
    EXPECT_EQ(log_.size(), 2u);  // the two refusals, named for the operator
  }
  // An agent that keeps no pinned limits (bare metal) takes the file as
  // no proof: the name carries the uid, and the process is not refused.
  {
    broker_.reset();
    options_.limits_dir.clear();
    StartBroker();
    auto bare = Client("k8s-0123456789abcdef", 50, &error, pinned);
    ASSERT_NE(bare, nullptr) << error;
    bool found = false;
    for (const auto& t : Report().tenants) found |= t.name == "k8s-0123456789abcdef@uid" + std::to_string(::getuid());
    EXPECT_TRUE(found);
  }
}

TEST_F(TurnsBrokerTest, TurnsPassBetweenTenantsAndAnEndedProcessGivesItsTurnBack) {
  StartBroker();
  std::string error;
  auto a = Client("a", 50, &error);
  ASSERT_NE(a, nullptr) << error;
  auto b = Client("b", 50, &error);
  ASSERT_NE(b, nullptr) << error;
  const int da = a->Device(kCard, 1ull << 30), db = b->Device(kCard, 1ull << 30);
  ASSERT_TRUE(a->SetComputeShare(da, 50, &error) && b->SetComputeShare(db, 50, &error)) << error;
  std::uint64_t until = 0;
  ASSERT_TRUE(a->AcquireDevice(da, Now(), kPeriodNs, &until, true));
  EXPECT_GT(until, Now());
  // Read from the read-only mapping, as a launch does.
  EXPECT_TRUE(a->HoldsDevice(da));
  EXPECT_FALSE(b->HoldsDevice(db));
  EXPECT_FALSE(b->AcquireDevice(db, Now(), kPeriodNs, &until, true));
  EXPECT_EQ(a->HoldUntil(da), until);
  // Given back: b's turn.
  a->ReleaseDevice(da, Now(), kPeriodNs, false);
  EXPECT_FALSE(a->HoldsDevice(da));
  ASSERT_TRUE(AcquireWithin(*b, db, 2.0));
  EXPECT_TRUE(b->HoldsDevice(db));
  // b's process ends holding the turn (its connection closes): a, which
  // asked meanwhile and waits, gets it, and the agent counted its wait.
  EXPECT_FALSE(a->AcquireDevice(da, Now(), kPeriodNs, &until, true));
  b.reset();
  ASSERT_TRUE(AcquireWithin(*a, da, 2.0));
  EXPECT_TRUE(a->HoldsDevice(da));
  EXPECT_GT(a->WaitedNs(Now()), 0u);
}

TEST_F(TurnsBrokerTest, WithoutTheAgentLaunchesWaitAndGoOnWhenItIsBack) {
  StartBroker();
  std::string error;
  auto a = Client("a", 40, &error);
  ASSERT_NE(a, nullptr) << error;
  const int d = a->Device(kCard, 1ull << 30);
  ASSERT_TRUE(a->SetComputeShare(d, 40, &error)) << error;
  std::uint64_t until = 0;
  ASSERT_TRUE(a->AcquireDevice(d, Now(), kPeriodNs, &until, true));
  // The agent stops: the turn is gone, and none is granted (never
  // unlimited) until an agent serves again.
  broker_.reset();
  EXPECT_FALSE(a->AcquireDevice(d, Now(), kPeriodNs, &until, true));
  EXPECT_FALSE(a->HoldsDevice(d));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_FALSE(a->AcquireDevice(d, Now(), kPeriodNs, &until, true));
  // A process that starts meanwhile waits too; it is not refused.
  auto late = Client("late", 40, &error);
  ASSERT_NE(late, nullptr) << error;
  const int dl = late->Device(kCard, 1ull << 30);
  ASSERT_TRUE(late->SetComputeShare(dl, 40, &error)) << error;
  StartBroker();
  ASSERT_TRUE(AcquireWithin(*a, d, 2.0));  // its place (tenant, device, share) taken again
  a->ReleaseDevice(d, Now(), kPeriodNs, false);
  ASSERT_TRUE(AcquireWithin(*late, dl, 2.0));
  std::vector<std::pair<std::string, std::uint32_t>> shares;
  for (const auto& t : Report().tenants)
    shares.emplace_back(t.name, t.compute_shares.empty() ? 0 : t.compute_shares[0]);
  ASSERT_EQ(shares.size(), 2u);
  for (const auto& [name, share] : shares) EXPECT_EQ(share, 40u) << name;
}

TEST_F(TurnsBrokerTest, AForkedChildTakesAPlaceOfItsOwn) {
  StartBroker();
  std::string error;
  auto a = Client("a", 50, &error);
  ASSERT_NE(a, nullptr) << error;
  const int d = a->Device(kCard, 1ull << 30);
  ASSERT_TRUE(a->SetComputeShare(d, 50, &error)) << error;
  std::uint64_t until = 0;
  ASSERT_TRUE(a->AcquireDevice(d, Now(), kPeriodNs, &until, true));
  const pid_t child = ::fork();
  if (child == 0) {
    // The parent's connection is not the child's: it asks for its own,
    // under the same tenant, which holds the device already.
    a->DetachAfterFork();
    std::string e;
    const bool reopened = a->ReopenAfterFork(&e);
    const bool holds = a->AcquireDevice(d, Now(), kPeriodNs, &until, true) && a->HoldsDevice(d);
    ::_exit(reopened && holds ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  // The parent's place is untouched by the child's coming and going (the
  // agent sees the child's connection close a moment later).
  EXPECT_TRUE(a->HoldsDevice(d));
  LedgerReport report;
  for (int i = 0; i < 200; ++i) {
    report = Report();
    if (report.tenants.size() == 1 && report.tenants[0].processes.size() == 1) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(report.tenants.size(), 1u);
  EXPECT_EQ(report.tenants[0].processes.size(), 1u);
  EXPECT_TRUE(a->HoldsDevice(d));
}

TEST_F(TurnsBrokerTest, OneUserCannotTakeEveryPlaceAndTheOneOverWaitsForAPlace) {
  // A user's processes beyond the cap (1,024 by default; 8 here) wait (the
  // agent closes their connection and says so); they are not refused for
  // good, and get in once one of the user's others ends.
  options_.max_clients_per_uid = 8;
  StartBroker();
  std::string error;
  std::vector<std::unique_ptr<BrokeredTurns>> clients;
  for (std::size_t i = 0; i < options_.max_clients_per_uid; ++i) {
    clients.push_back(Client("many", 10, &error));
    ASSERT_NE(clients.back(), nullptr) << i << ": " << error;
  }
  EXPECT_EQ(broker_->clients(), options_.max_clients_per_uid);
  auto over = Client("many", 10, &error);
  ASSERT_NE(over, nullptr) << error;  // waiting, not refused
  const int d = over->Device(kCard, 1ull << 30);
  ASSERT_TRUE(over->SetComputeShare(d, 10, &error)) << error;
  std::uint64_t until = 0;
  EXPECT_FALSE(over->AcquireDevice(d, Now(), kPeriodNs, &until, true));
  {
    std::lock_guard<std::mutex> lock(log_mu_);
    ASSERT_FALSE(log_.empty());
    EXPECT_NE(log_.back().find("refused a connection of uid"), std::string::npos) << log_.back();
  }
  clients.pop_back();  // one of the user's processes ends
  EXPECT_TRUE(AcquireWithin(*over, d, 3.0));
  const LedgerReport report = Report();
  ASSERT_EQ(report.tenants.size(), 1u);
  EXPECT_EQ(report.tenants[0].processes.size(), options_.max_clients_per_uid);
}

TEST_F(TurnsBrokerTest, AnotherReleasesProtocolAndAShareThatDisagreesAreRefusedByName) {
  StartBroker();
  int fd = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::strcpy(address.sun_path, options_.socket_path.c_str());
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  TurnsRequest request{};
  request.version = kTurnsProtocolVersion + 1;
  request.op = static_cast<std::uint32_t>(TurnsOp::kHello);
  std::strcpy(request.tenant, "a");
  ASSERT_EQ(::send(fd, &request, sizeof(request), 0), static_cast<ssize_t>(sizeof(request)));
  TurnsReply reply{};
  ASSERT_EQ(::recv(fd, &reply, sizeof(reply), 0), static_cast<ssize_t>(sizeof(reply)));
  EXPECT_EQ(reply.ok, 0u);
  EXPECT_NE(std::string(reply.error).find("run the agent and the jobs from one stoker release"), std::string::npos)
      << reply.error;
  EXPECT_EQ(::recv(fd, &reply, sizeof(reply), 0), 0);  // and dropped
  ::close(fd);
  // A call before hello, or a short message: dropped without a reply.
  fd = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  ASSERT_EQ(::send(fd, "junk", 4, 0), 4);
  EXPECT_EQ(::recv(fd, &reply, sizeof(reply), 0), 0);
  ::close(fd);

  std::string error;
  auto a = Client("same", 30, &error);
  ASSERT_NE(a, nullptr) << error;
  auto b = Client("same", 60, &error);  // the same tenant, another share
  EXPECT_EQ(b, nullptr);
  EXPECT_NE(error.find("all processes of a tenant must agree"), std::string::npos) << error;
}

}  // namespace
}  // namespace stoker::share
