#include "kube/extender.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kube/plugin_devices.h"
#include "place/placement.h"

namespace stoker::kube {
namespace {

using nlohmann::json;

// Go's JSON decoder matches keys regardless of case; so do we.
const json* Field(const json& object, std::string_view key) {
  if (!object.is_object()) return nullptr;
  for (auto it = object.begin(); it != object.end(); ++it) {
    const std::string& k = it.key();
    if (k.size() == key.size() &&
        std::equal(k.begin(), k.end(), key.begin(), [](char a, char b) { return std::tolower(a) == std::tolower(b); }))
      return &it.value();
  }
  return nullptr;
}

// A resource quantity as Kubernetes writes it for extended resources:
// a whole number, as a string or a number.
Result<std::uint64_t> Quantity(const json& value, const std::string& where) {
  if (value.is_number_unsigned()) return value.get<std::uint64_t>();
  if (value.is_string()) {
    const std::string s = value.get<std::string>();
    if (!s.empty() && s.size() < 19 && s.find_first_not_of("0123456789") == std::string::npos) return std::stoull(s);
  }
  return Status::InvalidArgument(fmt::format("{} is {}: extended resources are whole numbers", where, value.dump()));
}

// A member of the expected type, or `fallback` when it is absent or of
// another type (nlohmann's value() would throw).
std::string StringOr(const json& o, const char* key, std::string fallback) {
  return o.contains(key) && o[key].is_string() ? o[key].get<std::string>() : fallback;
}
std::int64_t IntOr(const json& o, const char* key, std::int64_t fallback) {
  return o.contains(key) && o[key].is_number_integer() ? o[key].get<std::int64_t>() : fallback;
}
bool BoolOr(const json& o, const char* key, bool fallback) {
  return o.contains(key) && o[key].is_boolean() ? o[key].get<bool>() : fallback;
}

}  // namespace

Result<NodeCards> ParseNodeCards(std::string_view text, const std::string& source) {
  json j = json::parse(text, nullptr, false);
  auto bad = [&](const std::string& what) {
    return Status::Corruption(fmt::format("the card state from {}: {}", source, what));
  };
  if (j.is_discarded() || !j.is_object()) return bad("not a JSON object");
  if (StringOr(j, "format", "") != "stoker-node-cards") return bad("\"format\" is not \"stoker-node-cards\"");
  if (!j.contains("version") || j["version"] != 1) return bad("\"version\" is not 1 (a newer or older stoker plugin)");
  NodeCards node;
  node.node = StringOr(j, "node", "");
  const std::string mode = StringOr(j, "mode", "");
  if (mode != "whole" && mode != "shared") return bad("\"mode\" is not \"whole\" or \"shared\"");
  node.whole_cards = mode == "whole";
  if (!j.contains("memory_unit_bytes") || !j["memory_unit_bytes"].is_number_unsigned() || j["memory_unit_bytes"] == 0)
    return bad("\"memory_unit_bytes\" is not a positive integer");
  node.memory_unit = j["memory_unit_bytes"].get<std::uint64_t>();
  if (!j.contains("cards") || !j["cards"].is_array()) return bad("\"cards\" is not a list");
  for (std::size_t i = 0; i < j["cards"].size(); ++i) {
    const json& c = j["cards"][i];
    NodeCards::Card card;
    const std::string at = fmt::format("card {}", i);
    if (!c.is_object() || !c.contains("uuid") || !c["uuid"].is_string()) return bad(at + ": \"uuid\" is not a string");
    card.uuid = c["uuid"].get<std::string>();
    for (auto [key, out] :
         {std::pair{"memory_units", &card.memory_units}, std::pair{"memory_units_used", &card.memory_units_used},
          std::pair{"compute_used", &card.compute_used}}) {
      if (!c.contains(key) || !c[key].is_number_unsigned())
        return bad(fmt::format("{}: \"{}\" is not a non-negative integer", at, key));
      *out = c[key].get<std::uint64_t>();
    }
    if (card.memory_units_used > card.memory_units || card.compute_used > 100)
      return bad(at + ": more is used than the card has");
    const std::int64_t index = IntOr(c, "index", static_cast<std::int64_t>(i));
    const std::int64_t numa = IntOr(c, "numa_node", -1);
    card.index = index >= 0 && index < 1024 ? static_cast<int>(index) : static_cast<int>(i);
    card.numa_node = numa >= 0 && numa < 65536 ? static_cast<int>(numa) : -1;
    card.healthy = BoolOr(c, "healthy", false);
    card.whole_used = BoolOr(c, "whole_used", false);
    node.cards.push_back(std::move(card));
  }
  return node;
}

Result<std::vector<ContainerAsk>> AsksOf(const std::string& pod_text) {
  json pod = json::parse(pod_text, nullptr, false);
  if (pod.is_discarded() || !pod.is_object()) return Status::InvalidArgument("the pod is not a JSON object");
  const json* metadata = Field(pod, "metadata");
  const std::string name = metadata && Field(*metadata, "name") && Field(*metadata, "name")->is_string()
                               ? Field(*metadata, "name")->get<std::string>()
                               : "(unnamed)";
  const json* spec = Field(pod, "spec");
  const json* containers = spec ? Field(*spec, "containers") : nullptr;
  std::vector<ContainerAsk> asks;
  if (!containers || !containers->is_array()) return asks;
  for (const json& c : *containers) {
    ContainerAsk ask;
    const json* cname = Field(c, "name");
    ask.container = cname && cname->is_string() ? cname->get<std::string>() : "";
    const json* resources = Field(c, "resources");
    // Extended resources must have limits equal to requests; either names them.
    const json* limits = resources ? Field(*resources, "limits") : nullptr;
    if (!limits || !limits->is_object()) limits = resources ? Field(*resources, "requests") : nullptr;
    if (!limits || !limits->is_object()) continue;
    const std::string where = fmt::format("pod {} container {}", name, ask.container);
    for (auto [resource, out] :
         {std::pair{kGpuResource, &ask.whole_cards}, std::pair{kMemoryResource, &ask.memory_units},
          std::pair{kComputeResource, &ask.compute}}) {
      if (!limits->contains(resource)) continue;
      auto q = Quantity((*limits)[resource], fmt::format("{}: {}", where, resource));
      if (!q.ok()) return q.error();
      *out = *q;
    }
    if (ask.whole_cards == 0 && ask.memory_units == 0 && ask.compute == 0) continue;
    if (ask.compute > 100)
      return Status::InvalidArgument(
          fmt::format("{}: {} {} is over 100 percent of a card", where, kComputeResource, ask.compute));
    if (ask.compute > 0 && ask.memory_units == 0)
      return Status::InvalidArgument(
          fmt::format("{}: {} needs {} in the same container (the share applies to the "
                      "card its memory is on)",
                      where, kComputeResource, kMemoryResource));
    if (ask.whole_cards > 0 && (ask.memory_units > 0 || ask.compute > 0))
      return Status::InvalidArgument(
          fmt::format("{}: ask for {} or for {}/{}, not both", where, kGpuResource, kMemoryResource, kComputeResource));
    asks.push_back(std::move(ask));
  }
  return asks;
}

NodeFit FitOnNode(const std::vector<ContainerAsk>& asks, const NodeCards& node, GpuPolicy policy) {
  std::vector<place::CardState> cards;
  for (const auto& c : node.cards) {
    place::CardState s;
    s.uuid = c.uuid;
    s.index = c.index;
    s.numa_node = c.numa_node;
    s.healthy = c.healthy;
    s.total_bytes = c.memory_units * node.memory_unit;
    s.leased_bytes = c.memory_units_used * node.memory_unit;
    s.leased_compute = static_cast<std::uint32_t>(c.compute_used);
    s.exclusive = c.whole_used;
    s.leases = (c.memory_units_used || c.compute_used || c.whole_used) ? 1 : 0;
    cards.push_back(std::move(s));
  }
  NodeFit fit;
  double fullness = 0;
  int placed = 0;
  for (const ContainerAsk& ask : asks) {
    if ((ask.whole_cards > 0) != node.whole_cards) {
      fit.reason = node.whole_cards ? "the node gives whole cards (stoker.io/gpu), not memory shares"
                                    : "the node shares cards by memory, not whole cards";
      return fit;
    }
    GpuRequest r;
    r.policy = policy;
    if (ask.whole_cards) {
      r.whole_cards = true;
      r.count = static_cast<std::uint32_t>(std::min<std::uint64_t>(ask.whole_cards, 64));
    } else {
      r.memory_bytes = ask.memory_units * node.memory_unit;
      r.compute_percent = static_cast<std::uint32_t>(ask.compute);
    }
    auto chosen = place::ChooseCards(r, cards);
    if (!chosen.ok()) {
      fit.reason = fmt::format("container {}: {}", ask.container, chosen.error().message());
      return fit;
    }
    for (std::size_t i : *chosen) {
      fullness += place::FullnessAfter(r, cards[i]);
      ++placed;
      if (r.whole_cards) {
        cards[i].exclusive = true;
      } else {
        cards[i].leased_bytes += r.memory_bytes;
        cards[i].leased_compute += r.compute_percent;
      }
      ++cards[i].leases;
    }
  }
  fit.fits = true;
  fit.fullness = placed ? fullness / placed : 0;
  return fit;
}

namespace {

struct ParsedArgs {
  std::vector<ContainerAsk> asks;
  std::vector<std::pair<std::string, std::string>> nodes;  // name, InternalIP
  bool node_objects = false;
  json nodes_json;
  std::string error;
};

ParsedArgs Parse(std::string_view text) {
  ParsedArgs out;
  json args = json::parse(text, nullptr, false);
  if (args.is_discarded() || !args.is_object()) {
    out.error = "the request body is not ExtenderArgs JSON";
    return out;
  }
  const json* pod = Field(args, "pod");
  if (!pod || !pod->is_object()) {
    out.error = "ExtenderArgs has no \"pod\"";
    return out;
  }
  auto asks = AsksOf(pod->dump());
  if (!asks.ok()) {
    out.error = asks.error().message();
    return out;
  }
  out.asks = std::move(*asks);
  if (const json* nodes = Field(args, "nodes"); nodes && nodes->is_object()) {
    out.node_objects = true;
    out.nodes_json = *nodes;
    const json* items = Field(*nodes, "items");
    if (items && items->is_array())
      for (const json& n : *items) {
        const json* meta = Field(n, "metadata");
        const json* name = meta ? Field(*meta, "name") : nullptr;
        if (!name || !name->is_string()) continue;
        std::string address;
        const json* status = Field(n, "status");
        const json* addresses = status ? Field(*status, "addresses") : nullptr;
        if (addresses && addresses->is_array())
          for (const json& a : *addresses)
            if (Field(a, "type") && *Field(a, "type") == "InternalIP" && Field(a, "address") &&
                Field(a, "address")->is_string())
              address = Field(a, "address")->get<std::string>();
        out.nodes.emplace_back(name->get<std::string>(), address);
      }
  } else if (const json* names = Field(args, "nodenames"); names && names->is_array()) {
    for (const json& n : *names)
      if (n.is_string()) out.nodes.emplace_back(n.get<std::string>(), "");
  }
  return out;
}

}  // namespace

std::string ExtenderFilter(std::string_view text, const NodeCardsSource& source, const ExtenderOptions& options) {
  ParsedArgs args = Parse(text);
  json result = json::object();
  if (!args.error.empty()) {
    result["error"] = args.error;
    return result.dump(-1, ' ', false, json::error_handler_t::replace);
  }
  json failed = json::object(), unresolvable = json::object();
  std::vector<std::string> passed;
  for (const auto& [name, address] : args.nodes) {
    if (args.asks.empty()) {
      passed.push_back(name);  // not ours to judge
      continue;
    }
    auto cards = source(name, address);
    if (!cards.ok()) {
      failed[name] = fmt::format("stoker: no card state: {}", cards.error().message());
      continue;
    }
    const NodeFit fit = FitOnNode(args.asks, *cards, options.policy);
    if (fit.fits) {
      passed.push_back(name);
    } else {
      failed[name] = "stoker: " + fit.reason;
    }
  }
  if (args.node_objects) {
    json nodes = args.nodes_json;
    json items = json::array();
    if (const json* all = Field(args.nodes_json, "items"); all && all->is_array())
      for (const json& n : *all) {
        const json* meta = Field(n, "metadata");
        const json* name = meta ? Field(*meta, "name") : nullptr;
        if (name && name->is_string() &&
            std::find(passed.begin(), passed.end(), name->get<std::string>()) != passed.end())
          items.push_back(n);
      }
    nodes["items"] = std::move(items);
    result["nodes"] = std::move(nodes);
  } else {
    result["nodenames"] = passed;
  }
  result["failedNodes"] = std::move(failed);
  result["failedAndUnresolvableNodes"] = std::move(unresolvable);
  return result.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string ExtenderPrioritize(std::string_view text, const NodeCardsSource& source, const ExtenderOptions& options) {
  ParsedArgs args = Parse(text);
  json list = json::array();
  for (const auto& [name, address] : args.nodes) {
    std::int64_t score = 0;
    if (args.error.empty() && !args.asks.empty()) {
      auto cards = source(name, address);
      if (cards.ok()) {
        const NodeFit fit = FitOnNode(args.asks, *cards, options.policy);
        if (fit.fits) {
          const double f = std::clamp(fit.fullness, 0.0, 1.0);
          score = std::llround(10.0 * (options.policy == GpuPolicy::kBinpack ? f : 1.0 - f));
        }
      }
    }
    list.push_back({{"host", name}, {"score", score}});
  }
  return list.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace stoker::kube
