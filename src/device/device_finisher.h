// DeviceFinisher: batch buffers laid out for the GPU's preprocessing kernel.
// Each buffer is [ImageDesc x batch][pixels]: workers decode each sample's
// crop (region of interest, DCT scaling) and copy only the box's whole
// pixels into the pixel area at an atomic cursor; the descriptor says where
// they are, the box and the flip. When a batch's room (device_input_factor
// output-sized images per sample) runs out, the crop is resized on the CPU
// into the sample's reserved output-sized slot and the GPU only flips,
// normalises and converts it (counted as a fallback).
//
// With GPU decode (EnableDeviceDecode), a JPEG the GPU's decoder takes is
// not decoded here: its compressed bytes go into the pixel area, a
// CompressedImage record says where and which decoder, and its descriptor
// points (source 1) at its place in the device's decode area, where the
// GPU decode stage (device/gpu_decode_stage.h) writes the whole image
// before the kernel resamples its box. What the GPU's decoder does not take
// (PlanGpuDecode's reasons), and what does not fit the decode area, is
// decoded here as before, counted by reason.
//
// With augmentation steps (device_finisher_augment.cc) each sample also
// gets an AugmentDesc (a third table) for the augmentation kernels
// (device/augment_math.h): warps before the crop that the kernel evaluates
// from the source region they read, colour ops after the crop, flips and
// RandomErasing's boxes. What the kernels cannot run is run here first: a
// warp chain Pillow's engines would not compute per pixel (counted), steps
// before the crop that are not warps, and steps after the crop without
// pixel ops (then every sample is resized and stepped here).
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <string>

#include "codec/jpeg_traits.h"
#include "core/mutex.h"
#include "device/augment_math.h"
#include "device/preprocess_math.h"
#include "pipeline/image_pipeline.h"
#include "pipeline/sample_finisher.h"
#include "stoker/loader.h"
#include "transform/augmentation.h"

namespace stoker::device {

// Where a sample's compressed JPEG is in a batch buffer (GPU decode).
struct CompressedImage {
  std::uint64_t offset = 0;  // from the start of the pixel area
  std::uint64_t length = 0;  // 0: the sample was decoded on the CPU
  std::int32_t width = 0, height = 0;
  std::int32_t hardware = 0;  // planned for the hardware decoder
  std::int32_t pad = 0;
};
static_assert(sizeof(CompressedImage) == 32);

// Samples the GPU decode path sent to the CPU, by reason.
struct DeviceDecodeRouting {
  std::uint64_t on_hardware = 0;                     // planned for the hardware decoder
  std::uint64_t no_room = 0;                         // decoded on the CPU: the batch's decode area was full
  std::map<std::string, std::uint64_t> cpu_reasons;  // decoded on the CPU: what the GPU does not take
};

class DeviceFinisher final : public pipeline::SampleFinisher {
 public:
  // `input_factor`: room for decoded crops, in output-sized uint8 images per
  // sample, beyond the one output-sized image always reserved for each.
  DeviceFinisher(const TransformOptions& transform, float input_factor);

  // Routes JPEGs the GPU's decoders take (per `caps`) to the GPU decode
  // stage, with `bytes_per_sample` of device decode area per sample. Before
  // Prepare.
  void EnableDeviceDecode(const codec::GpuDecodeCaps& caps, std::size_t bytes_per_sample);
  [[nodiscard]] bool decodes_on_device() const { return device_decode_; }

  Status Prepare(std::uint32_t slots, std::uint32_t batch_size) override;
  std::size_t BatchBufferBytes() const override { return desc_bytes_ + pixel_capacity_; }
  void BeginBatch(std::uint32_t slot) override;
  Status Finish(std::span<const std::byte> encoded, const pipeline::SampleContext& context, std::byte* buffer,
                ImageScratch& scratch, pipeline::LoaderCounters& counters) override;
  std::size_t UsedBytes(std::uint32_t slot, std::uint32_t size) const override;
  std::optional<codec::Roi> PlannedRegion(int width, int height, const pipeline::SampleContext& context) const override;

  // Where the pixels start in a batch buffer (after the descriptor table,
  // and with GPU decode the CompressedImage table).
  [[nodiscard]] std::size_t pixels_offset() const { return desc_bytes_; }
  // Where the CompressedImage table starts (GPU decode).
  [[nodiscard]] std::size_t compressed_table_offset() const { return compressed_offset_; }
  // Bytes of device decode area a batch needs at most (GPU decode).
  [[nodiscard]] std::size_t decode_area_bytes() const { return decode_capacity_; }
  [[nodiscard]] DeviceDecodeRouting routing() const;
  // The kernel's output description for the transform.
  [[nodiscard]] OutputDesc output() const;
  // Crops resized on the CPU because their batch ran out of room.
  [[nodiscard]] std::uint64_t fallbacks() const { return fallbacks_.load(std::memory_order_relaxed); }

  // Augmentation (after Prepare): whether the augmentation kernels finish
  // the batches, where their AugmentDesc table is in a batch buffer, and
  // the device staging a batch needs.
  [[nodiscard]] bool augments() const { return augment_; }
  [[nodiscard]] std::size_t augment_table_offset() const { return augment_offset_; }
  [[nodiscard]] std::size_t staging_bytes() const { return augment_ ? image_bytes_ * batch_size_ : 0; }
  // Samples whose warps before the crop ran here (a chain the kernel does
  // not evaluate per pixel), and samples whose steps after the crop did.
  [[nodiscard]] std::uint64_t cpu_warps() const { return cpu_warps_.load(std::memory_order_relaxed); }
  [[nodiscard]] std::uint64_t cpu_steps() const { return cpu_steps_.load(std::memory_order_relaxed); }

 private:
  TransformOptions transform_;
  float input_factor_;
  std::size_t image_bytes_ = 0;  // one output-sized uint8 RGB image
  std::size_t desc_bytes_ = 0, fallback_bytes_ = 0, pixel_capacity_ = 0;
  std::unique_ptr<std::atomic<std::uint64_t>[]> pixel_used_;  // per slot, from the start of the pixel area
  std::atomic<std::uint64_t> fallbacks_{0};

  // Reserves `bytes` of an area whose use is `used`, if they fit within
  // `capacity`: one image too large for the area leaves the rest of the
  // batch their room (a plain fetch_add would not).
  static bool Reserve(std::atomic<std::uint64_t>& used, std::uint64_t bytes, std::uint64_t capacity, std::uint64_t& at);
  // Copies the crop's pixels into the batch's pixel area and describes them
  // in `desc`, or (no room left) resizes them here into the sample's
  // fallback image.
  [[nodiscard]] Status PlaceCrop(const DecodedCrop& crop, const pipeline::SampleContext& context, std::byte* buffer,
                                 ImageScratch& scratch, ImageDesc& desc);
  // Copies an output-sized RGB image finished here into the sample's
  // fallback slot and describes it (the kernels then only normalise it).
  void PlaceFinished(const std::uint8_t* rgb, const pipeline::SampleContext& context, std::byte* buffer,
                     ImageDesc& desc) const;
  // Augmentation (device_finisher_augment.cc).
  // Unimplemented when the kernels cannot run a step of augmentation_ and
  // the CPU cannot run it for them (a step on the normalised tensor without
  // pixel ops: RandomErasing's random values), naming the step.
  [[nodiscard]] Status CheckAugmentation() const;
  // Whether the resize and the steps after the crop run here: a step there
  // has no pixel ops, or the resize is not the kernels' (bicubic).
  [[nodiscard]] bool resizes_here() const;
  [[nodiscard]] Status FinishAugmented(std::span<const std::byte> encoded, const pipeline::SampleContext& context,
                                       std::byte* buffer, ImageScratch& scratch, pipeline::LoaderCounters& counters);
  // Places the sample's crop for the kernels (or its finished image), with
  // its warps when the kernel evaluates them; `flip` is the crop stage's.
  [[nodiscard]] Status PlaceAugmentedSource(std::span<const std::byte> encoded, const pipeline::SampleContext& context,
                                            std::byte* buffer, ImageScratch& scratch, Rng& rng, ImageDesc& desc,
                                            AugmentDesc& augment, bool& flip);
  transform::Augmentation augmentation_;
  bool augment_ = false;
  std::uint32_t batch_size_ = 0;
  std::size_t augment_offset_ = 0;
  std::atomic<std::uint64_t> cpu_warps_{0}, cpu_steps_{0};

  // GPU decode.
  // A seekable JPEG (a restart table in scratch.restarts) whose crop leaves
  // whole intervals out goes as the JPEG of the intervals its region needs
  // (codec::AssembleSeekableRegion): the GPU's decoder (and the CPU's, for
  // nvJPEG's Huffman stage) reads and decodes only those. scratch.seek_use
  // says which.
  [[nodiscard]] bool RouteToDevice(std::span<const std::byte> encoded, const pipeline::SampleContext& context,
                                   std::byte* buffer, ImageScratch& scratch, Status& error);
  bool device_decode_ = false;
  codec::GpuDecodeCaps caps_;
  std::size_t decode_bytes_per_sample_ = 0, decode_capacity_ = 0, compressed_offset_ = 0;
  std::unique_ptr<std::atomic<std::uint64_t>[]> decode_used_;  // per slot
  std::atomic<std::uint64_t> on_hardware_{0}, no_room_{0};
  mutable Mutex reasons_mu_;
  std::map<std::string, std::uint64_t> cpu_reasons_ GUARDED_BY(reasons_mu_);
};

}  // namespace stoker::device
