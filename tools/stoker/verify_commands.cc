// `stoker verify|ls`: checking a dataset's every byte (and with --decode
// every field) and listing its samples.
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "stoker/byte_size.h"
#include "stoker/field_check.h"
#include "stoker/progress.h"
#include "stoker/remote.h"
#include "stoker/text.h"

namespace stoker_cli {

using stoker::Printable;

int RunVerify(const std::string& location, const RemoteArgs& remote, bool json, bool decode,
              const TokenVerifyArgs& tokens) {
  if (auto prefix = TokenPrefixFor(location, stoker::Status::Ok(), remote))
    return RunVerifyTokens(*prefix, remote, json, tokens);
  auto dataset = Open(location, remote);
  if (!dataset.ok()) {
    if (auto prefix = TokenPrefixFor(location, dataset.error(), remote))
      return RunVerifyTokens(*prefix, remote, json, tokens);
    return Fail(NotTokensEither(location, dataset.error()));
  }
  if (tokens.vocab_size != 0 || tokens.eos)
    return Fail(stoker::Status::InvalidArgument("--vocab-size and --eos are for Megatron token datasets"));
  std::optional<stoker::ProgressBar> bar;
  stoker::VerifyOptions options;
  options.on_progress = [&](std::uint64_t shards, std::uint64_t bytes) {
    if (!bar) bar.emplace("verify", "shards", (*dataset)->shards().size());
    bar->Update(shards, bytes);
  };
  auto report = stoker::Verify(**dataset, options);
  if (bar) bar->Finish();
  if (!report.ok()) return Fail(report.error());
  std::optional<stoker::DecodeCheckReport> decoded;
  if (decode) {
    std::optional<stoker::ProgressBar> decode_bar;
    stoker::DecodeCheckOptions decode_options;
    decode_options.on_progress = [&](std::uint64_t done, std::uint64_t total) {
      if (!decode_bar) decode_bar.emplace("decode", "samples", total);
      decode_bar->Update(done, 0);
    };
    auto checked = stoker::CheckFieldsDecode(**dataset, decode_options);
    if (decode_bar) decode_bar->Finish();
    if (!checked.ok()) return Fail(checked.error());
    decoded = std::move(*checked);
    for (auto& p : decoded->problems) report->problems.push_back(std::move(p));
  }
  if (json) {
    nlohmann::json out;
    out["ok"] = report->ok();
    out["samples_checked"] = report->samples_checked;
    out["shards_checked"] = report->shards_checked;
    out["bytes_checked"] = report->bytes_checked;
    if (decoded)
      out["decode"] = {{"samples_checked", decoded->samples_checked},
                       {"fields_decoded", decoded->fields_decoded},
                       {"fields_not_decodable", decoded->fields_not_decodable},
                       {"tiffs_decoded_as_arrays", decoded->tiffs_decoded_as_arrays}};
    out["bad_images_kept"] = (*dataset)->bad_images_kept();
    out["problems"] = nlohmann::json::array();
    for (const auto& p : report->problems)
      out["problems"].push_back({{"where", p.where}, {"key", p.key}, {"message", p.message}});
    fmt::print("{}\n", out.dump(2, ' ', false, nlohmann::json::error_handler_t::replace));
  } else {
    for (const auto& p : report->problems) {
      if (p.key.empty())
        fmt::print(stderr, "CORRUPT {}: {}\n", Printable(p.where), Printable(p.message));
      else
        fmt::print(stderr, "CORRUPT {} sample '{}': {}\n", Printable(p.where), Printable(p.key), Printable(p.message));
    }
    const std::string decode_note =
        decoded ? fmt::format("; decoded {} fields ({}{} of kind bytes or custom left as they are)",
                              decoded->fields_decoded,
                              decoded->tiffs_decoded_as_arrays
                                  ? fmt::format("{} TIFFs of samples no image mode holds as arrays, stoker.Array "
                                                "reads them; ",
                                                decoded->tiffs_decoded_as_arrays)
                                  : std::string(),
                              decoded->fields_not_decodable)
                : "";
    fmt::print("{}: checked {} in {} ({}){}: {}\n", Printable((*dataset)->index_path()),
               stoker::Counted(report->samples_checked, "sample", "samples"),
               stoker::Counted(report->shards_checked, "shard", "shards"), stoker::FormatBytes(report->bytes_checked),
               decode_note, report->ok() ? "OK" : stoker::Counted(report->problems.size(), "problem", "problems"));
    // The bytes are as written, but some were written knowing the loader cannot decode them: say so.
    if (const std::uint64_t kept = (*dataset)->bad_images_kept(); kept > 0 && !decoded)
      fmt::print(stderr,
                 "stoker: note: the index records {} kept as written by keep_bad_images ({}{}), which the loader "
                 "cannot decode; `stoker verify --decode` names each\n",
                 stoker::Counted(kept, "image", "images"),
                 kept == 1 ? "" : "the first: ", Printable((*dataset)->first_bad_image()));
  }
  return report->ok() ? kExitOk : kExitError;
}

// One line per sample: key, shard:offset, label, fields (or JSON Lines).
// Keys and paths print escaped (\n, \t, ...), so each sample is one line.
int RunList(const std::string& location, const RemoteArgs& remote, bool json) {
  if (auto prefix = TokenPrefixFor(location, stoker::Status::Ok(), remote))
    return Fail(stoker::Status::InvalidArgument(
        fmt::format("{} is a Megatron token dataset: `stoker inspect {}` summarises its documents and tokens (ls "
                    "lists a packed dataset's samples)",
                    Printable(*prefix), Printable(location))));
  auto dataset = Open(location, remote);
  if (!dataset.ok()) return Fail(dataset.error());
  const auto& d = **dataset;
  for (std::uint64_t i = 0; i < d.num_samples(); ++i) {
    auto info = d.Sample(i);
    if (!info.ok()) return Fail(info.error());
    std::vector<std::string> fields;
    std::uint64_t first = UINT64_MAX;
    nlohmann::json field_json = nlohmann::json::object();
    for (std::size_t f = 0; f < info->fields.size(); ++f) {
      if (!info->fields[f]) continue;
      fields.push_back(Printable(d.field_names()[f]));
      first = std::min(first, info->fields[f]->offset);
      field_json[d.field_names()[f]] = {{"offset", info->fields[f]->offset}, {"size", info->fields[f]->size}};
    }
    const std::string& shard = d.shards()[info->shard].path;
    if (json) {
      nlohmann::json line = {{"index", i}, {"key", info->key}, {"shard", shard}, {"fields", field_json}};
      line["label"] = info->label == stoker::kNoLabel ? nlohmann::json() : nlohmann::json(info->label);
      fmt::print("{}\n", line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
    } else {
      std::string label = info->label == stoker::kNoLabel ? "-" : std::to_string(info->label);
      fmt::print("{}\t{}:{}\t{}\t{}\n", Printable(info->key), Printable(shard), first, label, fmt::join(fields, ","));
    }
  }
  return kExitOk;
}

}  // namespace stoker_cli
