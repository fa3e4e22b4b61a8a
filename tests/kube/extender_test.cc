// The scheduler extender on kube-scheduler's request bodies (tests/kube/
// data): nodes where the pod's GPU asks fit one card each pass, the others
// are named with what their cards have free; scores follow the policy.
#include "kube/extender.h"

#include <gtest/gtest.h>

#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

namespace stoker::kube {
namespace {

using nlohmann::json;

std::string Data(const std::string& name) {
  std::ifstream in(std::string(STOKER_KUBE_TEST_DATA) + "/" + name);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

NodeCards Node(const std::string& name, std::vector<std::array<std::uint64_t, 3>> cards) {
  NodeCards node;
  node.node = name;
  node.memory_unit = std::uint64_t{1} << 30;
  int i = 0;
  for (const auto& [units, used, compute] : cards) {
    NodeCards::Card c;
    c.uuid = name + "-GPU-" + std::to_string(i);
    c.index = i++;
    c.memory_units = units;
    c.memory_units_used = used;
    c.compute_used = compute;
    c.numa_node = 0;
    node.cards.push_back(c);
  }
  return node;
}

class ExtenderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    nodes_["gpu-a"] = Node("gpu-a", {{140, 130, 0}, {140, 125, 80}});  // neither card has 20 GiB and 30%
    nodes_["gpu-b"] = Node("gpu-b", {{140, 100, 50}, {140, 0, 0}});
    nodes_["gpu-c"] = Node("gpu-c", {{140, 0, 0}, {140, 0, 0}, {140, 0, 0}, {140, 0, 0}});
    source_ = [this](const std::string& node, const std::string& address) -> Result<NodeCards> {
      asked_[node] = address;
      auto it = nodes_.find(node);
      if (it == nodes_.end()) return Status::Unavailable("GET http://" + node + ":9453/cards: connection refused");
      return it->second;
    };
  }
  std::map<std::string, NodeCards> nodes_;
  std::map<std::string, std::string> asked_;
  NodeCardsSource source_;
};

TEST_F(ExtenderTest, FilterKeepsNodesWhereTheAskFitsOneCardAndNamesTheOthers) {
  const json result = json::parse(ExtenderFilter(Data("filter_nodes.json"), source_, {}));
  ASSERT_FALSE(result.contains("error")) << result.dump();
  ASSERT_EQ(result["nodes"]["items"].size(), 2u);
  EXPECT_EQ(result["nodes"]["items"][0]["metadata"]["name"], "gpu-b");
  EXPECT_EQ(result["nodes"]["items"][1]["metadata"]["name"], "gpu-c");
  EXPECT_EQ(result["nodes"]["items"][0]["status"]["addresses"][0]["address"], "10.0.0.12") << "Node objects kept whole";
  const std::string why = result["failedNodes"]["gpu-a"];
  EXPECT_NE(why.find("container trainer: 20.0 GiB and 30% compute on 1 card does not fit now"), std::string::npos)
      << why;
  EXPECT_NE(why.find("10.0 GiB of 140.0 GiB free"), std::string::npos) << why;
  EXPECT_EQ(asked_["gpu-b"], "10.0.0.12") << "the node's InternalIP is where its card state is asked";
}

TEST_F(ExtenderTest, NodeNamesInNodeNamesOut) {
  const json result = json::parse(ExtenderFilter(Data("filter_nodenames.json"), source_, {}));
  EXPECT_EQ(result["nodenames"], json({"gpu-b", "gpu-c"}));
  EXPECT_FALSE(result.contains("nodes"));
  EXPECT_EQ(asked_["gpu-a"], "") << "no address without Node objects";
}

TEST_F(ExtenderTest, PrioritizeScoresByThePolicy) {
  const json binpack = json::parse(ExtenderPrioritize(Data("filter_nodenames.json"), source_, {GpuPolicy::kBinpack}));
  std::map<std::string, int> score;
  for (const auto& h : binpack) score[h["host"]] = h["score"];
  EXPECT_EQ(score["gpu-a"], 0) << "does not fit";
  EXPECT_GT(score["gpu-b"], score["gpu-c"]) << "binpack prefers the node whose card it fills";
  EXPECT_EQ(score["gpu-b"], 9);  // card 0 after: max(120/140, 80%) = 0.86
  const json spread = json::parse(ExtenderPrioritize(Data("filter_nodenames.json"), source_, {GpuPolicy::kSpread}));
  for (const auto& h : spread) score[h["host"]] = h["score"];
  EXPECT_EQ(score["gpu-c"], 7);  // an empty card: 1 - max(20/140, 30%)
  EXPECT_GE(score["gpu-c"], score["gpu-b"]);
  for (const auto& h : spread) EXPECT_TRUE(h["score"] >= 0 && h["score"] <= 10);
}

TEST_F(ExtenderTest, EachContainerNeedsACardOfItsOwn) {
  const json result = json::parse(ExtenderFilter(Data("filter_two_containers.json"), source_, {}));
  EXPECT_EQ(result["nodenames"], json({"gpu-c"}));
  EXPECT_NE(result["failedNodes"]["gpu-b"].get<std::string>().find("container b"), std::string::npos)
      << result["failedNodes"].dump();
}

TEST_F(ExtenderTest, PodsWithoutGpuAsksPassAndBadAsksAreErrors) {
  EXPECT_EQ(json::parse(ExtenderFilter(Data("filter_no_gpu.json"), source_, {}))["nodenames"],
            json({"gpu-a", "gpu-b"}));
  EXPECT_TRUE(asked_.empty()) << "no node state is fetched for a pod without GPU asks";
  const json bad = json::parse(ExtenderFilter(Data("filter_compute_alone.json"), source_, {}));
  EXPECT_NE(bad["error"].get<std::string>().find(
                "pod bad container c: stoker.io/gpu-compute needs stoker.io/gpu-memory in the same container"),
            std::string::npos)
      << bad.dump();
  EXPECT_EQ(json::parse(ExtenderFilter("{not json", source_, {}))["error"],
            "the request body is not ExtenderArgs JSON");
  nodes_.erase("gpu-b");
  const json unreachable = json::parse(ExtenderFilter(Data("filter_nodenames.json"), source_, {}));
  EXPECT_NE(unreachable["failedNodes"]["gpu-b"].get<std::string>().find("no card state: GET http://gpu-b"),
            std::string::npos);
}

TEST_F(ExtenderTest, WholeCardsGoOnlyToWholeCardNodes) {
  NodeCards whole = Node("w", {{80, 0, 0}, {80, 0, 0}});
  whole.whole_cards = true;
  whole.cards[0].whole_used = true;
  ContainerAsk two{"c", 2, 0, 0}, one{"c", 1, 0, 0}, memory{"c", 0, 10, 0};
  EXPECT_FALSE(FitOnNode({two}, whole, GpuPolicy::kBinpack).fits);
  EXPECT_TRUE(FitOnNode({one}, whole, GpuPolicy::kBinpack).fits);
  EXPECT_NE(FitOnNode({memory}, whole, GpuPolicy::kBinpack).reason.find("gives whole cards"), std::string::npos);
  EXPECT_NE(FitOnNode({one}, nodes_["gpu-c"], GpuPolicy::kBinpack).reason.find("shares cards by memory"),
            std::string::npos);
}

TEST(NodeCardsFormat, MembersOfTheWrongTypeAreDefaultedNotThrown) {
  auto parsed = ParseNodeCards(R"({"format":"stoker-node-cards","version":1,"mode":"shared","node":7,
      "memory_unit_bytes":1,"cards":[{"uuid":"g","memory_units":4,"memory_units_used":1,"compute_used":0,
      "index":"x","numa_node":[1],"healthy":"yes"}]})",
                               "here");
  ASSERT_TRUE(parsed.ok()) << parsed.error().ToString();
  EXPECT_EQ(parsed->node, "");
  EXPECT_EQ(parsed->cards[0].index, 0);
  EXPECT_EQ(parsed->cards[0].numa_node, -1);
  EXPECT_FALSE(parsed->cards[0].healthy);
}

TEST(NodeCardsFormat, MalformedStatesAreNamed) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"[]", "not a JSON object"},
      {R"({"format":1})", "\"format\" is not \"stoker-node-cards\""},
      {R"({"format":"x"})", "\"format\" is not \"stoker-node-cards\""},
      {R"({"format":"stoker-node-cards","version":2})", "\"version\" is not 1"},
      {R"({"format":"stoker-node-cards","version":1,"mode":"both"})", "\"mode\""},
      {R"({"format":"stoker-node-cards","version":1,"mode":"shared","memory_unit_bytes":0})", "memory_unit_bytes"},
      {R"({"format":"stoker-node-cards","version":1,"mode":"shared","memory_unit_bytes":1,"cards":[{"uuid":"g",
          "memory_units":4,"memory_units_used":5,"compute_used":0}]})",
       "card 0: more is used than the card has"},
  };
  for (const auto& [text, says] : cases) {
    auto parsed = ParseNodeCards(text, "http://10.0.0.1:9453/cards");
    ASSERT_FALSE(parsed.ok()) << text;
    EXPECT_NE(parsed.error().message().find("http://10.0.0.1:9453/cards"), std::string::npos);
    EXPECT_NE(parsed.error().message().find(says), std::string::npos) << parsed.error().message();
  }
}

}  // namespace
}  // namespace stoker::kube
