#include "pipeline/sample_producer.h"

#include <algorithm>
#include <iterator>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "pipeline/field_decoders.h"
#include "pipeline/field_extension.h"
#include "stoker/text.h"
#include "transform/array_transform.h"

namespace stoker::pipeline {
namespace {

using Clock = std::chrono::steady_clock;

// Whether a spec of kind `spec` can decode field `key`, which the index
// records as `recorded`. Only what cannot work is refused: images and
// arrays are binary (a TIFF or PNG is both: an Array reads its samples as
// stored);
// a float's text is no integer; JSON values that are not plain numbers are
// no number. Text may hold anything (numbers, JSON).
bool KindsAgree(FieldKind spec, FieldKind recorded, std::string_view key) {
  if (spec == FieldKind::kBytes || spec == FieldKind::kCustom || recorded == FieldKind::kBytes) return true;
  if (spec == FieldKind::kArray && recorded == FieldKind::kImage) return ArrayReadsImageKey(key);
  if (spec == FieldKind::kBoxes || spec == FieldKind::kKeypoints)
    return recorded == FieldKind::kArray || recorded == FieldKind::kJson || recorded == FieldKind::kText;
  if (spec == FieldKind::kMask) return recorded == FieldKind::kImage;
  if (spec == FieldKind::kImage || spec == FieldKind::kArray) return recorded == spec;
  if (recorded == FieldKind::kImage || recorded == FieldKind::kArray) return false;
  if (spec == FieldKind::kInt) return recorded != FieldKind::kFloat && recorded != FieldKind::kJson;
  if (spec == FieldKind::kFloat) return recorded != FieldKind::kJson;
  return true;
}

// What the index records, checked at creation so that a spec that cannot
// work fails now, not mid-epoch: a key whose recorded kind the spec cannot
// decode, and (unless the spec is optional or corrupt samples are skipped)
// samples without any of its keys.
Status CheckSpecAgainstIndex(const Dataset& dataset, const FieldSpec& spec, const std::vector<std::size_t>& present,
                             CorruptPolicy on_corrupt) {
  std::uint64_t with_key = 0;
  bool counted = true;
  for (std::size_t f : present) {
    const auto recorded = dataset.recorded_field(f);
    if (recorded.kind && !KindsAgree(spec.kind, *recorded.kind, dataset.field_names()[f]))
      return Status::InvalidArgument(fmt::format(
          "field '{}' ({}) reads key '{}', which dataset '{}' records as {}: a {} decoder cannot read it (use the "
          "spec of its kind, or Bytes)",
          spec.name, FieldKindName(spec.kind), Printable(dataset.field_names()[f]), dataset.index_path(),
          FieldKindName(*recorded.kind), FieldKindName(spec.kind)));
    if (recorded.samples)
      with_key += *recorded.samples;
    else
      counted = false;
  }
  if (spec.optional || on_corrupt == CorruptPolicy::kSkip || present.empty() || !counted ||
      with_key >= dataset.num_samples())
    return Status::Ok();
  // Some samples lack every key: name the first (a scan, on this error path only).
  std::uint64_t lacking = dataset.num_samples() - with_key;
  std::string first;
  for (std::uint64_t i = 0; i < dataset.num_samples() && first.empty(); ++i) {
    auto info = dataset.Sample(i);
    if (!info.ok()) return info.error();
    if (std::none_of(present.begin(), present.end(), [&](std::size_t f) { return info->fields[f].has_value(); }))
      first = fmt::format("sample '{}' in {}", Printable(info->key), dataset.shards()[info->shard].path);
  }
  if (first.empty()) return Status::Ok();  // counts that do not hold: the reads will say what is wrong
  if (present.size() > 1) lacking = 0;     // a sample may have several keys: the sum only bounds the count
  return Status::InvalidArgument(fmt::format(
      "field '{}' ({}): {} of dataset '{}' {} none of its keys {} (the first: {}); optional=True gives None for "
      "them, on_corrupt skip skips them",
      spec.name, FieldKindName(spec.kind),
      lacking ? fmt::format("{} of {} samples", lacking, dataset.num_samples()) : std::string("some samples"),
      dataset.index_path(), lacking == 1 ? "has" : "have", fmt::join(spec.keys, ", "), first));
}

// Image files stoker's loader does not decode (it decodes JPEG, PNG, WebP,
// TIFF, PGM, PPM and BMP): named in its errors, with the way on.
constexpr std::string_view kOtherImageFormats[] = {"gif"};

}  // namespace

Result<std::unique_ptr<SampleProducer>> SampleProducer::Create(std::shared_ptr<const Dataset> dataset,
                                                               const LoaderOptions& options, SampleFinisher* finisher,
                                                               LoaderCounters* counters) {
  std::unique_ptr<SampleProducer> p(new SampleProducer());
  std::vector<std::string> candidates =
      options.image_field.empty()
          ? std::vector<std::string>{"jpg", "jpeg", "png", "webp", "tif", "tiff", "ppm", "pgm", "bmp"}
          : std::vector<std::string>{options.image_field};
  bool wants_image = options.fields.empty();
  for (const FieldSpec& spec : options.fields) {
    STOKER_RETURN_IF_ERROR(CheckFieldSpec(spec));
    std::vector<std::size_t> present;
    for (const auto& key : spec.keys)
      if (auto f = dataset->FieldIndex(key)) present.push_back(*f);
    if (present.empty() && !spec.optional)
      return Status::InvalidArgument(fmt::format(
          "field '{}' ({}) names keys no sample of dataset '{}' has: {} (its fields: {}; optional=True allows it)",
          spec.name, FieldKindName(spec.kind), dataset->index_path(), fmt::join(spec.keys, ", "),
          fmt::join(dataset->field_names(), ", ")));
    STOKER_RETURN_IF_ERROR(CheckSpecAgainstIndex(*dataset, spec, present, options.on_corrupt));
    if (spec.transformed) {
      if (wants_image) return Status::InvalidArgument("at most one field may be a transformed image");
      wants_image = true;
      candidates = spec.keys;
      continue;
    }
    FieldDecodeOptions decode;
    decode.max_pixels = options.transform.max_pixels;
    if (spec.kind == FieldKind::kCustom) {
      STOKER_ASSIGN_OR_RETURN(decode.custom, FindFieldExtension(spec.decoder));
    }
    p->field_specs_.push_back(spec);
    p->field_candidates_.push_back(std::move(present));
    p->field_options_.push_back(decode);
  }
  if (wants_image) {
    for (const auto& c : candidates)
      if (auto f = dataset->FieldIndex(c)) p->image_fields_.push_back(*f);
    if (p->image_fields_.empty()) {
      std::vector<std::string> undecodable;  // image files of formats the loader does not decode
      for (const auto& name : dataset->field_names())
        for (std::string_view ext : kOtherImageFormats)
          if (name == ext || name.ends_with(fmt::format(".{}", ext))) undecodable.push_back(name);
      return Status::InvalidArgument(fmt::format(
          "dataset '{}' has no image field {} (its fields: {}){}", dataset->index_path(), fmt::join(candidates, " or "),
          fmt::join(dataset->field_names(), ", "),
          undecodable.empty() ? std::string()
                              : fmt::format("; {} hold images in formats the loader does not decode (it decodes JPEG, "
                                            "PNG, WebP, TIFF, PGM, PPM and BMP): "
                                            "convert them to PNG and pack again, or read them with fields={{\"image\": "
                                            "stoker.Bytes(\"{}\")}} and decode them in map=",
                                            fmt::join(undecodable, ", "), fmt::join(undecodable, ";"))));
    }
  }
  STOKER_ASSIGN_OR_RETURN(p->follower_,
                          TargetFollower::Create(p->field_specs_, wants_image && !options.fields.empty()));
  p->seekable_ = dataset->seekable_payloads() > 0;
  p->read_parts_ = p->seekable_ && options.read_crop_rows && dataset->has_region_records();
  p->dataset_ = std::move(dataset);
  p->options_ = options;
  p->finisher_ = finisher;
  p->counters_ = counters;
  return p;
}

std::optional<std::size_t> SampleProducer::FieldOf(const SampleInfo& info, std::size_t f) const {
  for (std::size_t d : field_candidates_[f])
    if (info.fields[d]) return d;
  return std::nullopt;
}

Status SampleProducer::MissingField(const SampleInfo& info, std::size_t f) const {
  const FieldSpec& spec = field_specs_[f];
  return Status::Corruption(fmt::format("sample '{}' in {} has no field for '{}' ({})", Printable(info.key),
                                        dataset_->shards()[info.shard].path, spec.name, fmt::join(spec.keys, " or ")));
}

Status SampleProducer::DecodeField(const SampleInfo& info, std::size_t f, std::size_t dataset_field,
                                   std::span<const std::byte> bytes, const SampleContext& context,
                                   ProducerScratch& scratch, FieldValue* out) const {
  const FieldSpec& spec = field_specs_[f];
  out->present = false;
  Status s = FieldDecoderFor(spec.kind)(bytes, spec, field_options_[f], out);
  if (s.ok() && !spec.array_transform.empty()) {
    // Every array field starts from the sample's own draws: a stream apart from the image's.
    Rng rng(context.seed ^ 0x61727261792d7478ull, SplitMix64(context.epoch) ^ context.sample);
    s = transform::ApplyArrayTransform(spec.array_transform, spec.array_layout, rng, out->tensor,
                                       scratch.array_scratch);
  }
  if (!s.ok())
    return s.WithContext(fmt::format("sample '{}' (field '{}', key '{}' at {}:{})", Printable(info.key), spec.name,
                                     dataset_->field_names()[dataset_field], dataset_->shards()[info.shard].path,
                                     info.fields[dataset_field]->offset));
  out->present = true;
  return Status::Ok();
}

std::optional<std::size_t> SampleProducer::ImageFieldOf(const SampleInfo& info) const {
  for (std::size_t f : image_fields_)
    if (info.fields[f]) return f;
  return std::nullopt;
}

Status SampleProducer::NoImageField(const SampleInfo& info) const {
  for (std::size_t f = 0; f < info.fields.size(); ++f) {
    const std::string& name = dataset_->field_names()[f];
    if (info.fields[f] &&
        std::find(std::begin(kOtherImageFormats), std::end(kOtherImageFormats), name) != std::end(kOtherImageFormats))
      return Status::Unimplemented(fmt::format(
          "sample '{}' in {} holds a {} image (field '{}'): stoker's loader decodes JPEG, PNG, WebP, TIFF, PGM, "
          "PPM and BMP (convert the images before packing)",
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
  const std::size_t nf = field_specs_.size();
  input.infos.clear();
  input.reads.clear();
  input.field_reads.assign(n * nf, Dataset::FieldRead{});
  for (std::size_t i = 0; i < n; ++i) input.infos.push_back(dataset_->Sample(input.samples[i]));
  for (std::size_t i = 0; i < n; ++i) {
    if (!has_image()) continue;
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
  if (read_parts_) {
    input.parts.resize(n);
    for (std::size_t i = 0; i < n; ++i) PlanPartRead(input, i);
  }
  for (std::size_t i = 0; i < n; ++i) {
    // Each sample is checked against its record once: by its image's read,
    // else by its first field's.
    bool checked = has_image();
    for (std::size_t f = 0; f < nf; ++f) {
      Dataset::FieldRead& read = input.field_reads[i * nf + f];
      if (!input.infos[i].ok()) {
        read.status = input.infos[i].error();
        continue;
      }
      const SampleInfo& info = *input.infos[i];
      if (auto field = FieldOf(info, f)) {
        read.sample = &info;
        read.field = *field;
        read.check = !checked;
        checked = true;
      } else if (!field_specs_[f].optional) {
        read.status = MissingField(info, f);
      }
    }
  }
  // Everything with something to read, in one batch of requests.
  std::vector<Dataset::FieldRead*> wanted;
  std::vector<Dataset::FieldRead> to_read;
  for (auto* reads : {&input.reads, &input.field_reads})
    for (auto& r : *reads)
      if (r.sample != nullptr && r.status.ok()) {
        wanted.push_back(&r);
        to_read.push_back(r);
      }
  Dataset::ReadFieldsOptions read_options;
  read_options.verify = options_.verify_samples;
  counters_->read_requests.fetch_add(dataset_->ReadFields(to_read, input.encoded, read_options),
                                     std::memory_order_relaxed);
  std::uint64_t bytes = 0;
  for (std::size_t k = 0; k < wanted.size(); ++k) {
    *wanted[k] = to_read[k];
    bytes += to_read[k].bytes.size();
  }
  for (const auto& read : input.reads) {
    bytes += read.rows.size();
    if (read.part && read.status.ok()) counters_->seekable_part_reads.fetch_add(1, std::memory_order_relaxed);
  }
  counters_->bytes.fetch_add(bytes, std::memory_order_relaxed);
  counters_->samples_read.fetch_add(n, std::memory_order_relaxed);
  LoaderCounters::Add(counters_->read_ns, Clock::now() - t0);
}

void SampleProducer::PlanPartRead(BatchInput& input, std::size_t i) {
  SeekablePart& part = input.parts[i];
  part.table.clear();  // FinishImage takes it as this sample's: none unless the index gives one
  Dataset::FieldRead& read = input.reads[i];
  read.part.reset();
  if (read.sample == nullptr || !read.status.ok()) return;
  if (!dataset_->RestartTable(input.samples[i], read.field, part.table, &part.region) || part.region.rows() == 0)
    return;
  const JpegGeometry& g = part.region.geometry;
  const SampleContext context{input.seed, input.epoch, input.samples[i], 0, static_cast<std::uint32_t>(i)};
  const auto roi = finisher_->PlannedRegion(static_cast<int>(g.width), static_cast<int>(g.height), context);
  if (!roi || roi->height <= 0 || roi->y < 0) return;
  const std::uint32_t rows = part.region.rows();
  const auto first = static_cast<std::uint32_t>(roi->y) / g.mcu_height;
  const auto end = std::min<std::uint64_t>(
      rows,
      (static_cast<std::uint64_t>(roi->y) + static_cast<std::uint64_t>(roi->height) + g.mcu_height - 1) / g.mcu_height);
  if (first >= end || (first == 0 && end == rows)) return;  // every row: read whole
  read.part = Dataset::FieldRead::Part{&part.table, &part.region, first, static_cast<std::uint32_t>(end)};
  part.rows_at = part.region.RowStart(part.table, first, read.sample->fields[read.field]->size);
}

Result<SampleProducer::Produced> SampleProducer::Produce(const BatchInput& input, std::uint32_t index,
                                                         const order::Permutation& epoch_order, std::uint64_t position,
                                                         SampleContext context, std::byte* buffer,
                                                         FieldColumns& columns, ProducerScratch& scratch) {
  constexpr int kMaxSubstitutes = 64;
  const std::uint64_t n = epoch_order.size();
  const std::size_t nf = field_specs_.size();
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
      s = input.infos[index].status();
      if (s.ok()) out.label = input.infos[index]->label;
      if (s.ok() && has_image()) {
        const Dataset::FieldRead& read = input.reads[index];
        s = read.status;
        if (read.pieces_disagree) s = Status::Ok();  // FinishImage reads it whole: the sample's checksum tells
        if (s.ok()) {
          const SeekablePart* part = read_parts_ ? &input.parts[index] : nullptr;
          s = FinishImage(read.bytes, &read, part, *read.sample, read.field, context, buffer, scratch);
          if (!s.ok())
            s = s.WithContext(fmt::format(
                "sample '{}' (field '{}' at {}:{})", Printable(read.sample->key), dataset_->field_names()[read.field],
                dataset_->shards()[read.sample->shard].path, read.sample->fields[read.field]->offset));
        }
      }
      const auto t0 = Clock::now();
      for (std::size_t f = 0; f < nf && s.ok(); ++f) {
        const Dataset::FieldRead& read = input.field_reads[index * nf + f];
        FieldValue& value = columns[f][index];
        s = read.status;
        if (!s.ok()) break;
        if (read.sample == nullptr) {
          value.present = false;  // optional, absent
          continue;
        }
        s = DecodeField(*read.sample, f, read.field, read.bytes, context, scratch, &value);
      }
      if (s.ok() && !follower_.empty()) s = Follow(*input.infos[index], columns, index, scratch);
      if (nf > 0) LoaderCounters::Add(counters_->decode_ns, Clock::now() - t0);
    } else {
      auto label = ProduceOne(out.sample, context, buffer, columns, scratch);
      if (label.ok()) out.label = *label;
      s = label.status();
    }
    if (s.ok()) return out;
    if (options_.on_corrupt == CorruptPolicy::kError || s.code() != StatusCode::kCorruption) return s;
    if (first_error.ok()) first_error = s;
  }
  return first_error.WithContext(fmt::format("{} samples in a row are corrupt", kMaxSubstitutes + 1));
}

Status SampleProducer::FinishImage(std::span<const std::byte> bytes, const Dataset::FieldRead* read,
                                   const SeekablePart* part, const SampleInfo& info, std::size_t field,
                                   const SampleContext& context, std::byte* buffer, ProducerScratch& scratch) {
  ImageScratch& image = scratch.image;
  image.record_geometry = !follower_.empty();
  if (!seekable_) return finisher_->Finish(bytes, context, buffer, image, *counters_);
  image.restarts = {};
  const std::vector<std::uint32_t>* table = nullptr;
  if (part != nullptr) {
    if (!part->table.empty()) table = &part->table;  // the batch read looked it up: not decoded twice
  } else if (dataset_->RestartTable(context.sample, field, image.restart_table)) {
    table = &image.restart_table;
  }
  if (table != nullptr)
    image.restarts = {reinterpret_cast<const std::byte*>(table->data()), static_cast<std::uint32_t>(table->size())};
  const bool in_part = read != nullptr && read->part && (!read->rows.empty() || read->pieces_disagree);
  if (in_part) {
    image.held_rows = read->rows;
    image.rows_at = part->rows_at;
  }
  image.seek_use.reset();
  // Rows that differ from the index's region record (a damaged record, or
  // damaged bytes) are not decoded.
  Status s = in_part && read->pieces_disagree ? Status::Unavailable("pieces disagree")
                                              : finisher_->Finish(bytes, context, buffer, image, *counters_);
  image.held_rows = {};
  if (in_part && (!s.ok() || image.seek_use == codec::SeekUse::kNeedsWhole)) {
    // The rows read did not serve the crop: read the JPEG whole (checked by
    // the sample's checksum) and finish it again, so that a damaged part or
    // record costs a read, never wrong pixels or an error on good data.
    counters_->seekable_part_rereads.fetch_add(1, std::memory_order_relaxed);
    const auto t0 = Clock::now();
    STOKER_RETURN_IF_ERROR(dataset_->ReadFieldInto(info, field, scratch.encoded, options_.verify_samples));
    counters_->bytes.fetch_add(scratch.encoded.size(), std::memory_order_relaxed);
    LoaderCounters::Add(counters_->read_ns, Clock::now() - t0);
    image.seek_use.reset();
    s = finisher_->Finish(scratch.encoded, context, buffer, image, *counters_);
  }
  image.restarts = {};
  if (image.seek_use == codec::SeekUse::kUsed)
    counters_->seekable_decodes.fetch_add(1, std::memory_order_relaxed);
  else if (image.seek_use == codec::SeekUse::kDisagrees)
    counters_->seekable_fallbacks.fetch_add(1, std::memory_order_relaxed);
  return s;
}

Result<std::int64_t> SampleProducer::ProduceOne(std::uint64_t sample, SampleContext context, std::byte* buffer,
                                                FieldColumns& columns, ProducerScratch& scratch) {
  const auto t0 = Clock::now();
  STOKER_ASSIGN_OR_RETURN(SampleInfo info, dataset_->Sample(sample));
  counters_->samples_read.fetch_add(1, std::memory_order_relaxed);
  bool checked = false;
  if (has_image()) {
    const auto field = ImageFieldOf(info);  // datasets may mix .jpg and .jpeg
    if (!field) return NoImageField(info);
    STOKER_RETURN_IF_ERROR(dataset_->ReadFieldInto(info, *field, scratch.encoded, options_.verify_samples));
    checked = true;
    counters_->bytes.fetch_add(scratch.encoded.size(), std::memory_order_relaxed);
    LoaderCounters::Add(counters_->read_ns, Clock::now() - t0);
    Status s = FinishImage(scratch.encoded, nullptr, nullptr, info, *field, context, buffer, scratch);
    if (!s.ok())
      return s.WithContext(fmt::format("sample '{}' (field '{}' at {}:{})", Printable(info.key),
                                       dataset_->field_names()[*field], dataset_->shards()[info.shard].path,
                                       info.fields[*field]->offset));
  }
  for (std::size_t f = 0; f < field_specs_.size(); ++f) {
    FieldValue& value = columns[f][context.index];
    const auto field = FieldOf(info, f);
    if (!field) {
      if (!field_specs_[f].optional) return MissingField(info, f);
      value.present = false;
      continue;
    }
    STOKER_RETURN_IF_ERROR(dataset_->ReadFieldInto(info, *field, scratch.encoded, options_.verify_samples && !checked));
    checked = true;
    counters_->bytes.fetch_add(scratch.encoded.size(), std::memory_order_relaxed);
    STOKER_RETURN_IF_ERROR(DecodeField(info, f, *field, scratch.encoded, context, scratch, &value));
  }
  if (!follower_.empty()) STOKER_RETURN_IF_ERROR(Follow(info, columns, context.index, scratch));
  return info.label;
}

Status SampleProducer::Follow(const SampleInfo& info, FieldColumns& columns, std::size_t index,
                              ProducerScratch& scratch) const {
  Status s = follower_.Apply(scratch.image.geometry, columns, index, scratch.target);
  if (s.ok()) return s;
  return s.WithContext(fmt::format("sample '{}' in {}", Printable(info.key), dataset_->shards()[info.shard].path));
}

}  // namespace stoker::pipeline
