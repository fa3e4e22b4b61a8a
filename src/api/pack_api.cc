// The public Pack(): the dataset layer's packer, with the image re-encoder
// of the prepare layer plugged in when max_side asks for lighter images.
#include "dataset/pack_rewrite.h"
#include "prepare/jpeg_shrink.h"
#include "stoker/pack.h"

namespace stoker {

Result<PackSummary> Pack(const std::string& source, const std::string& out_dir, const PackOptions& options) {
  if (options.max_side == 0) {
    if (options.quality != PackOptions{}.quality)
      return Status::InvalidArgument("a JPEG quality needs max_side (only re-encoded images take it)");
    return pack_internal::PackWith(source, out_dir, options, nullptr);
  }
  STOKER_ASSIGN_OR_RETURN(auto shrinker, prepare::JpegShrinker::Create(options.max_side, options.quality));
  return pack_internal::PackWith(source, out_dir, options, shrinker.get());
}

}  // namespace stoker
