#include "share/interposer/entry_points.h"

#include <algorithm>
#include <string>
#include <type_traits>

#include "share/interposer/real_driver.h"

namespace stoker::share {
namespace {

// Each hook has exactly the type cudaTypedefs.h gives its variant.
#define STOKER_VARIANT(api, name, version, per_thread, symbol, pfn) \
  static_assert(std::is_same_v<decltype(&symbol), pfn>, "the hook " name " does not match " #pfn);
#include "entry_points.inc"
#undef STOKER_VARIANT

const VariantInfo kVariants[] = {
#define STOKER_VARIANT(api, name, version, per_thread, symbol, pfn) \
  {#api, name, version, per_thread != 0, reinterpret_cast<void*>(&symbol)},
#include "entry_points.inc"
#undef STOKER_VARIANT
};
static_assert(std::size(kVariants) == kVariantCount);

using GetProcAddressV2 = PFN_cuGetProcAddress_v12000;
using GetProcAddressV1 = PFN_cuGetProcAddress_v11030;

// What the real driver answers for `v`: through its cuGetProcAddress (as
// the CUDA runtime would ask), else by the exported name.
void* Resolve(const VariantInfo& v) {
  if (v.api != "cuGetProcAddress") {
    const cuuint64_t flags =
        v.per_thread ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : CU_GET_PROC_ADDRESS_LEGACY_STREAM;
    const std::string api(v.api);
    void* fn = nullptr;
    if (auto get2 = reinterpret_cast<GetProcAddressV2>(DriverSymbol("cuGetProcAddress_v2"))) {
      CUdriverProcAddressQueryResult found{};
      if (get2(api.c_str(), &fn, v.version, flags, &found) == CUDA_SUCCESS && fn) return fn;
    } else if (auto get1 = reinterpret_cast<GetProcAddressV1>(DriverSymbol("cuGetProcAddress"))) {
      if (get1(api.c_str(), &fn, v.version, flags) == CUDA_SUCCESS && fn) return fn;
    }
  }
  return DriverSymbol(std::string(v.symbol).c_str());
}

struct RealTable {
  void* fn[kVariantCount] = {};
  RealTable() {
    for (int v = 0; v < kVariantCount; ++v) fn[v] = Resolve(kVariants[v]);
  }
};

}  // namespace

const VariantInfo& Info(Variant v) {
  return kVariants[v];
}

int SelectVariant(std::string_view api, int version, bool per_thread) {
  int best = -1;
  for (int v = 0; v < kVariantCount; ++v) {
    const VariantInfo& info = kVariants[v];
    if (info.api != api || info.version > version) continue;
    if (info.per_thread && !per_thread) continue;
    if (best < 0) {
      best = v;
      continue;
    }
    const VariantInfo& b = kVariants[best];
    // A later version wins; at equal versions (or a per-thread form of an
    // earlier signature), the per-thread form wins when asked for.
    if (per_thread && info.per_thread != b.per_thread) {
      if (info.per_thread) best = v;
    } else if (info.version > b.version) {
      best = v;
    }
  }
  return best;
}

int VariantBySymbol(std::string_view symbol) {
  for (int v = 0; v < kVariantCount; ++v)
    if (kVariants[v].symbol == symbol) return v;
  return -1;
}

void* RealFunction(Variant v) {
  static const RealTable* table = new RealTable();
  return table->fn[v];
}

}  // namespace stoker::share
