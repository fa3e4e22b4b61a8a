/* Preloaded into stoker_single_threaded_tests in the release build: a test
 * there that starts a thread fails at once, saying what to do. Those tests
 * are left out of the ThreadSanitizer build as having nothing for it to
 * check; one that starts a thread belongs in stoker_tests. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

/* Only the test process is guarded: the programs its tests run (tar, a
 * Python) are not, and may start threads of their own. */
__attribute__((constructor)) static void NotInherited(void) {
  unsetenv("LD_PRELOAD");
}

int pthread_create(pthread_t* thread, const pthread_attr_t* attr, void* (*start)(void*), void* arg) {
  (void)thread;
  (void)attr;
  (void)start;
  (void)arg;
  static const char kSaid[] =
      "\nstoker_single_threaded_tests: this test started a thread, so ThreadSanitizer must run it: move its file from "
      "single_threaded_test_sources to threaded_test_sources in tests/CMakeLists.txt\n";
  (void)!write(2, kSaid, sizeof(kSaid) - 1);
  abort();
}
