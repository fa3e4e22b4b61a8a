#include "transform/step.h"

#include <gtest/gtest.h>

#include "transform/augmentation.h"
#include "transform/targets.h"

namespace stoker::transform {
namespace {

TransformStep StepOf(std::string name, std::vector<std::pair<std::string, std::vector<double>>> args = {},
                     std::vector<std::pair<std::string, std::string>> words = {}) {
  return TransformStep{std::move(name), std::move(args), std::move(words), {}};
}

Image StepGradient(int w, int h) {
  Image im;
  im.Reset(w, h, 3);
  for (std::size_t i = 0; i < im.pixels.size(); ++i) im.pixels[i] = static_cast<std::uint8_t>(i * 31 % 251);
  return im;
}

TEST(StepRegistry, RefusesUnknownStepsAndArgumentsByName) {
  auto unknown = MakeStep(StepOf("RandomPerspective"));
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.error().message().find("RandomPerspective"), std::string::npos);
  EXPECT_NE(unknown.error().message().find("RandomRotation"), std::string::npos);  // lists what exists
  auto typo = MakeStep(StepOf("RandomRotation", {{"degrees", {10}}, {"degres", {5}}}));
  ASSERT_FALSE(typo.ok());
  EXPECT_NE(typo.error().message().find("degres"), std::string::npos);
  auto missing = MakeStep(StepOf("RandomRotation"));
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message().find("degrees"), std::string::npos);
  auto count = MakeStep(StepOf("RandomRotation", {{"degrees", {1, 2, 3}}}));
  ASSERT_FALSE(count.ok());
  EXPECT_NE(count.error().message().find("1 or 2"), std::string::npos);
  auto nan = MakeStep(StepOf("ColorJitter", {{"brightness", {std::nan("")}}}));
  EXPECT_FALSE(nan.ok());
  EXPECT_TRUE(MakeStep(StepOf("RandomRotation", {{"degrees", {10}}}, {{"interpolation", "bilinear"}})).ok());
  // A sigma that is positive as a double but 0 in float32 (where the kernel
  // is computed) would give NaN weights: refused when built and on replay.
  auto tiny = MakeStep(StepOf("GaussianBlur", {{"kernel_size", {3}}, {"sigma", {1e-300, 1}}}));
  ASSERT_FALSE(tiny.ok());
  EXPECT_NE(tiny.error().message().find("float32"), std::string::npos);
  auto blur = MakeStep(StepOf("GaussianBlur", {{"kernel_size", {3}}}));
  ASSERT_TRUE(blur.ok());
  Image im = StepGradient(5, 5), scratch;
  StepParams given{"GaussianBlur", {{"sigma", 1e-300}}, {}}, used;
  Rng rng(0, 0);
  const Status replay = (*blur)->Run(im, scratch, rng, &given, used);
  ASSERT_FALSE(replay.ok());
  EXPECT_NE(replay.message().find("sigma"), std::string::npos);
}

TEST(Steps, DrawsDependOnlyOnTheStream) {
  auto step = MakeStep(StepOf("RandomAffine", {{"degrees", {30}}, {"translate", {0.2, 0.2}}, {"scale", {0.5, 2}}}));
  ASSERT_TRUE(step.ok());
  Rng a(1, 2), b(1, 2), c(1, 3);
  const StepParams pa = (*step)->Draw({100, 80}, a), pb = (*step)->Draw({100, 80}, b), pc = (*step)->Draw({100, 80}, c);
  EXPECT_EQ(pa.values, pb.values);
  EXPECT_NE(pa.values, pc.values);
  ASSERT_EQ(pa.values.size(), 6u);
  EXPECT_EQ(pa.values[0].first, "angle");
  EXPECT_LE(std::abs(pa.values[0].second), 30);
  EXPECT_LE(std::abs(pa.values[1].second), 20);  // translate_x within 0.2 * width
}

TEST(Steps, ReplayTakesGivenParametersInAnyOrder) {
  auto step = MakeStep(StepOf("RandomCrop", {{"size", {4, 6}}}));
  ASSERT_TRUE(step.ok());
  Image im = StepGradient(10, 8), scratch;
  const Image original = im;
  StepParams given{"RandomCrop", {{"left", 3}, {"top", 2}}, {}};
  Rng rng(0, 0);
  StepParams used;
  ASSERT_TRUE((*step)->Run(im, scratch, rng, &given, used).ok());
  ASSERT_EQ(im.width, 6);
  ASSERT_EQ(im.height, 4);
  EXPECT_EQ(im.row(0)[0], original.row(2)[3 * 3]);
  EXPECT_EQ(used.values[0].first, "top");
  StepParams outside{"RandomCrop", {{"top", 5}, {"left", 0}}, {}};
  Image again = original;
  EXPECT_FALSE((*step)->Run(again, scratch, rng, &outside, used).ok());
}

TEST(Steps, RandomApplyReplaysItsChildren) {
  TransformStep apply = StepOf("RandomApply", {{"p", {0.5}}});
  apply.children.push_back(StepOf("RandomVerticalFlip", {{"p", {0.5}}}));
  auto step = MakeStep(apply);
  ASSERT_TRUE(step.ok());
  Image im = StepGradient(3, 2), scratch;
  const Image original = im;
  StepParams given{"RandomApply", {{"applied", 1}}, {StepParams{"RandomVerticalFlip", {{"flip", 1}}, {}}}};
  Rng rng(0, 0);
  StepParams used;
  ASSERT_TRUE((*step)->Run(im, scratch, rng, &given, used).ok());
  EXPECT_EQ(im.row(0)[0], original.row(1)[0]);
  ASSERT_EQ(used.children.size(), 1u);
  StepParams without_children{"RandomApply", {{"applied", 1}}, {}};
  EXPECT_FALSE((*step)->Run(im, scratch, rng, &without_children, used).ok());
  TransformStep empty = StepOf("RandomApply");
  EXPECT_FALSE(MakeStep(empty).ok());
}

TEST(Steps, RandomErasingWritesItsBoxInEveryLayoutAndDtype) {
  auto step = MakeStep(StepOf("RandomErasing", {{"p", {1}}, {"value", {1, 2, 3}}}));
  ASSERT_TRUE(step.ok());
  ASSERT_TRUE((*step)->on_tensor());
  std::vector<float> nchw(3 * 4 * 5, -1.0f);
  const TensorView view{nchw.data(), DType::kFloat32, Layout::kNCHW, 5, 4, 3};
  StepParams given{
      "RandomErasing", {{"erase", 1}, {"top", 1}, {"left", 2}, {"height", 2}, {"width", 3}, {"noise_seed", 0}}, {}};
  Rng rng(0, 0);
  StepParams used;
  ASSERT_TRUE((*step)->RunTensor(view, rng, &given, used).ok());
  EXPECT_EQ(nchw[0 * 20 + 1 * 5 + 2], 1.0f);
  EXPECT_EQ(nchw[2 * 20 + 2 * 5 + 4], 3.0f);
  EXPECT_EQ(nchw[1 * 20 + 0 * 5 + 2], -1.0f);  // row 0 untouched
  StepParams too_big = given;
  too_big.values[4].second = 4;  // width 4 from column 2 leaves a 5-wide image
  EXPECT_FALSE((*step)->RunTensor(view, rng, &too_big, used).ok());
  // Drawn boxes stay inside and are smaller than the image.
  for (std::uint64_t s = 0; s < 200; ++s) {
    Rng r(s, 1);
    const StepParams p = (*step)->Draw({5, 4}, r);
    if (p.values[0].second == 0) continue;
    EXPECT_LE(p.values[1].second + p.values[3].second, 4);
    EXPECT_LE(p.values[2].second + p.values[4].second, 5);
  }
}

TEST(Augmentation, RefusesStepsInTheWrongStage) {
  TransformOptions t;
  t.width = t.height = 32;
  t.after_crop = {StepOf("RandomErasing")};
  EXPECT_FALSE(Augmentation::Create(t).ok());
  t.after_crop = {StepOf("RandomRotation", {{"degrees", {10}}, {"expand", {1}}})};
  auto grows = Augmentation::Create(t);
  ASSERT_FALSE(grows.ok());
  EXPECT_NE(grows.error().message().find("change the 32x32"), std::string::npos);
  t.after_crop = {StepOf("RandomRotation", {{"degrees", {10}}})};
  EXPECT_TRUE(Augmentation::Create(t).ok());
  t.after_normalize = {StepOf("ColorJitter", {{"brightness", {0.2}}})};
  EXPECT_FALSE(Augmentation::Create(t).ok());
  t.after_normalize = {StepOf("RandomErasing")};
  EXPECT_TRUE(Augmentation::Create(t).ok());
  TransformOptions none;
  none.kind = TransformOptions::Kind::kNone;
  none.width = none.height = 32;
  none.before_crop = {StepOf("ColorJitter", {{"brightness", {0.2}}})};
  EXPECT_FALSE(Augmentation::Create(none).ok());  // nothing fixes the size
  none.before_crop.push_back(StepOf("RandomCrop", {{"size", {32}}, {"pad_if_needed", {1}}}));
  EXPECT_TRUE(Augmentation::Create(none).ok());
  none.before_crop.push_back(StepOf("Pad", {{"padding", {1}}}));
  EXPECT_FALSE(Augmentation::Create(none).ok());  // ends at 34x34
}

}  // namespace
}  // namespace stoker::transform

namespace stoker::transform {
namespace {

TEST(Targets, MasksAndBoxesFollowAnAffineStepAfterTheCrop) {
  auto step = MakeStep(StepOf("RandomAffine", {{"degrees", {10}}}));
  ASSERT_TRUE(step.ok());
  SampleGeometry g;
  g.valid = true;
  g.source = {20, 20};
  g.crop = SampleGeometry::Crop::kBox;
  g.box = {0, 0, 20, 20};
  g.out = {20, 20};
  // A shift by 5 to the right, nothing else.
  StepParams shift{"RandomAffine",
                   {{"angle", 0}, {"translate_x", 5}, {"translate_y", 0}, {"scale", 1}, {"shear_x", 0}, {"shear_y", 0}},
                   {}};
  g.after.push_back({step->get(), shift, {20, 20}});
  Image mask, scratch;
  mask.Reset(20, 20, 1);
  std::fill(mask.pixels.begin(), mask.pixels.end(), 0);
  for (int y = 4; y < 8; ++y)
    for (int x = 2; x < 6; ++x) mask.row(y)[x] = 3;
  ASSERT_TRUE(FollowMask(g, mask, scratch, 9).ok());
  EXPECT_EQ(mask.row(5)[8], 3);                      // moved 5 to the right
  EXPECT_EQ(mask.row(5)[6], 0);                      // from column 1
  EXPECT_EQ(mask.row(5)[4], 9);                      // moved in from outside: the fill
  std::vector<float> box{2, 4, 6, 8, 17, 0, 19, 3};  // the second leaves the image
  const auto keep = FollowBoxes(g, box);
  EXPECT_TRUE(keep[0]);
  EXPECT_FALSE(keep[1]);
  EXPECT_FLOAT_EQ(box[0], 7);
  EXPECT_FLOAT_EQ(box[2], 11);
}

}  // namespace
}  // namespace stoker::transform

namespace stoker::transform {
namespace {

TEST(Targets, AMaskDrawnInPartsEqualsTheWholeWarpCropped) {
  auto rotation = MakeStep(StepOf("RandomRotation", {{"degrees", {25}}}));
  ASSERT_TRUE(rotation.ok());
  Image mask, scratch;
  mask.Reset(60, 40, 1);
  for (std::size_t i = 0; i < mask.pixels.size(); ++i) mask.pixels[i] = static_cast<std::uint8_t>(i * 7 % 5);
  for (double angle : {-20.0, 3.5, 17.0}) {
    SampleGeometry whole;
    whole.valid = true;
    whole.source = {60, 40};
    const StepParams p{"RandomRotation", {{"angle", angle}}, {}};
    whole.before.push_back({rotation->get(), p, {60, 40}});
    whole.crop = SampleGeometry::Crop::kBox;
    whole.box = {11, 7, 41, 33};
    whole.out = {20, 16};
    SampleGeometry parts = whole;
    const auto warp = (*rotation)->WarpFor(p, {60, 40});
    ASSERT_TRUE(warp.has_value());
    const Rect crop{11, 7, 30, 26};
    parts.regions = {InputRegion(warp->matrix, {60, 40}, crop), crop};
    Image a = mask, b = mask;
    ASSERT_TRUE(FollowMask(whole, a, scratch, 9).ok());
    ASSERT_TRUE(FollowMask(parts, b, scratch, 9).ok());
    EXPECT_EQ(a.pixels, b.pixels) << angle;
  }
}

}  // namespace
}  // namespace stoker::transform
