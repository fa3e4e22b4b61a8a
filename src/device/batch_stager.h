// The look-ahead of the device loader (DeviceLoaderOptions::stage_ahead): a
// thread of its own fetches host batches and submits them to the GPU (copy,
// JPEG decode, kernel) into free device buffers, so that the decoder's host
// work runs beside the training thread instead of inside Next(). Items keep
// the host loader's order: batches, then the epoch's end (nullopt) or an
// error, after which staging waits until the consumer has taken it and
// asks for more: nothing of the next epoch is fetched before the consumer
// asks for it (a set_epoch between epochs drops nothing).
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <thread>

#include "core/mutex.h"
#include "stoker/device_loader.h"

namespace stoker::device {

class BatchStager {
 public:
  using Item = Result<std::optional<DeviceBatchView>>;
  struct Hooks {
    // Runs first on the thread (for example: make the device current); an
    // error is the first item.
    std::function<Status()> start;
    // Fetches and submits one batch, waiting at most `slice` for the host
    // loader (DeadlineExceeded: nothing yet, asked again).
    std::function<Item(std::chrono::nanoseconds slice)> produce;
    // A staged batch no consumer will see: give its device buffer back.
    std::function<void(const DeviceBatchView&)> abandon;
  };
  // What is staged and not yet taken.
  struct Pending {
    std::uint64_t consumed = 0;  // batches and errors: each counted as delivered by the host loader
    bool end = false;            // the epoch's end is staged (the host loader is in the next epoch)
  };

  // `buffers`: device buffers in the pool (staged + held by the consumer <= buffers).
  BatchStager(Hooks hooks, std::uint32_t buffers);
  // Stops the thread (after the batch it is submitting) and joins it.
  ~BatchStager();
  BatchStager(const BatchStager&) = delete;
  BatchStager& operator=(const BatchStager&) = delete;

  // The next item, waiting at most `timeout` (DeadlineExceeded: call again).
  // ResourceExhausted when nothing is staged and the consumer holds every
  // buffer (waiting would never end).
  [[nodiscard]] Item Take(std::chrono::nanoseconds timeout);
  // The consumer gave back a batch it had taken.
  void Released();

  // With the thread idle (between batches): `action` runs with what is
  // staged; with `drop`, the staged batches are abandoned first (and
  // `action` sees what was dropped).
  void WhilePaused(bool drop, const std::function<void(const Pending&)>& action);

 private:
  void Run();
  bool CanStage() const REQUIRES(mu_);
  Pending PendingLocked() const REQUIRES(mu_);

  const Hooks hooks_;
  const std::uint32_t buffers_;
  mutable Mutex mu_;
  CondVar cv_;
  std::deque<Item> staged_ GUARDED_BY(mu_);
  std::uint32_t staged_batches_ GUARDED_BY(mu_) = 0;  // items holding a device buffer
  std::uint32_t held_ GUARDED_BY(mu_) = 0;            // taken by the consumer, not yet released
  bool halted_ GUARDED_BY(mu_) = false;               // an end or error is staged, or was the last taken: wait for Take
  bool paused_ GUARDED_BY(mu_) = false;
  bool producing_ GUARDED_BY(mu_) = false;
  bool stop_ GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace stoker::device
