#pragma once

#include <gtest/gtest.h>

// For a test of single-threaded arithmetic, checked over many values, in a
// file whose other tests start threads (a file none of whose tests does
// belongs in stoker_single_threaded_tests, which the TSan build leaves out:
// tests/CMakeLists.txt): ThreadSanitizer has nothing to check in it, and it
// runs three to eight times slower under it. The release and ASan+UBSan
// builds run it.
#if defined(__SANITIZE_THREAD__)
#define STOKER_SKIP_UNDER_TSAN_SINGLE_THREADED() \
  GTEST_SKIP() << "single-threaded: nothing for ThreadSanitizer to check (the other builds run it)"
#else
#define STOKER_SKIP_UNDER_TSAN_SINGLE_THREADED() static_cast<void>(0)
#endif
