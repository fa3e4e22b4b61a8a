// Colour and filter steps: ColorJitter, Grayscale, RandomGrayscale,
// GaussianBlur (torchvision.transforms on PIL images).
#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "transform/color.h"
#include "transform/step.h"

namespace stoker::transform {
namespace {

constexpr double kNone = std::numeric_limits<double>::quiet_NaN();

class ColorJitter final : public Step {
 public:
  using Range = std::optional<std::array<double, 2>>;
  ColorJitter(Range brightness, Range contrast, Range saturation, Range hue)
      : ranges_{brightness, contrast, saturation, hue} {}
  std::string_view name() const override { return "ColorJitter"; }
  bool allows_absent_values() const override { return true; }
  std::vector<std::string_view> param_names() const override {
    return {"order0", "order1", "order2", "order3", "brightness", "contrast", "saturation", "hue"};
  }
  StepParams Draw(Size, Rng& rng) const override {
    std::array<double, 4> order{0, 1, 2, 3};
    Shuffle(order.data(), order.size(), rng);
    std::vector<double> values(order.begin(), order.end());
    for (const auto& r : ranges_) values.push_back(r ? rng.Uniform((*r)[0], (*r)[1]) : kNone);
    return MakeParams(std::move(values));
  }
  bool describes_pixels() const override { return true; }
  Status DescribePixels(const StepParams& p, PixelProgram& program) const override {
    return ForEach(p, [&program](int which, double factor) {
      static constexpr PixelOp::Kind kKinds[] = {PixelOp::Kind::kBrightness, PixelOp::Kind::kContrast,
                                                 PixelOp::Kind::kSaturation, PixelOp::Kind::kHue};
      program.ops.push_back({kKinds[which], factor});
    });
  }
  Status Apply(const StepParams& p, Image& image, Image&) const override {
    return ForEach(p, [&image](int which, double factor) {
      switch (which) {
        case 0:
          AdjustBrightness(image, factor);
          break;
        case 1:
          AdjustContrast(image, factor);
          break;
        case 2:
          AdjustSaturation(image, factor);
          break;
        default:
          AdjustHue(image, factor);
          break;
      }
    });
  }

 private:
  // Calls `adjust(which, factor)` for each adjustment drawn, in the drawn
  // order, after checking the parameters.
  template <typename Adjust>
  static Status ForEach(const StepParams& p, Adjust adjust) {
    for (int k = 0; k < 4; ++k) {
      const double which = p.values[static_cast<std::size_t>(k)].second;
      if (!(which >= 0 && which <= 3 && which == std::floor(which)))
        return Status::InvalidArgument(fmt::format("ColorJitter: order values must be 0..3, not {}", which));
      const double factor = p.values[4 + static_cast<std::size_t>(which)].second;
      if (std::isnan(factor)) continue;
      if (which == 3 && !(factor >= -0.5 && factor <= 0.5))
        return Status::InvalidArgument(fmt::format("ColorJitter: hue {} is not in [-0.5, 0.5]", factor));
      adjust(static_cast<int>(which), factor);
    }
    return Status::Ok();
  }

  std::array<Range, 4> ranges_;
};

// torchvision's ColorJitter._check_input.
Result<ColorJitter::Range> JitterRange(StepArgs& args, std::string_view name, double center, double lo, double hi,
                                       bool clip_first_on_zero) {
  STOKER_ASSIGN_OR_RETURN(auto v, args.Numbers(name, {1, 2}));
  if (!v) return ColorJitter::Range();
  std::array<double, 2> r{};
  if (v->size() == 1) {
    if ((*v)[0] < 0)
      return args.Error(fmt::format("if {} is a single number, it must be non negative, not {}", name, (*v)[0]));
    r = {center - (*v)[0], center + (*v)[0]};
    if (clip_first_on_zero) r[0] = std::max(r[0], 0.0);
  } else {
    r = {(*v)[0], (*v)[1]};
  }
  if (!(lo <= r[0] && r[0] <= r[1] && r[1] <= hi))
    return args.Error(
        fmt::format("{} values should be between {} and {} with min <= max, not [{}, {}]", name, lo, hi, r[0], r[1]));
  if (r[0] == center && r[1] == center) return ColorJitter::Range();
  return ColorJitter::Range(r);
}

class Grayscale final : public Step {
 public:
  explicit Grayscale(std::optional<double> p) : p_(p) {}
  std::string_view name() const override { return p_ ? "RandomGrayscale" : "Grayscale"; }
  std::vector<std::string_view> param_names() const override {
    if (p_) return {"gray"};
    return {};
  }
  StepParams Draw(Size, Rng& rng) const override {
    if (!p_) return MakeParams({});
    return MakeParams({rng.Uniform01() < *p_ ? 1.0 : 0.0});
  }
  Status Apply(const StepParams& p, Image& image, Image&) const override {
    if (!p_ || p.values[0].second != 0) ToGrayscale(image);
    return Status::Ok();
  }
  bool describes_pixels() const override { return true; }
  Status DescribePixels(const StepParams& p, PixelProgram& program) const override {
    if (!p_ || p.values[0].second != 0) program.ops.push_back({PixelOp::Kind::kGrayscale, 1});
    return Status::Ok();
  }

 private:
  std::optional<double> p_;
};

// torchvision's _get_gaussian_kernel1d in float32: linspace (symmetric, as
// torch computes it), exp, normalised by the sum.
std::vector<float> GaussianKernel(int size, double sigma) {
  std::vector<float> x(static_cast<std::size_t>(size));
  const float half = static_cast<float>((size - 1) * 0.5);
  const float step = size > 1 ? (half - -half) / static_cast<float>(size - 1) : 0.0f;
  for (int i = 0; i < size; ++i)
    x[static_cast<std::size_t>(i)] =
        i < size / 2 ? -half + step * static_cast<float>(i) : half - step * static_cast<float>(size - 1 - i);
  float sum = 0;
  const auto s = static_cast<float>(sigma);
  for (float& v : x) {
    const float t = v / s;
    v = std::exp(-0.5f * (t * t));
    sum += v;
  }
  for (float& v : x) v /= sum;
  return x;
}

int Reflect(int i, int n) {
  if (n == 1) return 0;
  const int m = 2 * (n - 1);
  const int k = ((i % m) + m) % m;
  return k < n ? k : m - k;
}

// torchvision's gaussian_blur for uint8 images: reflect padding, float32
// convolution (separable here), rounded half to even.
void Blur(Image& image, int kx, int ky, double sigma_x, double sigma_y, Image& scratch) {
  const auto wx = GaussianKernel(kx, sigma_x), wy = GaussianKernel(ky, sigma_y);
  const int W = image.width, H = image.height, c = image.channels;
  std::vector<float> rows(static_cast<std::size_t>(W) * H * c);
  const int hx = kx / 2, hy = ky / 2;
  std::vector<int> xs(static_cast<std::size_t>(W + 2 * hx));
  for (int i = 0; i < W + 2 * hx; ++i) xs[static_cast<std::size_t>(i)] = Reflect(i - hx, W) * c;
  for (int y = 0; y < H; ++y) {
    const std::uint8_t* r = image.row(y);
    float* o = rows.data() + static_cast<std::size_t>(y) * W * c;
    for (int x = 0; x < W; ++x)
      for (int b = 0; b < c; ++b) {
        float acc = 0;
        for (int k = 0; k < kx; ++k)
          acc += wx[static_cast<std::size_t>(k)] * r[xs[static_cast<std::size_t>(x + k)] + b];
        o[x * c + b] = acc;
      }
  }
  scratch.Reset(W, H, c);
  const std::size_t stride = static_cast<std::size_t>(W) * c;
  for (int y = 0; y < H; ++y) {
    std::uint8_t* o = scratch.row(y);
    for (std::size_t i = 0; i < stride; ++i) {
      float acc = 0;
      for (int k = 0; k < ky; ++k)
        acc += wy[static_cast<std::size_t>(k)] * rows[static_cast<std::size_t>(Reflect(y + k - hy, H)) * stride + i];
      o[i] = static_cast<std::uint8_t>(std::clamp(std::nearbyint(acc), 0.0f, 255.0f));
    }
  }
  std::swap(image, scratch);
}

// The kernel is computed in float32, as torchvision's is: a sigma that rounds
// to 0 there gives 0/0 (NaN) weights, so it is refused, not blurred with.
bool SigmaUsable(double sigma) {
  return sigma > 0 && static_cast<float>(sigma) > 0;
}

class GaussianBlur final : public Step {
 public:
  GaussianBlur(int kx, int ky, std::array<double, 2> sigma) : kx_(kx), ky_(ky), sigma_(sigma) {}
  std::string_view name() const override { return "GaussianBlur"; }
  std::vector<std::string_view> param_names() const override { return {"sigma"}; }
  StepParams Draw(Size, Rng& rng) const override { return MakeParams({rng.Uniform(sigma_[0], sigma_[1])}); }
  Status Apply(const StepParams& p, Image& image, Image& scratch) const override {
    const double sigma = p.values[0].second;
    if (!SigmaUsable(sigma))
      return Status::InvalidArgument(
          fmt::format("GaussianBlur: sigma {} must be positive and at least {} (float32's smallest)", sigma,
                      std::numeric_limits<float>::denorm_min()));
    Blur(image, kx_, ky_, sigma, sigma, scratch);
    return Status::Ok();
  }

 private:
  int kx_, ky_;
  std::array<double, 2> sigma_;
};

}  // namespace

Result<std::unique_ptr<Step>> MakeColorJitter(StepArgs& args) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  STOKER_ASSIGN_OR_RETURN(auto brightness, JitterRange(args, "brightness", 1, 0, kInf, true));
  STOKER_ASSIGN_OR_RETURN(auto contrast, JitterRange(args, "contrast", 1, 0, kInf, true));
  STOKER_ASSIGN_OR_RETURN(auto saturation, JitterRange(args, "saturation", 1, 0, kInf, true));
  STOKER_ASSIGN_OR_RETURN(auto hue, JitterRange(args, "hue", 0, -0.5, 0.5, false));
  return std::unique_ptr<Step>(new ColorJitter(brightness, contrast, saturation, hue));
}

Result<std::unique_ptr<Step>> MakeGrayscale(StepArgs& args) {
  STOKER_ASSIGN_OR_RETURN(double channels, args.Number("num_output_channels", 1));
  if (channels == 1)
    return args.Error("num_output_channels=1 is not compiled: batches hold 3 channels; use num_output_channels=3");
  if (channels != 3) return args.Error(fmt::format("num_output_channels must be 1 or 3, not {}", channels));
  return std::unique_ptr<Step>(new Grayscale(std::nullopt));
}

Result<std::unique_ptr<Step>> MakeRandomGrayscale(StepArgs& args) {
  STOKER_ASSIGN_OR_RETURN(double p, args.Probability("p", 0.1));
  return std::unique_ptr<Step>(new Grayscale(p));
}

Result<std::unique_ptr<Step>> MakeGaussianBlur(StepArgs& args) {
  STOKER_ASSIGN_OR_RETURN(auto kernel, args.Numbers("kernel_size", {1, 2}));
  if (!kernel) return args.Error("needs kernel_size");
  for (double k : *kernel)
    if (!(k > 0 && k <= 1023 && k == std::floor(k) && static_cast<int>(k) % 2 == 1))
      return args.Error(fmt::format("kernel size value should be an odd and positive number, not {}", k));
  STOKER_ASSIGN_OR_RETURN(auto sigma, args.Numbers("sigma", {1, 2}));
  std::array<double, 2> range{0.1, 2.0};
  if (sigma) {
    if (sigma->size() == 1) {
      if (!((*sigma)[0] > 0)) return args.Error("if sigma is a single number, it must be positive");
      if (!SigmaUsable((*sigma)[0])) return args.Error(fmt::format("sigma {} rounds to 0 in float32", (*sigma)[0]));
      range = {(*sigma)[0], (*sigma)[0]};
    } else {
      range = {(*sigma)[0], (*sigma)[1]};
      if (!(0 < range[0] && range[0] <= range[1]))
        return args.Error("sigma values should be positive and of the form (min, max)");
      if (!SigmaUsable(range[0])) return args.Error(fmt::format("sigma {} rounds to 0 in float32", range[0]));
    }
  }
  const int kx = static_cast<int>((*kernel)[0]), ky = static_cast<int>((*kernel)[kernel->size() == 1 ? 0 : 1]);
  return std::unique_ptr<Step>(new GaussianBlur(kx, ky, range));
}

}  // namespace stoker::transform
