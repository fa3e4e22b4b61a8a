// `stoker pack|index|merge|inspect`: making datasets and looking at them.
#include <algorithm>
#include <filesystem>
#include <optional>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "stoker/byte_size.h"
#include "stoker/decode.h"
#include "stoker/fields.h"
#include "stoker/merge.h"
#include "stoker/pack.h"
#include "stoker/progress.h"
#include "stoker/remote.h"
#include "stoker/text.h"

namespace stoker_cli {

using stoker::Printable;

namespace {

// A .parquet or .arrow file or pattern, or a folder of such files (a
// Hugging Face save_to_disk folder) and no sub-folders or shards.
bool NamesParquet(const std::string& source) {
  if (source.ends_with(".parquet") || source.ends_with(".arrow")) return true;
  std::error_code ec;
  if (!std::filesystem::is_directory(source, ec)) return false;
  if (std::filesystem::exists(std::filesystem::path(source) / "dataset_dict.json", ec))
    return true;  // a Hugging Face DatasetDict's save_to_disk: the Python side names its splits
  bool parquet = false;
  for (const auto& entry : std::filesystem::directory_iterator(source, ec)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_directory(ec) || name.ends_with(".tar")) return false;
    parquet = parquet || name.ends_with(".parquet") || name.ends_with(".arrow");
  }
  return parquet;
}

// pack and index --keep-bad-images: how many were kept, and the first few.
void WarnOfKeptBadImages(std::uint64_t kept, const std::vector<std::string>& named) {
  if (kept == 0) return;
  std::string listed;
  for (const auto& n : named) listed += fmt::format("\n  {}", Printable(n));
  Warn(
      fmt::format("kept {} that the loader cannot decode, as {} (--keep-bad-images); reading {} fails unless the "
                  "loader skips corrupt samples (on_corrupt=\"skip\"){}{}",
                  stoker::Counted(kept, "image", "images"), kept == 1 ? "it was" : "they were",
                  kept == 1 ? "it" : "them", kept > named.size() ? "; the first by key:" : ":", listed));
}

}  // namespace

int RunPack(const PackArgs& args) {
  if (NamesParquet(args.source)) return RunPackParquet(args);
  const std::string& source = args.source;
  const std::string& out = args.out;
  auto target = stoker::ParseByteSize(args.shard_size);
  if (!target.ok()) return Fail(target.error().WithContext("--shard-size"));
  stoker::PackOptions options;
  options.target_shard_bytes = *target;
  options.threads = args.threads;
  options.overwrite = args.force;
  options.max_side = args.max_side;
  options.quality = args.quality;
  options.shuffle = args.shuffle_seed.has_value();
  options.shuffle_seed = args.shuffle_seed.value_or(0);
  options.file_columns = args.file_columns;
  options.seekable_jpeg = args.seekable_jpeg;
  options.keep_bad_images = args.keep_bad_images;
  const std::uint32_t max_side = args.max_side;
  const int quality = args.quality;
  std::optional<stoker::ProgressBar> bar;
  options.on_progress = [&](const stoker::PackProgress& p) {
    if (!bar) bar.emplace("pack", "samples", p.samples_total);
    bar->Update(p.samples_done, p.bytes_done);
  };
  auto summary = stoker::Pack(source, out, options);
  if (bar) bar->Finish();
  if (!summary.ok()) return Fail(summary.error());
  for (const auto& w : summary->warnings) Warn(w);
  WarnOfKeptBadImages(summary->bad_images_kept, summary->bad_images_named);
  fmt::print("packed {} into {} ({}; payload {}) in {}\n", stoker::Counted(summary->samples, "sample", "samples"),
             stoker::Counted(summary->shards, "shard", "shards"), stoker::FormatBytes(summary->shard_bytes),
             stoker::FormatBytes(summary->payload_bytes), Printable(out));
  if (!summary->class_names.empty())
    fmt::print("labels: {}, from the sorted class names\n",
               stoker::Counted(summary->class_names.size(), "class", "classes"));
  if (max_side > 0)
    fmt::print("re-encoded {} JPEGs over {} px at quality {}: {} -> {}\n", summary->images_reencoded, max_side, quality,
               stoker::FormatBytes(summary->reencoded_bytes_before),
               stoker::FormatBytes(summary->reencoded_bytes_after));
  if (args.seekable_jpeg) {
    const double before = static_cast<double>(summary->seekable_bytes_before);
    const double change =
        before > 0 ? 100.0 * (static_cast<double>(summary->seekable_bytes_after) - before) / before : 0;
    fmt::print(
        "seekable JPEGs: {} re-written losslessly with restart intervals ({} -> {}, {:+.1f}%), {} kept as they "
        "were (progressive, arithmetic, CMYK or not decodable; `stoker inspect` counts them)\n",
        summary->seekable_jpegs, stoker::FormatBytes(summary->seekable_bytes_before),
        stoker::FormatBytes(summary->seekable_bytes_after), change, summary->seekable_kept);
  }
  fmt::print("index: {}\n", Printable(summary->index_path));
  return kExitOk;
}

int RunIndex(const std::vector<std::string>& shards, const std::string& output, bool force, bool keep_bad_images) {
  stoker::IndexOptions options;
  options.output = output;
  options.overwrite = force;
  options.keep_bad_images = keep_bad_images;
  std::optional<stoker::ProgressBar> bar;
  options.on_progress = [&](std::uint64_t done, std::uint64_t total) {
    if (!bar) bar.emplace("index", "shards", total);
    bar->Update(done, 0);
  };
  auto summary = stoker::IndexShards(shards, options);
  if (bar) bar->Finish();
  if (!summary.ok()) return Fail(summary.error());
  for (const auto& w : summary->warnings) Warn(w);
  WarnOfKeptBadImages(summary->bad_images_kept, summary->bad_images_named);
  fmt::print("indexed {} in {} ({})", stoker::Counted(summary->samples, "sample", "samples"),
             stoker::Counted(summary->shards, "shard", "shards"), stoker::FormatBytes(summary->shard_bytes));
  if (summary->skipped_members)
    fmt::print("; left out {} as WebDataset does (no extension, links, folders, __*__)",
               stoker::Counted(summary->skipped_members, "member", "members"));
  if (summary->seekable_payloads)
    fmt::print(
        "; {} restart intervals: their restart tables are indexed (seekable)",
        summary->seekable_payloads == 1 ? "1 JPEG has" : fmt::format("{} JPEGs have", summary->seekable_payloads));
  fmt::print("\nindex: {}\n", Printable(summary->index_path));
  return kExitOk;
}

int RunMerge(const std::vector<std::string>& parts, const std::string& output, bool force) {
  stoker::MergeOptions options;
  options.overwrite = force;
  std::optional<stoker::ProgressBar> bar, write_bar;
  if (parts.size() >= 100)  // merging reads indexes only: a bar for many of them
    options.on_progress = [&](std::uint64_t done, std::uint64_t total) {
      if (!bar) bar.emplace("merge", "parts", total);
      bar->Update(done, 0);
    };
  options.on_write_progress = [&](std::uint64_t written, std::uint64_t total) {
    if (!write_bar && total < (std::uint64_t{64} << 20)) return;  // a small index is written at once
    if (bar) bar->Finish();
    if (!write_bar) write_bar.emplace("index", "MiB", total >> 20);
    write_bar->Update(written >> 20, 0);
  };
  auto summary = stoker::MergeDatasets(parts, output, options);
  if (bar) bar->Finish();
  if (write_bar) write_bar->Finish();
  if (!summary.ok()) return Fail(summary.error());
  fmt::print("merged {}: {} in {} ({})", stoker::Counted(summary->parts, "part", "parts"),
             stoker::Counted(summary->samples, "sample", "samples"),
             stoker::Counted(summary->shards, "shard", "shards"), stoker::FormatBytes(summary->shard_bytes));
  if (!summary->class_names.empty())
    fmt::print(", {}", stoker::Counted(summary->class_names.size(), "class", "classes"));
  if (summary->seekable_payloads) fmt::print(", {} seekable JPEGs", summary->seekable_payloads);
  fmt::print("\nindex: {}\n", Printable(summary->index_path));
  return kExitOk;
}

namespace {

// pack --max-side values worth showing: those that re-encode something.
constexpr std::uint32_t kMaxSideCandidates[] = {256, 320, 400, 512, 768, 1024};

std::uint32_t LongestSidePercentile(const std::vector<std::uint32_t>& sorted, double p) {
  if (sorted.empty()) return 0;
  const auto at = static_cast<std::size_t>(p * static_cast<double>(sorted.size() - 1) + 0.5);
  return sorted[std::min(at, sorted.size() - 1)];
}

std::vector<std::uint32_t> SortedLongestSides(const stoker::ImageSurvey& survey) {
  std::vector<std::uint32_t> sides;
  for (const auto& size : survey.sizes) sides.push_back(std::max(size.width, size.height));
  std::sort(sides.begin(), sides.end());
  return sides;
}

nlohmann::json SurveyJson(const stoker::ImageSurvey& v) {
  nlohmann::json out;
  out["field"] = v.field;
  out["surveyed"] = v.surveyed;
  out["without_image"] = v.without_image;
  out["jpeg_headers_read"] = v.sizes.size();
  const auto sides = SortedLongestSides(v);
  out["longest_side"] = {{"p10", LongestSidePercentile(sides, 0.1)},
                         {"p50", LongestSidePercentile(sides, 0.5)},
                         {"p90", LongestSidePercentile(sides, 0.9)},
                         {"max", sides.empty() ? 0u : sides.back()}};
  out["max_side"] = nlohmann::json::array();
  for (std::uint32_t n : kMaxSideCandidates) {
    const stoker::MaxSideEffect e = stoker::EstimateMaxSide(v, n);
    out["max_side"].push_back(
        {{"max_side", n}, {"images_reencoded", e.images_reencoded}, {"pixels_left", e.pixels_left}});
  }
  out["coding"] = v.coding;
  out["gpu_decode_route"] = {{"hardware", v.route_hardware}, {"gpu", v.route_gpu}, {"cpu", v.route_cpu}};
  out["unreadable"] = v.unreadable;
  out["unreadable_examples"] = v.unreadable_examples;
  return out;
}

void PrintSurvey(const stoker::ImageSurvey& v) {
  fmt::print("images   {} of {} surveyed (field {}; headers read, nothing decoded)\n", v.surveyed,
             stoker::Counted(v.samples, "sample", "samples"), v.field);
  if (v.without_image)
    fmt::print("  without {:<6} {}\n", v.field, stoker::Counted(v.without_image, "sample", "samples"));
  if (v.unreadable) {
    fmt::print("  unreadable     {} that {} not JPEG (`stoker verify` checks every sample), the first:\n",
               stoker::Counted(v.unreadable, "header", "headers"), v.unreadable == 1 ? "is" : "are");
    for (const auto& e : v.unreadable_examples) fmt::print("    {}\n", Printable(e));
  }
  if (v.sizes.empty()) return;
  const auto sides = SortedLongestSides(v);
  double pixels = 0;
  for (const auto& size : v.sizes) pixels += static_cast<double>(size.width) * size.height;
  fmt::print("  longest side   p10 {}  p50 {}  p90 {}  max {} px; {:.2f} Mpx on average\n",
             LongestSidePercentile(sides, 0.1), LongestSidePercentile(sides, 0.5), LongestSidePercentile(sides, 0.9),
             sides.back(), pixels / static_cast<double>(v.sizes.size()) / 1e6);
  bool any = false;
  for (std::uint32_t n : kMaxSideCandidates) {
    const stoker::MaxSideEffect e = stoker::EstimateMaxSide(v, n);
    if (e.images_reencoded == 0) continue;
    any = true;
    fmt::print("  --max-side {:<4} re-encodes {:.0f}% of them; {:.0f}% of the pixels to decode left\n", n,
               100 * e.images_reencoded, 100 * e.pixels_left);
  }
  if (!any)
    fmt::print("  --max-side     nothing to re-encode: every image is {} px or less on its longest side\n",
               sides.back());
  std::vector<std::string> coding;
  for (const auto& [name, count] : v.coding) coding.push_back(fmt::format("{} {}", name, count));
  fmt::print("  coding         {}\n", fmt::join(coding, ", "));
  std::uint64_t on_cpu = 0;
  std::vector<std::string> reasons;
  for (const auto& [reason, count] : v.route_cpu) {
    on_cpu += count;
    reasons.push_back(fmt::format("{} {}", reason, count));
  }
  fmt::print(
      "  decode=\"gpu\"   on A100/H100/H200: {} to the hardware decoder, {} to nvJPEG's GPU decoder, {} to the "
      "CPU{}\n",
      v.route_hardware, v.route_gpu, on_cpu, reasons.empty() ? "" : fmt::format(" ({})", fmt::join(reasons, ", ")));
}

void PrintLabels(const stoker::DatasetSummary& s) {
  if (s.label_counts.empty()) {
    fmt::print("labels   none\n");
    return;
  }
  std::uint64_t lo = UINT64_MAX, hi = 0;
  for (const auto& [label, count] : s.label_counts) {
    lo = std::min(lo, count);
    hi = std::max(hi, count);
  }
  fmt::print("labels   {}, {}..{} samples per class, {} unlabelled{}\n",
             stoker::Counted(s.label_counts.size(), "class", "classes"), lo, hi, s.unlabelled,
             s.class_names.empty() ? "" : "; class names kept by pack");
  std::size_t shown = 0;
  for (const auto& [label, count] : s.label_counts) {
    if (shown++ == 20) {
      fmt::print("  ... ({} more; --json lists all)\n", s.label_counts.size() - 20);
      break;
    }
    const bool named = label >= 0 && static_cast<std::uint64_t>(label) < s.class_names.size();
    const std::string bar(std::max<std::uint64_t>(1, count * 40 / hi), '#');
    if (named) {
      fmt::print("  {:>6}: {:>8} {:<40}  {}\n", label, count, bar,
                 Printable(s.class_names[static_cast<std::size_t>(label)]));
    } else {
      fmt::print("  {:>6}: {:>8} {}\n", label, count, bar);
    }
  }
}

// For an image field of TIFFs no image mode holds (bands, floats, signed
// samples): its first sample's array, as stoker.Array decodes it. Looked
// for among the first 1,000 samples; nullopt for other fields.
std::optional<stoker::HostTensor> TiffArrayOf(const stoker::Dataset& dataset, std::size_t field) {
  if (!stoker::IsTiffKey(dataset.field_names()[field])) return std::nullopt;
  for (std::uint64_t i = 0; i < std::min<std::uint64_t>(dataset.num_samples(), 1000); ++i) {
    auto info = dataset.Sample(i);
    if (!info.ok()) return std::nullopt;
    if (!info->fields[field]) continue;
    auto bytes = dataset.ReadField(i, field, /*verify=*/false);
    if (!bytes.ok()) return std::nullopt;
    auto image = stoker::DecodeImage(*bytes, "RGB");
    if (image.ok() || image.error().code() != stoker::StatusCode::kUnimplemented) return std::nullopt;
    auto array = stoker::DecodeArray(*bytes);
    if (!array.ok()) return std::nullopt;
    return std::move(*array);
  }
  return std::nullopt;
}

}  // namespace

stoker::Status NotTokensEither(const std::string& location, const stoker::Status& error) {
  if (!stoker::IsRemoteLocation(location) || error.code() != stoker::StatusCode::kNotFound) return error;
  return stoker::Status::NotFound(error.message() + "; nor a Megatron token dataset's prefix (no " + location +
                                  ".idx there)");
}

int RunInspect(const std::string& location, const RemoteArgs& remote, bool json, std::uint64_t images,
               std::uint64_t seq_len) {
  if (auto prefix = TokenPrefixFor(location, stoker::Status::Ok(), remote))
    return RunInspectTokens(*prefix, remote, json, seq_len);
  auto dataset = Open(location, remote);
  if (!dataset.ok()) {
    if (auto prefix = TokenPrefixFor(location, dataset.error(), remote))
      return RunInspectTokens(*prefix, remote, json, seq_len);
    return Fail(NotTokensEither(location, dataset.error()));
  }
  auto summary = stoker::Summarize(**dataset);
  if (!summary.ok()) return Fail(summary.error());
  const auto& s = *summary;
  std::optional<stoker::ImageSurvey> survey;
  if (images > 0) {
    auto surveyed = stoker::SurveyImages(**dataset, images);
    if (!surveyed.ok()) return Fail(surveyed.error());
    survey = std::move(*surveyed);
  }
  if (json) {
    nlohmann::json out;
    out["index"] = (*dataset)->index_path();
    out["samples"] = s.num_samples;
    out["shards"] = s.num_shards;
    out["shard_bytes"] = s.shard_bytes;
    out["skipped_members"] = s.skipped_members;
    // What pack did to the samples (--max-side), as the index records it.
    out["pack"] = s.pack_note.empty() ? nlohmann::json(nullptr)
                                      : nlohmann::json::parse(s.pack_note, nullptr, /*allow_exceptions=*/false);
    out["seekable_payloads"] = s.seekable_payloads;
    out["region_records"] = s.region_records;
    out["field_names"] = (*dataset)->field_names();
    out["fields"] = nlohmann::json::array();
    for (std::size_t i = 0; i < s.fields.size(); ++i) {
      const auto& f = s.fields[i];
      nlohmann::json entry = {{"name", f.name},
                              {"kind", std::string(stoker::FieldKindName(f.kind))},
                              {"kind_recorded", f.kind_recorded},
                              {"samples", f.samples},
                              {"bytes", f.bytes}};
      if (f.kind == stoker::FieldKind::kImage)
        if (auto array = TiffArrayOf(**dataset, i))
          entry["tiff_arrays"] = {{"first_shape", array->shape},
                                  {"dtype", std::string(stoker::ElementTypeName(array->type))}};
      out["fields"].push_back(std::move(entry));
    }
    nlohmann::json labels = nlohmann::json::object();
    for (const auto& [label, count] : s.label_counts) labels[std::to_string(label)] = count;
    out["labels"] = labels;
    out["num_classes"] = s.label_counts.size();
    out["class_names"] = s.class_names;
    out["unlabelled"] = s.unlabelled;
    out["shard_list"] = nlohmann::json::array();
    for (const auto& shard : (*dataset)->shards())
      out["shard_list"].push_back({{"path", shard.path}, {"bytes", shard.size}, {"samples", shard.num_samples}});
    if (survey) out["images"] = SurveyJson(*survey);
    // Invalid UTF-8 in a key or path is replaced, not an exception.
    fmt::print("{}\n", out.dump(2, ' ', false, nlohmann::json::error_handler_t::replace));
    return kExitOk;
  }
  fmt::print("dataset  {}\n", Printable((*dataset)->index_path()));
  fmt::print("samples  {}\n", s.num_samples);
  fmt::print("shards   {} ({})\n", s.num_shards, stoker::FormatBytes(s.shard_bytes));
  if (s.skipped_members)
    fmt::print("skipped  {} tar members left out as WebDataset does (no extension, links, folders, __*__)\n",
               s.skipped_members);
  bool seekable_shown = false;   // by pack's note
  std::string bad_images_shown;  // pack --keep-bad-images's, after what pack changed
  if (!s.pack_note.empty()) {
    // A note that is not the JSON pack writes is shown as it is.
    const auto note = nlohmann::json::parse(s.pack_note, nullptr, /*allow_exceptions=*/false);
    // The index is input: a member of another type reads as absent, never as an exception.
    auto num = [&](const char* key) -> std::optional<std::uint64_t> {
      if (!note.is_object() || !note.contains(key) || !note[key].is_number_unsigned()) return std::nullopt;
      return note[key].get<std::uint64_t>();
    };
    const auto max_side = num("max_side"), quality = num("quality"), reencoded = num("images_reencoded"),
               kept = num("images_kept"), before = num("reencoded_bytes_before"), after = num("reencoded_bytes_after");
    bool shown = false;
    if (max_side && quality && reencoded && kept && before && after) {
      fmt::print(
          "packed   images over {} px re-encoded at quality {} ({} of {} JPEGs; {} -> {}; EXIF orientation "
          "applied)\n",
          *max_side, *quality, *reencoded, *reencoded + *kept, stoker::FormatBytes(*before),
          stoker::FormatBytes(*after));
      shown = true;
    }
    if (note.is_object() && note.contains("seekable_jpeg") && note["seekable_jpeg"].is_object()) {
      const auto& seek = note["seekable_jpeg"];
      auto count = [&](const char* key) -> std::uint64_t {
        return seek.contains(key) && seek[key].is_number_unsigned() ? seek[key].get<std::uint64_t>() : 0;
      };
      const std::uint64_t kept_total = count("kept_progressive") + count("kept_arithmetic") + count("kept_cmyk") +
                                       count("kept_undecodable") + count("kept_other");
      const double b = static_cast<double>(count("rewritten_bytes_before"));
      const double a = static_cast<double>(count("rewritten_bytes_after"));
      fmt::print(
          "seekable {} of {} JPEGs re-written with restart intervals, lossless ({} -> {}, {:+.1f}%; {} restart tables "
          "in the index); kept as they were: {} progressive, {} arithmetic, {} CMYK, {} not decodable, {} other\n",
          count("images_rewritten"), count("images_rewritten") + kept_total,
          stoker::FormatBytes(count("rewritten_bytes_before")), stoker::FormatBytes(count("rewritten_bytes_after")),
          b > 0 ? 100 * (a - b) / b : 0.0, s.seekable_payloads, count("kept_progressive"), count("kept_arithmetic"),
          count("kept_cmyk"), count("kept_undecodable"), count("kept_other"));
      shown = seekable_shown = true;
    }
    if (note.is_object() && note.contains("bad_images") && note["bad_images"].is_object()) {
      const auto& bad = note["bad_images"];
      const std::uint64_t bad_kept =
          bad.contains("kept") && bad["kept"].is_number_unsigned() ? bad["kept"].get<std::uint64_t>() : 0;
      bad_images_shown = fmt::format("bad      {} kept as {} that the loader cannot decode (keep_bad_images){}\n",
                                     stoker::Counted(bad_kept, "image", "images"),
                                     bad_kept == 1 ? "it was" : "they were", bad_kept > 0 ? ":" : "");
      const bool named = bad.contains("named") && bad["named"].is_object();
      if (named)
        for (const auto& [name, why] : bad["named"].items())
          bad_images_shown +=
              fmt::format("  {}: {}\n", Printable(name), why.is_string() ? Printable(why.get<std::string>()) : "?");
      if (named && bad["named"].size() < bad_kept)
        bad_images_shown += fmt::format("  ... and {} more\n", bad_kept - bad["named"].size());
      shown = true;
    }
    if (note.is_object() && note.contains("merged") && note["merged"].is_object()) {
      const auto& merged = note["merged"];
      const std::uint64_t parts =
          merged.contains("parts") && merged["parts"].is_number_unsigned() ? merged["parts"].get<std::uint64_t>() : 0;
      fmt::print("merged   from {} parts written apart (stoker merge){}\n", parts,
                 merged.contains("differing") ? "; what their notes say differently: inspect --json" : "");
      shown = true;
    }
    // The class names are shown with the labels.
    if (note.is_object() && (note.contains("classes") || note.contains("classes_omitted"))) shown = true;
    if (!shown) fmt::print("packed   {}\n", Printable(s.pack_note));
  }
  if (s.seekable_payloads > 0 && !seekable_shown)
    fmt::print("seekable {} JPEGs carry restart tables in the index (written with restart intervals elsewhere)\n",
               s.seekable_payloads);
  if (s.seekable_payloads > 0)
    fmt::print("{}",
               s.region_records
                   ? "         a random crop reads only the MCU rows it covers (region records: index version 7)\n"
                   : "         a random crop reads the whole JPEG: the index (before version 7) has no region "
                     "records; `stoker index` over its shards rewrites it so that crops read only their rows\n");
  fmt::print("{}", bad_images_shown);
  const bool any_by_convention =
      std::any_of(s.fields.begin(), s.fields.end(), [](const auto& f) { return !f.kind_recorded; });
  fmt::print("fields   (kind: {}; the loader's fields= decodes it so)\n",
             any_by_convention ? "* by WebDataset's naming convention, an index from before kinds were recorded"
                               : "as the index records it");
  for (std::size_t i = 0; i < s.fields.size(); ++i) {
    const auto& f = s.fields[i];
    const std::string missing = f.samples < s.num_samples
                                    ? fmt::format("  ({} {} it)", s.num_samples - f.samples,
                                                  s.num_samples - f.samples == 1 ? "sample lacks" : "samples lack")
                                    : "";
    fmt::print("  {:<16} {:<6}{} {:>10} {:<7}  {:>10}{}\n", Printable(f.name), stoker::FieldKindName(f.kind),
               f.kind_recorded ? " " : "*", f.samples, f.samples == 1 ? "sample" : "samples",
               stoker::FormatBytes(f.bytes), missing);
    if (f.kind != stoker::FieldKind::kImage) continue;
    if (auto array = TiffArrayOf(**dataset, i))
      fmt::print("  {:<16} TIFFs no image mode holds (the first: [{}] {}): read them with stoker.Array(key=\"{}\")\n",
                 "", fmt::join(array->shape, ", "), stoker::ElementTypeName(array->type), Printable(f.name));
  }
  PrintLabels(s);
  if (survey) PrintSurvey(*survey);
  return kExitOk;
}

}  // namespace stoker_cli
