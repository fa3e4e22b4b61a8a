// The consumer's wait at an epoch's boundary against its wait within an
// epoch: a loader over a labels-only dataset of SAMPLES samples (so that
// reading and decoding cost little and the order's making shows), a full
// shuffle, two epochs and a few batches. Making an epoch's order is a pass
// over every sample; made under the loader's lock when scheduling reaches
// the epoch, the workers wait with it, and the consumer waits at the
// boundary; made ahead (pipeline/order_ahead.h), it does not.
//
//   stoker_epoch_boundary_bench DIR SAMPLES [BATCH]
//
// DIR is written (SAMPLES samples, a `cls` each) unless it holds a dataset
// of that size already.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "stoker/dataset.h"
#include "stoker/dataset_writer.h"
#include "stoker/loader.h"

namespace {

using Clock = std::chrono::steady_clock;

int Fail(const stoker::Status& status) {
  fmt::print(stderr, "{}\n", status.ToString());
  return 1;
}

double Ms(Clock::duration d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    fmt::print(stderr, "usage: stoker_epoch_boundary_bench DIR SAMPLES [BATCH]\n");
    return 1;
  }
  const std::string dir = argv[1];
  const std::uint64_t samples = std::strtoull(argv[2], nullptr, 10);
  const std::uint32_t batch = argc > 3 ? static_cast<std::uint32_t>(std::strtoul(argv[3], nullptr, 10)) : 4096;
  auto dataset = stoker::Dataset::Open(dir);
  if (!dataset.ok() || (*dataset)->num_samples() != samples) {
    stoker::DatasetWriterOptions options;
    options.overwrite = true;
    auto writer = stoker::DatasetWriter::Create(dir, options);
    if (!writer.ok()) return Fail(writer.error());
    std::string cls;
    for (std::uint64_t i = 0; i < samples; ++i) {
      const std::string key = fmt::format("{:010d}", i);
      cls = std::to_string(i % 1000);
      const stoker::SampleField fields[] = {{"cls", std::as_bytes(std::span(cls.data(), cls.size()))}};
      if (auto s = (*writer)->Add(key, fields); !s.ok()) return Fail(s);
    }
    if (auto summary = (*writer)->Finish(); !summary.ok()) return Fail(summary.error());
    dataset = stoker::Dataset::Open(dir);
    if (!dataset.ok()) return Fail(dataset.error());
  }
  stoker::LoaderOptions options;
  options.batch_size = batch;
  options.order = stoker::Order::kShuffle;
  stoker::FieldSpec label;
  label.name = "cls";
  label.kind = stoker::FieldKind::kInt;
  label.keys = {"cls"};
  options.fields = {label};
  const auto made = Clock::now();
  auto loader = stoker::Loader::Create(std::shared_ptr<const stoker::Dataset>(std::move(*dataset)), options);
  if (!loader.ok()) return Fail(loader.error());
  fmt::print("{} samples, batches of {}: loader made in {:.0f} ms\n", samples, batch, Ms(Clock::now() - made));

  // Each Next()'s wait, within epoch 0 and around its end.
  std::vector<double> within, boundary;
  const std::uint64_t per_epoch = (*loader)->batches_per_epoch();
  for (std::uint64_t epoch = 0; epoch < 2; ++epoch) {
    std::uint64_t k = 0;
    const auto epoch_start = Clock::now();
    for (;;) {
      const auto asked = Clock::now();
      auto next = (*loader)->Next();
      const double waited = Ms(Clock::now() - asked);
      if (!next.ok()) return Fail(next.error());
      if (!next->has_value()) break;
      // Scheduling runs a few batches ahead of delivery: it reaches epoch 1
      // while epoch 0's last batches are delivered.
      if ((epoch == 0 && k + 8 >= per_epoch) || (epoch == 1 && k < 8)) boundary.push_back(waited);
      if (epoch == 0 && k >= 8 && k + 8 < per_epoch) within.push_back(waited);
      ++k;
    }
    fmt::print("epoch {}: {} batches in {:.2f} s\n", epoch, k, Ms(Clock::now() - epoch_start) / 1000);
  }
  std::sort(within.begin(), within.end());
  const double median = within.empty() ? 0 : within[within.size() / 2];
  const double worst_within = within.empty() ? 0 : within.back();
  fmt::print("wait within epoch 0: median {:.2f} ms, longest {:.1f} ms\n", median, worst_within);
  fmt::print(
      "wait at the boundary (epoch 0's last 8 batches, epoch 1's first 8): longest {:.1f} ms, summed {:.1f} ms\n",
      *std::max_element(boundary.begin(), boundary.end()), std::accumulate(boundary.begin(), boundary.end(), 0.0));
  return 0;
}
