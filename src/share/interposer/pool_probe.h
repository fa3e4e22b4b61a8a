// The size a device's memory pools grow by, measured before a pool's first
// growth is admitted: without it, a pool's first allocation was admitted
// for its own size and the chunk the driver reserved around it (32 MiB and
// more) was charged after the fact, past the quota.
#pragma once

#include <cstdint>

namespace stoker::share {

// Measures, on device `ordinal` (the calling thread's current context must
// be on it), how much a fresh pool with the default properties reserves for
// a 1-byte allocation: a pool and a non-blocking stream of its own, through
// the real driver (never the hooks), all given back before it returns; a
// capture in progress on the thread is not disturbed (relaxed mode for the
// probe). 0 when the driver lacks a call or any step fails: the caller then
// admits as before.
std::uint64_t MeasurePoolChunk(int ordinal);

}  // namespace stoker::share
