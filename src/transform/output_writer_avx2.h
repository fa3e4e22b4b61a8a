// OutputWriter's (transform.h) vector paths, planar (NCHW) and interleaved
// (NHWC): 8 pixels at a time, their bytes put in output order with
// shuffles (pixels in reverse order when flipped), and each value computed as the
// writer's tables were: float(v) / 255, less the mean, over the std, in
// IEEE single precision (the divisions are exact-rounded in vector lanes
// as in scalar code, so the floats are the tables'), then rounded to nearest
// even for float16 (F16C) or bfloat16. The writer checks every byte value
// against its tables once before using it. Built on x86-64 with GCC or
// Clang only; callers check HasAvx2() and F16C first.
#pragma once

#include <cstdint>

namespace stoker::transform {

enum class PlaneFormat { kUint8, kFloat32, kFloat16, kBFloat16 };

struct PlaneConstants {
  float mean[3] = {0, 0, 0};
  float std[3] = {1, 1, 1};
  bool normalize = false;
};

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
// Writes the first `blocks` * 8 pixels of each of the out_h rows of an
// out_w-wide RGB image (rows out_w * 3 bytes apart) to `dst`, elements of
// `format`: into three planes of out_w * out_h elements when `planar`
// (NCHW), else as out_w * out_h pixels of 3 elements (NHWC). Output pixel x
// (x = 0 .. 8 * blocks - 1) is source pixel x, or out_w - 1 - x when
// `flip`. Reads no byte outside the rows it takes pixels from; the caller
// writes the columns past 8 * blocks.
__attribute__((target("avx2,f16c"))) void WriteRowsAvx2(PlaneFormat format, bool planar, const PlaneConstants& k,
                                                        const std::uint8_t* rgb, int out_w, int out_h, int blocks,
                                                        bool flip, void* dst);
#endif

}  // namespace stoker::transform
