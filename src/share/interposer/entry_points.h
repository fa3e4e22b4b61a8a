// The hooked driver entry points, one per variant (version, per-thread
// form), generated from entry_points.txt and the toolkit's cudaTypedefs.h
// (gen_entry_points.py), and the real driver's function for each.
#pragma once

#include <cstdint>
#include <string_view>

#include "share/interposer/cuda_api.h"

namespace stoker::share {

enum Variant : int {
#define STOKER_VARIANT(api, name, version, per_thread, symbol, pfn) kV_##symbol,
#include "entry_points.inc"
#undef STOKER_VARIANT
  kVariantCount
};

struct VariantInfo {
  std::string_view api;     // "cuMemAlloc"
  std::string_view symbol;  // "cuMemAlloc_v2"
  int version;              // the CUDA version that introduced it (3020)
  bool per_thread;          // a _ptsz/_ptds form
  void* hook;               // the interposer's function
};

// Every variant, ordered by api then version (per-thread forms after plain).
const VariantInfo& Info(Variant v);

// The variant a cuGetProcAddress(api, version, flags) request resolves to,
// the way the driver chooses: the highest version at or below `version`,
// the per-thread form when `per_thread` asks for it and there is one.
// -1 when `api` is not hooked or has no variant that old.
int SelectVariant(std::string_view api, int version, bool per_thread);

// The variant exported under `symbol`; -1 when not hooked.
int VariantBySymbol(std::string_view symbol);

// The real driver's function for `v`, or nullptr when the driver lacks it
// (the hook then answers CUDA_ERROR_NOT_FOUND, never calling through NULL).
void* RealFunction(Variant v);

// Whether `fn` lies in this library (the interposer) itself.
bool OwnFunction(const void* fn);

// Whether the driver's lookup answered with one of the interposer's own
// hooks for some entry point (then resolved by name in the driver's own
// scope instead, or left missing when that too gave ours).
bool DriverAnsweredWithOurHooks();

template <typename Pfn>
Pfn Real(Variant v) {
  return reinterpret_cast<Pfn>(RealFunction(v));
}

}  // namespace stoker::share
