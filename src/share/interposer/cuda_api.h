// The driver API as the interposer sees it: every versioned entry point
// under its own exported name (cuMemAlloc is the 32-bit v2000 function,
// cuMemAlloc_v2 the current one), and the PFN_ type of each.
#pragma once

#ifndef __CUDA_API_VERSION_INTERNAL
#define __CUDA_API_VERSION_INTERNAL 1
#endif
#include <cuda.h>
#include <cudaTypedefs.h>

// A hook: exported under the driver's own name (the library is built with
// hidden visibility; only these and dlsym are exported).
#define STOKER_HOOK extern "C" __attribute__((visibility("default")))
