// CheckFieldsDecode: every field of a dataset through the loader's decoders.
#include "stoker/field_check.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <thread>

#include <fmt/format.h>

#include "codec/image_decode.h"
#include "codec/jpeg_restart.h"
#include "core/mutex.h"
#include "pipeline/field_decoders.h"
#include "stoker/text.h"

namespace stoker {
namespace {

constexpr std::uint64_t kSamplesPerRead = 64;

bool Decodable(FieldKind kind) {
  return kind != FieldKind::kBytes && kind != FieldKind::kCustom;
}

}  // namespace

namespace {

// A seekable JPEG's restart table (pack --seekable-jpeg) must be exactly the
// one its markers give; the loader would otherwise decode it whole.
Status CheckRestartTable(const Dataset& dataset, const SampleInfo& info, std::size_t field,
                         std::span<const std::byte> bytes) {
  if (dataset.seekable_payloads() == 0) return Status::Ok();
  std::vector<std::uint32_t> table;
  if (!dataset.RestartTable(info.index, field, table)) return Status::Ok();
  auto found = codec::FindRestartTable(bytes);
  if (!found.ok())
    return Status::Corruption(
        fmt::format("the index has a restart table, but the JPEG's markers give none ({}); the "
                    "loader decodes it whole",
                    found.status().message()));
  if (*found != table)
    return Status::Corruption(
        fmt::format("the index's restart table ({} intervals) disagrees with the JPEG's markers "
                    "({} intervals); the loader decodes it whole",
                    table.size() - 1, found->size() - 1));
  RegionRecord region;
  if (!dataset.RestartTable(info.index, field, table, &region) || region.rows() == 0) return Status::Ok();
  auto layout = codec::ReadScanLayout(bytes);
  if (!layout.ok() || region.geometry.width != static_cast<std::uint32_t>(layout->width) ||
      region.geometry.height != static_cast<std::uint32_t>(layout->height) ||
      region.geometry.mcu_height != static_cast<std::uint32_t>(layout->mcu_height))
    return Status::Corruption(fmt::format(
        "the index's region record gives a {}x{} image of {}-px MCU rows, the JPEG's frame {}; the loader may "
        "read it whole",
        region.geometry.width, region.geometry.height, region.geometry.mcu_height,
        layout.ok() ? fmt::format("{}x{} of {}-px rows", layout->width, layout->height, layout->mcu_height)
                    : std::string(layout.status().message())));
  return dataset.CheckRegionRecord(info, field, bytes);
}

}  // namespace

Result<DecodeCheckReport> CheckFieldsDecode(const Dataset& dataset, const DecodeCheckOptions& options) {
  const auto& names = dataset.field_names();
  std::vector<FieldSpec> specs(names.size());
  for (std::size_t f = 0; f < names.size(); ++f) {
    specs[f].name = names[f];
    specs[f].kind = dataset.recorded_field(f).kind.value_or(ConventionalFieldKind(names[f]));
    specs[f].keys = {names[f]};
  }
  pipeline::FieldDecodeOptions decode_options;
  decode_options.max_pixels = options.max_pixels;

  const std::uint64_t total = dataset.num_samples();
  const unsigned threads =
      std::max(1u, std::min<unsigned>(options.threads ? options.threads : std::thread::hardware_concurrency(),
                                      static_cast<unsigned>((total + kSamplesPerRead - 1) / kSamplesPerRead)));
  std::atomic<std::uint64_t> next{0}, done{0}, decoded{0}, skipped{0}, as_arrays{0};
  Mutex mu;
  DecodeCheckReport report;
  std::vector<std::pair<std::pair<std::uint64_t, std::size_t>, VerifyProblem>> problems;  // by (sample, field)
  Status failure;                                                                         // reading itself failed
  auto work = [&] {
    std::vector<SampleInfo> infos;
    std::vector<Dataset::FieldRead> reads;
    std::vector<std::byte> arena;
    FieldValue value;
    Dataset::ReadFieldsOptions read_options;
    read_options.verify = false;
    for (;;) {
      const std::uint64_t first = next.fetch_add(kSamplesPerRead);
      if (first >= total) return;
      const std::uint64_t last = std::min(total, first + kSamplesPerRead);
      infos.clear();
      reads.clear();
      for (std::uint64_t i = first; i < last; ++i) {
        auto info = dataset.Sample(i);
        if (!info.ok()) {
          MutexLock lock(mu);
          failure = info.error();
          return;
        }
        infos.push_back(std::move(info).value());
      }
      for (const SampleInfo& info : infos)
        for (std::size_t f = 0; f < info.fields.size(); ++f) {
          if (!info.fields[f]) continue;
          if (!Decodable(specs[f].kind)) {
            skipped.fetch_add(1, std::memory_order_relaxed);
            continue;
          }
          reads.push_back({&info, f, {}, {}, false, std::nullopt, {}});
        }
      dataset.ReadFields(reads, arena, read_options);
      std::vector<std::pair<std::pair<std::uint64_t, std::size_t>, VerifyProblem>> found;
      for (const auto& read : reads) {
        const SampleInfo& info = *read.sample;
        const auto where = [&] {
          return fmt::format("{}:{}", dataset.shards()[info.shard].path, info.fields[read.field]->offset);
        };
        if (!read.status.ok()) {
          if (read.status.code() != StatusCode::kCorruption) {
            MutexLock lock(mu);
            failure = read.status;
            return;
          }
          found.push_back({{info.index, read.field}, {where(), std::string(info.key), read.status.message()}});
          continue;
        }
        const FieldSpec& spec = specs[read.field];
        Status s = pipeline::FieldDecoderFor(spec.kind)(read.bytes, spec, decode_options, &value);
        // A TIFF of bands, floats or signed samples is no image, and is what Array fields read.
        if (s.code() == StatusCode::kUnimplemented && spec.kind == FieldKind::kImage &&
            codec::DetectImageFormat(read.bytes) == codec::ImageFormat::kTiff) {
          Status as_array = pipeline::FieldDecoderFor(FieldKind::kArray)(read.bytes, spec, decode_options, &value);
          if (as_array.ok()) as_arrays.fetch_add(1, std::memory_order_relaxed);
          s = as_array;  // its refusal, if any, is the more exact one
        }
        if (!s.ok()) {
          found.push_back({{info.index, read.field},
                           {where(), std::string(info.key),
                            fmt::format("field '{}' ({}) does not decode: {}", Printable(names[read.field]),
                                        FieldKindName(spec.kind), s.message())}});
        } else {
          decoded.fetch_add(1, std::memory_order_relaxed);
          if (Status t = CheckRestartTable(dataset, info, read.field, read.bytes); !t.ok())
            found.push_back({{info.index, read.field},
                             {where(), std::string(info.key),
                              fmt::format("field '{}': {}", Printable(names[read.field]), t.message())}});
        }
      }
      done.fetch_add(last - first);
      MutexLock lock(mu);
      for (auto& p : found) problems.push_back(std::move(p));
    }
  };
  {
    std::vector<std::jthread> workers;
    for (unsigned t = 1; t < threads; ++t) workers.emplace_back(work);
    std::jthread progress;
    if (options.on_progress) {
      progress = std::jthread([&](std::stop_token stop) {
        while (!stop.stop_requested()) {
          options.on_progress(done.load(), total);
          std::this_thread::sleep_for(std::chrono::milliseconds(200));
        }
      });
    }
    work();
    workers.clear();
    if (progress.joinable()) {
      progress.request_stop();
      progress.join();
      options.on_progress(done.load(), total);
    }
  }
  MutexLock lock(mu);
  if (!failure.ok()) return failure;
  // Workers finish out of order: problems in dataset order, as Verify reports them.
  std::sort(problems.begin(), problems.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (auto& p : problems) report.problems.push_back(std::move(p.second));
  report.samples_checked = done.load();
  report.fields_decoded = decoded.load();
  report.fields_not_decodable = skipped.load();
  report.tiffs_decoded_as_arrays = as_arrays.load();
  return report;
}

}  // namespace stoker
