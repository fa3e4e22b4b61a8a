#include "pipeline/sample_producer.h"

#include <algorithm>
#include <iterator>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "stoker/text.h"

namespace stoker::pipeline {
namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

Result<std::unique_ptr<SampleProducer>> SampleProducer::Create(std::shared_ptr<const Dataset> dataset,
                                                               const LoaderOptions& options, SampleFinisher* finisher,
                                                               LoaderCounters* counters) {
  std::unique_ptr<SampleProducer> p(new SampleProducer());
  const std::vector<std::string> candidates = options.image_field.empty()
                                                  ? std::vector<std::string>{"jpg", "jpeg", "png", "webp"}
                                                  : std::vector<std::string>{options.image_field};
  for (const auto& c : candidates)
    if (auto f = dataset->FieldIndex(c)) p->image_fields_.push_back(*f);
  if (p->image_fields_.empty()) {
    return Status::InvalidArgument(fmt::format("dataset '{}' has no image field {} (its fields: {})",
                                               dataset->index_path(), fmt::join(candidates, " or "),
                                               fmt::join(dataset->field_names(), ", ")));
  }
  p->dataset_ = std::move(dataset);
  p->options_ = options;
  p->finisher_ = finisher;
  p->counters_ = counters;
  return p;
}

std::optional<std::size_t> SampleProducer::ImageFieldOf(const SampleInfo& info) const {
  for (std::size_t f : image_fields_)
    if (info.fields[f]) return f;
  return std::nullopt;
}

Status SampleProducer::NoImageField(const SampleInfo& info) const {
  static constexpr std::string_view kOtherFormats[] = {"bmp", "gif", "tif", "tiff", "ppm", "pgm"};
  for (std::size_t f = 0; f < info.fields.size(); ++f) {
    const std::string& name = dataset_->field_names()[f];
    if (info.fields[f] &&
        std::find(std::begin(kOtherFormats), std::end(kOtherFormats), name) != std::end(kOtherFormats))
      return Status::Unimplemented(fmt::format(
          "sample '{}' in {} holds a {} image (field '{}'): stoker's loader decodes JPEG, PNG and WebP (convert "
          "the images before packing)",
          Printable(info.key), dataset_->shards()[info.shard].path, name, name));
  }
  std::vector<std::string> names;
  for (std::size_t f : image_fields_) names.push_back(dataset_->field_names()[f]);
  return Status::Corruption(fmt::format("sample '{}' in {} has no image field ({})", Printable(info.key),
                                        dataset_->shards()[info.shard].path, fmt::join(names, " or ")));
}

std::string SampleProducer::ReadMethod() const {
  return dataset_->file_system()->ReadBatchMethod();
}

void SampleProducer::ReadBatch(BatchInput& input) {
  const auto t0 = Clock::now();
  const std::size_t n = input.samples.size();
  input.infos.clear();
  input.reads.clear();
  for (std::size_t i = 0; i < n; ++i) input.infos.push_back(dataset_->Sample(input.samples[i]));
  for (std::size_t i = 0; i < n; ++i) {
    Dataset::FieldRead read;
    if (input.infos[i].ok()) {
      read.sample = &*input.infos[i];
      if (auto field = ImageFieldOf(*read.sample)) {
        read.field = *field;
      } else {
        read.status = NoImageField(*read.sample);
      }
    } else {
      read.status = input.infos[i].error();
    }
    input.reads.push_back(read);
  }
  std::vector<std::size_t> wanted;  // samples with something to read
  std::vector<Dataset::FieldRead> to_read;
  for (std::size_t i = 0; i < n; ++i)
    if (input.reads[i].sample != nullptr && input.reads[i].status.ok()) {
      wanted.push_back(i);
      to_read.push_back(input.reads[i]);
    }
  Dataset::ReadFieldsOptions read_options;
  read_options.verify = options_.verify_samples;
  counters_->read_requests.fetch_add(dataset_->ReadFields(to_read, input.encoded, read_options),
                                     std::memory_order_relaxed);
  std::uint64_t bytes = 0;
  for (std::size_t k = 0; k < wanted.size(); ++k) {
    input.reads[wanted[k]] = to_read[k];
    bytes += to_read[k].bytes.size();
  }
  counters_->bytes.fetch_add(bytes, std::memory_order_relaxed);
  LoaderCounters::Add(counters_->read_ns, Clock::now() - t0);
}

Result<SampleProducer::Produced> SampleProducer::Produce(const BatchInput& input, std::uint32_t index,
                                                         std::span<const std::uint64_t> epoch_order,
                                                         std::uint64_t position, SampleContext context,
                                                         std::byte* buffer, ProducerScratch& scratch) {
  constexpr int kMaxSubstitutes = 64;
  const std::uint64_t n = epoch_order.size();
  Status first_error;
  for (int attempt = 0; attempt <= kMaxSubstitutes; ++attempt) {
    Produced out;
    out.sample =
        attempt == 0 ? input.samples[index] : epoch_order[(position + static_cast<std::uint64_t>(attempt)) % n];
    out.substituted = attempt > 0;
    context.sample = out.sample;
    Status s;
    if (attempt == 0) {
      // The batch read fetched the first choice.
      const Dataset::FieldRead& read = input.reads[index];
      s = read.status;
      if (s.ok()) {
        out.label = read.sample->label;
        s = finisher_->Finish(read.bytes, context, buffer, scratch.image, *counters_);
        if (!s.ok())
          s = s.WithContext(fmt::format(
              "sample '{}' (field '{}' at {}:{})", Printable(read.sample->key), dataset_->field_names()[read.field],
              dataset_->shards()[read.sample->shard].path, read.sample->fields[read.field]->offset));
      }
    } else {
      auto label = ProduceOne(out.sample, context, buffer, scratch);
      if (label.ok()) out.label = *label;
      s = label.status();
    }
    if (s.ok()) return out;
    if (options_.on_corrupt == CorruptPolicy::kError || s.code() != StatusCode::kCorruption) return s;
    if (first_error.ok()) first_error = s;
  }
  return first_error.WithContext(fmt::format("{} samples in a row are corrupt", kMaxSubstitutes + 1));
}

Result<std::int64_t> SampleProducer::ProduceOne(std::uint64_t sample, SampleContext context, std::byte* buffer,
                                                ProducerScratch& scratch) {
  const auto t0 = Clock::now();
  STOKER_ASSIGN_OR_RETURN(SampleInfo info, dataset_->Sample(sample));
  const auto field = ImageFieldOf(info);  // datasets may mix .jpg and .jpeg
  if (!field) return NoImageField(info);
  STOKER_RETURN_IF_ERROR(dataset_->ReadFieldInto(info, *field, scratch.encoded, options_.verify_samples));
  counters_->bytes.fetch_add(scratch.encoded.size(), std::memory_order_relaxed);
  LoaderCounters::Add(counters_->read_ns, Clock::now() - t0);
  Status s = finisher_->Finish(scratch.encoded, context, buffer, scratch.image, *counters_);
  if (!s.ok())
    return s.WithContext(fmt::format("sample '{}' (field '{}' at {}:{})", Printable(info.key),
                                     dataset_->field_names()[*field], dataset_->shards()[info.shard].path,
                                     info.fields[*field]->offset));
  return info.label;
}

}  // namespace stoker::pipeline
