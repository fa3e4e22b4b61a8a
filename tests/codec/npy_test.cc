#include "codec/npy.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

namespace stoker::codec {
namespace {

std::vector<std::byte> Npy(const std::string& dict, const std::vector<std::uint8_t>& data, int major = 1) {
  std::string header = dict;
  const std::size_t prefix = major == 1 ? 10 : 12;
  while ((prefix + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::string out = "\x93NUMPY";
  out += static_cast<char>(major);
  out += '\0';
  const std::size_t n = header.size();
  out += static_cast<char>(n & 0xFF);
  out += static_cast<char>((n >> 8) & 0xFF);
  if (major != 1) out += std::string("\0\0", 2);
  out += header;
  std::vector<std::byte> bytes(out.size() + data.size());
  std::memcpy(bytes.data(), out.data(), out.size());
  if (!data.empty()) std::memcpy(bytes.data() + out.size(), data.data(), data.size());
  return bytes;
}

std::vector<std::byte> Copy(const NpyArray& a) {
  std::vector<std::byte> out(a.elements() * ElementSize(a.type));
  CopyNpyData(a, out.data());
  return out;
}

TEST(Npy, FortranOrderIsBroughtToCOrder) {
  // [[0, 1, 2], [3, 4, 5]] stored column by column: 0 3 1 4 2 5.
  const auto bytes = Npy("{'descr': '|u1', 'fortran_order': True, 'shape': (2, 3), }", {0, 3, 1, 4, 2, 5});
  auto a = ParseNpy(bytes);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->shape, (std::vector<std::int64_t>{2, 3}));
  const auto c = Copy(*a);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(static_cast<int>(c[i]), i);
}

TEST(Npy, ThreeDimensionalFortranOrder) {
  // shape (2, 2, 2), element (i, j, k) = 4i + 2j + k, Fortran offset i + 2j + 4k.
  std::vector<std::uint8_t> data(8);
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j)
      for (int k = 0; k < 2; ++k) data[i + 2 * j + 4 * k] = static_cast<std::uint8_t>(4 * i + 2 * j + k);
  const auto bytes = Npy("{'descr': '|u1', 'fortran_order': True, 'shape': (2, 2, 2), }", data);
  auto a = ParseNpy(bytes);  // (the array points into `bytes`)
  ASSERT_TRUE(a.ok());
  const auto c = Copy(*a);
  for (int e = 0; e < 8; ++e) EXPECT_EQ(static_cast<int>(c[e]), e);
}

TEST(Npy, BigEndianIsSwapped) {
  const auto bytes = Npy("{'descr': '>i2', 'fortran_order': False, 'shape': (2,), }", {0x01, 0x02, 0xFF, 0xFE}, 2);
  auto a = ParseNpy(bytes);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_TRUE(a->byte_swapped);
  const auto c = Copy(*a);
  std::int16_t v[2];
  std::memcpy(v, c.data(), 4);
  EXPECT_EQ(v[0], 0x0102);
  EXPECT_EQ(v[1], -2);
}

TEST(Npy, ScalarsAndEmptyArrays) {
  auto scalar = ParseNpy(Npy("{'descr': '<f4', 'fortran_order': False, 'shape': (), }", {0, 0, 0x80, 0x3F}));
  ASSERT_TRUE(scalar.ok());
  EXPECT_TRUE(scalar->shape.empty());
  EXPECT_EQ(scalar->elements(), 1u);
  auto empty = ParseNpy(Npy("{'descr': '<f8', 'fortran_order': False, 'shape': (0, 5), }", {}));
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->elements(), 0u);
}

TEST(Npy, HeadersThatLieAreCorruption) {
  const std::string dict = "{'descr': '<i4', 'fortran_order': False, 'shape': (3,), }";
  for (std::size_t n : {0u, 11u, 13u}) {
    auto a = ParseNpy(Npy(dict, std::vector<std::uint8_t>(n)));
    ASSERT_FALSE(a.ok());
    EXPECT_EQ(a.status().code(), StatusCode::kCorruption);
    EXPECT_NE(a.status().message().find("needs 12 bytes"), std::string::npos) << a.status().message();
  }
  // A product of dimensions far past 2^64.
  auto huge = ParseNpy(Npy("{'descr': '<f8', 'fortran_order': False, 'shape': (4294967296, 4294967296, 16), }", {1}));
  ASSERT_FALSE(huge.ok());
  EXPECT_NE(huge.status().message().find("needs more than 1 bytes"), std::string::npos) << huge.status().message();
  // Header length past the end.
  auto b = Npy(dict, std::vector<std::uint8_t>(12));
  b[8] = std::byte{0xFF};
  b[9] = std::byte{0x7F};
  EXPECT_EQ(ParseNpy(b).status().code(), StatusCode::kCorruption);
}

TEST(Npy, MalformedDictionariesAreCorruption) {
  for (const char* dict : {
           "{'descr': '<i4', 'fortran_order': False}",                                 // no shape
           "{'descr': '<i4', 'fortran_order': False, 'shape': (3,), 'x': 1}",          // extra key
           "{'descr': '<i4', 'descr': '<i4', 'fortran_order': False, 'shape': (3,)}",  // repeated
           "{'descr': '<i4', 'fortran_order': Maybe, 'shape': (3,)}",
           "{'descr': '<i4', 'fortran_order': False, 'shape': (3,-1)}",
           "{'descr': '<i4', 'fortran_order': False, 'shape': (3,)} trailing",
           "['descr', '<i4']",
           "{'descr': '<i4', 'fortran_order': False, 'shape': (3,)",
       }) {
    auto a = ParseNpy(Npy(dict, std::vector<std::uint8_t>(12)));
    ASSERT_FALSE(a.ok()) << dict;
    EXPECT_EQ(a.status().code(), StatusCode::kCorruption) << dict;
  }
}

TEST(Npy, UnsupportedDtypesSaySo) {
  for (const char* descr : {"|O", "<c8", "|S10", "<U3", "<M8[ns]", "<f16", "<i3"}) {
    auto a = ParseNpy(Npy(std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': (1,), }", {}));
    ASSERT_FALSE(a.ok()) << descr;
    EXPECT_EQ(a.status().code(), StatusCode::kUnimplemented) << descr;
  }
  // A structured dtype is a list, not a string.
  auto s = ParseNpy(Npy("{'descr': [('a', '<i4')], 'fortran_order': False, 'shape': (1,), }", {0, 0, 0, 0}));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("simple type string"), std::string::npos);
}

}  // namespace
}  // namespace stoker::codec
