// SampleProducer: a batch's samples from storage to its buffer. ReadBatch
// reads the image bytes of all of a batch's samples at once (neighbours
// merged, submitted together; each sample checked against its index record
// unless turned off); Produce finishes one sample from those bytes through
// the SampleFinisher, and under CorruptPolicy::kSkip replaces a corrupt one
// by the next samples of the epoch's order (read one by one).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "order/sampler.h"
#include "pipeline/field_decoders.h"
#include "pipeline/loader_counters.h"
#include "pipeline/sample_finisher.h"
#include "pipeline/target_fields.h"
#include "stoker/dataset.h"
#include "stoker/loader.h"

namespace stoker::pipeline {

// A transformed image's seekable JPEG as the index records it, when the
// batch read reads it in part (LoaderOptions::read_crop_rows).
struct SeekablePart {
  std::vector<std::uint32_t> table;
  RegionRecord region;
  std::uint64_t rows_at = 0;  // where the rows read start in the JPEG
};

// One batch's samples as read.
struct BatchInput {
  std::uint64_t seed = 0, epoch = 0;   // the samples' random streams (the crops planned before reading)
  std::vector<std::uint64_t> samples;  // dataset positions (first choices), one per place in the batch
  std::vector<Result<SampleInfo>> infos;
  std::vector<Dataset::FieldRead> reads;  // the transformed image's, one per sample (none without one)
  std::vector<SeekablePart> parts;        // per sample, with `reads`: what a read in part reads by
  // LoaderOptions::fields (all but a transformed image): samples x fields,
  // row-major. `sample` null: the sample lacks the field (an error in
  // `status`, or absent where the spec is optional).
  std::vector<Dataset::FieldRead> field_reads;
  std::vector<std::byte> encoded;  // the compressed bytes the reads point into
};

// The fields a batch's slot holds: per spec (LoaderOptions::fields order,
// without a transformed image), one value per place in the batch.
using FieldColumns = std::vector<std::vector<FieldValue>>;

// Per-thread buffers, reused for every sample.
struct ProducerScratch {
  std::vector<std::byte> encoded;
  ImageScratch image;
  transform::RasterScratch target;       // masks and arrays following the image
  std::vector<std::byte> array_scratch;  // arrays' transforms
};

class SampleProducer {
 public:
  // `finisher` and `counters` must outlive the producer.
  [[nodiscard]] static Result<std::unique_ptr<SampleProducer>> Create(std::shared_ptr<const Dataset> dataset,
                                                                      const LoaderOptions& options,
                                                                      SampleFinisher* finisher,
                                                                      LoaderCounters* counters);

  // Fills input.infos, input.reads and input.encoded for input.samples.
  void ReadBatch(BatchInput& input);
  // How ReadBatch reads ("io_uring", "pread", ...), once it has read.
  [[nodiscard]] std::string ReadMethod() const;

  struct Produced {
    std::uint64_t sample = 0;  // the dataset position actually used
    std::int64_t label = kNoLabel;
    bool substituted = false;  // a corrupt sample was replaced (kSkip)
  };
  // Finishes the sample at `index` of `input` into `buffer`; `position` is
  // its place in `epoch_order`, whose following samples substitute for a
  // corrupt one under kSkip. Errors name the sample and shard:offset.
  // Its fields (if any) go to place `index` of `columns`.
  [[nodiscard]] Result<Produced> Produce(const BatchInput& input, std::uint32_t index,
                                         const order::Permutation& epoch_order, std::uint64_t position,
                                         SampleContext context, std::byte* buffer, FieldColumns& columns,
                                         ProducerScratch& scratch);
  // Specs of the fields Produce decodes (the columns' order).
  [[nodiscard]] const std::vector<FieldSpec>& field_specs() const { return field_specs_; }
  // Whether samples have a transformed image (Batch::images()).
  [[nodiscard]] bool has_image() const { return !image_fields_.empty(); }

 private:
  SampleProducer() = default;
  // The finisher on one sample's image (field `field` of `info`), with its
  // restart table when the index has one; counts seekable decodes. `read`
  // (may be null) is the batch read's; `part` (with read_crop_rows) holds
  // the table the batch read looked up, and `read->part` says whether it
  // read the JPEG in part: if the rows read do not serve, the JPEG is read
  // whole and finished again.
  [[nodiscard]] Status FinishImage(std::span<const std::byte> bytes, const Dataset::FieldRead* read,
                                   const SeekablePart* part, const SampleInfo& info, std::size_t field,
                                   const SampleContext& context, std::byte* buffer, ProducerScratch& scratch);
  // Plans the read in part of sample i's image (read_crop_rows).
  void PlanPartRead(BatchInput& input, std::size_t i);
  [[nodiscard]] std::optional<std::size_t> ImageFieldOf(const SampleInfo& info) const;
  [[nodiscard]] Status NoImageField(const SampleInfo& info) const;
  // The dataset field spec `f` reads for `info`, or nullopt (absent).
  [[nodiscard]] std::optional<std::size_t> FieldOf(const SampleInfo& info, std::size_t f) const;
  [[nodiscard]] Status MissingField(const SampleInfo& info, std::size_t f) const;
  // Decodes field spec `f` of `info`, then runs its array transform with
  // the sample's draws (`context`).
  [[nodiscard]] Status DecodeField(const SampleInfo& info, std::size_t f, std::size_t dataset_field,
                                   std::span<const std::byte> bytes, const SampleContext& context,
                                   ProducerScratch& scratch, FieldValue* out) const;
  // Moves the sample's following targets as its image moved.
  [[nodiscard]] Status Follow(const SampleInfo& info, FieldColumns& columns, std::size_t index,
                              ProducerScratch& scratch) const;
  [[nodiscard]] Result<std::int64_t> ProduceOne(std::uint64_t sample, SampleContext context, std::byte* buffer,
                                                FieldColumns& columns, ProducerScratch& scratch);

  std::shared_ptr<const Dataset> dataset_;
  LoaderOptions options_;
  std::vector<std::size_t> image_fields_;  // candidates present in the dataset, in preference order
  bool seekable_ = false;                  // the index holds restart tables
  bool read_parts_ = false;                // region records and read_crop_rows: images may be read in part
  std::vector<FieldSpec> field_specs_;     // LoaderOptions::fields but a transformed image
  std::vector<std::vector<std::size_t>> field_candidates_;  // per spec: its keys present in the dataset
  std::vector<FieldDecodeOptions> field_options_;           // per spec
  TargetFollower follower_;                                 // boxes, keypoints, masks that follow the image
  SampleFinisher* finisher_ = nullptr;
  LoaderCounters* counters_ = nullptr;
};

}  // namespace stoker::pipeline
