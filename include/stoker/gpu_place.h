// GPU placement: choosing the card(s) a command runs on, by memory and by
// card, and recording the choice as a lease so that the next command is
// placed around it (docs/gpu-sharing.md, "Placing work"). `stoker gpu run`
// and the Kubernetes device plugin and scheduler extender share this code.
//
// A request asks for whole cards (`cards`, nothing else shares them) or for
// `memory_bytes` (and optionally a compute share) on each of `count`
// cards. Placement scores every card that fits and takes the best by the
// policy:
//   binpack  the card that is fullest after placing (fewest cards in use)
//   spread   the card that is emptiest after placing (least interference)
// A card's fullness is max(memory leased / physical, compute leased / 100).
// Over several cards, sets within one NUMA node come first, and among
// those the set whose farthest pair is closest on PCIe (one switch before
// one host bridge before one node).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "stoker/status.h"

namespace stoker {

// One GPU of the node, as NVML (loaded at run time) or the CUDA driver sees it.
struct GpuCard {
  int index = 0;     // NVML's (PCI bus) order
  std::string uuid;  // "GPU-..."
  std::string name;
  std::string pci_bus_id;
  std::uint64_t total_bytes = 0;
  std::uint64_t used_bytes = 0;  // by every process on the card (NVML only)
  bool used_known = false;       // false from the driver API: no context is created to ask
  int numa_node = -1;            // -1: unknown
  bool healthy = true;           // false: NVML reports the card lost or failing
  // How each card (by position in the inventory) is reached from this one,
  // as NVML's topology levels: 10 one PCIe switch, 20 several switches, 30
  // one host bridge, 40 one NUMA node, 50 across nodes (0 itself). Empty
  // when unknown (no NVML).
  std::vector<int> link_levels;
  // The processes NVML lists on the card (compute contexts), with their
  // device memory; host PIDs. Empty, and processes_known false, without
  // NVML.
  struct Process {
    int pid = 0;
    std::uint64_t used_bytes = 0;
  };
  std::vector<Process> processes;
  bool processes_known = false;
};

struct GpuInventory {
  std::string source;  // "NVML" or "CUDA driver"
  std::vector<GpuCard> cards;
};

// The node's GPUs: NVML when libnvidia-ml.so.1 loads, else the CUDA
// driver (libcuda.so.1). NotFound says what each source answered.
[[nodiscard]] Result<GpuInventory> ReadGpuInventory();

enum class GpuPolicy { kBinpack, kSpread };
[[nodiscard]] Result<GpuPolicy> ParseGpuPolicy(const std::string& name);  // "binpack" | "spread"
[[nodiscard]] const char* GpuPolicyName(GpuPolicy policy);

struct GpuRequest {
  std::uint32_t count = 1;            // cards
  bool whole_cards = false;           // nobody else on them; memory/compute unset
  std::uint64_t memory_bytes = 0;     // per card (whole_cards false)
  std::uint32_t compute_percent = 0;  // per card, 0: none
  GpuPolicy policy = GpuPolicy::kBinpack;
  std::vector<std::string> allowed_uuids;  // empty: any card
};
// InvalidArgument naming the field for a request that can never be valid.
[[nodiscard]] Status CheckGpuRequest(const GpuRequest& request);

struct GpuLeaseCard {
  std::string uuid;
  std::uint64_t memory_bytes = 0;  // whole card: its physical memory
  std::uint32_t compute_percent = 0;
};
struct GpuLease {
  std::string id;               // unique on the node
  std::string tenant;           // the interposer's tenant for the command's processes
  int pid = 0;                  // the process that holds it (the command, after exec)
  std::uint64_t pid_start = 0;  // its start time (clock ticks since boot): pid reuse
  std::uint64_t created_unix = 0;
  bool whole_cards = false;
  std::string command;
  std::string ledger;  // where its processes are counted
  std::vector<GpuLeaseCard> cards;
};

struct GpuPlacementOptions {
  std::string leases;   // the lease file; empty: DefaultGpuLeasePath()
  std::string ledger;   // empty: the interposer's default
  std::string tenant;   // empty: "lease-<id>"
  std::string command;  // recorded for `stoker gpu ls`
  int pid = 0;          // 0: this process
  // Waiting for room: nullopt fails at once (saying what is free per
  // card); otherwise polls until the request fits or the time is up.
  std::optional<double> wait_seconds;  // +inf: no limit
};

// Places `request` on the node's cards around the live leases, records the
// lease (under the lease file's lock, leases of dead processes reclaimed
// first) and returns it. ResourceExhausted, naming what each card has
// free, when it does not fit; DeadlineExceeded when a wait ran out.
[[nodiscard]] Result<GpuLease> PlaceGpuRequest(const GpuRequest& request, const GpuInventory& inventory,
                                               const GpuPlacementOptions& options);

// Each card with what the leases promise of it, as placement sees it
// (`free_bytes`: physical less leases less use outside them).
struct GpuCardUse {
  GpuCard card;
  std::uint64_t leased_bytes = 0, other_bytes = 0, free_bytes = 0;
  std::uint32_t leased_compute = 0, leases = 0;
  bool whole_leased = false;
};
[[nodiscard]] std::vector<GpuCardUse> DescribeGpuUse(const GpuInventory& inventory,
                                                     const std::vector<GpuLease>& leases);

// The live leases (dead ones reclaimed while reading).
[[nodiscard]] Result<std::vector<GpuLease>> ReadGpuLeases(const std::string& leases = "");
// Gives a lease back before its process ends. NotFound if it is not there.
[[nodiscard]] Status ReleaseGpuLease(const std::string& id, const std::string& leases = "");

// The lease file used when none is named.
[[nodiscard]] std::string DefaultGpuLeasePath();

}  // namespace stoker
