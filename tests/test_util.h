// Helpers shared by the C++ tests.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "stoker/status.h"

namespace stoker::testing {

// A fresh directory removed with everything in it at scope exit.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "stoker-test-XXXXXX").string();
    path_ = ::mkdtemp(pattern.data());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::permissions(path_, std::filesystem::perms::owner_all, ec);
    std::filesystem::remove_all(path_, ec);
  }
  [[nodiscard]] const std::string& path() const { return path_; }
  [[nodiscard]] std::string operator/(const std::string& rel) const { return path_ + "/" + rel; }

 private:
  std::string path_;
};

inline void WriteFile(const std::string& path, std::string_view content) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream out(path, std::ios::binary);
  out.write(content.data(), static_cast<std::streamsize>(content.size()));
}

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

inline std::span<const std::byte> Bytes(std::string_view s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

inline std::string Text(std::span<const std::byte> b) {
  return {reinterpret_cast<const char*>(b.data()), b.size()};
}

// Deterministic pseudo-random bytes.
inline std::string RandomBytes(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (auto& c : s) c = static_cast<char>(rng() & 0xff);
  return s;
}

// `n` bytes (at least 33) that pass pack's image header check as an 8x8
// grey image of the format `extension` names (a JPEG's header up to its
// scan, or a PNG's signature and IHDR), then RandomBytes: for tests of
// pack's mechanics, where the pixels do not matter. They do not decode.
inline std::string FakeImage(std::string_view extension, std::size_t n, unsigned seed) {
  static constexpr std::string_view kJpegHeader(
      "\xff\xd8\xff\xc0\x00\x0b\x08\x00\x08\x00\x08\x01\x01\x11\x00\xff\xda\x00\x08\x01\x01\x00\x00\x3f\x00", 25);
  static constexpr std::string_view kPngHeader(
      "\x89PNG\r\n\x1a\n\x00\x00\x00\x0dIHDR\x00\x00\x00\x08\x00\x00\x00\x08\x08\x00\x00\x00\x00\xe1\x64\xe1\x57", 33);
  std::string lower(extension);
  for (auto& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  const std::string_view header = lower == "png" ? kPngHeader : kJpegHeader;
  std::string s = RandomBytes(n, seed);
  s.replace(0, std::min(n, header.size()), header.substr(0, std::min(n, header.size())));
  return s;
}

}  // namespace stoker::testing

#define ASSERT_OK(expr)                                                  \
  do {                                                                   \
    const ::stoker::Status assert_ok_status_ = (expr);                   \
    ASSERT_TRUE(assert_ok_status_.ok()) << assert_ok_status_.ToString(); \
  } while (false)

// `ASSERT_OK_AND_ASSIGN(auto x, MakeX());`
#define ASSERT_OK_AND_ASSIGN(lhs, expr) ASSERT_OK_AND_ASSIGN_IMPL_(STOKER_CONCAT_(assert_result_, __LINE__), lhs, expr)
#define ASSERT_OK_AND_ASSIGN_IMPL_(tmp, lhs, expr)        \
  auto tmp = (expr);                                      \
  ASSERT_TRUE(tmp.has_value()) << tmp.error().ToString(); \
  lhs = std::move(tmp).value()
