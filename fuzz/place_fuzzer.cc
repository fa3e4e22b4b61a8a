// The placement and Kubernetes parsers: the node's lease file, a node's card
// state (from its device plugin), kube-scheduler's ExtenderArgs (filter and
// prioritize answered from card states parsed from the same input), and
// device IDs. The first byte picks which.
#include <cstdint>
#include <string>

#include "kube/extender.h"
#include "kube/plugin_devices.h"
#include "place/lease_book.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 4) {
    case 0: {
      auto leases = stoker::place::ParseLeases(text, "fuzz.json");
      if (leases.ok()) {
        // What parses must round-trip.
        auto again = stoker::place::ParseLeases(stoker::place::SerializeLeases(*leases), "fuzz.json");
        if (!again.ok() || again->size() != leases->size()) __builtin_trap();
      }
      break;
    }
    case 1: {
      auto cards = stoker::kube::ParseNodeCards(text, "fuzz");
      if (cards.ok()) (void)stoker::kube::FitOnNode({{"c", 0, 3, 20}}, *cards, stoker::GpuPolicy::kSpread);
      break;
    }
    case 2: {
      // Node state for every node: a fixed two-card node.
      stoker::kube::NodeCards node;
      node.memory_unit = 1 << 30;
      node.cards = {{"GPU-a", 0, 0, true, false, 80, 10, 20}, {"GPU-b", 1, 1, true, false, 80, 70, 90}};
      auto source = [&](const std::string&, const std::string&) -> stoker::Result<stoker::kube::NodeCards> {
        return node;
      };
      (void)stoker::kube::ExtenderFilter(text, source, {});
      (void)stoker::kube::ExtenderPrioritize(text, source, {stoker::GpuPolicy::kSpread});
      break;
    }
    default: {
      auto id = stoker::kube::ParseDeviceId(text);
      if (id && id->uuid.empty()) __builtin_trap();
      break;
    }
  }
  return 0;
}
