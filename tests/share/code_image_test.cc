// Keys for code images and files (code_image.h), and the ledger's table of
// what their loads took.
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "share/code_image.h"
#include "share/ledger.h"

namespace stoker::share {
namespace {

void Put(std::vector<std::uint8_t>& b, std::size_t at, std::uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) b[at + i] = static_cast<std::uint8_t>(v >> (8 * i));
}

TEST(CodeImage, EachFormatsLengthComesFromItsOwnHeader) {
  // A fatbin: 16 bytes of header, then its body.
  std::vector<std::uint8_t> fatbin(16 + 1000, 0xab);
  Put(fatbin, 0, kFatbinMagic, 4);
  Put(fatbin, 4, 1, 2);
  Put(fatbin, 6, 16, 2);
  Put(fatbin, 8, 1000, 8);
  EXPECT_EQ(CodeImageLength(fatbin.data(), fatbin.size()), 1016u);
  EXPECT_EQ(CodeImageLength(fatbin.data(), 500), 0u);  // longer than what is there
  // A 64-bit ELF: its section headers at 4,000, 10 of 64 bytes.
  std::vector<std::uint8_t> elf(4640, 0);
  std::memcpy(elf.data(),
              "\x7f"
              "ELF",
              4);
  elf[4] = 2;
  elf[5] = 1;
  Put(elf, 0x28, 4000, 8);
  Put(elf, 0x3a, 64, 2);
  Put(elf, 0x3c, 10, 2);
  EXPECT_EQ(CodeImageLength(elf.data(), elf.size()), 4640u);
  elf[4] = 1;  // 32-bit: not a cubin
  EXPECT_EQ(CodeImageLength(elf.data(), elf.size()), 0u);
  // PTX: up to its NUL.
  const char ptx[] = ".version 8.0\n.target sm_90\n";
  EXPECT_EQ(CodeImageLength(ptx, sizeof(ptx)), sizeof(ptx) - 1);
  EXPECT_EQ(CodeImageLength(ptx, 10), 0u);  // no NUL within reach
  const std::uint8_t binary[] = {0x01, 0x02, 0x03, 0x04, 0x00};
  EXPECT_EQ(CodeImageLength(binary, sizeof(binary)), 0u);
}

TEST(CodeImage, KeysTellCodeApartAndAgreeOnTheSameCode) {
  std::vector<std::uint8_t> a(3 << 20);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = static_cast<std::uint8_t>(i * 7 + (i >> 9));
  std::vector<std::uint8_t> b = a;
  EXPECT_EQ(CodeBytesKey(a.data(), a.size()), CodeBytesKey(b.data(), b.size()));
  EXPECT_NE(CodeBytesKey(a.data(), a.size()), 0u);
  b.front() ^= 1;  // a change at either end, or in the middle's samples, or of length, is another key
  EXPECT_NE(CodeBytesKey(a.data(), a.size()), CodeBytesKey(b.data(), b.size()));
  b.front() ^= 1;
  b.back() ^= 1;
  EXPECT_NE(CodeBytesKey(a.data(), a.size()), CodeBytesKey(b.data(), b.size()));
  b.back() ^= 1;
  EXPECT_NE(CodeBytesKey(a.data(), a.size()), CodeBytesKey(a.data(), a.size() - 1));
  EXPECT_NE(CodeBytesKey(a.data(), a.size(), 1), CodeBytesKey(a.data(), a.size(), 2));  // JIT options
  EXPECT_EQ(CodeImageKey(nullptr), 0u);
  // The runtime's wrapper is keyed as the fatbin it points to.
  std::vector<std::uint8_t> fatbin(16 + 100, 7);
  Put(fatbin, 0, kFatbinMagic, 4);
  Put(fatbin, 6, 16, 2);
  Put(fatbin, 8, 100, 8);
  struct {
    std::uint32_t magic, version;
    const void* data;
    void* filename;
  } wrapper{kFatbinWrapperMagic, 1, fatbin.data(), nullptr};
  EXPECT_NE(CodeImageKey(fatbin.data()), 0u);
  EXPECT_EQ(CodeImageKey(&wrapper), CodeImageKey(fatbin.data()));
  // Files: by path, size and modification.
  const std::string path = "/tmp/stoker-code-image-" + std::to_string(::getpid());
  std::ofstream(path) << "ptx";
  const std::uint64_t k = CodeFileKey(path.c_str());
  EXPECT_NE(k, 0u);
  EXPECT_EQ(CodeFileKey(path.c_str()), k);
  std::ofstream(path) << "ptx, longer";
  EXPECT_NE(CodeFileKey(path.c_str()), k);
  ::unlink(path.c_str());
  EXPECT_EQ(CodeFileKey(path.c_str()), 0u);
}

TEST(CodeImage, TheLedgerLearnsWhatEachCodeTookPerDeviceAndForgetsTheLeastUsed) {
  const std::string path = "/dev/shm/stoker-code-sizes-" + std::to_string(::getpid());
  ::unlink(path.c_str());
  std::string error;
  std::unique_ptr<Ledger> ledger(Ledger::Open(path, &error));
  ASSERT_NE(ledger, nullptr) << error;
  ASSERT_TRUE(ledger->Register("t", 0, &error)) << error;
  EXPECT_EQ(ledger->CodeBytes(0, 42), 0u);
  ledger->LearnCodeBytes(0, 42, 5 << 20);
  EXPECT_EQ(ledger->CodeBytes(0, 42), 5u << 20);
  EXPECT_EQ(ledger->CodeBytes(1, 42), 0u);  // another device
  ledger->LearnCodeBytes(0, 42, 6 << 20);   // measured again: the newest counts
  EXPECT_EQ(ledger->CodeBytes(0, 42), 6u << 20);
  // A full table makes room: every key fits in turn, the newest is kept.
  for (std::uint64_t k = 1000; k < 1000 + 2 * kMaxCodeSizes; ++k) ledger->LearnCodeBytes(0, k, k);
  EXPECT_EQ(ledger->CodeBytes(0, 1000 + 2 * kMaxCodeSizes - 1), 1000 + 2 * kMaxCodeSizes - 1);
  ledger.reset();
  ::unlink(path.c_str());
}

}  // namespace
}  // namespace stoker::share
