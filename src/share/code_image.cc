#include "share/code_image.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstring>

namespace stoker::share {
namespace {

std::uint64_t Load(const std::uint8_t* p, int bytes) {
  std::uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | p[i];  // little-endian, as fatbins and x86 ELF are
  return v;
}

// FNV-1a, 64-bit, over `n` bytes, continuing from `h`.
std::uint64_t Fnv(std::uint64_t h, const void* data, std::size_t n) {
  const auto* p = static_cast<const std::uint8_t*>(data);
  for (std::size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

std::uint64_t Finish(std::uint64_t h) {
  // A final mix (FNV's low bits are weak), and never 0 (0: no key).
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  return h == 0 ? 1 : h;
}

}  // namespace

std::uint64_t CodeImageLength(const void* image, std::size_t available) {
  if (image == nullptr || available < 4) return 0;
  const auto* p = static_cast<const std::uint8_t*>(image);
  std::uint64_t length = 0;
  if (Load(p, 4) == kFatbinMagic) {
    // magic u32, version u16, header size u16, fat size u64.
    if (available < 16) return 0;
    const std::uint64_t header = Load(p + 6, 2), body = Load(p + 8, 8);
    if (header < 16 || body > kMaxCodeImageBytes) return 0;
    length = header + body;
  } else if (std::memcmp(p,
                         "\x7f"
                         "ELF",
                         4) == 0) {
    // A 64-bit little-endian ELF (cubins are): the furthest of its two
    // header tables, which come after the sections they describe.
    if (available < 64 || p[4] != 2 || p[5] != 1) return 0;
    const std::uint64_t phoff = Load(p + 0x20, 8), shoff = Load(p + 0x28, 8);
    const std::uint64_t phentsize = Load(p + 0x36, 2), phnum = Load(p + 0x38, 2);
    const std::uint64_t shentsize = Load(p + 0x3a, 2), shnum = Load(p + 0x3c, 2);
    if (phoff > kMaxCodeImageBytes || shoff > kMaxCodeImageBytes) return 0;
    length = std::max<std::uint64_t>({64, phoff + phentsize * phnum, shoff + shentsize * shnum});
  } else {
    // PTX: text up to its NUL.
    for (std::size_t i = 0; i < 4; ++i)
      if (!(p[i] >= 0x20 && p[i] < 0x7f) && p[i] != '\n' && p[i] != '\r' && p[i] != '\t') return 0;
    const std::size_t limit = std::min<std::uint64_t>(available, kMaxCodeImageBytes);
    const void* end = std::memchr(p, 0, limit);
    if (end == nullptr) return 0;
    length = static_cast<const std::uint8_t*>(end) - p;
  }
  return length <= available && length <= kMaxCodeImageBytes ? length : 0;
}

std::uint64_t CodeBytesKey(const void* image, std::uint64_t length, std::uint64_t variant) {
  if (image == nullptr || length == 0) return 0;
  const auto* p = static_cast<const std::uint8_t*>(image);
  constexpr std::uint64_t kEdge = 64 << 10, kSamples = 256, kSample = 64;
  std::uint64_t h = 0xcbf29ce484222325ull;
  h = Fnv(h, &length, sizeof(length));
  h = Fnv(h, &variant, sizeof(variant));
  h = Fnv(h, p, std::min(length, kEdge));
  if (length > kEdge) h = Fnv(h, p + length - std::min(length - kEdge, kEdge), std::min(length - kEdge, kEdge));
  if (length > 2 * kEdge + kSample)
    for (std::uint64_t i = 0; i < kSamples; ++i) {
      const std::uint64_t at = kEdge + (length - 2 * kEdge - kSample) / kSamples * i;
      h = Fnv(h, p + at, kSample);
    }
  return Finish(h);
}

std::uint64_t CodeImageKey(const void* image, std::uint64_t variant) {
  // The wrapper the CUDA runtime registers ({magic, version, data, ...}):
  // the fatbin it points to, which the driver reads the same way.
  if (image != nullptr && Load(static_cast<const std::uint8_t*>(image), 4) == kFatbinWrapperMagic) {
    const void* data = nullptr;
    std::memcpy(&data, static_cast<const std::uint8_t*>(image) + 8, sizeof(data));
    image = data;
  }
  return CodeBytesKey(image, CodeImageLength(image, SIZE_MAX), variant);
}

std::uint64_t CodeFileKey(const char* path, std::uint64_t variant) {
  struct stat st {};
  if (path == nullptr || ::stat(path, &st) != 0 || !S_ISREG(st.st_mode)) return 0;
  std::uint64_t h = 0x84222325cbf29ce4ull;
  h = Fnv(h, path, std::strlen(path));
  const std::uint64_t facts[] = {static_cast<std::uint64_t>(st.st_size), static_cast<std::uint64_t>(st.st_mtim.tv_sec),
                                 static_cast<std::uint64_t>(st.st_mtim.tv_nsec), static_cast<std::uint64_t>(st.st_ino),
                                 variant};
  return Finish(Fnv(h, facts, sizeof(facts)));
}

}  // namespace stoker::share
