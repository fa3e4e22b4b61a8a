// The snapshot: the part of a save that training waits for. PlanSnapshot
// validates the tensors and lays them out (ordered by element size, then
// name, so each is aligned in its file; cut into files of at most
// max_file_bytes); SnapshotCopier copies them into one host arena, device
// tensors by asynchronous copies on one stream per device, enqueued first so
// they overlap the host copies, which run on several threads.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "checkpoint/safetensors.h"
#include "core/host_buffer.h"
#include "device/runtime.h"
#include "stoker/checkpoint.h"

namespace stoker::checkpoint {

// One output file: the tensors it holds, laid out in its data buffer, and
// where that buffer lies in the snapshot arena.
struct FilePlan {
  std::string name;
  std::vector<safetensors::TensorLayout> tensors;
  std::vector<std::size_t> sources;  // per tensor: its index in the caller's span
  std::uint64_t arena_offset = 0;
  std::uint64_t bytes = 0;
};

struct SnapshotPlan {
  std::vector<FilePlan> files;
  std::uint64_t tensor_bytes = 0;
};

// InvalidArgument for an empty, duplicate or reserved name, a bad shape or
// dtype, or missing data; names the tensor. `reuse`: an earlier plan whose
// storage the new one takes over (the checkpointer passes the last one back).
// Files are named "<file_stem>.safetensors", or "<file_stem>-0000K-of-0000N
// .safetensors" when split. A piece of a sharded tensor (global_shape set)
// is checked to lie inside it and laid out under PieceKey().
[[nodiscard]] Result<SnapshotPlan> PlanSnapshot(std::span<const TensorRef> tensors, std::uint64_t max_file_bytes,
                                                SnapshotPlan reuse = {}, std::string_view file_stem = "model");
// "name", or "name@o0,o1,..." for a piece of a sharded tensor.
[[nodiscard]] std::string PieceKey(const TensorRef& t);

class SnapshotCopier {
 public:
  // `runtime` is used for device tensors; nullptr: the CUDA runtime, found
  // when the first device tensor arrives.
  SnapshotCopier(device::DeviceRuntime* runtime, std::uint32_t copy_threads)
      : runtime_(runtime), copy_threads_(copy_threads) {}

  // Unavailable naming the tensor when one is on a GPU and CUDA is not usable.
  [[nodiscard]] Status CheckDevices(std::span<const TensorRef> tensors);
  // Copies every tensor into `arena` as `plan` lays them out; returns when
  // all copies are complete. The caller's current device is put back.
  [[nodiscard]] Status Copy(const SnapshotPlan& plan, std::span<const TensorRef> tensors, HostBuffer& arena);

 private:
  device::DeviceRuntime* runtime_;
  std::string unavailable_;
  std::uint32_t copy_threads_;
  std::map<int, device::Stream> streams_;  // one per device, made on first use
};

}  // namespace stoker::checkpoint
