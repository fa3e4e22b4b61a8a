// Compiled three ways by tests/CMakeLists.txt to show that the build
// enforces the layers: as the dataset layer sees headers (allowed includes
// only: it compiles), the same with an include from a layer above (it must
// not compile), and as the CLI and Python see headers (the public API only:
// an internal header must not be found).
#if defined(STOKER_PROBE_UPWARD)
#include "pipeline/loader_internal.h"  // the pipeline sits above the dataset layer
#elif defined(STOKER_PROBE_INTERNAL_FROM_FACE)
#include "core/mutex.h"  // internals are out of reach of the faces
#else
#include "dataset/sample_check.h"
#include "format/index_format.h"
#include "stoker/dataset.h"
#endif

int StokerLayeringProbe() {
  return 0;
}
