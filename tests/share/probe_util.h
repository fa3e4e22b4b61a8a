// Helpers shared by the share probe's scenarios.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "probe_driver.h"

namespace probe {

// Whether libcuda.so.1 is the fake (else a real driver: the GPU check).
bool OnFakeDriver();
// The fake device a CUDA ordinal is (the fake's UUIDs start with 0x10 * (d + 1)).
int PhysicalOf(const Driver& d, int ordinal);
// Bytes the fake device holds for this process / for every live process.
std::uint64_t FakeProcessUsed(int physical);
std::uint64_t FakeDeviceUsed(int physical);
// This process's charge on `ordinal` in the ledger, and its tenant's.
struct Charges {
  std::uint64_t process = 0, tenant = 0, quota = ~std::uint64_t{0};
  std::uint64_t oom_refusals = 0, throttled_ns = 0, launches = 0;
};
Charges LedgerCharges(const Driver& d, int ordinal);
std::string LedgerPath();

[[noreturn]] inline void Fail(const std::string& what) {
  std::fprintf(stderr, "probe: FAIL: %s\n", what.c_str());
  std::exit(1);
}
inline void Check(CUresult r, const char* what) {
  if (r != CUDA_SUCCESS) Fail(std::string(what) + " returned " + std::to_string(static_cast<int>(r)));
}

// SplitMix64: our own deterministic generator.
struct Random {
  std::uint64_t state;
  std::uint64_t Next() {
    std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  std::uint64_t Below(std::uint64_t n) { return n ? Next() % n : 0; }
};

int RunProperty(const Driver& d, std::uint64_t ops, std::uint64_t seed);

}  // namespace probe
