// Persisting one rank's share of a sharded checkpoint, and rank 0's commit
// (the checkpointer's background thread, when world_size > 1):
//   1. every rank writes its files into the save's shared temporary folder
//      (.tmp-sharded-step-N-<save id>/), each fsynced and checksummed per
//      block, then rank-RRRRR.json (fsynced, renamed into place): its
//      presence says the rank's files are durable;
//   2. rank 0 waits for all W parts (a rank that failed leaves
//      rank-RRRRR.failed instead, so rank 0 stops waiting at once), merges
//      them into manifest.json, fsyncs, and publishes the folder as step-N
//      (persist.h's PublishFolder): one rename, the commit point.
// A rank that dies leaves no manifest.json, so no step-N: the previous
// checkpoint stays the newest, and rank 0 removes the leftovers on its next
// save (RemoveStaleTemporaries).
#pragma once

#include <cstdint>
#include <string>

#include "checkpoint/persist.h"
#include "core/clock.h"

namespace stoker::checkpoint {

struct ShardedSaveInfo {
  std::uint32_t rank = 0;
  std::uint32_t world_size = 1;
  std::string save_id;
};

// Step 1 for this rank. `job.pieces` describes each of the plan's sources.
[[nodiscard]] Status PersistRankPart(FileSystem& fs, const std::string& temp, const PersistJob& job,
                                     const HostBuffer& arena, const ShardedSaveInfo& info,
                                     std::uint64_t* bytes_written);

// Best effort: tells rank 0 that this rank's part will not come.
void RecordRankFailure(FileSystem& fs, const std::string& temp, std::uint32_t rank, const Status& why);

// Step 2, on rank 0 after its own part: DeadlineExceeded naming the ranks
// still missing after `timeout_seconds`; the failure a rank recorded;
// Corruption when the parts disagree or do not tile a tensor.
[[nodiscard]] Status CommitShardedCheckpoint(FileSystem& fs, const std::string& directory, const std::string& temp,
                                             std::int64_t step, const ShardedSaveInfo& info, double timeout_seconds,
                                             Clock& clock, bool replace_existing);

// Rank 0: removes every temporary in `directory` except `keep` (the
// current save's folder name): the leftovers of saves that never committed.
[[nodiscard]] Status RemoveStaleTemporaries(FileSystem& fs, const std::string& directory, std::string_view keep);

}  // namespace stoker::checkpoint
