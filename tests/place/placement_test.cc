// Placement as a pure function: random request sequences never over-commit
// a card, binpack fills cards before opening new ones, spread opens new
// ones first, several cards stay inside one NUMA node when they can.
#include "place/placement.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "core/rng.h"

namespace stoker::place {
namespace {

constexpr std::uint64_t kGiB = std::uint64_t{1} << 30;

std::vector<CardState> Cards(int n, std::uint64_t bytes, std::vector<int> numa = {}) {
  std::vector<CardState> cards;
  for (int i = 0; i < n; ++i) {
    CardState c;
    c.uuid = "GPU-" + std::to_string(i);
    c.index = i;
    c.total_bytes = bytes;
    c.numa_node = numa.empty() ? 0 : numa[static_cast<std::size_t>(i)];
    cards.push_back(c);
  }
  return cards;
}

GpuRequest Memory(std::uint64_t bytes, std::uint32_t compute = 0, GpuPolicy policy = GpuPolicy::kBinpack,
                  std::uint32_t count = 1) {
  GpuRequest r;
  r.memory_bytes = bytes;
  r.compute_percent = compute;
  r.policy = policy;
  r.count = count;
  return r;
}

struct Placed {
  std::vector<std::size_t> cards;
  GpuRequest request;
};

void Apply(std::vector<CardState>& cards, const Placed& p, int sign) {
  for (std::size_t i : p.cards) {
    CardState& c = cards[i];
    if (p.request.whole_cards) {
      c.exclusive = sign > 0;
      c.leased_compute = sign > 0 ? 100 : 0;
    } else {
      c.leased_bytes = sign > 0 ? c.leased_bytes + p.request.memory_bytes : c.leased_bytes - p.request.memory_bytes;
      c.leased_compute =
          sign > 0 ? c.leased_compute + p.request.compute_percent : c.leased_compute - p.request.compute_percent;
    }
    c.leases = sign > 0 ? c.leases + 1 : c.leases - 1;
  }
}

TEST(Placement, RandomSequencesNeverOverCommitACard) {
  for (std::uint64_t seed = 0; seed < 40; ++seed) {
    Rng rng(seed, 7);
    const int n = 1 + static_cast<int>(rng.Below(8));
    std::vector<CardState> cards;
    for (int i = 0; i < n; ++i) {
      CardState c;
      c.uuid = "GPU-" + std::to_string(i);
      c.index = i;
      c.numa_node = static_cast<int>(rng.Below(2));
      c.total_bytes = (16 + rng.Below(128)) * kGiB;
      c.other_bytes = rng.Below(4) == 0 ? rng.Below(8) * kGiB : 0;
      cards.push_back(c);
    }
    std::vector<Placed> live;
    int placed = 0, refused = 0;
    for (int step = 0; step < 2000; ++step) {
      if (!live.empty() && rng.Below(3) == 0) {
        const std::size_t k = rng.Below(live.size());
        Apply(cards, live[k], -1);
        live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
        continue;
      }
      GpuRequest r;
      r.policy = rng.Below(2) ? GpuPolicy::kSpread : GpuPolicy::kBinpack;
      r.count = 1 + static_cast<std::uint32_t>(rng.Below(std::min<std::uint64_t>(3, cards.size())));
      if (rng.Below(10) == 0) {
        r.whole_cards = true;
      } else {
        r.memory_bytes = (1 + rng.Below(40)) * kGiB;
        r.compute_percent = rng.Below(3) == 0 ? static_cast<std::uint32_t>(rng.Below(60)) : 0;
        if (r.compute_percent == 0 && r.memory_bytes == 0) r.memory_bytes = kGiB;
      }
      auto chosen = ChooseCards(r, cards);
      if (!chosen.ok()) {
        ASSERT_TRUE(chosen.error().code() == StatusCode::kResourceExhausted ||
                    chosen.error().code() == StatusCode::kInvalidArgument)
            << chosen.error().ToString();
        // Refused only when no `count` cards fit.
        if (chosen.error().code() == StatusCode::kResourceExhausted) {
          ASSERT_LT(std::count_if(cards.begin(), cards.end(), [&](const CardState& c) { return Fits(r, c); }),
                    static_cast<std::ptrdiff_t>(r.count));
        }
        ++refused;
        continue;
      }
      ASSERT_EQ(chosen->size(), r.count);
      ASSERT_EQ(std::set<std::size_t>(chosen->begin(), chosen->end()).size(), r.count) << "a card chosen twice";
      for (std::size_t i : *chosen) ASSERT_TRUE(Fits(r, cards[i]));
      Placed p{*chosen, r};
      Apply(cards, p, +1);
      live.push_back(p);
      ++placed;
      for (const CardState& c : cards) {
        if (c.exclusive) {
          ASSERT_EQ(c.leases, 1u) << "a whole card shared";
          continue;
        }
        ASSERT_LE(c.leased_bytes + c.other_bytes, c.total_bytes)
            << "card " << c.index << " over-committed, seed " << seed;
        ASSERT_LE(c.leased_compute, 100u);
      }
    }
    EXPECT_GT(placed, 100) << "seed " << seed;
    EXPECT_GT(refused, 0) << "seed " << seed;
  }
}

TEST(Placement, BinpackFillsUsedCardsBeforeOpeningNewOnesAndSpreadOpensNewOnesFirst) {
  for (std::uint64_t seed = 0; seed < 50; ++seed) {
    Rng rng(seed, 11);
    std::vector<CardState> binpack = Cards(6, 80 * kGiB), spread = Cards(6, 80 * kGiB);
    std::vector<std::uint64_t> sizes;
    for (int i = 0; i < 12; ++i) sizes.push_back((1 + rng.Below(30)) * kGiB);
    for (std::uint64_t size : sizes) {
      for (auto* cards : {&binpack, &spread}) {
        const GpuRequest r = Memory(size, 0, cards == &binpack ? GpuPolicy::kBinpack : GpuPolicy::kSpread);
        auto chosen = ChooseCards(r, *cards);
        if (!chosen.ok()) continue;
        const CardState& c = (*cards)[chosen->front()];
        const bool used_fits =
            std::any_of(cards->begin(), cards->end(), [&](const CardState& o) { return o.leases > 0 && Fits(r, o); });
        const bool empty_fits =
            std::any_of(cards->begin(), cards->end(), [&](const CardState& o) { return o.leases == 0 && Fits(r, o); });
        if (cards == &binpack && used_fits) {
          EXPECT_GT(c.leases, 0u) << "binpack opened a card while a used one fit";
        }
        if (cards == &spread && empty_fits) {
          EXPECT_EQ(c.leases, 0u) << "spread stacked while an empty card fit";
        }
        Apply(*cards, Placed{*chosen, r}, +1);
      }
    }
    auto in_use = [](const std::vector<CardState>& cards) {
      return std::count_if(cards.begin(), cards.end(), [](const CardState& c) { return c.leases > 0; });
    };
    EXPECT_LE(in_use(binpack), in_use(spread)) << "seed " << seed;
    EXPECT_EQ(in_use(spread), 6) << "12 requests over 6 cards: spread uses every card";
    // The fewest: binpack never uses more cards than the total need rounds up to, plus slack for fragmentation.
    std::uint64_t total = 0;
    for (auto s : sizes) total += s;
    EXPECT_LE(in_use(binpack), static_cast<std::ptrdiff_t>((total + 80 * kGiB - 1) / (80 * kGiB) + 1))
        << "seed " << seed;
  }
}

TEST(Placement, BinpackTakesTheTightestFitAndTiesGoToTheLowerIndex) {
  auto cards = Cards(3, 80 * kGiB);
  cards[1].leased_bytes = 50 * kGiB;
  cards[1].leases = 1;
  cards[2].leased_bytes = 70 * kGiB;
  cards[2].leases = 1;
  EXPECT_EQ(ChooseCards(Memory(20 * kGiB), cards)->front(), 1u) << "card 2 has only 10 GiB left";
  EXPECT_EQ(ChooseCards(Memory(5 * kGiB), cards)->front(), 2u);
  EXPECT_EQ(ChooseCards(Memory(5 * kGiB, 0, GpuPolicy::kSpread), cards)->front(), 0u);
  auto empty = Cards(3, 80 * kGiB);
  EXPECT_EQ(ChooseCards(Memory(5 * kGiB), empty)->front(), 0u);
  EXPECT_EQ(ChooseCards(Memory(5 * kGiB, 0, GpuPolicy::kSpread), empty)->front(), 0u);
}

TEST(Placement, ComputeSharesAreLimitedToAHundredPercentPerCard) {
  auto cards = Cards(1, 80 * kGiB);
  cards[0].leased_compute = 70;
  cards[0].leases = 1;
  EXPECT_TRUE(ChooseCards(Memory(kGiB, 30), cards).ok());
  auto refused = ChooseCards(Memory(kGiB, 31), cards);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(refused.error().message().find("30% compute free"), std::string::npos) << refused.error().message();
}

TEST(Placement, SeveralCardsStayInsideOneNumaNodeWhenTheyCan) {
  auto cards = Cards(4, 80 * kGiB, {0, 1, 0, 1});
  auto chosen = ChooseCards(Memory(10 * kGiB, 0, GpuPolicy::kBinpack, 2), cards);
  ASSERT_TRUE(chosen.ok());
  EXPECT_EQ(*chosen, (std::vector<std::size_t>{0, 2}));
  // Node 0's cards are busier: binpack still keeps the set on one node, and prefers the fuller node.
  cards[2].leased_bytes = 40 * kGiB;
  cards[2].leases = 1;
  chosen = ChooseCards(Memory(10 * kGiB, 0, GpuPolicy::kBinpack, 2), cards);
  EXPECT_EQ(*chosen, (std::vector<std::size_t>{0, 2}));
  chosen = ChooseCards(Memory(10 * kGiB, 0, GpuPolicy::kSpread, 2), cards);
  EXPECT_EQ(*chosen, (std::vector<std::size_t>{1, 3}));
  // No node has two cards that fit: the set spans nodes.
  cards[0].exclusive = true;
  cards[3].exclusive = true;
  chosen = ChooseCards(Memory(10 * kGiB, 0, GpuPolicy::kBinpack, 2), cards);
  EXPECT_EQ(*chosen, (std::vector<std::size_t>{1, 2}));
}

TEST(Placement, SeveralCardsPreferOnePcieSwitchInsideTheNode) {
  // One NUMA node; cards 0+1 share a switch, 2+3 share another.
  auto cards = Cards(4, 80 * kGiB);
  const std::vector<std::vector<int>> levels = {{0, 10, 40, 40}, {10, 0, 40, 40}, {40, 40, 0, 10}, {40, 40, 10, 0}};
  for (std::size_t i = 0; i < 4; ++i) cards[i].link_levels = levels[i];
  // Binpack alone would take the two fullest, 0 and 2, across switches.
  cards[0].leased_bytes = 30 * kGiB;
  cards[0].leases = 1;
  cards[2].leased_bytes = 20 * kGiB;
  cards[2].leases = 1;
  EXPECT_EQ(*ChooseCards(Memory(10 * kGiB, 0, GpuPolicy::kBinpack, 2), cards), (std::vector<std::size_t>{0, 1}));
  EXPECT_EQ(*ChooseCards(Memory(10 * kGiB, 0, GpuPolicy::kSpread, 2), cards), (std::vector<std::size_t>{2, 3}));
  // A switch with one card free: the set spans switches rather than fail.
  cards[1].exclusive = true;
  EXPECT_EQ(*ChooseCards(Memory(10 * kGiB, 0, GpuPolicy::kBinpack, 2), cards), (std::vector<std::size_t>{2, 3}));
  cards[3].exclusive = true;
  EXPECT_EQ(*ChooseCards(Memory(10 * kGiB, 0, GpuPolicy::kBinpack, 2), cards), (std::vector<std::size_t>{0, 2}));
}

TEST(Placement, WholeCardsTakeOnlyCardsNobodyLeases) {
  auto cards = Cards(3, 80 * kGiB);
  cards[0].leased_bytes = kGiB;
  cards[0].leases = 1;
  GpuRequest r;
  r.whole_cards = true;
  r.count = 2;
  EXPECT_EQ(*ChooseCards(r, cards), (std::vector<std::size_t>{1, 2}));
  r.count = 3;
  EXPECT_EQ(ChooseCards(r, cards).error().code(), StatusCode::kResourceExhausted);
}

TEST(Placement, BadAndImpossibleRequestsSayWhy) {
  auto cards = Cards(2, 80 * kGiB);
  cards[1].healthy = false;
  auto too_big = ChooseCards(Memory(100 * kGiB), cards);
  ASSERT_FALSE(too_big.ok());
  EXPECT_EQ(too_big.error().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(too_big.error().message().find("can never fit: the largest card here has 80.0 GiB"), std::string::npos)
      << too_big.error().message();
  auto too_many = ChooseCards(Memory(kGiB, 0, GpuPolicy::kBinpack, 3), cards);
  EXPECT_NE(too_many.error().message().find("more cards than the 2"), std::string::npos) << too_many.error().message();
  EXPECT_EQ(ChooseCards(Memory(0), cards).error().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ChooseCards(Memory(kGiB, 101), cards).error().code(), StatusCode::kInvalidArgument);
  GpuRequest none = Memory(kGiB);
  none.count = 0;
  EXPECT_EQ(ChooseCards(none, cards).error().code(), StatusCode::kInvalidArgument);
  // An unhealthy card is never chosen and is named so.
  auto two = ChooseCards(Memory(kGiB, 0, GpuPolicy::kBinpack, 2), cards);
  ASSERT_FALSE(two.ok());
  EXPECT_NE(two.error().message().find("GPU-1 (1): unhealthy"), std::string::npos) << two.error().message();
  EXPECT_EQ(ParseGpuPolicy("pack").error().message(), "unknown placement policy 'pack': use binpack or spread");
}

TEST(Placement, OnlyAllowedCardsAreChosen) {
  auto cards = Cards(3, 80 * kGiB);
  GpuRequest r = Memory(kGiB);
  r.allowed_uuids = {"GPU-2"};
  EXPECT_EQ(ChooseCards(r, cards)->front(), 2u);
}

}  // namespace
}  // namespace stoker::place
