// Contexts, modules and libraries (their memory measured: the device's use
// before and after, then reconciled with NVML's per-process view where it
// has one), and graph memory (the device's graph reservation, read after
// each launch, upload, trim and destruction).
#include "share/code_image.h"
#include "share/interposer/hook_prologue.h"

using stoker::share::Dev;
using stoker::share::Interposer;

namespace {

// A context is admitted before it is made, for what the last one measured
// on that device took (any process's: the same driver and device make the
// same context), then charged what this one measured.
template <typename Create>
CUresult CreateContext(Interposer& ip, CUcontext* out, CUdevice device, Create create) {
  Dev dev;
  if (!ip.DeviceOf(device, &dev)) return create(out);
  const std::uint64_t expected = ip.ledger().ContextBytes(dev.ledger);
  if (expected > 0 && !ip.Admit(dev, expected)) return CUDA_ERROR_OUT_OF_MEMORY;
  std::uint64_t measured = 0;
  CUcontext ctx = nullptr;
  const CUresult r = ip.Measure(
      dev, &measured, [&] { return create(&ctx); }, expected);
  if (r != CUDA_SUCCESS) {
    if (expected > 0) ip.ledger().Uncharge(dev.ledger, expected);
    return r;
  }
  if (out) *out = ctx;
  {
    std::lock_guard<std::mutex> lock(ip.mu);
    ip.AddOverhead(dev, measured, /*reserved=*/expected);
    ip.contexts[ctx] = {dev, measured};
  }
  ip.ledger().LearnContextBytes(dev.ledger, measured);
  ip.Reconcile(dev.ordinal);
  return r;
}

template <typename Destroy>
CUresult DestroyContext(Interposer& ip, CUcontext ctx, Destroy destroy) {
  const CUresult r = destroy();
  if (r == CUDA_SUCCESS) ip.ForgetContext(ctx);
  return r;
}

// The primary context: measured when first retained, forgotten (with
// everything allocated in it) when released for the last time or reset.
template <typename Release>
CUresult ReleasePrimary(Interposer& ip, CUdevice device, bool reset, Release release) {
  const CUresult r = release();
  if (r != CUDA_SUCCESS || device < 0 || device >= static_cast<int>(stoker::share::kMaxOrdinals)) return r;
  CUcontext gone = nullptr;
  {
    std::lock_guard<std::mutex> lock(ip.mu);
    if (reset || --ip.primary_refs[device] <= 0) {
      ip.primary_refs[device] = 0;
      gone = ip.primary[device];
      ip.primary[device] = nullptr;
    }
  }
  if (gone != nullptr) ip.ForgetContext(gone);
  return r;
}

// Modules and libraries: admitted before the load for what the same code
// (`key`, code_image.h; 0: unknown) took when last loaded on that device
// by any process of the user, then measured around the load in the current
// context and that measurement learned.
template <typename Load>
CUresult LoadCode(Interposer& ip, void** out, std::uint64_t key, Load load) {
  Dev dev;
  CUcontext ctx = nullptr;
  if (!ip.CurrentDevice(&dev, &ctx)) return load(out);
  const std::uint64_t expected = key != 0 ? ip.ledger().CodeBytes(dev.ledger, key) : 0;
  if (expected > 0 && !ip.Admit(dev, expected)) return CUDA_ERROR_OUT_OF_MEMORY;
  std::uint64_t measured = 0;
  void* handle = nullptr;
  const CUresult r = ip.Measure(
      dev, &measured, [&] { return load(&handle); }, expected);
  if (r != CUDA_SUCCESS) {
    if (expected > 0) ip.ledger().Uncharge(dev.ledger, expected);
    return r;
  }
  if (out) *out = handle;
  {
    std::lock_guard<std::mutex> lock(ip.mu);
    ip.AddOverhead(dev, measured, /*reserved=*/expected);
    ip.modules[handle] = {ctx, dev, measured};
  }
  if (key != 0) ip.ledger().LearnCodeBytes(dev.ledger, key, measured);
  ip.Reconcile(dev.ordinal);
  return r;
}

// What shapes a JIT load besides the image: the options that change the
// code made, with their values (others, such as log buffers, whose values
// are pointers that differ from call to call, by name only).
std::uint64_t JitVariant(unsigned int n, const CUjit_option* options, void* const* values) {
  std::uint64_t v = n;
  for (unsigned int i = 0; options != nullptr && i < n && i < 64; ++i) {
    const CUjit_option o = options[i];
    const bool shapes_code = o == CU_JIT_MAX_REGISTERS || o == CU_JIT_THREADS_PER_BLOCK ||
                             o == CU_JIT_OPTIMIZATION_LEVEL || o == CU_JIT_TARGET || o == CU_JIT_FALLBACK_STRATEGY ||
                             o == CU_JIT_GENERATE_DEBUG_INFO || o == CU_JIT_GENERATE_LINE_INFO ||
                             o == CU_JIT_CACHE_MODE;
    v = v * 1099511628211ull + static_cast<std::uint64_t>(o) * 31;
    if (shapes_code && values != nullptr) v += static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(values[i]));
  }
  return v;
}

template <typename Unload>
CUresult UnloadCode(Interposer& ip, void* handle, Unload unload) {
  const CUresult r = unload();
  if (r != CUDA_SUCCESS) return r;
  int ordinal = -1;
  {
    std::lock_guard<std::mutex> lock(ip.mu);
    auto it = ip.modules.find(handle);
    if (it != ip.modules.end()) {
      ordinal = it->second.dev.ordinal;
      ip.ForgetOverhead(it->second.dev, it->second.bytes);
      ip.modules.erase(it);
    }
  }
  if (ordinal >= 0) ip.Reconcile(ordinal);
  return r;
}

}  // namespace

STOKER_HOOK CUresult CUDAAPI cuCtxCreate(CUcontext* ctx, unsigned int flags, CUdevice_v1 device) {
  STOKER_PROLOGUE(cuCtxCreate, PFN_cuCtxCreate_v2000)
  return CreateContext(ip, ctx, device, [&](CUcontext* c) { return real(c, flags, device); });
}
STOKER_HOOK CUresult CUDAAPI cuCtxCreate_v2(CUcontext* ctx, unsigned int flags, CUdevice device) {
  STOKER_PROLOGUE(cuCtxCreate_v2, PFN_cuCtxCreate_v3020)
  return CreateContext(ip, ctx, device, [&](CUcontext* c) { return real(c, flags, device); });
}
STOKER_HOOK CUresult CUDAAPI cuCtxCreate_v3(CUcontext* ctx, CUexecAffinityParam* params, int count, unsigned int flags,
                                            CUdevice device) {
  STOKER_PROLOGUE(cuCtxCreate_v3, PFN_cuCtxCreate_v11040)
  return CreateContext(ip, ctx, device, [&](CUcontext* c) { return real(c, params, count, flags, device); });
}
STOKER_HOOK CUresult CUDAAPI cuCtxCreate_v4(CUcontext* ctx, CUctxCreateParams* params, unsigned int flags,
                                            CUdevice device) {
  STOKER_PROLOGUE(cuCtxCreate_v4, PFN_cuCtxCreate_v12050)
  return CreateContext(ip, ctx, device, [&](CUcontext* c) { return real(c, params, flags, device); });
}
STOKER_HOOK CUresult CUDAAPI cuCtxDestroy(CUcontext ctx) {
  STOKER_PROLOGUE(cuCtxDestroy, PFN_cuCtxDestroy_v2000)
  return DestroyContext(ip, ctx, [&] { return real(ctx); });
}
STOKER_HOOK CUresult CUDAAPI cuCtxDestroy_v2(CUcontext ctx) {
  STOKER_PROLOGUE(cuCtxDestroy_v2, PFN_cuCtxDestroy_v4000)
  return DestroyContext(ip, ctx, [&] { return real(ctx); });
}

// The malloc heap (its size is the request: admitted before) and the stacks
// (per thread, times the threads the device keeps) take device memory in
// the current context: measured, and kept with the context, so that its end
// gives them back. A smaller limit gives memory back.
STOKER_HOOK CUresult CUDAAPI cuCtxSetLimit(CUlimit limit, size_t value) {
  STOKER_PROLOGUE(cuCtxSetLimit, PFN_cuCtxSetLimit_v3010)
  Dev dev;
  CUcontext ctx = nullptr;
  if ((limit != CU_LIMIT_MALLOC_HEAP_SIZE && limit != CU_LIMIT_STACK_SIZE) || !ip.CurrentDevice(&dev, &ctx))
    return real(limit, value);
  const std::uint64_t expected = limit == CU_LIMIT_MALLOC_HEAP_SIZE ? value : 0;
  if (expected > 0 && !ip.Admit(dev, expected)) return CUDA_ERROR_OUT_OF_MEMORY;
  std::uint64_t before = 0, after = 0;
  const bool measured = ip.DeviceUsed(dev.ordinal, &before);
  const CUresult r = real(limit, value);
  const bool measured_after = measured && ip.DeviceUsed(dev.ordinal, &after);
  {
    std::lock_guard<std::mutex> lock(ip.mu);
    auto c = ip.contexts.find(ctx);
    if (r != CUDA_SUCCESS) {
      if (expected > 0) ip.ledger().Uncharge(dev.ledger, expected);
    } else if (!measured_after || after >= before) {
      // Grown (unmeasured: the heap's size stands in for it).
      const std::uint64_t grown = measured_after ? after - before : expected;
      ip.AddOverhead(dev, grown, expected);
      if (c != ip.contexts.end()) c->second.measured += grown;
    } else {
      // A smaller limit: memory given back.
      if (expected > 0) ip.ledger().Uncharge(dev.ledger, expected);
      const std::uint64_t freed = std::min(before - after, c != ip.contexts.end() ? c->second.measured : 0);
      ip.ForgetOverhead(dev, freed);
      if (c != ip.contexts.end()) c->second.measured -= freed;
    }
  }
  ip.Reconcile(dev.ordinal);
  return r;
}

STOKER_HOOK CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext* ctx, CUdevice device) {
  STOKER_PROLOGUE(cuDevicePrimaryCtxRetain, PFN_cuDevicePrimaryCtxRetain_v7000)
  Dev dev;
  if (device < 0 || device >= static_cast<int>(stoker::share::kMaxOrdinals) || !ip.DeviceOf(device, &dev))
    return real(ctx, device);
  bool first = false;
  {
    std::lock_guard<std::mutex> lock(ip.mu);
    first = ip.primary_refs[device] == 0;
  }
  if (!first) {
    const CUresult r = real(ctx, device);
    if (r == CUDA_SUCCESS) {
      std::lock_guard<std::mutex> lock(ip.mu);
      ++ip.primary_refs[device];
    }
    return r;
  }
  return CreateContext(ip, ctx, device, [&](CUcontext* c) {
    const CUresult r = real(c, device);
    if (r == CUDA_SUCCESS) {
      std::lock_guard<std::mutex> lock(ip.mu);
      ++ip.primary_refs[device];
      ip.primary[device] = *c;
    }
    return r;
  });
}
STOKER_HOOK CUresult CUDAAPI cuDevicePrimaryCtxRelease(CUdevice_v1 device) {
  STOKER_PROLOGUE(cuDevicePrimaryCtxRelease, PFN_cuDevicePrimaryCtxRelease_v7000)
  return ReleasePrimary(ip, device, false, [&] { return real(device); });
}
STOKER_HOOK CUresult CUDAAPI cuDevicePrimaryCtxRelease_v2(CUdevice device) {
  STOKER_PROLOGUE(cuDevicePrimaryCtxRelease_v2, PFN_cuDevicePrimaryCtxRelease_v11000)
  return ReleasePrimary(ip, device, false, [&] { return real(device); });
}
STOKER_HOOK CUresult CUDAAPI cuDevicePrimaryCtxReset(CUdevice_v1 device) {
  STOKER_PROLOGUE(cuDevicePrimaryCtxReset, PFN_cuDevicePrimaryCtxReset_v7000)
  return ReleasePrimary(ip, device, true, [&] { return real(device); });
}
STOKER_HOOK CUresult CUDAAPI cuDevicePrimaryCtxReset_v2(CUdevice device) {
  STOKER_PROLOGUE(cuDevicePrimaryCtxReset_v2, PFN_cuDevicePrimaryCtxReset_v11000)
  return ReleasePrimary(ip, device, true, [&] { return real(device); });
}

#define STOKER_LOAD(handle_type, out, key, call) \
  LoadCode(ip, reinterpret_cast<void**>(out), key, [&](void** h) { return call(reinterpret_cast<handle_type*>(h)); })

STOKER_HOOK CUresult CUDAAPI cuModuleLoad(CUmodule* module, const char* path) {
  STOKER_PROLOGUE(cuModuleLoad, PFN_cuModuleLoad_v2000)
  return STOKER_LOAD(CUmodule, module, stoker::share::CodeFileKey(path), [&](CUmodule* m) { return real(m, path); });
}
STOKER_HOOK CUresult CUDAAPI cuModuleLoadData(CUmodule* module, const void* image) {
  STOKER_PROLOGUE(cuModuleLoadData, PFN_cuModuleLoadData_v2000)
  return STOKER_LOAD(CUmodule, module, stoker::share::CodeImageKey(image), [&](CUmodule* m) { return real(m, image); });
}
STOKER_HOOK CUresult CUDAAPI cuModuleLoadDataEx(CUmodule* module, const void* image, unsigned int n,
                                                CUjit_option* options, void** values) {
  STOKER_PROLOGUE(cuModuleLoadDataEx, PFN_cuModuleLoadDataEx_v2010)
  return STOKER_LOAD(CUmodule, module, stoker::share::CodeImageKey(image, JitVariant(n, options, values)),
                     [&](CUmodule* m) { return real(m, image, n, options, values); });
}
STOKER_HOOK CUresult CUDAAPI cuModuleLoadFatBinary(CUmodule* module, const void* image) {
  STOKER_PROLOGUE(cuModuleLoadFatBinary, PFN_cuModuleLoadFatBinary_v2000)
  return STOKER_LOAD(CUmodule, module, stoker::share::CodeImageKey(image), [&](CUmodule* m) { return real(m, image); });
}
STOKER_HOOK CUresult CUDAAPI cuModuleUnload(CUmodule module) {
  STOKER_PROLOGUE(cuModuleUnload, PFN_cuModuleUnload_v2000)
  return UnloadCode(ip, module, [&] { return real(module); });
}
STOKER_HOOK CUresult CUDAAPI cuLibraryLoadData(CUlibrary* library, const void* code, CUjit_option* jit_options,
                                               void** jit_values, unsigned int jit_count,
                                               CUlibraryOption* library_options, void** library_values,
                                               unsigned int library_count) {
  STOKER_PROLOGUE(cuLibraryLoadData, PFN_cuLibraryLoadData_v12000)
  return STOKER_LOAD(
      CUlibrary, library, stoker::share::CodeImageKey(code, JitVariant(jit_count, jit_options, jit_values)),
      [&](CUlibrary* l) {
        return real(l, code, jit_options, jit_values, jit_count, library_options, library_values, library_count);
      });
}
STOKER_HOOK CUresult CUDAAPI cuLibraryLoadFromFile(CUlibrary* library, const char* path, CUjit_option* jit_options,
                                                   void** jit_values, unsigned int jit_count,
                                                   CUlibraryOption* library_options, void** library_values,
                                                   unsigned int library_count) {
  STOKER_PROLOGUE(cuLibraryLoadFromFile, PFN_cuLibraryLoadFromFile_v12000)
  return STOKER_LOAD(
      CUlibrary, library, stoker::share::CodeFileKey(path, JitVariant(jit_count, jit_options, jit_values)),
      [&](CUlibrary* l) {
        return real(l, path, jit_options, jit_values, jit_count, library_options, library_values, library_count);
      });
}
STOKER_HOOK CUresult CUDAAPI cuLibraryUnload(CUlibrary library) {
  STOKER_PROLOGUE(cuLibraryUnload, PFN_cuLibraryUnload_v12000)
  return UnloadCode(ip, library, [&] { return real(library); });
}

// --- graph memory ---

namespace {

template <typename Call>
CUresult AfterGraphMemory(Interposer& ip, Call call) {
  const CUresult r = call();
  Dev dev;
  if (ip.CurrentDevice(&dev)) ip.RefreshGraphMemory(dev.ordinal);
  return r;
}

}  // namespace

STOKER_HOOK CUresult CUDAAPI cuGraphUpload(CUgraphExec exec, CUstream stream) {
  STOKER_PROLOGUE(cuGraphUpload, PFN_cuGraphUpload_v11010)
  return AfterGraphMemory(ip, [&] { return real(exec, stream); });
}
STOKER_HOOK CUresult CUDAAPI cuGraphUpload_ptsz(CUgraphExec exec, CUstream stream) {
  STOKER_PROLOGUE(cuGraphUpload_ptsz, PFN_cuGraphUpload_v11010_ptsz)
  return AfterGraphMemory(ip, [&] { return real(exec, stream); });
}
STOKER_HOOK CUresult CUDAAPI cuGraphExecDestroy(CUgraphExec exec) {
  STOKER_PROLOGUE(cuGraphExecDestroy, PFN_cuGraphExecDestroy_v10000) {
    std::lock_guard<std::mutex> lock(ip.graph_mu);
    ip.graphs_with_memory.erase(exec);
  }
  return AfterGraphMemory(ip, [&] { return real(exec); });
}
STOKER_HOOK CUresult CUDAAPI cuDeviceGraphMemTrim(CUdevice device) {
  STOKER_PROLOGUE(cuDeviceGraphMemTrim, PFN_cuDeviceGraphMemTrim_v11040)
  const CUresult r = real(device);
  if (r == CUDA_SUCCESS) ip.RefreshGraphMemory(device);
  return r;
}
