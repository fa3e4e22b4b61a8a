#include "share/interposer/entry_points.h"

#include <dlfcn.h>

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

// Whether `fn` is one of this library's own functions: a driver whose
// lookups bind in the global scope (or another interposer handing ours
// back) answers with our hooks, and calling one as "the real driver" would
// recurse until the stack overflows.
bool Ours(const void* fn) {
  return OwnFunction(fn);
}

// What the real driver answers for `v`: through its cuGetProcAddress (as
// the CUDA runtime would ask), else by the exported name in the driver's
// own scope; never one of our hooks.
void* Resolve(const VariantInfo& v, bool* self_answered) {
  if (v.api != "cuGetProcAddress") {
    const cuuint64_t flags =
        v.per_thread ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : CU_GET_PROC_ADDRESS_LEGACY_STREAM;
    const std::string api(v.api);
    void* fn = nullptr;
    void* get2 = DriverSymbol("cuGetProcAddress_v2");
    void* get1 = DriverSymbol("cuGetProcAddress");
    if (get2 != nullptr && !Ours(get2)) {
      CUdriverProcAddressQueryResult found{};
      if (reinterpret_cast<GetProcAddressV2>(get2)(api.c_str(), &fn, v.version, flags, &found) != CUDA_SUCCESS)
        fn = nullptr;
    } else if (get1 != nullptr && !Ours(get1)) {
      if (reinterpret_cast<GetProcAddressV1>(get1)(api.c_str(), &fn, v.version, flags) != CUDA_SUCCESS) fn = nullptr;
    }
    if (fn != nullptr && !Ours(fn)) return fn;
    if (fn != nullptr) *self_answered = true;
  }
  void* fn = DriverSymbol(std::string(v.symbol).c_str());
  if (Ours(fn)) {
    *self_answered = true;
    return nullptr;  // the hook answers CUDA_ERROR_NOT_FOUND (cuInit says why)
  }
  return fn;
}

struct RealTable {
  void* fn[kVariantCount] = {};
  bool self_answered = false;
  RealTable() {
    for (int v = 0; v < kVariantCount; ++v) fn[v] = Resolve(kVariants[v], &self_answered);
  }
};

const RealTable& Table() {
  static const RealTable* table = new RealTable();
  return *table;
}

}  // namespace

bool OwnFunction(const void* fn) {
  static const void* self_base = [] {
    Dl_info info{};
    return ::dladdr(reinterpret_cast<const void*>(&OwnFunction), &info) ? info.dli_fbase : nullptr;
  }();
  Dl_info info{};
  return fn != nullptr && self_base != nullptr && ::dladdr(fn, &info) && info.dli_fbase == self_base;
}

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
  return Table().fn[v];
}

bool DriverAnsweredWithOurHooks() {
  return Table().self_answered;
}

}  // namespace stoker::share
