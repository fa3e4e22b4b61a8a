// The three ways code reaches the driver, all answered with the hooks:
//  - direct calls to the exported names (this library is preloaded, so its
//    definitions come first);
//  - dlsym(handle, "cu...") on the driver's library: the hook, when the
//    real lookup lands in the driver;
//  - cuGetProcAddress / cuGetProcAddress_v2 (how the CUDA runtime and
//    cudaGetDriverEntryPoint reach the driver): the hook for the variant
//    the request resolves to (version, per-thread default stream), or an
//    error when the driver knows a newer variant than this build.
// cuInit starts the interposer: a process that cannot be held to its quota
// fails there, loudly.
#include <dlfcn.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <mutex>

#include "share/interposer/hook_prologue.h"
#include "share/interposer/nvml_api.h"
#include "share/interposer/real_driver.h"

using stoker::share::Info;
using stoker::share::Interposer;
using stoker::share::SelectVariant;
using stoker::share::Variant;

namespace {

// Rewrites a successful lookup of a hooked entry point. `ask(version, pfn)`
// asks the real driver for the same symbol at another version.
template <typename Ask>
CUresult Redirect(const char* symbol, void** pfn, int version, cuuint64_t flags, CUresult r,
                  CUdriverProcAddressQueryResult* status, Ask ask) {
  if (r != CUDA_SUCCESS || symbol == nullptr || pfn == nullptr || *pfn == nullptr) return r;
  const int v = SelectVariant(symbol, version, (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0);
  if (v < 0) return r;  // not hooked
  const auto& info = Info(static_cast<Variant>(v));
  void* known = nullptr;
  if (ask(info.version, &known) != CUDA_SUCCESS || known != *pfn) {
    // The driver answers with a variant newer than this build knows: its
    // accounting would be missed, so it is not handed out.
    static std::once_flag warned;
    std::call_once(warned, [&] {
      std::fprintf(stderr,
                   "stoker-share: warning: the driver has a newer %s than this interposer knows (requested for CUDA "
                   "%d); rebuild stoker against a newer CUDA toolkit\n",
                   symbol, version);
    });
    *pfn = nullptr;
    if (status) *status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  *pfn = info.hook;
  return r;
}

}  // namespace

STOKER_HOOK CUresult CUDAAPI cuGetProcAddress_v2(const char* symbol, void** pfn, int version, cuuint64_t flags,
                                                 CUdriverProcAddressQueryResult* status) {
  auto real = stoker::share::Real<PFN_cuGetProcAddress_v12000>(stoker::share::kV_cuGetProcAddress_v2);
  if (real == nullptr) return CUDA_ERROR_NOT_FOUND;
  const CUresult r = real(symbol, pfn, version, flags, status);
  return Redirect(symbol, pfn, version, flags, r, status,
                  [&](int v, void** p) { return real(symbol, p, v, flags, nullptr); });
}

STOKER_HOOK CUresult CUDAAPI cuGetProcAddress(const char* symbol, void** pfn, int version, cuuint64_t flags) {
  auto real = stoker::share::Real<PFN_cuGetProcAddress_v11030>(stoker::share::kV_cuGetProcAddress);
  if (real == nullptr) return CUDA_ERROR_NOT_FOUND;
  const CUresult r = real(symbol, pfn, version, flags);
  return Redirect(symbol, pfn, version, flags, r, nullptr, [&](int v, void** p) { return real(symbol, p, v, flags); });
}

STOKER_HOOK CUresult CUDAAPI cuInit(unsigned int flags) {
  auto real = stoker::share::Real<PFN_cuInit_v2000>(stoker::share::kV_cuInit);
  if (real == nullptr) {
    if (stoker::share::DriverAnsweredWithOurHooks()) {
      static std::once_flag said;
      std::call_once(said, [] {
        std::fprintf(stderr,
                     "stoker-share: error: the CUDA driver answers cuInit with the interposer's own function (a "
                     "second interposer that hands ours back, or a libcuda.so.1 that is not NVIDIA's); refusing "
                     "to start rather than call ourselves; GPU calls in this process (pid %d) fail\n",
                     static_cast<int>(::getpid()));
      });
    }
    return CUDA_ERROR_NOT_FOUND;
  }
  const CUresult r = real(flags);
  if (r != CUDA_SUCCESS) return r;
  Interposer& ip = Interposer::Get();
  return ip.ok() && ip.CheckLimitOrdinals() ? r : ip.Refuse();
}

// --- dlsym ---

namespace {

void* HookFor(void* handle, const char* name) {
  if (name[0] == 'c' && name[1] == 'u') {
    const int v = stoker::share::VariantBySymbol(name);
    if (v < 0) return nullptr;
    void* real = stoker::share::RealDlsym(handle, name);
    return real && stoker::share::InDriver(real) ? Info(static_cast<Variant>(v)).hook : nullptr;
  }
  if (std::strcmp(name, "nvmlDeviceGetMemoryInfo") == 0 || std::strcmp(name, "nvmlDeviceGetMemoryInfo_v2") == 0) {
    void* real = stoker::share::RealDlsym(handle, name);
    if (real == nullptr || !stoker::share::InNvml(real)) return nullptr;
    return name[23] == '\0' ? reinterpret_cast<void*>(&nvmlDeviceGetMemoryInfo)
                            : reinterpret_cast<void*>(&nvmlDeviceGetMemoryInfo_v2);
  }
  return nullptr;
}

using DlsymFn = void* (*)(void*, const char*) noexcept;  // noexcept: else no tail call

// dlsym runs inside sanitizer runtimes' own start-up (they look up the
// functions they wrap), before their instrumentation works: the path that
// is not ours stays uninstrumented.
#define STOKER_UNINSTRUMENTED __attribute__((no_sanitize("address", "undefined", "thread")))

STOKER_UNINSTRUMENTED DlsymFn Next() {
  static DlsymFn fn = nullptr;
  DlsymFn f = __atomic_load_n(&fn, __ATOMIC_ACQUIRE);
  if (f == nullptr) {
    void* p = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
    if (p == nullptr) p = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
    f = reinterpret_cast<DlsymFn>(p);
    __atomic_store_n(&fn, f, __ATOMIC_RELEASE);
  }
  return f;
}

// Only names of the driver's and NVML's entry points can be ours.
STOKER_UNINSTRUMENTED bool MaybeOurs(const char* name) {
  return (name[0] == 'c' && name[1] == 'u') || (name[0] == 'n' && name[1] == 'v' && name[2] == 'm' && name[3] == 'l');
}

}  // namespace

// Everything else goes to glibc by a tail call, so that glibc sees the
// caller's return address: RTLD_NEXT keeps meaning "after the caller".
extern "C" __attribute__((visibility("default")))
#if !defined(__clang__)
__attribute__((optimize("O2")))  // also in unoptimised (sanitizer) builds
#endif
STOKER_UNINSTRUMENTED void*
dlsym(void* __restrict handle, const char* __restrict name) noexcept {
  if (MaybeOurs(name)) {  // glibc declares name nonnull
    if (void* hook = HookFor(handle, name)) return hook;
  }
#if defined(__clang__)
  [[clang::musttail]] return Next()(handle, name);
#else
  return Next()(handle, name);
#endif
}
