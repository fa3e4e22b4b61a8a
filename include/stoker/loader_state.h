// stoker/loader_state.h: where a Loader is in its epochs, as plain data, so
// that checkpoints can record it without depending on the loader.
#pragma once

#include <cstdint>

namespace stoker {

// Enough to resume a Loader exactly (Loader::state() / Loader::Restore()).
struct LoaderState {
  std::uint64_t seed = 0;
  std::uint64_t epoch = 0;
  std::uint64_t global_batch_size = 0;  // batch_size x world_size
  std::uint64_t batches_consumed = 0;   // global batches of this epoch already handed out
  std::uint64_t num_samples = 0;        // of the dataset, to catch a mismatched restore
};

}  // namespace stoker
