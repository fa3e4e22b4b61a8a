// The device plugin's pure parts: device IDs, preferred devices, grants.
#include "kube/plugin_devices.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include <set>

namespace stoker::kube {
namespace {

constexpr std::uint64_t kGiB = std::uint64_t{1} << 30;

std::vector<GpuCard> Cards(int n, std::vector<int> numa = {}) {
  std::vector<GpuCard> cards;
  for (int i = 0; i < n; ++i) {
    GpuCard c;
    c.index = i;
    c.uuid = "GPU-" + std::to_string(i) + "aaaaaaa-0000-0000-0000-000000000000";
    c.total_bytes = 8 * kGiB;
    c.numa_node = numa.empty() ? 0 : numa[static_cast<std::size_t>(i)];
    cards.push_back(c);
  }
  return cards;
}

std::vector<std::string> Ids(const std::vector<AdvertisedDevice>& devices) {
  std::vector<std::string> ids;
  for (const auto& d : devices) ids.push_back(d.id);
  return ids;
}

std::set<std::string> CardsOf(const std::vector<std::string>& ids) {
  std::set<std::string> cards;
  for (const auto& id : ids) cards.insert(ParseDeviceId(id)->uuid);
  return cards;
}

TEST(PluginDevices, IdsNameTheirCardAndUnit) {
  const auto cards = Cards(2);
  PluginSettings s;
  const auto memory = DevicesOf(Resource::kMemory, cards, s);
  ASSERT_EQ(memory.size(), 16u);
  auto id = ParseDeviceId(memory[9].id);
  ASSERT_TRUE(id);
  EXPECT_EQ(id->uuid, cards[1].uuid);
  EXPECT_EQ(id->resource, Resource::kMemory);
  EXPECT_EQ(id->unit, 1u);
  EXPECT_EQ(DevicesOf(Resource::kCompute, cards, s).size(), 200u);
  EXPECT_EQ(ParseDeviceId(cards[0].uuid)->resource, Resource::kWholeCards);
  for (const char* bad : {"nvidia0", "GPU-1_x3", "GPU-1_m", "GPU-1_m1a", "GPU-1_m12345678901"})
    EXPECT_FALSE(ParseDeviceId(bad)) << bad;
  s.memory_unit = 512u << 20;
  EXPECT_EQ(DevicesOf(Resource::kMemory, cards, s).size(), 32u);
}

TEST(PluginDevices, PreferredDevicesStayOnOneCardWhenOneHasRoom) {
  const auto cards = Cards(3);
  PluginSettings s;
  auto all = Ids(DevicesOf(Resource::kMemory, cards, s));
  // Card 0 has 2 units left, card 1 has 5, card 2 all 8.
  std::vector<std::string> available;
  for (const auto& id : all) {
    auto p = ParseDeviceId(id);
    const std::uint32_t from = p->uuid == cards[0].uuid ? 6 : p->uuid == cards[1].uuid ? 3 : 0;
    if (p->unit >= from) available.push_back(id);
  }
  auto four = PreferredDevices(Resource::kMemory, available, {}, 4, cards, s);
  ASSERT_TRUE(four.ok());
  EXPECT_EQ(CardsOf(*four), std::set<std::string>{cards[1].uuid}) << "binpack: the fullest card with room";
  s.policy = GpuPolicy::kSpread;
  EXPECT_EQ(CardsOf(*PreferredDevices(Resource::kMemory, available, {}, 4, cards, s)),
            std::set<std::string>{cards[2].uuid});
  // Nine units fit no card: the fewest cards, fullest first under binpack.
  s.policy = GpuPolicy::kBinpack;
  auto nine = PreferredDevices(Resource::kMemory, available, {}, 9, cards, s);
  ASSERT_TRUE(nine.ok());
  EXPECT_EQ(nine->size(), 9u);
  EXPECT_EQ(CardsOf(*nine), (std::set<std::string>{cards[0].uuid, cards[1].uuid, cards[2].uuid}));
  // What must be included is, and the rest joins it.
  auto kept = PreferredDevices(Resource::kMemory, available, {available.back()}, 3, cards, s);
  ASSERT_TRUE(kept.ok());
  EXPECT_EQ(kept->front(), available.back());
  // A pairing wins when its card has room.
  EXPECT_EQ(CardsOf(*PreferredDevices(Resource::kMemory, available, {}, 2, cards, s, cards[2].uuid)),
            std::set<std::string>{cards[2].uuid});
  EXPECT_EQ(PreferredDevices(Resource::kMemory, available, {}, 100, cards, s).error().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(PreferredDevices(Resource::kCompute, available, {}, 1, cards, s).error().code(),
            StatusCode::kInvalidArgument);
}

TEST(PluginDevices, WholeCardsPreferOneNumaNodeThenOnePcieSwitch) {
  auto cards = Cards(4, {1, 0, 1, 0});
  PluginSettings s;
  s.whole_cards = true;
  const auto all = Ids(DevicesOf(Resource::kWholeCards, cards, s));
  auto chosen = PreferredDevices(Resource::kWholeCards, all, {}, 2, cards, s);
  ASSERT_TRUE(chosen.ok());
  EXPECT_EQ(CardsOf(*chosen), (std::set<std::string>{cards[1].uuid, cards[3].uuid}));
  // Node 0 offers only card 1 now: the pair comes from node 1 (cards 0 and 2), not across nodes.
  chosen = PreferredDevices(Resource::kWholeCards, {all[0], all[1], all[2]}, {}, 2, cards, s);
  ASSERT_TRUE(chosen.ok());
  EXPECT_EQ(CardsOf(*chosen), (std::set<std::string>{cards[0].uuid, cards[2].uuid}));
  // One node of four cards, two switches (0+1, 2+3): a pair shares a switch.
  auto node = Cards(4);
  const std::vector<std::vector<int>> levels = {{0, 40, 10, 40}, {40, 0, 40, 10}, {10, 40, 0, 40}, {40, 10, 40, 0}};
  for (std::size_t i = 0; i < 4; ++i) node[i].link_levels = levels[i];
  chosen = PreferredDevices(Resource::kWholeCards, Ids(DevicesOf(Resource::kWholeCards, node, s)), {}, 2, node, s);
  ASSERT_TRUE(chosen.ok());
  EXPECT_EQ(CardsOf(*chosen), (std::set<std::string>{node[0].uuid, node[2].uuid}));
  // What must be included stays, and is not given twice.
  chosen = PreferredDevices(Resource::kWholeCards, Ids(DevicesOf(Resource::kWholeCards, node, s)), {node[1].uuid}, 2,
                            node, s);
  ASSERT_TRUE(chosen.ok());
  EXPECT_EQ((*chosen)[0], node[1].uuid);
  EXPECT_EQ(CardsOf(*chosen).size(), 2u);
}

TEST(PluginDevices, GrantsHoldTheContainerToWhatItWasGiven) {
  const auto cards = Cards(2);
  PluginSettings s;
  auto one = GrantFor(Resource::kMemory, {cards[1].uuid + "_m0", cards[1].uuid + "_m5"}, cards, s);
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->envs.at("CUDA_VISIBLE_DEVICES"), cards[1].uuid);
  EXPECT_EQ(one->envs.at("STOKER_GPU_MEMORY_LIMIT"), std::to_string(2 * kGiB));
  EXPECT_EQ(one->annotations.at("stoker.io/gpu-memory-cards"), cards[1].uuid);
  auto two =
      GrantFor(Resource::kMemory, {cards[1].uuid + "_m0", cards[0].uuid + "_m0", cards[0].uuid + "_m1"}, cards, s);
  ASSERT_TRUE(two.ok());
  EXPECT_EQ(two->envs.at("CUDA_VISIBLE_DEVICES"), cards[0].uuid + "," + cards[1].uuid);
  EXPECT_EQ(two->envs.at("STOKER_GPU_MEMORY_LIMIT_0"), std::to_string(2 * kGiB));
  EXPECT_EQ(two->envs.at("STOKER_GPU_MEMORY_LIMIT_1"), std::to_string(1 * kGiB));
  EXPECT_EQ(two->envs.count("STOKER_GPU_MEMORY_LIMIT"), 0u);
  EXPECT_NE(one->envs.at("STOKER_GPU_TENANT"), two->envs.at("STOKER_GPU_TENANT")) << "a tenant per container";
  EXPECT_EQ(GrantFor(Resource::kMemory, {cards[0].uuid + "_m1", cards[0].uuid + "_m0"}, cards, s)
                ->envs.at("STOKER_GPU_TENANT"),
            GrantFor(Resource::kMemory, {cards[0].uuid + "_m0", cards[0].uuid + "_m1"}, cards, s)
                ->envs.at("STOKER_GPU_TENANT"));
  auto compute = GrantFor(Resource::kCompute, {cards[0].uuid + "_c0", cards[0].uuid + "_c7"}, cards, s);
  EXPECT_EQ(compute->envs.at("STOKER_GPU_COMPUTE_SHARE"), "2");
  EXPECT_EQ(compute->envs.count("CUDA_VISIBLE_DEVICES"), 0u) << "the memory grant decides what the container sees";
  EXPECT_EQ(compute->envs.at("STOKER_GPU_COMPUTE_SHARES"), cards[0].uuid + ":2");
  // Spread over two cards, each card gets its own part (it was the largest
  // part on every card), and any other card the smallest.
  std::vector<std::string> spread = {cards[1].uuid + "_c0"};
  for (int i = 0; i < 3; ++i) spread.push_back(cards[0].uuid + "_c" + std::to_string(i));
  auto per_card = GrantFor(Resource::kCompute, spread, cards, s);
  ASSERT_TRUE(per_card.ok());
  EXPECT_EQ(per_card->envs.at("STOKER_GPU_COMPUTE_SHARES"), cards[0].uuid + ":3," + cards[1].uuid + ":1");
  EXPECT_EQ(per_card->envs.at("STOKER_GPU_COMPUTE_SHARE"), "1");
  EXPECT_EQ(per_card->envs.count("STOKER_GPU_COMPUTE_CARDS"), 0u);
  auto gone = GrantFor(Resource::kMemory, {"GPU-9_m0"}, cards, s);
  EXPECT_EQ(gone.error().code(), StatusCode::kNotFound);
  EXPECT_NE(gone.error().message().find("no longer has"), std::string::npos);
  PluginSettings bad = s;
  bad.memory_unit = 1000;
  EXPECT_EQ(CheckPluginSettings(bad).code(), StatusCode::kInvalidArgument);
  bad = s;
  bad.ledger_host_dir = "run/stoker";
  EXPECT_NE(CheckPluginSettings(bad).message().find("'run/stoker' must be an absolute path"), std::string::npos);
}

const ContainerGrant::Mount* MountAt(const ContainerGrant& g, const std::string& container_path) {
  for (const auto& m : g.mounts)
    if (m.container_path == container_path) return &m;
  return nullptr;
}

TEST(PluginDevices, EachContainerSeesOnlyItsTenantsStateAndPinnedLimits) {
  const auto cards = Cards(2);
  PluginSettings s;
  char dir_template[] = "/tmp/stoker-plugin-host-XXXXXX";
  s.ledger_host_dir = ::mkdtemp(dir_template);
  s.enforce_preload = true;
  auto memory = GrantFor(Resource::kMemory, {cards[1].uuid + "_m0", cards[1].uuid + "_m5"}, cards, s);
  auto compute = GrantFor(Resource::kCompute, {cards[1].uuid + "_c0", cards[1].uuid + "_c1"}, cards, s);
  ASSERT_TRUE(memory.ok() && compute.ok());
  const std::string tenant = memory->envs.at("STOKER_GPU_TENANT");
  // Memory: the tenant's own folder (never the node's), and limits pinned read-only.
  const auto* folder = MountAt(*memory, "/run/stoker");
  ASSERT_NE(folder, nullptr);
  EXPECT_EQ(folder->host_path, s.ledger_host_dir + "/tenants/" + tenant);
  EXPECT_FALSE(folder->read_only);
  const auto* pinned = MountAt(*memory, "/etc/stoker/gpu-limits.d/memory");
  ASSERT_NE(pinned, nullptr);
  EXPECT_TRUE(pinned->read_only);
  // Memory only: the node's schedule too, read-only (it takes turns beside
  // compute grants), under its own name with its user there.
  EXPECT_EQ(memory->envs.at("STOKER_GPU_TURNS"), "/run/stoker-turns");
  EXPECT_EQ(memory->envs.count("STOKER_GPU_TURNS_TENANT"), 0u);
  for (const char* path : {"/run/stoker-turns", "/run/stoker-turns.d"}) {
    const auto* mount = MountAt(*memory, path);
    ASSERT_NE(mount, nullptr) << path;
    EXPECT_TRUE(mount->read_only) << path;
    EXPECT_EQ(mount->host_path, MountAt(*compute, path)->host_path) << "the kubelet merges identical mounts";
  }
  // Compute: the node's schedule, read-only, under a tenant of its own
  // there, and the plugin's turns broker (its folder, read-only); its own
  // pinned file, which vouches for the tenant's name to the broker.
  EXPECT_EQ(compute->envs.at("STOKER_GPU_TURNS"), "/run/stoker-turns");
  EXPECT_EQ(compute->envs.at("STOKER_GPU_TURNS_SOCKET"), "/run/stoker-turns.d/turns.sock");
  EXPECT_EQ(compute->envs.at("STOKER_GPU_TURNS_TENANT").rfind("k8s-", 0), 0u);
  const auto* turns = MountAt(*compute, "/run/stoker-turns");
  ASSERT_NE(turns, nullptr);
  EXPECT_TRUE(turns->read_only);
  const auto* broker = MountAt(*compute, "/run/stoker-turns.d");
  ASSERT_NE(broker, nullptr);
  EXPECT_EQ(broker->host_path, s.ledger_host_dir + "/broker");
  EXPECT_TRUE(broker->read_only);
  EXPECT_EQ(MountAt(*compute, "/run/stoker"), nullptr);
  ASSERT_NE(MountAt(*compute, "/etc/stoker/gpu-limits.d/compute"), nullptr);
  // Both: the same interposer and preload mounts (the kubelet merges identical mounts).
  for (const auto* g : {&*memory, &*compute}) {
    const auto* preload = MountAt(*g, "/etc/ld.so.preload");
    ASSERT_NE(preload, nullptr);
    EXPECT_EQ(preload->host_path, s.ledger_host_dir + "/ld.so.preload");
    EXPECT_TRUE(preload->read_only);
  }
  // The host, made before the kubelet mounts anything.
  if (::geteuid() == 0) {
    ASSERT_TRUE(PrepareHost(*memory).ok());
    ASSERT_TRUE(PrepareHost(*compute).ok());
    struct stat st {};
    ASSERT_EQ(::stat(folder->host_path.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 07777, 01777u);
    ASSERT_EQ(::stat((s.ledger_host_dir + "/turns").c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 07777, 0644u);  // written by the plugin's broker alone
    EXPECT_EQ(st.st_uid, 0u);
    ASSERT_EQ(::stat((s.ledger_host_dir + "/broker").c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 07777, 0755u);
    ASSERT_EQ(::stat(pinned->host_path.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 07777, 0644u);
    EXPECT_EQ(st.st_uid, 0u);
    ASSERT_EQ(::stat((s.ledger_host_dir + "/limits").c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 022, 0u) << "limits/ is root's alone";
    std::ifstream file(pinned->host_path);
    const std::string text((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
    EXPECT_EQ(text, "STOKER_GPU_TENANT=" + tenant +
                        "\nSTOKER_GPU_LEDGER=/run/stoker/ledger\nSTOKER_GPU_TURNS=/run/stoker-turns\n"
                        "STOKER_GPU_TURNS_SOCKET=/run/stoker-turns.d/turns.sock\nSTOKER_GPU_MEMORY_LIMIT=" +
                        std::to_string(2 * kGiB) + "\n");
    std::ifstream preload(s.ledger_host_dir + "/ld.so.preload");
    std::string line;
    std::getline(preload, line);
    EXPECT_EQ(line, "/usr/local/stoker/libstoker-share.so");
  }
  std::filesystem::remove_all(s.ledger_host_dir);
}

}  // namespace
}  // namespace stoker::kube
