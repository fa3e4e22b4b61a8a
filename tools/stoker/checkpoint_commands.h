// `stoker checkpoint ...` subcommands.
#pragma once

#include <string>

namespace stoker_cli {

// Lists published checkpoints, oldest first. Returns the exit code.
int RunCheckpointList(const std::string& directory, bool json);
// Verifies one step-N folder or every one in a directory; exit code 1 if any is corrupt.
int RunCheckpointVerify(const std::string& path, bool json);

}  // namespace stoker_cli
