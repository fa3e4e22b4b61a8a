// The sweep of ended containers' host state (kube/tenant_sweep.h).
#include "kube/tenant_sweep.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <memory>

#include <gtest/gtest.h>

#include "kube/plugin_devices.h"
#include "share/ledger.h"

namespace stoker::kube {
namespace {

namespace fs = std::filesystem;

class TenantSweepTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = "/tmp/stoker-sweep-" + std::to_string(::getpid()) + "-" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::remove_all(dir_);
    fs::create_directories(dir_ + "/tenants");
    fs::create_directories(dir_ + "/limits");
  }
  void TearDown() override { fs::remove_all(dir_); }
  // The state a grant of `ids` leaves on the host, as the plugin makes it.
  std::string Grant(const std::vector<std::string>& ids, bool folder = true) {
    const std::string tenant = TenantOf(ids);
    if (folder) fs::create_directories(dir_ + "/tenants/" + tenant);
    std::ofstream(dir_ + "/limits/" + tenant + (folder ? ".memory" : ".compute")) << "STOKER_GPU_TENANT=" << tenant;
    return tenant;
  }
  bool Present(const std::string& tenant) {
    return fs::exists(dir_ + "/tenants/" + tenant) || fs::exists(dir_ + "/limits/" + tenant + ".memory") ||
           fs::exists(dir_ + "/limits/" + tenant + ".compute");
  }
  std::string dir_;
};

TEST_F(TenantSweepTest, OnlyEndedTenantsPastTheGraceAreRemoved) {
  const std::string listed = Grant({"GPU-a_m0", "GPU-a_m1"});
  const std::string ended = Grant({"GPU-a_m2"});
  const std::string ended_compute = Grant({"GPU-a_c0", "GPU-a_c1"}, /*folder=*/false);
  // Not the plugin's: never touched.
  fs::create_directories(dir_ + "/tenants/someone-else");
  std::ofstream(dir_ + "/limits/notes.txt") << "x";
  // Within the grace period nothing goes: a container being made may not be listed yet.
  auto swept = SweepEndedTenants(dir_, {listed}, std::chrono::seconds(3600));
  ASSERT_TRUE(swept.ok()) << swept.error().ToString();
  EXPECT_TRUE(swept->removed.empty());
  EXPECT_TRUE(Present(ended));
  swept = SweepEndedTenants(dir_, {listed}, std::chrono::seconds(0));
  ASSERT_TRUE(swept.ok()) << swept.error().ToString();
  std::vector<std::string> expected = {ended, ended_compute};
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(swept->removed, expected);
  EXPECT_TRUE(Present(listed));
  EXPECT_FALSE(Present(ended));
  EXPECT_FALSE(Present(ended_compute));
  EXPECT_TRUE(fs::exists(dir_ + "/tenants/someone-else"));
  EXPECT_TRUE(fs::exists(dir_ + "/limits/notes.txt"));
  // A host folder the plugin never made: nothing to do.
  swept = SweepEndedTenants(dir_ + "/none", {}, std::chrono::seconds(0));
  ASSERT_TRUE(swept.ok());
  EXPECT_TRUE(swept->removed.empty());
}

TEST_F(TenantSweepTest, ATenantWhoseLedgerALiveProcessHoldsIsKept) {
  // The kubelet no longer lists the container, but one of its processes
  // still runs (a container being torn down): its ledger stays.
  const std::string tenant = Grant({"GPU-b_m0"});
  const std::string ledger_path = dir_ + "/tenants/" + tenant + "/ledger";
  std::string error;
  std::unique_ptr<share::Ledger> ledger(share::Ledger::Open(ledger_path, &error));
  ASSERT_TRUE(ledger) << error;
  ASSERT_TRUE(ledger->Register(tenant, 0, &error)) << error;
  auto swept = SweepEndedTenants(dir_, {}, std::chrono::seconds(0));
  ASSERT_TRUE(swept.ok()) << swept.error().ToString();
  EXPECT_TRUE(swept->removed.empty());
  EXPECT_EQ(swept->in_use, std::vector<std::string>{tenant});
  EXPECT_TRUE(fs::exists(ledger_path));
  ledger.reset();  // the process ends
  swept = SweepEndedTenants(dir_, {}, std::chrono::seconds(0));
  ASSERT_TRUE(swept.ok()) << swept.error().ToString();
  EXPECT_EQ(swept->removed, std::vector<std::string>{tenant});
  EXPECT_FALSE(Present(tenant));
  // A ledger that is not one (or of another version) does not keep an ended tenant.
  const std::string junk = Grant({"GPU-b_m1"});
  std::ofstream(dir_ + "/tenants/" + junk + "/ledger") << "not a ledger";
  swept = SweepEndedTenants(dir_, {}, std::chrono::seconds(0));
  ASSERT_TRUE(swept.ok()) << swept.error().ToString();
  EXPECT_EQ(swept->removed, std::vector<std::string>{junk});
  ASSERT_EQ(swept->notes.size(), 1u);
  EXPECT_NE(swept->notes[0].find(junk + "/ledger"), std::string::npos) << swept->notes[0];
}

}  // namespace
}  // namespace stoker::kube
