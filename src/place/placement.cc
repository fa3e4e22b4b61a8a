#include "place/placement.h"

#include <algorithm>
#include <map>

#include <fmt/format.h>

#include "stoker/byte_size.h"

namespace stoker::place {

std::uint64_t CardState::FreeBytes() const {
  const std::uint64_t taken = other_bytes + leased_bytes;
  return taken >= total_bytes ? 0 : total_bytes - taken;
}

namespace {

bool Allowed(const GpuRequest& request, const CardState& card) {
  return request.allowed_uuids.empty() || std::find(request.allowed_uuids.begin(), request.allowed_uuids.end(),
                                                    card.uuid) != request.allowed_uuids.end();
}

}  // namespace

bool Fits(const GpuRequest& request, const CardState& card) {
  if (!card.healthy || card.exclusive || !Allowed(request, card)) return false;
  if (request.whole_cards) return card.leases == 0;
  return request.memory_bytes <= card.FreeBytes() && request.compute_percent <= card.FreeCompute();
}

double FullnessAfter(const GpuRequest& request, const CardState& card) {
  if (request.whole_cards || card.total_bytes == 0) return 1.0;
  const double memory = static_cast<double>(card.other_bytes + card.leased_bytes + request.memory_bytes) /
                        static_cast<double>(card.total_bytes);
  const double compute = static_cast<double>(card.leased_compute + request.compute_percent) / 100.0;
  return std::max(memory, compute);
}

namespace {

// Cards in the policy's order of preference: binpack the fullest first,
// spread the emptiest; ties go to the lower index, so decisions repeat.
std::vector<std::size_t> Ranked(const GpuRequest& request, std::span<const CardState> cards,
                                const std::vector<std::size_t>& fitting) {
  std::vector<std::pair<double, std::size_t>> scored;
  for (std::size_t i : fitting) scored.emplace_back(FullnessAfter(request, cards[i]), i);
  std::stable_sort(scored.begin(), scored.end(), [&](const auto& a, const auto& b) {
    if (a.first != b.first) return request.policy == GpuPolicy::kBinpack ? a.first > b.first : a.first < b.first;
    return cards[a.second].index < cards[b.second].index;
  });
  std::vector<std::size_t> out;
  for (const auto& s : scored) out.push_back(s.second);
  return out;
}

// NVML's level between two cards (positions); 40 (one NUMA node) when
// unknown, which the callers only ask within a node.
int LinkLevel(std::span<const CardState> cards, std::size_t a, std::size_t b) {
  const auto& levels = cards[a].link_levels;
  if (b < levels.size() && levels[b] > 0) return levels[b];
  return 40;
}

double SetScore(const GpuRequest& request, std::span<const CardState> cards, std::span<const std::size_t> set) {
  double sum = 0;
  for (std::size_t i : set) sum += FullnessAfter(request, cards[i]);
  return sum;
}

}  // namespace

Result<std::vector<std::size_t>> ChooseCards(const GpuRequest& request, std::span<const CardState> cards) {
  if (Status s = CheckGpuRequest(request); !s.ok()) return s;
  std::vector<std::size_t> allowed;
  for (std::size_t i = 0; i < cards.size(); ++i)
    if (Allowed(request, cards[i])) allowed.push_back(i);
  if (allowed.size() < request.count)
    return Status::InvalidArgument(
        fmt::format("{} asks for more cards than the {} this node offers", DescribeRequest(request), allowed.size()));
  // Could it ever fit: count cards large enough when empty.
  std::size_t large_enough = 0;
  std::uint64_t largest = 0;
  for (std::size_t i : allowed) {
    largest = std::max(largest, cards[i].total_bytes);
    if (cards[i].total_bytes >= request.memory_bytes) ++large_enough;
  }
  if (!request.whole_cards && large_enough < request.count)
    return Status::InvalidArgument(
        fmt::format("{} can never fit: the largest card here has {}", DescribeRequest(request), FormatBytes(largest)));

  std::vector<std::size_t> fitting;
  for (std::size_t i : allowed)
    if (Fits(request, cards[i])) fitting.push_back(i);
  if (fitting.size() < request.count)
    return Status::ResourceExhausted(
        fmt::format("{} does not fit now: {}", DescribeRequest(request), DescribeFree(cards)));
  const std::vector<std::size_t> ranked = Ranked(request, cards, fitting);
  if (request.count == 1) return std::vector<std::size_t>{ranked.front()};

  // Several cards: inside one NUMA node if any node has enough, and the
  // set whose farthest pair is closest on PCIe; then the policy's score.
  std::map<int, std::vector<std::size_t>> by_node;
  for (std::size_t i : ranked) by_node[cards[i].numa_node].push_back(i);
  std::vector<std::size_t> best;
  int best_span = 0;
  double best_score = 0;
  auto consider = [&](std::vector<std::size_t> set, int span) {
    const double score = SetScore(request, cards, set);
    const bool better =
        best.empty() || span < best_span ||
        (span == best_span && (request.policy == GpuPolicy::kBinpack ? score > best_score : score < best_score));
    if (better) {
      best = std::move(set);
      best_span = span;
      best_score = score;
    }
  };
  for (auto& [node, members] : by_node) {
    if (node < 0 || members.size() < request.count) continue;
    // Grown from each member in turn: the next card is the closest to those
    // taken (ties: the policy's order).
    for (std::size_t seed = 0; seed < members.size(); ++seed) {
      std::vector<std::size_t> set = {members[seed]};
      int span = 0;
      while (set.size() < request.count) {
        std::size_t pick = members.size();
        int pick_level = 0;
        for (std::size_t m = 0; m < members.size(); ++m) {
          if (std::find(set.begin(), set.end(), members[m]) != set.end()) continue;
          int level = 0;
          for (std::size_t taken : set) level = std::max(level, LinkLevel(cards, members[m], taken));
          if (pick == members.size() || level < pick_level) {
            pick = m;
            pick_level = level;
          }
        }
        set.push_back(members[pick]);
        span = std::max(span, pick_level);
      }
      consider(std::move(set), span);
    }
  }
  if (best.empty()) best.assign(ranked.begin(), ranked.begin() + request.count);
  std::sort(best.begin(), best.end(), [&](std::size_t a, std::size_t b) { return cards[a].index < cards[b].index; });
  return best;
}

std::string DescribeFree(std::span<const CardState> cards) {
  std::vector<std::string> parts;
  for (const CardState& c : cards) {
    const std::string name = fmt::format("{} ({})", c.uuid, c.index);
    if (!c.healthy) {
      parts.push_back(name + ": unhealthy");
    } else if (c.exclusive) {
      parts.push_back(name + ": leased whole");
    } else {
      parts.push_back(fmt::format("{}: {} of {} free, {}% compute free", name, FormatBytes(c.FreeBytes()),
                                  FormatBytes(c.total_bytes), c.FreeCompute()));
    }
  }
  return parts.empty() ? "no cards" : fmt::format("{}", fmt::join(parts, "; "));
}

std::string DescribeRequest(const GpuRequest& request) {
  const std::string cards = fmt::format("{} card{}", request.count, request.count == 1 ? "" : "s");
  if (request.whole_cards) return fmt::format("{} whole card{}", request.count, request.count == 1 ? "" : "s");
  std::string what = FormatBytes(request.memory_bytes);
  if (request.compute_percent) what += fmt::format(" and {}% compute", request.compute_percent);
  return fmt::format("{} on {}", what, request.count == 1 ? "1 card" : fmt::format("each of {}", cards));
}

}  // namespace stoker::place
