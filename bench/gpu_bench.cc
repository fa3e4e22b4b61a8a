// GPU figures for scripts/gpu-check: host-to-device bandwidth from pinned vs
// pageable memory, and the preprocessing kernel's images/s. Prints one JSON
// object; exits 2 where no GPU is usable.
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include <nlohmann/json.hpp>

#include "device/preprocess_cpu.h"
#include "device/runtime.h"

using namespace stoker;

namespace {

double CopyGbPerSecond(device::DeviceRuntime& gpu, void* host, std::size_t bytes, bool async, int reps) {
  auto dst = device::MakeDeviceMemory(gpu, bytes);
  auto stream = device::MakeStream(gpu);
  if (!dst.ok() || !stream.ok()) return 0;
  auto s = static_cast<cudaStream_t>(stream->get());
  (void)cudaMemcpyAsync(dst->get(), host, bytes, cudaMemcpyHostToDevice, s);  // warm up
  (void)cudaStreamSynchronize(s);
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) {
    if (async) {
      (void)cudaMemcpyAsync(dst->get(), host, bytes, cudaMemcpyHostToDevice, s);
    } else {
      (void)cudaMemcpy(dst->get(), host, bytes, cudaMemcpyHostToDevice);
    }
  }
  (void)cudaStreamSynchronize(s);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return static_cast<double>(bytes) * reps / seconds / 1e9;
}

}  // namespace

int main() {
  std::string why;
  device::DeviceRuntime* gpu = device::CudaDeviceRuntime(&why);
  if (gpu == nullptr) {
    std::printf("{\"error\": \"no GPU: %s\"}\n", why.c_str());
    return 2;
  }
  (void)gpu->SetDevice(0);
  nlohmann::json out;
  cudaDeviceProp prop{};
  (void)cudaGetDeviceProperties(&prop, 0);
  out["device"] = prop.name;

  const std::size_t bytes = std::size_t{256} << 20;
  auto pinned = gpu->PinnedAlloc(bytes);
  std::vector<std::byte> pageable(bytes, std::byte{1});
  if (pinned.ok()) {
    device::PinnedMemory owner(gpu, *pinned);
    std::memset(owner.get(), 1, bytes);
    out["h2d_pinned_gb_per_s"] = CopyGbPerSecond(*gpu, owner.get(), bytes, true, 20);
  }
  out["h2d_pageable_gb_per_s"] = CopyGbPerSecond(*gpu, pageable.data(), bytes, false, 20);

  // The kernel: 256 decoded images of about 500x375 (what RandomResizedCrop
  // decodes from ImageNet-sized JPEGs) to 224x224, several output types.
  std::mt19937 rng(1);
  std::vector<device::ImageDesc> images;
  std::vector<std::uint8_t> pixels;
  for (int k = 0; k < 256; ++k) {
    device::ImageDesc d;
    d.width = 400 + static_cast<int>(rng() % 200);
    d.height = 300 + static_cast<int>(rng() % 150);
    d.offset = pixels.size();
    d.x0 = static_cast<float>(rng() % 60);
    d.y0 = static_cast<float>(rng() % 40);
    d.x1 = static_cast<float>(d.width) - static_cast<float>(rng() % 60);
    d.y1 = static_cast<float>(d.height) - static_cast<float>(rng() % 40);
    d.flip = static_cast<int>(rng() & 1);
    images.push_back(d);
    pixels.resize(pixels.size() + static_cast<std::size_t>(d.width) * d.height * 3, 128);
  }
  auto dpixels = device::MakeDeviceMemory(*gpu, pixels.size());
  auto ddescs = device::MakeDeviceMemory(*gpu, images.size() * sizeof(device::ImageDesc));
  auto stream = device::MakeStream(*gpu);
  auto e0 = device::MakeEvent(*gpu, true), e1 = device::MakeEvent(*gpu, true);
  (void)cudaMemcpy(dpixels->get(), pixels.data(), pixels.size(), cudaMemcpyHostToDevice);
  (void)cudaMemcpy(ddescs->get(), images.data(), images.size() * sizeof(device::ImageDesc), cudaMemcpyHostToDevice);
  for (auto [type, name] :
       {std::pair{device::OutputType::kFloat32, "float32"}, std::pair{device::OutputType::kBFloat16, "bfloat16"}}) {
    device::OutputDesc o;
    o.width = o.height = 224;
    o.type = type;
    auto dout = device::MakeDeviceMemory(*gpu, device::OutputImageBytes(o) * images.size());
    auto launch = [&] {
      return gpu->LaunchPreprocess(static_cast<const std::uint8_t*>(dpixels->get()), nullptr,
                                   static_cast<const device::ImageDesc*>(ddescs->get()),
                                   static_cast<std::int32_t>(images.size()), o, dout->get(), stream->get());
    };
    (void)launch();
    (void)gpu->RecordEvent(e0->get(), stream->get());
    constexpr int kReps = 20;
    for (int i = 0; i < kReps; ++i) (void)launch();
    (void)gpu->RecordEvent(e1->get(), stream->get());
    (void)gpu->SynchronizeEvent(e1->get());
    const float ms = *gpu->ElapsedMilliseconds(e0->get(), e1->get());
    out[std::string("preprocess_images_per_s_") + name] = images.size() * kReps / (ms / 1000.0);
  }
  // And the CPU twin on one core, for scale.
  {
    device::OutputDesc o;
    o.width = o.height = 224;
    std::vector<float> host_out(device::OutputImageBytes(o) / 4 * 16);
    const auto start = std::chrono::steady_clock::now();
    device::PreprocessOnCpu(pixels.data(), std::span(images).first(16), o, host_out.data());
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    out["cpu_twin_images_per_s_one_core"] = 16 / s;
  }
  std::printf("%s\n", out.dump().c_str());
  return 0;
}
