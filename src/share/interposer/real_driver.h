// The real CUDA driver and NVML, opened by the interposer for its own calls
// (never through its own hooks).
#pragma once

namespace stoker::share {

// glibc's dlsym (the interposer exports its own).
void* RealDlsym(void* handle, const char* name);

// The real libcuda.so.1 (STOKER_GPU_REAL_LIBCUDA names another file), opened
// on first use; nullptr when it cannot be opened.
void* DriverHandle();
// A symbol of the real driver, or nullptr.
void* DriverSymbol(const char* name);
// Whether `address` lies in the real driver's library.
bool InDriver(const void* address);

// The real libnvidia-ml.so.1, or nullptr; and whether an address lies in it.
void* NvmlHandle();
void* NvmlSymbol(const char* name);
bool InNvml(const void* address);

}  // namespace stoker::share
