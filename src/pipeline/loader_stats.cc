// LoaderStats arithmetic and its one-line summary.
#include <fmt/format.h>

#include "stoker/loader.h"

namespace stoker {

LoaderStats LoaderStats::Since(const LoaderStats& earlier) const {
  LoaderStats d = *this;
  d.batches -= earlier.batches;
  d.samples -= earlier.samples;
  d.bytes_read -= earlier.bytes_read;
  d.corrupt_skipped -= earlier.corrupt_skipped;
  d.wait_seconds -= earlier.wait_seconds;
  d.read_seconds -= earlier.read_seconds;
  d.decode_seconds -= earlier.decode_seconds;
  d.transform_seconds -= earlier.transform_seconds;
  d.read_requests -= earlier.read_requests;
  d.seekable_decodes -= earlier.seekable_decodes;
  d.seekable_fallbacks -= earlier.seekable_fallbacks;
  d.seekable_part_reads -= earlier.seekable_part_reads;
  d.samples_read -= earlier.samples_read;
  d.seekable_part_rereads -= earlier.seekable_part_rereads;
  return d;
}

std::string LoaderStats::Summary(double wall_seconds) const {
  const double busy = read_seconds + decode_seconds + transform_seconds;
  auto pct = [&](double x) { return busy > 0 ? 100.0 * x / busy : 0.0; };
  return fmt::format(
      "{} batches, {} images in {:.2f} s ({:.0f} img/s, {:.1f} MB/s read, {:.1f} KB an image); consumer waited {:.2f} "
      "s ({:.1f}%); "
      "worker time: read {:.0f}%, decode {:.0f}%, transform {:.0f}%; {:.1f} of {} batches ready on average; "
      "{} corrupt skipped; {} read requests ({})",
      batches, samples, wall_seconds, wall_seconds > 0 ? samples / wall_seconds : 0.0,
      wall_seconds > 0 ? bytes_read / wall_seconds / 1e6 : 0.0,
      samples_read > 0 ? static_cast<double>(bytes_read) / static_cast<double>(samples_read) / 1e3 : 0.0, wait_seconds,
      wall_seconds > 0 ? 100.0 * wait_seconds / wall_seconds : 0.0, pct(read_seconds), pct(decode_seconds),
      pct(transform_seconds), mean_ready_batches, prefetch, corrupt_skipped, read_requests,
      read_method.empty() ? "none yet" : read_method);
}

}  // namespace stoker
