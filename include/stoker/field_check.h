// stoker/field_check.h: decoding a whole dataset's fields once, as the
// loader's typed fields would, to find what would fail mid-epoch
// (`stoker verify --decode`).
#pragma once

#include <cstdint>
#include <functional>

#include "stoker/dataset.h"
#include "stoker/status.h"

namespace stoker {

struct DecodeCheckOptions {
  // Images over this many pixels are refused, as the loader refuses them
  // (LoaderOptions' transform max_pixels).
  std::uint64_t max_pixels = 178'956'970;
  // Decoding threads; 0: one per core.
  unsigned threads = 0;
  // Called now and then from one thread with (samples done, samples); may be empty.
  std::function<void(std::uint64_t, std::uint64_t)> on_progress;
};

struct DecodeCheckReport {
  std::uint64_t samples_checked = 0;
  std::uint64_t fields_decoded = 0;
  // Of those, image fields holding TIFFs no image mode has (multi-band,
  // float, signed samples), decoded as a stoker.Array field reads them.
  std::uint64_t tiffs_decoded_as_arrays = 0;
  // Fields left undecoded: kind bytes (anything goes) or custom.
  std::uint64_t fields_not_decodable = 0;
  std::vector<VerifyProblem> problems;  // one per field that does not decode
  [[nodiscard]] bool ok() const { return problems.empty(); }
};

// Decodes every field of every sample by its kind: the one the index
// records, else the one WebDataset's convention gives its name (images as
// RGB, numbers, .npy arrays, UTF-8 text, JSON; a TIFF image no mode holds
// as its samples). Each field that does not
// decode is a problem naming the sample's key, the field and shard:offset.
// Checksums are not checked here (Verify checks them). A non-OK Status only
// when reading itself fails.
[[nodiscard]] Result<DecodeCheckReport> CheckFieldsDecode(const Dataset& dataset,
                                                          const DecodeCheckOptions& options = {});

}  // namespace stoker
