// What identifies the code a module or library load is given, so that the
// memory the load took can be learned once and admitted before the next
// load of the same code (a ledger's code sizes, Ledger::CodeBytes):
//  - an image in memory (cuModuleLoadData, cuLibraryLoadData, ...): its
//    length as its format says (a fatbin's header, a 64-bit ELF cubin's
//    section and program header tables, PTX text's terminating NUL), and a
//    hash of that length and of samples of its bytes (its first and last
//    64 KiB and 256 spread between: an image of hundreds of megabytes is
//    keyed in well under a millisecond);
//  - a file (cuModuleLoad, cuLibraryLoadFromFile): its path, size and
//    modification time.
// 0 where the code cannot be told (an image of another format, a file that
// cannot be read): the load is then measured after the fact, as before.
//
// Plain C++ and the C library: this runs inside the interposer.
#pragma once

#include <cstddef>
#include <cstdint>

namespace stoker::share {

inline constexpr std::uint32_t kFatbinMagic = 0xBA55ED50u;
inline constexpr std::uint32_t kFatbinWrapperMagic = 0x466243B1u;  // the runtime's wrapper around a fatbin
// Images longer than this are not believed (a corrupt header).
inline constexpr std::uint64_t kMaxCodeImageBytes = 4ull << 30;

// The image's length by its format, reading at most `available` bytes of
// it (SIZE_MAX: as many as its format says, as the driver will); 0 when its
// format is none of the above, or its length passes `available` or
// kMaxCodeImageBytes.
std::uint64_t CodeImageLength(const void* image, std::size_t available);

// The key of the image at `image` (0: none), read as the driver will read
// it (through the runtime's fatbin wrapper to the fatbin). `variant` mixes in what else shapes the load (JIT options).
std::uint64_t CodeImageKey(const void* image, std::uint64_t variant = 0);
// The same for the bytes [image, image + length) already known.
std::uint64_t CodeBytesKey(const void* image, std::uint64_t length, std::uint64_t variant = 0);

// The key of the code file at `path` (0: it cannot be read).
std::uint64_t CodeFileKey(const char* path, std::uint64_t variant = 0);

}  // namespace stoker::share
