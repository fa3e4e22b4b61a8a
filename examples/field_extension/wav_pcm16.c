/* A field decoder of your own, run by stoker's loader threads: 16-bit PCM
 * WAV audio -> float32 [channels, frames] in [-1, 1).
 *
 * Build:  cc -O2 -shared -fPIC -I<stoker>/include wav_pcm16.c -o libwav_pcm16.so
 * Use:    stoker.load_field_extension("./libwav_pcm16.so")
 *         stoker.Loader(shards, fields={"audio": stoker.Custom("wav", decoder="wav_pcm16"), ...})
 *
 * It includes only stoker/field_extension.h and links nothing of stoker's.
 * Every malformed input is reported through out->error(): stoker names the
 * sample and where it lies, and skips it under on_corrupt="skip".
 */
#include <stdint.h>
#include <string.h>

#include "stoker/field_extension.h"

static uint32_t le32(const uint8_t* p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint16_t le16(const uint8_t* p) {
  return (uint16_t)(p[0] | p[1] << 8);
}

static int fail(StokerFieldOutput* out, const char* why) {
  out->error(out->ctx, why);
  return 1;
}

static int decode_wav(const uint8_t* data, size_t size, StokerFieldOutput* out) {
  if (size < 12 || memcmp(data, "RIFF", 4) != 0 || memcmp(data + 8, "WAVE", 4) != 0)
    return fail(out, "not a RIFF/WAVE file");
  const uint8_t* fmt = NULL;
  const uint8_t* samples = NULL;
  size_t samples_size = 0;
  size_t at = 12;
  while (at + 8 <= size) {
    const uint32_t chunk = le32(data + at + 4);
    if (chunk > size - at - 8) return fail(out, "a chunk runs past the end of the file");
    if (memcmp(data + at, "fmt ", 4) == 0 && chunk >= 16) fmt = data + at + 8;
    if (memcmp(data + at, "data", 4) == 0) {
      samples = data + at + 8;
      samples_size = chunk;
    }
    at += 8 + chunk + (chunk & 1);
  }
  if (fmt == NULL || samples == NULL) return fail(out, "no fmt or data chunk");
  const uint16_t format = le16(fmt), channels = le16(fmt + 2), bits = le16(fmt + 14);
  if (format != 1 || bits != 16) return fail(out, "only 16-bit PCM is decoded");
  if (channels == 0 || samples_size % (2u * channels) != 0) return fail(out, "data is not whole frames");
  const int64_t frames = (int64_t)(samples_size / (2u * channels));
  const int64_t shape[2] = {channels, frames};
  float* audio = (float*)out->tensor(out->ctx, STOKER_FLOAT32, 2, shape);
  if (audio == NULL) return fail(out, "stoker refused the tensor");
  for (int64_t f = 0; f < frames; ++f)
    for (uint16_t c = 0; c < channels; ++c)
      audio[c * frames + f] = (float)(int16_t)le16(samples + 2 * (f * channels + c)) / 32768.0f;
  return 0;
}

static const StokerFieldDecoder kDecoders[] = {{STOKER_FIELD_EXTENSION_VERSION, "wav_pcm16", decode_wav}};

int stoker_field_decoders(const StokerFieldDecoder** decoders, size_t* count) {
  *decoders = kDecoders;
  *count = sizeof(kDecoders) / sizeof(kDecoders[0]);
  return 0;
}
