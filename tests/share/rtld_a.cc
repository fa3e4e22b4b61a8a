// Two libraries that define the same function, for the RTLD_NEXT check:
// A's stoker_probe_next() asks for the next definition after A (B's).
#include <dlfcn.h>

extern "C" __attribute__((visibility("default"))) char stoker_probe_layer() {
  return 'A';
}
extern "C" __attribute__((visibility("default"))) char stoker_probe_next() {
  auto next = reinterpret_cast<char (*)()>(dlsym(RTLD_NEXT, "stoker_probe_layer"));
  return next ? next() : '?';
}
