// Where the GPU decoder's host work runs (DeviceLoaderOptions::stage_ahead),
// on the fake runtime (tests/device/fake_runtime.h: "device" memory is host
// memory): a stand-in decoder spends --decode-ms of CPU per batch (as
// nvJPEG's hybrid decoder spends on Huffman decoding), the consumer "trains"
// --step-ms per batch, and the consumer's time inside Next() is measured
// with staging off and on. It shows the mechanism, not a GPU's figures.
//
//   stoker_stage_ahead_bench [--batches 200] [--decode-ms 5] [--step-ms 8]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "codec/jpeg.h"
#include "device/device_loader_internal.h"
#include "device/fake_runtime.h"
#include "pipeline/loader_test_util.h"

namespace {

using Clock = std::chrono::steady_clock;

// Decodes with libjpeg-turbo, then spins until `cost` has passed for the batch.
class BusyDecoder final : public stoker::device::DeviceJpegDecoder {
 public:
  explicit BusyDecoder(std::chrono::microseconds cost) : cost_(cost) {}
  std::string name() const override { return "busy stand-in"; }
  stoker::codec::GpuDecodeCaps caps() const override { return {.hardware = true}; }
  stoker::Status DecodeBatch(std::span<const stoker::device::DeviceJpegJob> jobs,
                             stoker::device::StreamHandle stream) override {
    const auto until = Clock::now() + cost_;
    for (const auto& job : jobs) STOKER_RETURN_IF_ERROR(DecodeOne(job, stream));
    while (Clock::now() < until) {
    }
    return stoker::Status::Ok();
  }
  stoker::Status DecodeOne(const stoker::device::DeviceJpegJob& job, stoker::device::StreamHandle) override {
    stoker::codec::DecodedRegion d;
    STOKER_RETURN_IF_ERROR(stoker::codec::DecodeJpeg(job.jpeg, stoker::codec::Roi{}, 1, d));
    std::memcpy(job.out, d.pixels.data(), d.pixels.size());
    return stoker::Status::Ok();
  }

 private:
  std::chrono::microseconds cost_;
};

double MeanMsInNext(std::shared_ptr<const stoker::Dataset> dataset, bool stage, int batches, double decode_ms,
                    double step_ms) {
  stoker::testing::FakeDeviceRuntime fake;
  stoker::LoaderOptions options = stoker::SmallOptions();
  options.threads = 1;
  stoker::DeviceLoaderOptions device;
  device.finish_on_device = device.decode_on_device = true;
  device.stage_ahead = stage;
  device.device_buffers = 3;
  const auto cost = std::chrono::microseconds(static_cast<long>(decode_ms * 1000));
  auto loader = stoker::device::CreateDeviceLoader(
      dataset, options, fake, 0, device, [cost](std::string*) { return std::make_unique<BusyDecoder>(cost); });
  if (!loader.ok()) {
    std::fprintf(stderr, "%s\n", loader.error().ToString().c_str());
    std::exit(1);
  }
  auto consumer = reinterpret_cast<void*>(std::uintptr_t{77});
  double in_next = 0;
  for (int b = 0; b < batches;) {
    const auto t0 = Clock::now();
    auto next = (*loader)->Next(consumer);
    in_next += std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    if (!next.ok()) {
      std::fprintf(stderr, "%s\n", next.error().ToString().c_str());
      std::exit(1);
    }
    if (!next->has_value()) continue;  // the epoch's end: go on into the next
    ++b;
    std::this_thread::sleep_for(std::chrono::microseconds(static_cast<long>(step_ms * 1000)));  // the step
    (void)(*loader)->Release(**next, consumer);
  }
  return in_next / batches;
}

}  // namespace

int main(int argc, char** argv) {
  int batches = 200;
  double decode_ms = 5, step_ms = 8;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--batches") {
      batches = std::atoi(argv[i + 1]);
    } else if (flag == "--decode-ms") {
      decode_ms = std::atof(argv[i + 1]);
    } else if (flag == "--step-ms") {
      step_ms = std::atof(argv[i + 1]);
    } else {
      std::fprintf(stderr, "usage: %s [--batches N] [--decode-ms MS] [--step-ms MS]\n", argv[0]);
      return 2;
    }
  }
  stoker::TempDir dir;
  auto dataset = stoker::MakeDataset(dir);
  std::printf("decoder host work %.1f ms a batch, step %.1f ms, %d batches of 4 (fake runtime)\n", decode_ms, step_ms,
              batches);
  for (bool stage : {false, true})
    std::printf("  stage_ahead=%-5s consumer in Next(): %.2f ms a batch\n", stage ? "true" : "false",
                MeanMsInNext(dataset, stage, batches, decode_ms, step_ms));
  return 0;
}
