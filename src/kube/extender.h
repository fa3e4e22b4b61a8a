// The kube-scheduler extender: its HTTP JSON webhook (filter and
// prioritize, k8s.io/kube-scheduler/extender/v1) answered from each node's
// card state (the device plugin's GET /cards), with the placement policies
// of stoker/gpu_place.h. Kubernetes remains the scheduler: the extender only
// says which nodes can hold a pod's GPU asks on one card each, and how well.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "stoker/gpu_place.h"
#include "stoker/status.h"

namespace stoker::kube {

// A node's cards as its device plugin reports them.
struct NodeCards {
  std::string node;
  bool whole_cards = false;
  std::uint64_t memory_unit = 0;
  struct Card {
    std::string uuid;
    int index = 0, numa_node = -1;
    bool healthy = true, whole_used = false;
    std::uint64_t memory_units = 0, memory_units_used = 0, compute_used = 0;
  };
  std::vector<Card> cards;
};
// Corruption naming `source` and the field for anything malformed.
[[nodiscard]] Result<NodeCards> ParseNodeCards(std::string_view json, const std::string& source);

// One container's GPU asks (limits of the stoker.io resources).
struct ContainerAsk {
  std::string container;
  std::uint64_t whole_cards = 0, memory_units = 0, compute = 0;
};
// The pod's containers that ask for any stoker.io resource; InvalidArgument
// naming the pod and container for asks that cannot be met on any node
// (compute without memory, whole cards with memory, non-integer counts).
[[nodiscard]] Result<std::vector<ContainerAsk>> AsksOf(const std::string& pod_json);

// Looks a node's cards up (node name; its InternalIP when the scheduler
// sent Node objects, else empty).
using NodeCardsSource = std::function<Result<NodeCards>(const std::string& node, const std::string& address)>;

struct ExtenderOptions {
  GpuPolicy policy = GpuPolicy::kBinpack;
};

// The filter verb: ExtenderArgs in, ExtenderFilterResult out (both JSON).
[[nodiscard]] std::string ExtenderFilter(std::string_view args, const NodeCardsSource& source,
                                         const ExtenderOptions& options);
// The prioritize verb: ExtenderArgs in, HostPriorityList out (0-10).
[[nodiscard]] std::string ExtenderPrioritize(std::string_view args, const NodeCardsSource& source,
                                             const ExtenderOptions& options);

// Whether `asks` fit on `node` (one card per ask, asks placed in turn), and
// the mean fullness of the cards chosen (for the score). The reason says
// what each card has free when they do not.
struct NodeFit {
  bool fits = false;
  double fullness = 0;
  std::string reason;
};
[[nodiscard]] NodeFit FitOnNode(const std::vector<ContainerAsk>& asks, const NodeCards& node, GpuPolicy policy);

}  // namespace stoker::kube
