// The public Pack(): the dataset layer's packer, with the image re-encoder
// of the prepare layer plugged in when max_side asks for lighter images,
// and the seekable-JPEG writer (after it) when seekable_jpeg asks.
#include "dataset/pack_rewrite.h"
#include "prepare/jpeg_shrink.h"
#include "prepare/seekable_jpeg.h"
#include "stoker/pack.h"

namespace stoker {

Result<PackSummary> Pack(const std::string& source, const std::string& out_dir, const PackOptions& options) {
  std::unique_ptr<prepare::JpegShrinker> shrinker;
  if (options.max_side == 0) {
    if (options.quality != PackOptions{}.quality)
      return Status::InvalidArgument("a JPEG quality needs max_side (only re-encoded images take it)");
  } else {
    STOKER_ASSIGN_OR_RETURN(shrinker, prepare::JpegShrinker::Create(options.max_side, options.quality));
  }
  if (!options.seekable_jpeg) return pack_internal::PackWith(source, out_dir, options, shrinker.get());
  const prepare::SeekableJpegWriter seekable(shrinker.get());
  return pack_internal::PackWith(source, out_dir, options, &seekable);
}

}  // namespace stoker
