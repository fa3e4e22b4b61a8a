// resolve: every hooked entry point is what a program gets, by each of the
// three ways, at the versions and per-thread forms it asks for; what the
// driver lacks is an error, never a NULL call; RTLD_NEXT still means
// "after the caller".
#include <dlfcn.h>

#include <cstring>

#include "probe_util.h"

extern "C" char stoker_probe_next();     // rtld_a.cc: dlsym(RTLD_NEXT, ...) from a library
extern "C" int stoker_probe_b_loaded();  // rtld_b.cc

namespace probe {
namespace {

struct Request {
  const char* api;
  int version;
  cuuint64_t flags;
  const char* expect;  // the interposer's function exported under this name
};

constexpr cuuint64_t kPt = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
constexpr cuuint64_t kLegacy = CU_GET_PROC_ADDRESS_LEGACY_STREAM;

const Request kRequests[] = {
    {"cuMemAlloc", 3000, 0, "cuMemAlloc"},
    {"cuMemAlloc", 3020, 0, "cuMemAlloc_v2"},
    {"cuMemAlloc", 13000, 0, "cuMemAlloc_v2"},
    {"cuMemGetInfo", 2000, 0, "cuMemGetInfo"},
    {"cuMemGetInfo", 12000, 0, "cuMemGetInfo_v2"},
    {"cuCtxCreate", 4000, 0, "cuCtxCreate_v2"},
    {"cuCtxCreate", 11040, 0, "cuCtxCreate_v3"},
    {"cuCtxCreate", 12000, 0, "cuCtxCreate_v3"},
    {"cuCtxCreate", 12050, 0, "cuCtxCreate_v4"},
    {"cuDevicePrimaryCtxRelease", 10000, 0, "cuDevicePrimaryCtxRelease"},
    {"cuDevicePrimaryCtxRelease", 11000, 0, "cuDevicePrimaryCtxRelease_v2"},
    {"cuLaunchKernel", 12000, kPt, "cuLaunchKernel_ptsz"},
    {"cuLaunchKernel", 12000, kLegacy, "cuLaunchKernel"},
    {"cuLaunchKernel", 12000, 0, "cuLaunchKernel"},
    {"cuLaunchKernel", 6000, kPt, "cuLaunchKernel"},
    {"cuMemAllocAsync", 12000, kPt, "cuMemAllocAsync_ptsz"},
    {"cuMemFreeAsync", 12000, kLegacy, "cuMemFreeAsync"},
    {"cuGraphLaunch", 12000, kPt, "cuGraphLaunch_ptsz"},
    {"cuGetProcAddress", 11030, 0, "cuGetProcAddress"},
    {"cuGetProcAddress", 12000, 0, "cuGetProcAddress_v2"},
};

int checked = 0;

void Expect(bool ok, const std::string& what) {
  if (!ok) Fail(what);
  ++checked;
}

}  // namespace

int Resolve() {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) Fail(std::string("dlopen libcuda.so.1: ") + dlerror());
  auto get = reinterpret_cast<PFN_cuGetProcAddress_v12000>(dlsym(lib, "cuGetProcAddress_v2"));
  auto get1 = reinterpret_cast<PFN_cuGetProcAddress_v11030>(dlsym(lib, "cuGetProcAddress"));
  Expect(get != nullptr && reinterpret_cast<void*>(get) == dlsym(RTLD_DEFAULT, "cuGetProcAddress_v2"),
         "dlsym(libcuda, cuGetProcAddress_v2) is not the interposer's");
  Expect(get1 != nullptr && reinterpret_cast<void*>(get1) == dlsym(RTLD_DEFAULT, "cuGetProcAddress"),
         "dlsym(libcuda, cuGetProcAddress) is not the interposer's");

  // Every hooked variant, by name and through cuGetProcAddress at its version.
  int present = 0, absent = 0;
#define STOKER_VARIANT(api, name, version, pt, symbol, pfn)                                                            \
  {                                                                                                                    \
    void* ours = dlsym(RTLD_DEFAULT, name);                                                                            \
    Expect(ours != nullptr, std::string("the interposer does not export ") + name);                                    \
    void* by_name = dlsym(lib, name);                                                                                  \
    void* by_proc = nullptr;                                                                                           \
    CUdriverProcAddressQueryResult found{};                                                                            \
    const CUresult r = get(#api, &by_proc, version, pt ? kPt : kLegacy, &found);                                       \
    if (by_name != nullptr) {                                                                                          \
      ++present;                                                                                                       \
      Expect(by_name == ours, std::string("dlsym(libcuda, ") + name + ") is not the interposer's");                    \
      Expect(r == CUDA_SUCCESS && by_proc == ours, std::string("cuGetProcAddress(" #api ", ") +                        \
                                                       std::to_string(version) + ") is not the interposer's " + name); \
    } else {                                                                                                           \
      ++absent; /* the driver lacks it: an error, never NULL with success */                                           \
      Expect(r != CUDA_SUCCESS && by_proc == nullptr,                                                                  \
             std::string("cuGetProcAddress(" #api ") succeeded for a symbol the driver lacks"));                       \
    }                                                                                                                  \
  }
#include "entry_points.inc"
#undef STOKER_VARIANT

  for (const Request& q : kRequests) {
    void* expect = dlsym(RTLD_DEFAULT, q.expect);
    void* got = nullptr;
    const CUresult r = get(q.api, &got, q.version, q.flags, nullptr);
    if (dlsym(lib, q.expect) == nullptr) continue;  // this driver lacks it
    Expect(r == CUDA_SUCCESS && got == expect, std::string("cuGetProcAddress_v2(") + q.api + ", " +
                                                   std::to_string(q.version) + ", flags " + std::to_string(q.flags) +
                                                   ") is not " + q.expect);
    got = nullptr;
    Expect(get1(q.api, &got, q.version, q.flags) == CUDA_SUCCESS && got == expect,
           std::string("cuGetProcAddress(") + q.api + ") is not " + q.expect);
  }
  // Not hooked: the driver's own. Unknown: not found.
  void* stream_create = nullptr;
  Expect(get("cuStreamCreate", &stream_create, 12000, 0, nullptr) == CUDA_SUCCESS &&
             stream_create == dlsym(lib, "cuStreamCreate") && stream_create != dlsym(RTLD_DEFAULT, "cuMemAlloc_v2"),
         "cuStreamCreate is not the driver's");
  void* nothing = reinterpret_cast<void*>(1);
  CUdriverProcAddressQueryResult status{};
  Expect(get("cuNoSuchEntryPoint", &nothing, 13000, 0, &status) != CUDA_SUCCESS && nothing == nullptr &&
             status == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND,
         "an unknown symbol was found");
  // A driver with a newer variant than this build knows: refused, not mixed up.
  if (const char* newer = std::getenv("FAKE_CUDA_NEWER")) {
    void* fn = reinterpret_cast<void*>(1);
    const CUresult r = get(newer, &fn, 13050, 0, &status);
    Expect(r == CUDA_ERROR_NOT_SUPPORTED && fn == nullptr && status == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND,
           std::string("the newer ") + newer + " was handed out (result " + std::to_string(r) + ")");
    fn = nullptr;
    Expect(get(newer, &fn, 13000, 0, nullptr) == CUDA_SUCCESS && fn == dlsym(RTLD_DEFAULT, "cuMemAlloc_v2"),
           "the known variant stopped resolving");
  }
  // Hooks of entry points the driver lacks answer an error when called.
  if (dlsym(lib, "cuMemCreate") == nullptr) {
    auto create = reinterpret_cast<PFN_cuMemCreate_v10020>(dlsym(RTLD_DEFAULT, "cuMemCreate"));
    CUmemGenericAllocationHandle h = 0;
    CUmemAllocationProp prop{};
    Expect(create(&h, 2 << 20, &prop, 0) == CUDA_ERROR_NOT_FOUND, "cuMemCreate without a driver's did not fail");
    auto async = reinterpret_cast<PFN_cuMemAllocAsync_v11020>(dlsym(RTLD_DEFAULT, "cuMemAllocAsync"));
    CUdeviceptr p = 0;
    Expect(async(&p, 1 << 20, nullptr) == CUDA_ERROR_NOT_FOUND, "cuMemAllocAsync without a driver's did not fail");
  }
  auto launch = reinterpret_cast<PFN_cuLaunch_v2000>(dlsym(RTLD_DEFAULT, "cuLaunch"));
  if (dlsym(lib, "cuLaunch") == nullptr)
    Expect(launch(nullptr) == CUDA_ERROR_NOT_FOUND, "cuLaunch without a driver's did not fail");
  Expect(stoker_probe_b_loaded() == 1 && stoker_probe_next() == 'B',
         "dlsym(RTLD_NEXT) from a library did not find the next library's symbol");
  std::printf("resolve: %d checks; %d hooked variants the driver has, %d it lacks\n", checked, present, absent);
  return 0;
}

}  // namespace probe
