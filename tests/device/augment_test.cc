// The augmentation kernels' CPU twin (device/augment_math.h) against the CPU
// path's own steps: warps evaluated per pixel equal Pillow's engines
// (transform/warp.cc) pixel for pixel, colour ops equal transform/color.cc,
// and the final write flips, normalises and erases; then the device loader
// over the fake runtime against the CPU loader on an augmentation recipe.
#include <cmath>
#include <cstdio>

#include <gtest/gtest.h>

#include "core/rng.h"
#include "device/augment_plan.h"
#include "device/device_loader_internal.h"
#include "device/preprocess_cpu.h"
#include "device_loader_test_util.h"
#include "fake_runtime.h"
#include "pipeline/loader_test_util.h"
#include "stoker/device_loader.h"
#include "transform/color.h"
#include "transform/step.h"
#include "transform/warp.h"

namespace stoker {
namespace {

TransformStep KernelStepOf(std::string name, std::vector<std::pair<std::string, std::vector<double>>> args = {},
                           std::vector<std::pair<std::string, std::string>> words = {}) {
  return TransformStep{std::move(name), std::move(args), std::move(words), {}};
}

transform::Image NoiseImage(int w, int h, std::uint64_t seed) {
  transform::Image im;
  im.Reset(w, h, 3);
  Rng rng(seed, 1);
  // Smooth ramps plus noise: bilinear weights and nearest rounding both matter.
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int c = 0; c < 3; ++c)
        im.row(y)[x * 3 + c] = static_cast<std::uint8_t>((x * 5 + y * 3 + c * 70 + rng.Below(24)) % 256);
  return im;
}

// Draws each step's parameters and warp on the size the previous one made;
// the CPU chain warps whole images. Returns false when a draw is no warp.
bool ChainOf(const std::vector<TransformStep>& specs, transform::Size source, std::uint64_t seed,
             std::vector<transform::Step::PartWarp>& warps, std::vector<transform::Size>& sizes) {
  Rng rng(seed, 2);
  sizes = {source};
  warps.clear();
  for (const auto& spec : specs) {
    auto step = transform::MakeStep(spec);
    EXPECT_TRUE(step.ok()) << step.error().ToString();
    const StepParams p = (*step)->Draw(sizes.back(), rng);
    auto warp = (*step)->WarpFor(p, sizes.back());
    if (!warp) return false;
    warps.push_back(*warp);
    sizes.push_back(warp->out);
  }
  return true;
}

TEST(AugmentKernels, WarpsEvaluatedPerPixelArePillowsEnginesPixelForPixel) {
  const std::vector<std::vector<TransformStep>> chains = {
      {KernelStepOf("RandomRotation", {{"degrees", {30}}})},
      {KernelStepOf("RandomRotation", {{"degrees", {30}}}, {{"interpolation", "bilinear"}})},
      {KernelStepOf("RandomRotation", {{"degrees", {180}}, {"expand", {1}}, {"fill", {10, 200, 30}}},
                    {{"interpolation", "bilinear"}})},
      {KernelStepOf("RandomAffine", {{"degrees", {20}}, {"translate", {0.1, 0.2}}, {"shear", {-10, 10, -5, 5}}})},
      {KernelStepOf("RandomAffine", {{"degrees", {15}}, {"scale", {0.7, 1.3}}}, {{"interpolation", "bilinear"}}),
       KernelStepOf("RandomHorizontalFlip", {{"p", {1}}})},
      {KernelStepOf("RandomVerticalFlip", {{"p", {1}}}),
       KernelStepOf("RandomRotation", {{"degrees", {45}}, {"expand", {1}}}, {{"interpolation", "bilinear"}}),
       KernelStepOf("RandomAffine", {{"degrees", {10}}, {"shear", {8}}})},
  };
  int compared = 0;
  for (std::size_t c = 0; c < chains.size(); ++c) {
    for (std::uint64_t seed = 0; seed < 6; ++seed) {
      const transform::Image source = NoiseImage(61 + static_cast<int>(seed) * 7, 47 + static_cast<int>(c) * 5, seed);
      std::vector<transform::Step::PartWarp> warps;
      std::vector<transform::Size> sizes;
      if (!ChainOf(chains[c], source.size(), seed * 31 + c, warps, sizes)) continue;
      device::AugmentDesc a;
      ASSERT_TRUE(device::KernelWarps(warps, sizes, a)) << "chain " << c << " seed " << seed;
      a.region_width = source.width;
      a.region_height = source.height;
      transform::Image cpu = source, next;
      for (std::size_t i = 0; i < warps.size(); ++i) {
        transform::WarpAffine(cpu, warps[i].matrix, warps[i].interpolation, warps[i].fill, sizes[i + 1], next);
        std::swap(cpu, next);
      }
      int differ = 0;
      for (int y = 0; y < cpu.height; ++y)
        for (int x = 0; x < cpu.width; ++x) {
          std::uint8_t v[3];
          device::WarpedPixel(source.pixels.data(), a, x, y, v);
          for (int b = 0; b < 3; ++b) differ += v[b] != cpu.row(y)[x * 3 + b];
        }
      EXPECT_EQ(differ, 0) << "chain " << c << " seed " << seed;
      ++compared;
    }
  }
  EXPECT_GE(compared, 30);
}

TEST(AugmentKernels, WarpsPillowComputesByAccumulationAreLeftToTheCpu) {
  const transform::Size in{300, 200};
  // RandomAffine with only a scale takes Pillow's scale engine, which adds
  // the step along each row: not the same per pixel.
  transform::Step::PartWarp scale{{1.1, 0, -3.5, 0, 0.9, 2.25}, transform::Interpolation::kNearest, {}, in};
  device::AugmentDesc a;
  EXPECT_FALSE(device::KernelWarps(std::span(&scale, 1), std::vector<transform::Size>{in, in}, a));
  // Past 16.16 fixed point Pillow takes its floating-point engine.
  transform::Step::PartWarp huge{{0.8, 0.6, 40000, -0.6, 0.8, 0}, transform::Interpolation::kNearest, {}, in};
  EXPECT_FALSE(device::KernelWarps(std::span(&huge, 1), std::vector<transform::Size>{in, in}, a));
  // Two bilinear warps: each corner of one would need four of the other.
  transform::Step::PartWarp turn{{0.8, 0.6, 0, -0.6, 0.8, 0}, transform::Interpolation::kBilinear, {}, in};
  const transform::Step::PartWarp two[] = {turn, turn};
  EXPECT_FALSE(device::KernelWarps(two, std::vector<transform::Size>{in, in, in}, a));
  // A flip not drawn is the identity, left out.
  transform::Step::PartWarp identity{{1, 0, 0, 0, 1, 0}, transform::Interpolation::kNearest, {}, in};
  const transform::Step::PartWarp with_identity[] = {identity, turn};
  ASSERT_TRUE(device::KernelWarps(with_identity, std::vector<transform::Size>{in, in, in}, a));
  EXPECT_EQ(a.warp_count, 1);
  EXPECT_EQ(a.warps[0].engine, device::kWarpBilinear);
}

TEST(AugmentKernels, ColourOpsAreTheCpuStepsArithmetic) {
  using Kind = transform::PixelOp::Kind;
  const std::vector<transform::PixelOp> ops = {
      {Kind::kBrightness, 0.6},  {Kind::kBrightness, 1.37}, {Kind::kBrightness, 0},   {Kind::kContrast, 0.55},
      {Kind::kContrast, 1.8},    {Kind::kSaturation, 0.3},  {Kind::kSaturation, 1.6}, {Kind::kSaturation, 0},
      {Kind::kHue, 0.21},        {Kind::kHue, -0.37},       {Kind::kHue, 0.5},        {Kind::kGrayscale, 1},
      {Kind::kContrast, 1.0001}, {Kind::kBrightness, 1e30}};
  for (std::size_t i = 0; i < ops.size(); ++i) {
    transform::Image cpu = NoiseImage(37, 29, i);
    const transform::Image source = cpu;
    switch (ops[i].kind) {
      case Kind::kBrightness:
        transform::AdjustBrightness(cpu, ops[i].factor);
        break;
      case Kind::kContrast:
        transform::AdjustContrast(cpu, ops[i].factor);
        break;
      case Kind::kSaturation:
        transform::AdjustSaturation(cpu, ops[i].factor);
        break;
      case Kind::kHue:
        transform::AdjustHue(cpu, ops[i].factor);
        break;
      default:
        transform::ToGrayscale(cpu);
        break;
    }
    device::AugmentDesc a;
    transform::PixelProgram program;
    program.ops = {ops[i]};
    ASSERT_TRUE(device::DescribeProgram(program, false, a).ok());
    ASSERT_EQ(a.op_count, 1);
    std::vector<std::uint8_t> twin = source.pixels;
    const std::uint64_t n = twin.size() / 3;
    std::uint64_t luma = 0;
    for (std::uint64_t p = 0; p < n; ++p) luma += device::PillowLuma(twin.data() + p * 3);
    const std::uint8_t mean = device::ContrastMean(luma, n);
    for (std::uint64_t p = 0; p < n; ++p) device::ApplyPixelOp(a.ops[0], mean, twin.data() + p * 3);
    EXPECT_EQ(twin, cpu.pixels) << "op " << i << " factor " << ops[i].factor;
  }
}

TEST(AugmentKernels, TheFinalWriteFlipsNormalisesAndErases) {
  // A crop the size of the output resizes to itself; then a flip each way
  // and an erasure.
  const transform::Image source = NoiseImage(12, 9, 3);
  device::ImageDesc desc;
  desc.width = 12;
  desc.height = 9;
  desc.x1 = 12;
  desc.y1 = 9;
  device::OutputDesc o;
  o.width = 12;
  o.height = 9;
  o.type = device::OutputType::kFloat32;
  o.mean[0] = o.mean[1] = o.mean[2] = 0.5f;
  o.inv_std[0] = o.inv_std[1] = o.inv_std[2] = 2.0f;
  transform::PixelProgram program;
  program.ops = {{transform::PixelOp::Kind::kFlipTopBottom, 1}};
  program.erases = {{2, 3, 4, 5, {-1.5f, 0.25f, 7.0f}}};
  device::AugmentDesc a;
  ASSERT_TRUE(device::DescribeProgram(program, true, a).ok());  // the crop stage's flip, then a vertical one
  std::vector<std::uint8_t> staging(12 * 9 * 3);
  std::vector<float> out(12 * 9 * 3);
  device::AugmentOnCpu(source.pixels.data(), std::span(&desc, 1), &a, o, staging.data(), out.data());
  EXPECT_EQ(staging, source.pixels);  // the resize of a same-sized crop changes nothing
  for (int y = 0; y < 9; ++y)
    for (int x = 0; x < 12; ++x)
      for (int c = 0; c < 3; ++c) {
        const float got = out[static_cast<std::size_t>(c) * 108 + y * 12 + x];
        const bool erased = y >= 2 && y < 6 && x >= 3 && x < 8;
        const float want = erased ? program.erases[0].value[static_cast<std::size_t>(c)]
                                  : (source.row(8 - y)[(11 - x) * 3 + c] * (1.0f / 255.0f) - 0.5f) * 2.0f;
        ASSERT_EQ(got, want) << x << "," << y << " channel " << c;
      }
  // More colour ops than the kernels take are refused, not dropped.
  transform::PixelProgram many;
  many.ops.assign(device::kMaxPixelOps + 1, {transform::PixelOp::Kind::kGrayscale, 1});
  device::AugmentDesc b;
  const Status refused = device::DescribeProgram(many, false, b);
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.ToString().find("gpu_preprocess=False"), std::string::npos) << refused.ToString();
}

// A detection-style recipe before the crop plus colour after it and an
// erasure after Normalize.
TransformOptions AugmentedRecipe() {
  TransformOptions t;
  t.width = t.height = 32;
  t.normalize = true;
  t.mean = {0.485f, 0.456f, 0.406f};
  t.std = {0.229f, 0.224f, 0.225f};
  t.before_crop = {KernelStepOf("RandomRotation", {{"degrees", {25}}}, {{"interpolation", "bilinear"}})};
  t.after_crop = {KernelStepOf("ColorJitter", {{"brightness", {0.4}}, {"contrast", {0.4}}, {"saturation", {0.4}}}),
                  KernelStepOf("RandomVerticalFlip", {{"p", {0.5}}}), KernelStepOf("RandomGrayscale", {{"p", {0.2}}})};
  t.after_normalize = {KernelStepOf("RandomErasing", {{"p", {0.7}}, {"value", {0}}})};
  return t;
}

TEST(AugmentKernels, TheDeviceLoaderDrawsWhatTheCpuLoaderDraws) {
  TempDir dir;
  auto dataset = MakeDataset(dir);
  LoaderOptions options = SmallOptions();
  options.transform = AugmentedRecipe();
  auto cpu = Loader::Create(dataset, options);
  ASSERT_TRUE(cpu.ok()) << cpu.error().ToString();
  const Epoch on_cpu = RunEpoch(**cpu);

  testing::FakeDeviceRuntime fake;
  DeviceLoaderOptions on_gpu;
  on_gpu.finish_on_device = true;
  on_gpu.device_buffers = 2;
  on_gpu.device_input_factor = 16;  // the source regions the warps read are larger than these 32x32 outputs
  auto loader = device::CreateDeviceLoader(dataset, options, fake, 0, on_gpu);
  ASSERT_TRUE(loader.ok()) << loader.error().ToString();
  const Epoch finished = DrainDeviceEpoch(**loader);
  ASSERT_EQ(finished.indices, on_cpu.indices);
  ASSERT_EQ(finished.pixels.size(), on_cpu.pixels.size());
  int kernels = 0;
  for (const auto& line : fake.log) kernels += line.starts_with("augment ");
  EXPECT_EQ(kernels, 8);

  // The GPU's resize is a float triangle filter, the CPU's Pillow's fixed
  // point one, and the colour ops see those values: close, not equal. Wrong
  // draws (another angle, flip or box) would be far off.
  const auto* x = reinterpret_cast<const float*>(finished.pixels.data());
  const auto* y = reinterpret_cast<const float*>(on_cpu.pixels.data());
  const std::size_t n = finished.pixels.size() / 4;
  std::size_t far = 0, erased_cpu = 0, erased_both = 0;
  double sum = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const int c = static_cast<int>((i / (32 * 32)) % 3);
    const double d = std::abs(static_cast<double>(x[i]) - y[i]) * options.transform.std[c] * 255;
    sum += d;
    far += d > 4.0;
    erased_cpu += y[i] == 0.0f;
    erased_both += y[i] == 0.0f && x[i] == 0.0f;
  }
  std::printf("augmented on the GPU twin vs CPU: mean %.3f levels, %zu of %zu values off by more than 4\n",
              sum / static_cast<double>(n), far, n);
  EXPECT_LT(sum / static_cast<double>(n), 1.0);
  EXPECT_LT(static_cast<double>(far), 0.01 * static_cast<double>(n));
  EXPECT_GT(erased_cpu, 1000u);  // the recipe erases
  EXPECT_EQ(erased_both, erased_cpu);
  const auto stats = (*loader)->stats();
  EXPECT_EQ(stats.device_fallbacks, 0u);
  EXPECT_EQ(stats.device_cpu_steps, 0u);
  EXPECT_EQ(stats.device_cpu_warps, 0u);  // one bilinear rotation: always the kernel's
}

TEST(AugmentKernels, StepsTheKernelsCannotRunAreRunOnTheCpuOrRefused) {
  TempDir dir;
  auto dataset = MakeDataset(dir);
  testing::FakeDeviceRuntime fake;
  DeviceLoaderOptions on_gpu;
  on_gpu.finish_on_device = true;
  on_gpu.device_buffers = 2;

  // GaussianBlur has no pixel ops: every sample is resized and stepped on
  // the CPU, and the kernels only normalise.
  LoaderOptions options = SmallOptions();
  options.transform.after_crop = {KernelStepOf("GaussianBlur", {{"kernel_size", {3}}})};
  auto cpu = Loader::Create(dataset, options);
  ASSERT_TRUE(cpu.ok());
  const Epoch on_cpu = RunEpoch(**cpu);
  auto loader = device::CreateDeviceLoader(dataset, options, fake, 0, on_gpu);
  ASSERT_TRUE(loader.ok()) << loader.error().ToString();
  const Epoch finished = DrainDeviceEpoch(**loader);
  ASSERT_EQ(finished.pixels.size(), on_cpu.pixels.size());
  EXPECT_LT(MaxFloatDifference(finished, on_cpu), 1e-4) << "resized and stepped here, only normalised there";
  EXPECT_GE((*loader)->stats().device_cpu_steps, 30u);

  // A bicubic resize is the CPU's too: resized here, normalised there.
  options.transform.after_crop.clear();
  options.transform.interpolation = TransformOptions::Interpolation::kBicubic;
  auto bicubic_cpu = Loader::Create(dataset, options);
  ASSERT_TRUE(bicubic_cpu.ok());
  const Epoch bicubic_on_cpu = RunEpoch(**bicubic_cpu);
  testing::FakeDeviceRuntime fake_bicubic;
  auto bicubic = device::CreateDeviceLoader(dataset, options, fake_bicubic, 0, on_gpu);
  ASSERT_TRUE(bicubic.ok()) << bicubic.error().ToString();
  const Epoch bicubic_finished = DrainDeviceEpoch(**bicubic);
  ASSERT_EQ(bicubic_finished.pixels.size(), bicubic_on_cpu.pixels.size());
  EXPECT_LT(MaxFloatDifference(bicubic_finished, bicubic_on_cpu), 1e-4);
  EXPECT_GE((*bicubic)->stats().device_cpu_steps, 30u);
  options.transform.interpolation = TransformOptions::Interpolation::kBilinear;
  auto bilinear_cpu = Loader::Create(dataset, options);
  ASSERT_TRUE(bilinear_cpu.ok());
  EXPECT_NE(RunEpoch(**bilinear_cpu).pixels, bicubic_on_cpu.pixels);  // the filter took effect

  // Random noise is drawn in sequence: refused with the way out.
  options.transform.after_crop.clear();
  options.transform.after_normalize = {KernelStepOf("RandomErasing", {}, {{"value", "random"}})};
  auto refused = device::CreateDeviceLoader(dataset, options, fake, 0, on_gpu);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().code(), StatusCode::kUnimplemented);
  EXPECT_NE(refused.error().ToString().find("gpu_preprocess=False"), std::string::npos);
}

}  // namespace
}  // namespace stoker
