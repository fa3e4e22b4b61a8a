#pragma once

#include <gtest/gtest.h>

// For a test of single-threaded arithmetic, checked over many values: it
// starts no thread, so ThreadSanitizer has nothing to check in it, and it
// runs three to eight times slower under it (the ones marked took 146 s of
// CI's TSan stage, 2026-12-07). The release and ASan+UBSan builds run it.
#if defined(__SANITIZE_THREAD__)
#define STOKER_SKIP_UNDER_TSAN_SINGLE_THREADED() \
  GTEST_SKIP() << "single-threaded: nothing for ThreadSanitizer to check (the other builds run it)"
#else
#define STOKER_SKIP_UNDER_TSAN_SINGLE_THREADED() static_cast<void>(0)
#endif
