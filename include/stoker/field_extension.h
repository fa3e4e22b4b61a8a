/* stoker/field_extension.h: your own field decoders, compiled into a shared
 * library and run on stoker's loader threads (no GIL, no Python).
 *
 * Plain C, so that a library built with another compiler or standard
 * library works: it includes only this header and links nothing of
 * stoker's. It exports one function,
 *
 *   int stoker_field_decoders(const StokerFieldDecoder** decoders, size_t* count);
 *
 * that hands stoker a table of decoders that lives as long as the library.
 * stoker.load_field_extension(path) (C++: LoadFieldExtension) loads it;
 * stoker.Custom(key, decoder="name") (FieldKind::kCustom, FieldSpec::decoder)
 * uses a decoder by name. See examples/field_extension/.
 */
#ifndef STOKER_FIELD_EXTENSION_H_
#define STOKER_FIELD_EXTENSION_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define STOKER_FIELD_EXTENSION_VERSION 1

/* Element types, NumPy's. */
enum StokerDType {
  STOKER_BOOL = 0,
  STOKER_INT8,
  STOKER_UINT8,
  STOKER_INT16,
  STOKER_UINT16,
  STOKER_INT32,
  STOKER_UINT32,
  STOKER_INT64,
  STOKER_UINT64,
  STOKER_FLOAT16,
  STOKER_FLOAT32,
  STOKER_FLOAT64
};

/* Where a decoder puts one sample's value: call exactly one of tensor() or
 * bytes(), or error() and return nonzero. The memory is stoker's. */
typedef struct StokerFieldOutput {
  void* ctx;
  /* A C-order tensor of `ndim` (at most 32) dimensions: returns the buffer
   * to fill (shape's product x the element size), or NULL (bad arguments). */
  void* (*tensor)(void* ctx, int dtype, int ndim, const int64_t* shape);
  /* Bytes handed over as they are (copied). */
  void (*bytes)(void* ctx, const void* data, size_t size);
  /* Why the field does not decode: the sample is reported (or skipped) as
   * corrupt, with this message, its key and where it lies. */
  void (*error)(void* ctx, const char* message);
} StokerFieldOutput;

/* Decodes one field's bytes. 0 on success; nonzero after out->error().
 * Called from several threads at once: keep no unguarded global state. */
typedef int (*StokerFieldDecodeFn)(const uint8_t* data, size_t size, StokerFieldOutput* out);

typedef struct StokerFieldDecoder {
  int version; /* STOKER_FIELD_EXTENSION_VERSION */
  const char* name;
  StokerFieldDecodeFn decode;
} StokerFieldDecoder;

typedef int (*StokerFieldDecodersFn)(const StokerFieldDecoder** decoders, size_t* count);

#ifdef __cplusplus
}
#endif

#endif /* STOKER_FIELD_EXTENSION_H_ */
