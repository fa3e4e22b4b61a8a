// stoker's own deterministic PRNG: the same numbers on every compiler and
// platform (std::shuffle and the std distributions differ between them).
#pragma once

#include <cmath>
#include <cstdint>

namespace stoker {

__extension__ typedef unsigned __int128 UInt128;  // GCC/Clang extension; __extension__ keeps -Wpedantic quiet

// SplitMix64: turns any 64-bit value into a well-mixed one.
[[nodiscard]] constexpr std::uint64_t SplitMix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// xoshiro256** seeded from (seed, stream) through SplitMix64.
class Rng {
 public:
  Rng(std::uint64_t seed, std::uint64_t stream) {
    std::uint64_t x = SplitMix64(seed) ^ SplitMix64(stream + 0x632be59bd9b4e019ull);
    for (auto& s : s_) {
      x = SplitMix64(x);
      s = x;
    }
  }

  std::uint64_t Next() {
    const std::uint64_t result = Rotl(s_[1] * 5, 7) * 9;
    const std::uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = Rotl(s_[3], 45);
    return result;
  }

  // Uniform in [0, n), unbiased (Lemire's multiply-and-reject). n > 0.
  std::uint64_t Below(std::uint64_t n) {
    UInt128 m = static_cast<UInt128>(Next()) * n;
    auto low = static_cast<std::uint64_t>(m);
    if (low < n) {
      const std::uint64_t threshold = -n % n;
      while (low < threshold) {
        m = static_cast<UInt128>(Next()) * n;
        low = static_cast<std::uint64_t>(m);
      }
    }
    return static_cast<std::uint64_t>(m >> 64);
  }

  // Uniform in [0, 1) with 53 random bits.
  double Uniform01() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }
  double Uniform(double lo, double hi) { return lo + (hi - lo) * Uniform01(); }
  // Uniform integer in [lo, hi], inclusive, as Python's random.randint.
  std::int64_t IntInclusive(std::int64_t lo, std::int64_t hi) {
    return lo + static_cast<std::int64_t>(Below(static_cast<std::uint64_t>(hi - lo) + 1));
  }

 private:
  static constexpr std::uint64_t Rotl(std::uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  std::uint64_t s_[4];
};

// Fisher-Yates with our Rng: identical results everywhere.
template <typename T>
void Shuffle(T* data, std::uint64_t n, Rng& rng) {
  for (std::uint64_t i = n; i > 1; --i) {
    std::uint64_t j = rng.Below(i);
    std::swap(data[i - 1], data[j]);
  }
}

// The same shuffle, given up (returning false, `data` half shuffled) once
// `stopped()` says so; asked every 2^20 swaps, a few milliseconds apart.
template <typename T, typename Stopped>
bool ShuffleUnlessStopped(T* data, std::uint64_t n, Rng& rng, const Stopped& stopped) {
  for (std::uint64_t i = n; i > 1; --i) {
    if ((i & 0xFFFFF) == 0 && stopped()) return false;
    std::uint64_t j = rng.Below(i);
    std::swap(data[i - 1], data[j]);
  }
  return true;
}

}  // namespace stoker
