// Shared by the loader's tests and the device loader's: a small packed
// dataset of real JPEGs, small loader options, and one epoch's output.
#pragma once

#include <turbojpeg.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "stoker/dataset.h"
#include "stoker/loader.h"
#include "stoker/pack.h"
#include "test_util.h"

namespace stoker {

using testing::TempDir;
using testing::WriteFile;

inline std::string MakeJpeg(int w, int h, unsigned seed) {
  std::vector<unsigned char> rgb(static_cast<std::size_t>(w) * h * 3);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int c = 0; c < 3; ++c)
        rgb[(static_cast<std::size_t>(y) * w + x) * 3 + c] =
            static_cast<unsigned char>((x * (c + 1) + y * (3 - c) + seed * 40) & 0xff);
  tjhandle tj = tjInitCompress();
  unsigned char* out = nullptr;
  unsigned long size = 0;
  EXPECT_EQ(tjCompress2(tj, rgb.data(), w, 0, h, TJPF_RGB, &out, &size, TJSAMP_420, 90, 0), 0);
  std::string jpeg(reinterpret_cast<char*>(out), size);
  tjFree(out);
  tjDestroy(tj);
  return jpeg;
}

// Packs dir/src (an ImageFolder tree) into dir/out and opens it. Images
// that fail pack's header check are kept: loader tests pack damaged images
// on purpose, to see the loader name or skip them.
inline std::shared_ptr<const Dataset> PackSource(const TempDir& dir, PackOptions options = {}) {
  options.keep_bad_images = true;
  auto packed = Pack(dir / "src", dir / "out", options);
  EXPECT_TRUE(packed.ok()) << packed.error().ToString();
  auto dataset = Dataset::Open(dir / "out");
  EXPECT_TRUE(dataset.ok());
  return std::shared_ptr<const Dataset>(std::move(dataset).value());
}

// 3 classes x 10 images of varied sizes, packed into several shards.
inline std::shared_ptr<const Dataset> MakeDataset(const TempDir& dir, bool with_corrupt = false) {
  for (int c = 0; c < 3; ++c)
    for (int i = 0; i < 10; ++i)
      WriteFile(dir / ("src/c" + std::to_string(c) + "/" + std::to_string(i) + ".jpg"),
                MakeJpeg(60 + 7 * i, 50 + 5 * c, static_cast<unsigned>(c * 10 + i)));
  if (with_corrupt) WriteFile(dir / "src/c1/5.jpg", "this is not a JPEG at all, only text pretending to be one");
  PackOptions p;
  p.target_shard_bytes = 40000;
  return PackSource(dir, p);
}

inline LoaderOptions SmallOptions() {
  LoaderOptions o;
  o.batch_size = 4;
  o.seed = 5;
  o.rank = 0;
  o.world_size = 1;
  o.transform.width = o.transform.height = 32;
  return o;
}

struct Epoch {
  std::vector<std::uint64_t> indices;
  std::vector<std::int64_t> labels;
  std::vector<std::byte> pixels;
};

// The largest difference between two float32 epochs of the same size.
inline double MaxFloatDifference(const Epoch& a, const Epoch& b) {
  EXPECT_EQ(a.pixels.size(), b.pixels.size());
  const auto* x = reinterpret_cast<const float*>(a.pixels.data());
  const auto* y = reinterpret_cast<const float*>(b.pixels.data());
  double worst = 0;
  for (std::size_t i = 0; i < std::min(a.pixels.size(), b.pixels.size()) / 4; ++i)
    worst = std::max(worst, std::abs(static_cast<double>(x[i]) - y[i]));
  return worst;
}

// Appends batch `b`'s indices, labels and pixels to `e`.
inline void Append(Epoch& e, const Batch& b) {
  e.indices.insert(e.indices.end(), b.indices(), b.indices() + b.size());
  e.labels.insert(e.labels.end(), b.labels(), b.labels() + b.size());
  auto* p = static_cast<const std::byte*>(b.images());
  e.pixels.insert(e.pixels.end(), p, p + b.image_bytes());
}

inline Epoch RunEpoch(Loader& loader) {
  Epoch e;
  while (true) {
    auto next = loader.Next();
    EXPECT_TRUE(next.ok()) << next.error().ToString();
    if (!next.ok() || !next->has_value()) break;
    Append(e, **next);
  }
  return e;
}

}  // namespace stoker
