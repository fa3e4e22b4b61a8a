// SurveyImages and EstimateMaxSide: what `stoker inspect --images` shows.
// Headers only: the survey reads each JPEG's markers up to its frame header
// and plans its GPU route as the loader would; nothing is decoded.
#include <algorithm>
#include <optional>
#include <string>

#include <fmt/format.h>

#include "codec/jpeg_traits.h"
#include "prepare/jpeg_shrink.h"
#include "stoker/pack.h"

namespace stoker {
namespace {

constexpr std::size_t kUnreadableExamples = 10;

std::string_view ProcessName(codec::JpegProcess p) {
  switch (p) {
    case codec::JpegProcess::kBaseline:
      return "baseline";
    case codec::JpegProcess::kExtended:
      return "extended";
    case codec::JpegProcess::kProgressive:
      return "progressive";
    case codec::JpegProcess::kLossless:
      return "lossless";
    case codec::JpegProcess::kHierarchical:
      return "hierarchical";
    case codec::JpegProcess::kArithmetic:
      return "arithmetic";
  }
  return "unknown";
}

// "baseline 4:2:0", "progressive grey", "baseline CMYK", "extended 4:2:0 12-bit".
std::string Coding(const codec::JpegTraits& t) {
  std::string layout;
  if (t.components == 4) {
    layout = t.adobe_transform == 2 ? "YCCK" : "CMYK";
  } else {
    const std::string_view sampling = codec::Subsampling(t);
    layout = sampling.empty() ? fmt::format("{} components, other sampling", t.components) : std::string(sampling);
  }
  std::string out = fmt::format("{} {}", ProcessName(t.process), layout);
  if (t.precision != 8) out += fmt::format(" {}-bit", t.precision);
  return out;
}

}  // namespace

Result<ImageSurvey> SurveyImages(const Dataset& dataset, std::uint64_t max_images) {
  ImageSurvey survey;
  std::optional<std::size_t> field;
  for (std::string_view name : {"jpg", "jpeg"}) {
    if ((field = dataset.FieldIndex(name))) {
      survey.field = std::string(name);
      break;
    }
  }
  if (!field)
    return Status::InvalidArgument(fmt::format("dataset '{}' has no jpg or jpeg field to survey (its fields: {})",
                                               dataset.index_path(), fmt::join(dataset.field_names(), ", ")));
  survey.samples = dataset.num_samples();
  const std::uint64_t n = std::min(max_images, survey.samples);
  std::vector<std::byte> bytes;
  for (std::uint64_t k = 0; k < n; ++k) {
    // Evenly spread, so a dataset packed class by class is sampled across its classes.
    // floor(k * samples / n) without overflowing k * samples.
    const std::uint64_t i = k * (survey.samples / n) + k * (survey.samples % n) / n;
    STOKER_ASSIGN_OR_RETURN(const SampleInfo info, dataset.Sample(i));
    ++survey.surveyed;
    if (!info.fields[*field]) {
      ++survey.without_image;
      continue;
    }
    STOKER_RETURN_IF_ERROR(dataset.ReadFieldInto(info, *field, bytes, /*verify=*/false));
    const Result<codec::JpegTraits> traits = codec::ReadJpegTraits(bytes);
    if (!traits.ok()) {
      if (survey.unreadable++ < kUnreadableExamples)
        survey.unreadable_examples.push_back(fmt::format("sample '{}' at {}:{}: {}", info.key,
                                                         dataset.shards()[info.shard].path, info.fields[*field]->offset,
                                                         traits.error().message()));
      continue;
    }
    survey.sizes.push_back({static_cast<std::uint32_t>(traits->width), static_cast<std::uint32_t>(traits->height)});
    ++survey.coding[Coding(*traits)];
    const codec::DecodePlan plan = codec::PlanGpuDecode(*traits, {.hardware = true});
    if (plan.route == codec::DecodeRoute::kHardware) {
      ++survey.route_hardware;
    } else if (plan.route == codec::DecodeRoute::kGpu) {
      ++survey.route_gpu;
    } else {
      ++survey.route_cpu[std::string(plan.reason)];
    }
  }
  return survey;
}

MaxSideEffect EstimateMaxSide(const ImageSurvey& survey, std::uint32_t max_side) {
  MaxSideEffect effect;
  effect.max_side = max_side;
  if (survey.sizes.empty()) return effect;
  double before = 0, after = 0;
  std::uint64_t reencoded = 0;
  for (const ImageSurvey::Size& s : survey.sizes) {
    const auto w = static_cast<int>(s.width), h = static_cast<int>(s.height);
    const prepare::Size out = prepare::ShrunkSize(w, h, max_side);
    reencoded += out.width != w || out.height != h;
    before += static_cast<double>(w) * h;
    after += static_cast<double>(out.width) * out.height;
  }
  effect.images_reencoded = static_cast<double>(reencoded) / static_cast<double>(survey.sizes.size());
  effect.pixels_left = before > 0 ? after / before : 1;
  return effect;
}

}  // namespace stoker
