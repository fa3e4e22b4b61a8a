#include "probe_driver.h"

#include <dlfcn.h>

// Weak references: the probe also runs on an old driver that lacks some
// (their hooks in the interposer then answer; without it they are NULL).
#define PROBE_PRAGMA(text) _Pragma(#text)
#define PROBE_WEAK(field, symbol, api, v, pt) PROBE_PRAGMA(weak symbol)
PROBE_DRIVER_FUNCTIONS(PROBE_WEAK)
#undef PROBE_WEAK

namespace probe {

bool ParsePath(const std::string& text, Path* path) {
  if (text == "direct")
    *path = Path::kDirect;
  else if (text == "dlsym")
    *path = Path::kDlsym;
  else if (text == "proc")
    *path = Path::kProcAddress;
  else
    return false;
  return true;
}

bool LoadDriver(Path path, int version, Driver* d, std::string* error) {
  if (path == Path::kDirect) {
    // Linked against libcuda.so.1: the names bind to whatever comes first
    // (the preloaded interposer). One strong reference keeps the library a
    // dependency (weak ones alone would let the linker drop it).
    int version_of_driver = 0;
    (void)cuDriverGetVersion(&version_of_driver);
#define PROBE_DIRECT(field, symbol, api, v, pt) d->field = &::symbol;
    PROBE_DRIVER_FUNCTIONS(PROBE_DIRECT)
#undef PROBE_DIRECT
    return true;
  }
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    *error = std::string("dlopen libcuda.so.1: ") + dlerror();
    return false;
  }
  if (path == Path::kDlsym) {
#define PROBE_DLSYM(field, symbol, api, v, pt) d->field = reinterpret_cast<decltype(d->field)>(dlsym(lib, #symbol));
    PROBE_DRIVER_FUNCTIONS(PROBE_DLSYM)
#undef PROBE_DLSYM
    return true;
  }
  auto get = reinterpret_cast<PFN_cuGetProcAddress_v12000>(dlsym(lib, "cuGetProcAddress_v2"));
  if (get == nullptr) {
    *error = "the driver has no cuGetProcAddress_v2";
    return false;
  }
#define PROBE_PROC(field, symbol, api, v, pt)                                                                     \
  {                                                                                                               \
    void* fn = nullptr;                                                                                           \
    CUdriverProcAddressQueryResult found{};                                                                       \
    if ((version == 0 || version >= v) &&                                                                         \
        get(#api, &fn, v, pt ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : CU_GET_PROC_ADDRESS_LEGACY_STREAM, \
            &found) == CUDA_SUCCESS)                                                                              \
      d->field = reinterpret_cast<decltype(d->field)>(fn);                                                        \
  }
  PROBE_DRIVER_FUNCTIONS(PROBE_PROC)
#undef PROBE_PROC
  return true;
}

}  // namespace probe
