// LoadCheckpoint, counting its work: what it parsed and looked up, added to
// `work` (nullptr: not counted). Tests check that loading N tensors costs
// O(N) in these counts: each JSON text parsed once, a bounded number of
// look-ups per tensor.
#pragma once

#include <string>

#include "checkpoint/safetensors.h"
#include "stoker/checkpoint.h"

namespace stoker::checkpoint {

[[nodiscard]] Result<LoadedCheckpoint> LoadCheckpointCounted(const std::string& step_directory,
                                                             const LoadOptions& options, safetensors::ParseWork* work);

}  // namespace stoker::checkpoint
