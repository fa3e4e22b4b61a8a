// Steps that flip, pad, crop and resize (torchvision.transforms on PIL
// images): RandomHorizontalFlip, RandomVerticalFlip, Pad, RandomCrop,
// CenterCrop, Resize.
#include <algorithm>
#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "transform/resample.h"
#include "transform/step.h"

namespace stoker::transform {
namespace {

void ShiftPoints(std::span<double> xy, double dx, double dy) {
  for (std::size_t i = 0; i + 1 < xy.size(); i += 2) {
    xy[i] += dx;
    xy[i + 1] += dy;
  }
}

// ---- flips ----

class Flip final : public Step {
 public:
  Flip(bool vertical, double p) : vertical_(vertical), p_(p) {}
  std::string_view name() const override { return vertical_ ? "RandomVerticalFlip" : "RandomHorizontalFlip"; }
  std::vector<std::string_view> param_names() const override { return {"flip"}; }
  StepParams Draw(Size, Rng& rng) const override { return MakeParams({rng.Uniform01() < p_ ? 1.0 : 0.0}); }
  Status Apply(const StepParams& p, Image& image, Image& scratch) const override {
    if (p.values[0].second == 0) return Status::Ok();
    TransposeImage(image, vertical_ ? Transpose::kFlipTopBottom : Transpose::kFlipLeftRight, scratch);
    std::swap(image, scratch);
    return Status::Ok();
  }
  bool describes_pixels() const override { return true; }
  Status DescribePixels(const StepParams& p, PixelProgram& program) const override {
    if (p.values[0].second != 0)
      program.ops.push_back({vertical_ ? PixelOp::Kind::kFlipTopBottom : PixelOp::Kind::kFlipLeftRight, 1});
    return Status::Ok();
  }
  void MapPoints(const StepParams& p, Size in, std::span<double> xy) const override {
    if (p.values[0].second == 0) return;
    for (std::size_t i = vertical_ ? 1 : 0; i < xy.size(); i += 2) xy[i] = (vertical_ ? in.height : in.width) - xy[i];
  }
  Status ApplyToMask(const StepParams& p, Image& mask, Image& scratch, std::uint8_t) const override {
    return Apply(p, mask, scratch);
  }
  bool draws_parts() const override { return true; }
  // Pillow's scale engine with these matrices gives exactly the transpose.
  std::optional<PartWarp> WarpFor(const StepParams& p, Size in) const override {
    AffineMatrix m{1, 0, 0, 0, 1, 0};
    if (p.values[0].second != 0) {
      if (vertical_) {
        m = {1, 0, 0, 0, -1, static_cast<double>(in.height)};
      } else {
        m = {-1, 0, static_cast<double>(in.width), 0, 1, 0};
      }
    }
    return PartWarp{m, Interpolation::kNearest, {0, 0, 0}, in};
  }

 private:
  bool vertical_;
  double p_;
};

// ---- padding ----

enum class PadMode : std::uint8_t { kConstant, kEdge, kReflect, kSymmetric };

struct Padding {
  int left = 0, top = 0, right = 0, bottom = 0;
};

// numpy.pad's index for position i (may be outside [0, n)) of an axis of n.
int PadIndex(int i, int n, PadMode mode) {
  if (i >= 0 && i < n) return i;
  switch (mode) {
    case PadMode::kConstant:
      return -1;
    case PadMode::kEdge:
      return std::clamp(i, 0, n - 1);
    case PadMode::kReflect: {
      if (n == 1) return 0;
      const int m = 2 * (n - 1);
      const int k = ((i % m) + m) % m;
      return k < n ? k : m - k;
    }
    case PadMode::kSymmetric: {
      const int m = 2 * n;
      const int k = ((i % m) + m) % m;
      return k < n ? k : m - 1 - k;
    }
  }
  return -1;
}

void PadImage(const Image& in, const Padding& pad, PadMode mode, const Fill& fill, Image& out) {
  const int c = in.channels;
  out.Reset(in.width + pad.left + pad.right, in.height + pad.top + pad.bottom, c);
  DispatchChannels(c, [&](auto channels) {
    for (int y = 0; y < out.height; ++y) {
      const int sy = PadIndex(y - pad.top, in.height, mode);
      std::uint8_t* o = out.row(y);
      for (int x = 0; x < out.width; ++x, o += c) {
        const int sx = sy < 0 ? -1 : PadIndex(x - pad.left, in.width, mode);
        if (sx < 0 || sy < 0) {
          for (int b = 0; b < c; ++b) o[b] = b < 3 ? fill[b] : 0;
        } else {
          CopyPixel<channels()>(o, in.row(sy) + static_cast<std::size_t>(sx) * c, c);
        }
      }
    }
  });
}

Result<PadMode> ParsePadMode(StepArgs& args) {
  STOKER_ASSIGN_OR_RETURN(auto word, args.Word("padding_mode"));
  if (word.empty() || word == "constant") return PadMode::kConstant;
  if (word == "edge") return PadMode::kEdge;
  if (word == "reflect") return PadMode::kReflect;
  if (word == "symmetric") return PadMode::kSymmetric;
  return args.Error(fmt::format("padding_mode '{}' must be constant, edge, reflect or symmetric", word));
}

Result<std::optional<Padding>> ParsePadding(StepArgs& args) {
  STOKER_ASSIGN_OR_RETURN(auto v, args.Numbers("padding", {1, 2, 4}));
  if (!v) return std::optional<Padding>();
  for (double x : *v)
    if (!(x >= 0 && x <= 65536 && x == std::floor(x)))
      return args.Error(fmt::format("padding must be whole numbers in [0, 65536], not {}", x));
  const auto& p = *v;
  Padding pad;
  if (p.size() == 1) pad = {int(p[0]), int(p[0]), int(p[0]), int(p[0])};
  if (p.size() == 2) pad = {int(p[0]), int(p[1]), int(p[0]), int(p[1])};
  if (p.size() == 4) pad = {int(p[0]), int(p[1]), int(p[2]), int(p[3])};
  return std::optional<Padding>(pad);
}

class Pad final : public Step {
 public:
  Pad(Padding pad, PadMode mode, Fill fill) : pad_(pad), mode_(mode), fill_(fill) {}
  std::string_view name() const override { return "Pad"; }
  std::optional<Size> OutputSize(Size in) const override {
    return Size{in.width + pad_.left + pad_.right, in.height + pad_.top + pad_.bottom};
  }
  StepParams Draw(Size, Rng&) const override { return MakeParams({}); }
  Status Apply(const StepParams&, Image& image, Image& scratch) const override {
    PadImage(image, pad_, mode_, fill_, scratch);
    std::swap(image, scratch);
    return Status::Ok();
  }
  void MapPoints(const StepParams&, Size, std::span<double> xy) const override { ShiftPoints(xy, pad_.left, pad_.top); }
  Status ApplyToMask(const StepParams&, Image& mask, Image& scratch, std::uint8_t fill) const override {
    PadImage(mask, pad_, mode_, MaskFill(fill), scratch);
    std::swap(mask, scratch);
    return Status::Ok();
  }

 private:
  Padding pad_;
  PadMode mode_;
  Fill fill_;
};

// Copies the box (left, top, size) of `in`, zeros where it leaves the
// image (PIL's crop).
void CropImage(const Image& in, int left, int top, Size size, Image& out) {
  const int c = in.channels;
  out.Reset(size.width, size.height, c);
  std::fill(out.pixels.begin(), out.pixels.end(), 0);
  const int x0 = std::max(0, left), x1 = std::min(in.width, left + size.width);
  for (int y = 0; y < size.height; ++y) {
    const int sy = top + y;
    if (sy < 0 || sy >= in.height || x1 <= x0) continue;
    std::memcpy(out.row(y) + static_cast<std::size_t>(x0 - left) * c, in.row(sy) + static_cast<std::size_t>(x0) * c,
                static_cast<std::size_t>(x1 - x0) * c);
  }
}

// ---- RandomCrop ----

class RandomCrop final : public Step {
 public:
  RandomCrop(Size size, std::optional<Padding> padding, bool pad_if_needed, PadMode mode, Fill fill)
      : size_(size), padding_(padding), pad_if_needed_(pad_if_needed), mode_(mode), fill_(fill) {}
  std::string_view name() const override { return "RandomCrop"; }
  std::vector<std::string_view> param_names() const override { return {"top", "left"}; }
  std::optional<Size> OutputSize(Size) const override { return size_; }

  StepParams Draw(Size in, Rng& rng) const override {
    const Size padded = Padded(in);
    int top = 0, left = 0;
    if (padded.height >= size_.height && padded.width >= size_.width &&
        !(padded.width == size_.width && padded.height == size_.height)) {
      top = static_cast<int>(rng.IntInclusive(0, padded.height - size_.height));
      left = static_cast<int>(rng.IntInclusive(0, padded.width - size_.width));
    }
    return MakeParams({static_cast<double>(top), static_cast<double>(left)});
  }

  Status Apply(const StepParams& p, Image& image, Image& scratch) const override {
    return Crop(p, image, scratch, fill_);
  }
  Status ApplyToMask(const StepParams& p, Image& mask, Image& scratch, std::uint8_t fill) const override {
    return Crop(p, mask, scratch, MaskFill(fill));
  }
  void MapPoints(const StepParams& p, Size in, std::span<double> xy) const override {
    double dx = 0, dy = 0;
    if (padding_) {
      dx += padding_->left;
      dy += padding_->top;
      in.width += padding_->left + padding_->right;
      in.height += padding_->top + padding_->bottom;
    }
    if (pad_if_needed_ && in.width < size_.width) dx += size_.width - in.width;
    if (pad_if_needed_ && in.height < size_.height) dy += size_.height - in.height;
    ShiftPoints(xy, dx - p.values[1].second, dy - p.values[0].second);
  }

 private:
  Status Crop(const StepParams& p, Image& image, Image& scratch, const Fill& fill) const {
    const Size padded = Padded(image.size());
    if (static_cast<std::uint64_t>(padded.width) * static_cast<std::uint64_t>(padded.height) > kMaxStepPixels)
      return Status::Corruption(fmt::format("RandomCrop: padding a {}x{} image to {}x{} passes the limit of {} pixels",
                                            image.width, image.height, padded.width, padded.height, kMaxStepPixels));
    if (padding_) {
      PadImage(image, *padding_, mode_, fill, scratch);
      std::swap(image, scratch);
    }
    if (pad_if_needed_ && image.width < size_.width) {
      const int d = size_.width - image.width;
      PadImage(image, {d, 0, d, 0}, mode_, fill, scratch);
      std::swap(image, scratch);
    }
    if (pad_if_needed_ && image.height < size_.height) {
      const int d = size_.height - image.height;
      PadImage(image, {0, d, 0, d}, mode_, fill, scratch);
      std::swap(image, scratch);
    }
    if (image.width < size_.width || image.height < size_.height)
      return Status::Corruption(fmt::format(
          "RandomCrop: the image is {}x{} (after padding), smaller than the crop {}x{} (pad_if_needed pads it)",
          image.width, image.height, size_.width, size_.height));
    const double top_value = p.values[0].second, left_value = p.values[1].second;
    if (!(top_value >= 0 && top_value <= image.height && left_value >= 0 && left_value <= image.width))
      return Status::InvalidArgument(fmt::format("RandomCrop: top {} and left {} put the crop outside the {}x{} image",
                                                 top_value, left_value, image.width, image.height));
    const int top = static_cast<int>(top_value), left = static_cast<int>(left_value);
    if (top < 0 || left < 0 || top + size_.height > image.height || left + size_.width > image.width)
      return Status::InvalidArgument(
          fmt::format("RandomCrop: top {} and left {} put the {}x{} crop outside the {}x{} image", top, left,
                      size_.width, size_.height, image.width, image.height));
    CropImage(image, left, top, size_, scratch);
    std::swap(image, scratch);
    return Status::Ok();
  }

  Size Padded(Size in) const {
    if (padding_) {
      in.width += padding_->left + padding_->right;
      in.height += padding_->top + padding_->bottom;
    }
    if (pad_if_needed_ && in.width < size_.width) in.width += 2 * (size_.width - in.width);
    if (pad_if_needed_ && in.height < size_.height) in.height += 2 * (size_.height - in.height);
    return in;
  }

  Size size_;
  std::optional<Padding> padding_;
  bool pad_if_needed_;
  PadMode mode_;
  Fill fill_;
};

// ---- CenterCrop (torchvision pads with zeros when the crop is larger) ----

class CenterCrop final : public Step {
 public:
  explicit CenterCrop(Size size) : size_(size) {}
  std::string_view name() const override { return "CenterCrop"; }
  std::optional<Size> OutputSize(Size) const override { return size_; }
  StepParams Draw(Size, Rng&) const override { return MakeParams({}); }
  Status ApplyToMask(const StepParams& p, Image& mask, Image& scratch, std::uint8_t) const override {
    return Apply(p, mask, scratch);  // torchvision pads with zeros here too
  }
  void MapPoints(const StepParams&, Size in, std::span<double> xy) const override {
    const int cw = size_.width, ch = size_.height;
    double dx = 0, dy = 0;
    if (cw > in.width || ch > in.height) {
      const int dw = std::max(0, cw - in.width), dh = std::max(0, ch - in.height);
      dx = dw / 2;
      dy = dh / 2;
      in = {in.width + dw, in.height + dh};
      if (in.width == cw && in.height == ch) return ShiftPoints(xy, dx, dy);
    }
    ShiftPoints(xy, dx - RoundHalfEvenInt((in.width - cw) / 2.0), dy - RoundHalfEvenInt((in.height - ch) / 2.0));
  }
  Status Apply(const StepParams&, Image& image, Image& scratch) const override {
    const int cw = size_.width, ch = size_.height;
    if (cw > image.width || ch > image.height) {
      const int dw = std::max(0, cw - image.width), dh = std::max(0, ch - image.height);
      PadImage(image, {dw / 2, dh / 2, (dw + 1) / 2, (dh + 1) / 2}, PadMode::kConstant, {0, 0, 0}, scratch);
      std::swap(image, scratch);
      if (image.width == cw && image.height == ch) return Status::Ok();
    }
    const int top = RoundHalfEvenInt((image.height - ch) / 2.0), left = RoundHalfEvenInt((image.width - cw) / 2.0);
    CropImage(image, left, top, size_, scratch);
    std::swap(image, scratch);
    return Status::Ok();
  }

 private:
  Size size_;
};

// ---- Resize (bilinear, Pillow's antialiased resize) ----

class Resize final : public Step {
 public:
  Resize(std::optional<int> shorter, Size size, ResampleFilter filter)
      : shorter_(shorter), size_(size), filter_(filter) {}
  std::string_view name() const override { return "Resize"; }
  std::optional<Size> OutputSize(Size in) const override {
    if (!shorter_) return size_;
    const int s = *shorter_;
    if (in.width <= in.height) return Size{s, static_cast<int>(static_cast<double>(s) * in.height / in.width)};
    return Size{static_cast<int>(static_cast<double>(s) * in.width / in.height), s};
  }
  StepParams Draw(Size, Rng&) const override { return MakeParams({}); }
  Status Apply(const StepParams&, Image& image, Image& scratch) const override {
    const Size out = *OutputSize(image.size());
    if (out == image.size()) return Status::Ok();
    if (image.channels != 3) return Status::Internal("Resize works on RGB images");
    scratch.Reset(out.width, out.height, 3);
    ResampleScratch resample;
    const ImageView view{image.pixels.data(), image.width, image.height, image.stride()};
    if (!Resample(view, 0, 0, image.width, image.height, out.width, out.height, scratch.pixels.data(), resample,
                  filter_))
      return Status::Internal(
          fmt::format("Resize: cannot resample {}x{} to {}x{}", image.width, image.height, out.width, out.height));
    std::swap(image, scratch);
    return Status::Ok();
  }
  void MapPoints(const StepParams&, Size in, std::span<double> xy) const override {
    const Size out = *OutputSize(in);
    const double sx = static_cast<double>(out.width) / in.width, sy = static_cast<double>(out.height) / in.height;
    for (std::size_t i = 0; i + 1 < xy.size(); i += 2) {
      xy[i] *= sx;
      xy[i + 1] *= sy;
    }
  }
  Status ApplyToMask(const StepParams&, Image& mask, Image& scratch, std::uint8_t) const override {
    const Size out = *OutputSize(mask.size());
    if (out == mask.size()) return Status::Ok();
    ResizeNearest(mask, out, scratch);
    std::swap(mask, scratch);
    return Status::Ok();
  }

 private:
  std::optional<int> shorter_;
  Size size_;
  ResampleFilter filter_;
};

}  // namespace

Result<std::unique_ptr<Step>> MakeHorizontalFlip(StepArgs& args) {
  STOKER_ASSIGN_OR_RETURN(double p, args.Probability("p", 0.5));
  return std::unique_ptr<Step>(new Flip(false, p));
}

Result<std::unique_ptr<Step>> MakeVerticalFlip(StepArgs& args) {
  STOKER_ASSIGN_OR_RETURN(double p, args.Probability("p", 0.5));
  return std::unique_ptr<Step>(new Flip(true, p));
}

Result<std::unique_ptr<Step>> MakePad(StepArgs& args) {
  STOKER_ASSIGN_OR_RETURN(auto padding, ParsePadding(args));
  if (!padding) return args.Error("needs padding");
  STOKER_ASSIGN_OR_RETURN(Fill fill, args.FillArg("fill"));
  STOKER_ASSIGN_OR_RETURN(PadMode mode, ParsePadMode(args));
  return std::unique_ptr<Step>(new Pad(*padding, mode, fill));
}

Result<std::unique_ptr<Step>> MakeRandomCrop(StepArgs& args) {
  STOKER_ASSIGN_OR_RETURN(auto size, args.SizeArg("size"));
  if (!size) return args.Error("needs size");
  STOKER_ASSIGN_OR_RETURN(auto padding, ParsePadding(args));
  STOKER_ASSIGN_OR_RETURN(double pad_if_needed, args.Number("pad_if_needed", 0));
  STOKER_ASSIGN_OR_RETURN(Fill fill, args.FillArg("fill"));
  STOKER_ASSIGN_OR_RETURN(PadMode mode, ParsePadMode(args));
  return std::unique_ptr<Step>(new RandomCrop(*size, padding, pad_if_needed != 0, mode, fill));
}

Result<std::unique_ptr<Step>> MakeCenterCrop(StepArgs& args) {
  STOKER_ASSIGN_OR_RETURN(auto size, args.SizeArg("size"));
  if (!size) return args.Error("needs size");
  return std::unique_ptr<Step>(new CenterCrop(*size));
}

Result<std::unique_ptr<Step>> MakeResize(StepArgs& args) {
  STOKER_ASSIGN_OR_RETURN(auto v, args.Numbers("size", {1, 2}));
  STOKER_ASSIGN_OR_RETURN(auto size, args.SizeArg("size"));
  if (!size) return args.Error("needs size");
  STOKER_ASSIGN_OR_RETURN(auto word, args.Word("interpolation"));
  if (!word.empty() && word != "bilinear" && word != "bicubic")
    return args.Error(fmt::format("interpolation '{}' is not supported (bilinear or bicubic)", word));
  const ResampleFilter filter = word == "bicubic" ? ResampleFilter::kBicubic : ResampleFilter::kBilinear;
  return std::unique_ptr<Step>(
      new Resize(v->size() == 1 ? std::optional<int>(size->width) : std::nullopt, *size, filter));
}

}  // namespace stoker::transform
