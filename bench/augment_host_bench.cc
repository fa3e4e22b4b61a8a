// What an augmentation recipe still costs the host when the GPU's
// augmentation kernels run it (gpu_preprocess=True), against the CPU path:
// the worker threads' decode + transform time per image (summed over
// threads, from the loaders' own stats). The device loader runs on the fake
// runtime with a null GPU (its augmentation launch does nothing), so what
// the kernels do is not counted: on a machine with a GPU it runs there,
// asynchronously. The kernels' own time is scripts/gpu-check's `augment`
// part. Recipe: RandomRotation(15, bilinear), RandomResizedCrop(224),
// RandomHorizontalFlip, ColorJitter(0.4, 0.4, 0.4, 0.1), Normalize,
// RandomErasing(value=0).
//
//   stoker_augment_host_bench --data PACKED [--images 2000] [--threads 2]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "device/device_loader_internal.h"
#include "device/fake_runtime.h"
#include "stoker/loader.h"
#include "stoker/open.h"

namespace {

using Clock = std::chrono::steady_clock;

// The fake runtime whose augmentation kernels cost nothing here.
class NullGpu final : public stoker::testing::FakeDeviceRuntime {
 public:
  stoker::Status LaunchAugment(const std::uint8_t*, const std::uint8_t*, const stoker::device::ImageDesc*,
                               const stoker::device::AugmentDesc*, std::int32_t, const stoker::device::OutputDesc&,
                               std::uint8_t*, void*, stoker::device::StreamHandle) override {
    return stoker::Status::Ok();
  }
};

stoker::TransformStep Step(std::string name, std::vector<std::pair<std::string, std::vector<double>>> args,
                           std::vector<std::pair<std::string, std::string>> words = {}) {
  return stoker::TransformStep{std::move(name), std::move(args), std::move(words), {}};
}

stoker::LoaderOptions Recipe(int threads) {
  stoker::LoaderOptions o;
  o.batch_size = 64;
  o.threads = threads;
  o.seed = 1;
  auto& t = o.transform;
  t.width = t.height = 224;
  t.normalize = true;
  t.mean = {0.485f, 0.456f, 0.406f};
  t.std = {0.229f, 0.224f, 0.225f};
  t.before_crop = {Step("RandomRotation", {{"degrees", {15}}}, {{"interpolation", "bilinear"}})};
  t.after_crop = {
      Step("ColorJitter", {{"brightness", {0.4}}, {"contrast", {0.4}}, {"saturation", {0.4}}, {"hue", {0.1}}})};
  t.after_normalize = {Step("RandomErasing", {{"value", {0}}})};
  return o;
}

struct Figures {
  double worker_ms_per_image = 0, images_per_s = 0;
};

template <typename NextFn, typename StatsFn>
Figures Drain(int images, NextFn next, StatsFn stats) {
  int seen = 0;
  const auto start = Clock::now();
  while (seen < images) {
    const int got = next();
    if (got < 0) std::exit(1);
    seen += got;
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  const stoker::LoaderStats s = stats();
  return {1000.0 * (s.decode_seconds + s.transform_seconds) / static_cast<double>(s.samples), seen / seconds};
}

}  // namespace

int main(int argc, char** argv) {
  std::string data;
  int images = 2000, threads = 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--data") {
      data = argv[i + 1];
    } else if (flag == "--images") {
      images = std::atoi(argv[i + 1]);
    } else if (flag == "--threads") {
      threads = std::atoi(argv[i + 1]);
    } else {
      std::fprintf(stderr, "usage: %s --data PACKED [--images N] [--threads N]\n", argv[0]);
      return 2;
    }
  }
  if (data.empty()) {
    std::fprintf(stderr, "usage: %s --data PACKED [--images N] [--threads N]\n", argv[0]);
    return 2;
  }
  auto opened = stoker::OpenDataset(data);
  if (!opened.ok()) {
    std::fprintf(stderr, "%s\n", opened.error().ToString().c_str());
    return 1;
  }
  std::shared_ptr<const stoker::Dataset> dataset = std::move(*opened);
  const stoker::LoaderOptions options = Recipe(threads);

  auto cpu = stoker::Loader::Create(dataset, options);
  if (!cpu.ok()) {
    std::fprintf(stderr, "%s\n", cpu.error().ToString().c_str());
    return 1;
  }
  const Figures on_cpu = Drain(
      images,
      [&]() -> int {
        auto b = (*cpu)->Next();
        if (!b.ok()) {
          std::fprintf(stderr, "%s\n", b.error().ToString().c_str());
          return -1;
        }
        return b->has_value() ? static_cast<int>((*b)->size()) : 0;
      },
      [&] { return (*cpu)->stats(); });

  NullGpu gpu;
  stoker::DeviceLoaderOptions device;
  device.finish_on_device = true;
  device.device_buffers = 3;
  auto loader = stoker::device::CreateDeviceLoader(dataset, options, gpu, 0, device);
  if (!loader.ok()) {
    std::fprintf(stderr, "%s\n", loader.error().ToString().c_str());
    return 1;
  }
  auto consumer = reinterpret_cast<void*>(std::uintptr_t{77});
  const Figures on_gpu = Drain(
      images,
      [&]() -> int {
        auto b = (*loader)->Next(consumer);
        if (!b.ok()) {
          std::fprintf(stderr, "%s\n", b.error().ToString().c_str());
          return -1;
        }
        if (!b->has_value()) return 0;
        const int n = static_cast<int>((*b)->indices.size());
        (void)(*loader)->Release(**b, consumer);
        return n;
      },
      [&] { return (*loader)->loader().stats(); });
  const auto s = (*loader)->stats();
  std::printf(
      "RandomRotation(15, bilinear) + RandomResizedCrop(224) + flip + ColorJitter + Normalize + "
      "RandomErasing, %d images, %d threads\n",
      images, threads);
  std::printf("  CPU path:                      %.2f ms of worker time per image, %.0f images/s\n",
              on_cpu.worker_ms_per_image, on_cpu.images_per_s);
  std::printf(
      "  gpu_preprocess (null GPU):     %.2f ms of worker time per image, %.0f images/s host-bound "
      "(warps on the CPU: %llu, steps on the CPU: %llu, no room: %llu)\n",
      on_gpu.worker_ms_per_image, on_gpu.images_per_s, static_cast<unsigned long long>(s.device_cpu_warps),
      static_cast<unsigned long long>(s.device_cpu_steps), static_cast<unsigned long long>(s.device_fallbacks));
  return 0;
}
