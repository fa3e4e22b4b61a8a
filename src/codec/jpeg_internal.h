// libjpeg plumbing shared by the codec's JPEG code: an error manager that
// longjmps back instead of exiting, and RAII owners of libjpeg's
// decompressor and compressor.
#pragma once

#include <csetjmp>
#include <cstdio>
#include <cstdlib>

#include <fmt/format.h>
// jpeglib.h needs size_t and FILE first.
#include <jpeglib.h>

#include "stoker/status.h"

namespace stoker::codec::jpeg_internal {

// libjpeg reports errors by calling error_exit, which must not return: we
// longjmp back to the decoding function. Only trivially destructible locals
// live between setjmp and longjmp.
struct ErrorManager {
  jpeg_error_mgr base;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

inline void ErrorExit(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<ErrorManager*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, err->message);
  std::longjmp(err->jump, 1);
}

// Warnings (msg_level -1) mean corrupt data that libjpeg would paper over,
// e.g. a truncated file filled with grey: treat them as errors, so a damaged
// sample is never passed on silently. Trace messages (>= 0) are ignored.
inline void EmitMessage(j_common_ptr cinfo, int msg_level) {
  if (msg_level < 0) ErrorExit(cinfo);
}

// A libjpeg decompressor with our error handling, destroyed on scope exit.
// Functions using it check created(), then call setjmp(err.jump) in their own
// frame, so a longjmp never skips its destructor.
struct Decompressor {
  jpeg_decompress_struct cinfo{};
  ErrorManager err{};
  bool created = false;
  Decompressor() {
    cinfo.err = jpeg_std_error(&err.base);
    err.base.error_exit = ErrorExit;
    err.base.emit_message = EmitMessage;
    // Creation fails when the headers we were compiled with do not match the
    // library loaded at run time ("Wrong JPEG library version"): report it
    // rather than jump through an unset jmp_buf.
    if (setjmp(err.jump)) return;
    jpeg_create_decompress(&cinfo);
    created = true;
  }
  ~Decompressor() {
    if (created) jpeg_destroy_decompress(&cinfo);
  }
  [[nodiscard]] Status CreationError() const {
    return Status::Internal(fmt::format("libjpeg could not be initialised: {}", err.message));
  }
  Decompressor(const Decompressor&) = delete;
  Decompressor& operator=(const Decompressor&) = delete;
};

// A libjpeg compressor with our error handling (warnings ignored: a
// compressor's are about its own parameters), writing to memory.
struct Compressor {
  jpeg_compress_struct cinfo{};
  ErrorManager err{};
  bool created = false;
  unsigned char* buffer = nullptr;  // jpeg_mem_dest's, malloc'd
  unsigned long size = 0;
  Compressor() {
    cinfo.err = jpeg_std_error(&err.base);
    err.base.error_exit = ErrorExit;
    if (setjmp(err.jump)) return;
    jpeg_create_compress(&cinfo);
    created = true;
  }
  ~Compressor() {
    if (created) jpeg_destroy_compress(&cinfo);
    std::free(buffer);
  }
  Compressor(const Compressor&) = delete;
  Compressor& operator=(const Compressor&) = delete;
};

}  // namespace stoker::codec::jpeg_internal
