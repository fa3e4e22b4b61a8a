// stoker/device_loader.h: a Loader whose batches arrive on a GPU.
//
// Each batch the host loader prepares (in a page-locked buffer) is copied to
// a pool of device buffers on stoker's own copy stream; the consumer's stream
// waits on an event, so the host never blocks on a copy and batch k+1 copies
// while the consumer computes on batch k. A device buffer returns to the pool
// when the consumer releases the batch, once the consumer stream's work up to
// then completes (an event, not a host wait). With the GPU's JPEG decoder,
// a staging thread submits batches ahead (stage_ahead), so the decoder's
// host work runs beside the consumer instead of inside Next().
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "stoker/device.h"
#include "stoker/loader.h"
#include "stoker/status.h"

namespace stoker {

// A batch on the device. Labels and indices are host copies.
struct DeviceBatchView {
  void* images = nullptr;  // device memory: [N, C, H, W] or [N, H, W, C] in dtype
  std::array<std::int64_t, 4> shape{};
  DType dtype = DType::kFloat32;
  std::vector<std::int64_t> labels;
  std::vector<std::uint64_t> indices;
  std::uint64_t epoch = 0;
  std::uint64_t batch_index = 0;
  int device_index = 0;
  // The engine's handle (slot and submission number).
  std::uint32_t slot = 0;
  std::uint64_t sequence = 0;
};

struct DeviceLoaderOptions {
  // The GPU finishes each batch: the CPU decodes only each image's crop
  // (uint8), and one fused kernel resizes, flips, normalises and converts
  // on the device. Otherwise batches are finished on the CPU and copied.
  bool finish_on_device = false;
  // With finish_on_device: room for decoded crops in each batch buffer, in
  // output-sized uint8 images per sample (beyond one output-sized image
  // each, always reserved). A crop that does not fit is resized on the CPU
  // and only finished (flip, normalise, dtype) on the GPU.
  float device_input_factor = 3.0f;
  // Device buffers in the pool (at least 2).
  std::uint32_t device_buffers = 3;
  // With finish_on_device: JPEGs are decoded on the GPU by nvJPEG (loaded
  // at run time), with the hardware JPEG decoder where the GPU has one
  // (A100, H100, H200) and nvJPEG's GPU decoder otherwise; the CPU only
  // reads the bytes and parses headers. Images nvJPEG does not take (CMYK,
  // arithmetic coding, 12-bit, unusual sampling) are decoded on the CPU,
  // counted by reason in the stats. Without nvJPEG or a usable GPU, every
  // image is decoded on the CPU and stats().device_decoder says why.
  bool decode_on_device = false;
  // With decode_on_device: device memory per sample of each device buffer
  // for whole decoded images (3 bytes per pixel). An image that does not fit
  // its batch's area is decoded on the CPU (counted as decode_no_room).
  std::size_t device_decode_bytes_per_sample = std::size_t{1} << 20;
  // With decode_on_device and a decoder: a staging thread submits batches
  // ahead (copy, nvJPEG's call, kernel) into free device buffers, so that
  // the decoder's host work (parsing; Huffman decoding for what the hardware
  // decoder does not take) runs beside the training thread instead of in
  // Next(). Use the DeviceLoader's State/SetEpoch/Restore/Reshard/epoch then:
  // the host loader's own are ahead by the staged batches.
  bool stage_ahead = true;
};

struct DeviceLoaderStats {
  std::uint64_t batches = 0;
  double copy_seconds = 0;  // host-to-device copy time, measured with events
  std::uint64_t copied_bytes = 0;
  // Host time submitting batches (copy, decoder call, kernel launch): in
  // Next(), or on the staging thread with stage_ahead.
  double submit_seconds = 0;
  // finish_on_device: crops resized on the CPU because their batch ran out of room.
  std::uint64_t device_fallbacks = 0;
  // finish_on_device with augmentation steps: samples whose warps before the
  // crop ran on the CPU (a chain the GPU's kernel does not evaluate per
  // pixel), and samples whose steps after the crop did (a step without pixel
  // ops, such as GaussianBlur, makes that every sample).
  std::uint64_t device_cpu_warps = 0;
  std::uint64_t device_cpu_steps = 0;

  // decode_on_device: the decoder in use ("nvJPEG 12.4, hardware decoder
  // ..."), or, when none could be used, "CPU: " and why.
  std::string device_decoder;
  std::uint64_t decoded_on_device = 0;       // images the GPU's decoders decoded
  std::uint64_t decoded_on_hardware = 0;     // of the images planned for the GPU, those for the hardware decoder
  std::uint64_t decode_no_room = 0;          // decoded on the CPU: their batch's decode area was full
  std::uint64_t decode_batch_failures = 0;   // batches the decoder refused, then decoded image by image
  std::uint64_t decode_cpu_after_error = 0;  // images the GPU refused alone too: decoded on the CPU
  // on_corrupt = kSkip: images neither the GPU nor the CPU decoded (a good
  // header over corrupt data), each replaced by the next good image of its
  // batch (its label and index too).
  std::uint64_t decode_corrupt_skipped = 0;
  // Images decoded on the CPU because the GPU's decoders do not take them, by reason.
  std::vector<std::pair<std::string, std::uint64_t>> decoded_on_cpu_by_reason;
};

class DeviceLoader {
 public:
  // A Loader over `dataset` with `options` whose batches arrive on `device`
  // (a CUDA device). Unavailable when CUDA is not usable here (QueryCuda()
  // says why); callers then use a Loader directly.
  [[nodiscard]] static Result<std::unique_ptr<DeviceLoader>> Create(std::shared_ptr<const Dataset> dataset,
                                                                    const LoaderOptions& options, Device device,
                                                                    const DeviceLoaderOptions& device_options = {});
  ~DeviceLoader();
  DeviceLoader(const DeviceLoader&) = delete;
  DeviceLoader& operator=(const DeviceLoader&) = delete;

  // The next batch, ready for work enqueued on `consumer_stream` (a
  // cudaStream_t) from now on; nullopt at the end of an epoch.
  // ResourceExhausted when the consumer holds every device buffer.
  [[nodiscard]] Result<std::optional<DeviceBatchView>> Next(void* consumer_stream);
  // The same, waiting at most `timeout` for the host batch
  // (DeadlineExceeded: call again; nothing is lost).
  [[nodiscard]] Result<std::optional<DeviceBatchView>> Next(void* consumer_stream, std::chrono::nanoseconds timeout);
  // Gives the batch's device buffer back once `consumer_stream`'s work
  // enqueued so far completes. Thread-safe (tensor deleters may run anywhere).
  [[nodiscard]] Status Release(const DeviceBatchView& batch, void* consumer_stream);

  // The host loader: for its options, stats and sizes. Position and epoch
  // go through the methods below, which account for batches staged ahead.
  [[nodiscard]] Loader& loader();
  [[nodiscard]] DeviceLoaderStats stats() const;

  // As Loader's, as the consumer sees them: batches staged ahead
  // (stage_ahead) are not consumed yet. SetEpoch, Restore and Reshard drop
  // them. Each waits for the staging thread to finish the batch it is
  // submitting: not for every step. Not to be called while another thread
  // is in Next.
  [[nodiscard]] LoaderState State() const;
  [[nodiscard]] std::uint64_t epoch() const;
  void SetEpoch(std::uint64_t epoch);
  [[nodiscard]] Status Restore(const LoaderState& state);
  [[nodiscard]] Status Reshard(std::uint32_t rank, std::uint32_t world_size);

  struct Impl;

  // Made by the library's factories (Impl is opaque outside it).
  explicit DeviceLoader(std::unique_ptr<Impl> impl);

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace stoker
