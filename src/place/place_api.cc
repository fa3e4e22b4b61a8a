// The public face of placement (stoker/gpu_place.h): the lease file, the
// ledger and the inventory turned into card states, then ChooseCards.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <map>
#include <thread>

#include <fmt/format.h>

#include "place/lease_book.h"
#include "place/placement.h"
#include "stoker/gpu_share.h"

namespace stoker {

Result<GpuPolicy> ParseGpuPolicy(const std::string& name) {
  if (name == "binpack") return GpuPolicy::kBinpack;
  if (name == "spread") return GpuPolicy::kSpread;
  return Status::InvalidArgument(fmt::format("unknown placement policy '{}': use binpack or spread", name));
}

const char* GpuPolicyName(GpuPolicy policy) {
  return policy == GpuPolicy::kSpread ? "spread" : "binpack";
}

Status CheckGpuRequest(const GpuRequest& r) {
  if (r.count == 0) return Status::InvalidArgument("the number of cards must be at least 1");
  if (r.count > 64) return Status::InvalidArgument(fmt::format("{} cards is more than any node has", r.count));
  if (r.whole_cards) {
    if (r.memory_bytes || r.compute_percent)
      return Status::InvalidArgument(
          "whole cards take all their memory and compute: do not give memory or compute too");
    return Status::Ok();
  }
  if (r.compute_percent > 100)
    return Status::InvalidArgument(fmt::format("the compute share must be 1-100 percent, not {}", r.compute_percent));
  if (r.memory_bytes == 0 && r.compute_percent == 0)
    return Status::InvalidArgument("a request needs memory above zero, a compute share, or whole cards");
  return Status::Ok();
}

std::string DefaultGpuLeasePath() {
  const char* env = std::getenv("STOKER_GPU_LEASES");
  return env && *env ? env : fmt::format("{}/leases-uid{}.json", GpuStateDir(), ::getuid());
}

namespace {

std::string LeasePath(const std::string& given) {
  return given.empty() ? DefaultGpuLeasePath() : given;
}

// Each card's state: leases promised, and memory used outside them (NVML's
// use less what the ledger charges the leases' tenants there).
std::vector<place::CardState> CardStates(const GpuInventory& inventory, const std::vector<GpuLease>& leases,
                                         place::LedgerViews& ledgers) {
  std::vector<place::CardState> cards;
  std::map<std::string, std::size_t> by_uuid;
  for (const GpuCard& c : inventory.cards) {
    by_uuid[c.uuid] = cards.size();
    place::CardState s;
    s.uuid = c.uuid;
    s.index = c.index;
    s.numa_node = c.numa_node;
    s.healthy = c.healthy;
    s.total_bytes = c.total_bytes;
    s.other_bytes = c.used_known ? c.used_bytes : 0;
    s.link_levels = c.link_levels;
    cards.push_back(std::move(s));
  }
  for (const GpuLease& l : leases) {
    for (const GpuLeaseCard& lc : l.cards) {
      auto card = by_uuid.find(lc.uuid);
      if (card == by_uuid.end()) continue;  // a card gone from the node
      place::CardState& s = cards[card->second];
      s.leased_bytes += lc.memory_bytes;
      s.leased_compute += l.whole_cards ? 100 : lc.compute_percent;
      s.exclusive = s.exclusive || l.whole_cards;
      ++s.leases;
      const std::uint64_t inside = ledgers.Charged(l.ledger, l.tenant, lc.uuid);
      s.other_bytes = s.other_bytes > inside ? s.other_bytes - inside : 0;
    }
  }
  return cards;
}

std::string NewLeaseId() {
  static std::atomic<unsigned> counter{0};
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  return fmt::format("{:x}-{}-{}", std::chrono::duration_cast<std::chrono::microseconds>(now).count(), ::getpid(),
                     counter++);
}

}  // namespace

Result<GpuLease> PlaceGpuRequest(const GpuRequest& request, const GpuInventory& inventory,
                                 const GpuPlacementOptions& options) {
  if (Status s = CheckGpuRequest(request); !s.ok()) return s;
  if (options.wait_seconds && !(*options.wait_seconds >= 0))
    return Status::InvalidArgument("the wait must be zero or more seconds");
  const std::string path = LeasePath(options.leases);
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    auto book = place::LeaseBook::Open(path);
    if (!book.ok()) return book.error();
    place::LedgerViews ledgers;
    const int reclaimed = book->ReclaimDead(ledgers);
    const auto cards = CardStates(inventory, book->leases(), ledgers);
    auto chosen = place::ChooseCards(request, cards);
    if (chosen.ok()) {
      GpuLease lease;
      lease.id = NewLeaseId();
      lease.tenant = options.tenant.empty() ? "lease-" + lease.id : options.tenant;
      lease.pid = options.pid ? options.pid : ::getpid();
      lease.pid_start = place::ProcessStartTime(lease.pid);
      lease.created_unix = static_cast<std::uint64_t>(std::time(nullptr));
      lease.whole_cards = request.whole_cards;
      lease.command = options.command;
      lease.ledger = options.ledger;
      for (std::size_t i : *chosen)
        lease.cards.push_back({cards[i].uuid, request.whole_cards ? cards[i].total_bytes : request.memory_bytes,
                               request.whole_cards ? 100u : request.compute_percent});
      book->leases().push_back(lease);
      if (Status s = book->Save(); !s.ok()) return s.WithContext("recording the lease");
      return lease;
    }
    if (chosen.error().code() != StatusCode::kResourceExhausted) return chosen.error();
    if (reclaimed > 0) {
      if (Status s = book->Save(); !s.ok()) return s.WithContext("dropping ended leases");
    }
    if (!options.wait_seconds) return chosen.error();
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (waited >= *options.wait_seconds)
      return Status::DeadlineExceeded(fmt::format("waited {:.0f} s: {}", waited, chosen.error().message()));
    // Let go of the lock while waiting, then look again.
    { auto released = std::move(*book); }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

std::vector<GpuCardUse> DescribeGpuUse(const GpuInventory& inventory, const std::vector<GpuLease>& leases) {
  place::LedgerViews ledgers;
  const auto states = CardStates(inventory, leases, ledgers);
  std::vector<GpuCardUse> out;
  for (std::size_t i = 0; i < states.size(); ++i) {
    GpuCardUse use;
    use.card = inventory.cards[i];
    use.leased_bytes = states[i].leased_bytes;
    use.other_bytes = states[i].other_bytes;
    use.free_bytes = states[i].FreeBytes();
    use.leased_compute = states[i].leased_compute;
    use.leases = states[i].leases;
    use.whole_leased = states[i].exclusive;
    out.push_back(std::move(use));
  }
  return out;
}

Result<std::vector<GpuLease>> ReadGpuLeases(const std::string& leases) {
  auto book = place::LeaseBook::Open(LeasePath(leases));
  if (!book.ok()) return book.error();
  place::LedgerViews ledgers;
  if (book->ReclaimDead(ledgers) > 0) {
    if (Status s = book->Save(); !s.ok()) return s.WithContext("dropping ended leases");
  }
  return std::move(book->leases());
}

Status ReleaseGpuLease(const std::string& id, const std::string& leases) {
  auto book = place::LeaseBook::Open(LeasePath(leases));
  if (!book.ok()) return book.error();
  if (book->Foreign(id))
    return Status::FailedPrecondition(fmt::format("lease '{}' is another user's (in {})", id, book->path()));
  const auto erased = std::erase_if(book->leases(), [&](const GpuLease& l) { return l.id == id; });
  if (erased == 0) return Status::NotFound(fmt::format("no lease '{}' in {}", id, book->path()));
  return book->Save();
}

}  // namespace stoker
