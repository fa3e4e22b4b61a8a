#include "share/interposer/real_driver.h"

#include <dlfcn.h>
#include <link.h>

#include <cstdlib>

namespace stoker::share {
namespace {

using DlsymFn = void* (*)(void*, const char*);

DlsymFn GlibcDlsym() {
  // dlsym moved into libc in glibc 2.34; older versions keep 2.2.5.
  static DlsymFn fn = [] {
    void* f = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
    if (f == nullptr) f = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
    return reinterpret_cast<DlsymFn>(f);
  }();
  return fn;
}

struct Library {
  void* handle = nullptr;
  const void* base = nullptr;  // load address, to tell its symbols
};

Library Open(const char* env, const char* fallback, const char* probe) {
  Library lib;
  const char* path = std::getenv(env);
  lib.handle = ::dlopen(path && *path ? path : fallback, RTLD_NOW | RTLD_LOCAL);
  if (lib.handle == nullptr) return lib;
  Dl_info info{};
  if (void* symbol = RealDlsym(lib.handle, probe); symbol && ::dladdr(symbol, &info)) lib.base = info.dli_fbase;
  return lib;
}

bool In(const Library& lib, const void* address) {
  if (lib.base == nullptr || address == nullptr) return false;
  Dl_info info{};
  return ::dladdr(address, &info) && info.dli_fbase == lib.base;
}

const Library& Driver() {
  static const Library lib = Open("STOKER_GPU_REAL_LIBCUDA", "libcuda.so.1", "cuInit");
  return lib;
}
const Library& Nvml() {
  static const Library lib = Open("STOKER_GPU_REAL_LIBNVML", "libnvidia-ml.so.1", "nvmlInit_v2");
  return lib;
}

}  // namespace

void* RealDlsym(void* handle, const char* name) {
  DlsymFn fn = GlibcDlsym();
  return fn ? fn(handle, name) : nullptr;
}

void* DriverHandle() {
  return Driver().handle;
}
void* DriverSymbol(const char* name) {
  return Driver().handle ? RealDlsym(Driver().handle, name) : nullptr;
}
bool InDriver(const void* address) {
  return In(Driver(), address);
}

void* NvmlHandle() {
  return Nvml().handle;
}
void* NvmlSymbol(const char* name) {
  return Nvml().handle ? RealDlsym(Nvml().handle, name) : nullptr;
}
bool InNvml(const void* address) {
  return In(Nvml(), address);
}

}  // namespace stoker::share
