// BufferWarmth: which batch buffers' pages a loader has touched, so that a
// loop holding one batch at a time keeps two buffers resident, not
// prefetch + 1 (about 37 MiB each for 64 float32 images of 224 px).
//
// With warm buffers only (a loader whose prefetch depth is automatic),
// batches are still scheduled and read `prefetch` ahead, but a batch whose
// read is done starts decoding only
//
//   - into a warm buffer: its own slot's, or one taken from a free slot or
//     from a later batch that has not started decoding (the two slots swap
//     buffers; nothing is in either). Batches start in delivery order: one
//     read before an earlier batch that has neither started nor a warm
//     buffer waits for it (and leaves its own warm buffer to it),
//   - or into a cold one while fewer than two buffers are warm (the batch the
//     loop holds and the one being filled), or when the consumer is waiting
//     for that very batch (a loop that keeps two or more batches: its pool
//     warms up as it needs).
//
// Otherwise it waits, read, until a buffer is released. The rules carry no
// threads or locks; the loader calls them under its mutex. Without warm
// buffers only, every read batch starts at once (an explicit prefetch, the
// autotuner). A page-locked pool allocates a buffer when it first warms.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <span>
#include <vector>

namespace stoker::pipeline {

class BufferWarmth {
 public:
  // Buffers a loop holding one batch needs: that one and the one being filled.
  static constexpr std::uint32_t kWorkingSet = 2;

  BufferWarmth(std::uint32_t slots, bool warm_only);

  // A batch in `slot` may decode: with `take_buffer_of`, once the loader has
  // swapped the two slots' buffers.
  struct Start {
    std::uint32_t slot = 0;
    std::optional<std::uint32_t> take_buffer_of;
  };

  // A batch was scheduled into `slot`: it has not started decoding.
  void Scheduled(std::uint32_t slot) { started_[slot] = false; }
  // The batch in `slot` is empty (a rank's share of a short last batch):
  // it needs no buffer, and later batches do not leave theirs to it.
  void NeedsNoBuffer(std::uint32_t slot) { started_[slot] = true; }
  // `slot`'s batch is read: it waits for a buffer (Waiting()) until it may
  // decode. Returns the batches that may decode now, in delivery order (it,
  // and later ones that waited for it to start). `in_flight` are the
  // scheduler's batches in delivery order, `free_slots` its free slots, most
  // recently freed last; `consumer_waits` the batch Next() waits for.
  [[nodiscard]] std::vector<Start> ReadDone(std::uint32_t slot, const std::deque<std::uint32_t>& in_flight,
                                            std::span<const std::uint32_t> free_slots,
                                            std::optional<std::uint32_t> consumer_waits);
  // The waiting batches that may decode now, in delivery order (`in_flight`):
  // after a release, or when the consumer waits for `consumer_waits`.
  [[nodiscard]] std::vector<Start> StartWaiting(const std::deque<std::uint32_t>& in_flight,
                                                std::span<const std::uint32_t> free_slots,
                                                std::optional<std::uint32_t> consumer_waits);
  // Forgets every waiting batch (the loader drains its work) and returns them.
  std::vector<std::uint32_t> DropWaiting();

  [[nodiscard]] bool Waiting(std::uint32_t slot) const { return waiting_[slot]; }
  // Buffers whose pages a batch has been decoded into.
  [[nodiscard]] std::uint32_t touched() const { return touched_; }

 private:
  [[nodiscard]] std::optional<Start> TryStart(std::uint32_t slot, const std::deque<std::uint32_t>& in_flight,
                                              std::span<const std::uint32_t> free_slots, bool consumer_waits);
  // Whether a batch before `slot` has neither started nor a warm buffer.
  [[nodiscard]] bool EarlierNeedsWarm(std::uint32_t slot, const std::deque<std::uint32_t>& in_flight) const;
  // A warm buffer no batch is decoding into: a free slot's, else a later
  // batch's that has not started.
  [[nodiscard]] std::optional<std::uint32_t> SpareWarm(std::uint32_t slot, const std::deque<std::uint32_t>& in_flight,
                                                       std::span<const std::uint32_t> free_slots) const;

  bool warm_only_;
  std::vector<bool> warm_;     // per slot: the buffer it holds now has been decoded into
  std::vector<bool> waiting_;  // per slot: read, waiting for a buffer
  std::vector<bool> started_;  // per slot: its batch decodes (or has) into its buffer
  std::uint32_t touched_ = 0;
};

}  // namespace stoker::pipeline
