// The public Pack(): the dataset layer's packer with the prepare layer's
// rewriters plugged in, in this order: the image header check (always), the
// image re-encoder when max_side asks for lighter images, and the
// seekable-JPEG writer when seekable_jpeg asks.
#include "dataset/pack_rewrite.h"
#include "prepare/image_check.h"
#include "prepare/jpeg_shrink.h"
#include "prepare/rewriter_chain.h"
#include "prepare/seekable_jpeg.h"
#include "stoker/pack.h"

namespace stoker {

Result<PackSummary> Pack(const std::string& source, const std::string& out_dir, const PackOptions& options) {
  const prepare::ImageHeaderCheck check(options.keep_bad_images);
  std::vector<const pack_internal::FieldRewriter*> rewriters{&check};
  std::unique_ptr<prepare::JpegShrinker> shrinker;
  if (options.max_side == 0) {
    if (options.quality != PackOptions{}.quality)
      return Status::InvalidArgument("a JPEG quality needs max_side (only re-encoded images take it)");
  } else {
    STOKER_ASSIGN_OR_RETURN(shrinker, prepare::JpegShrinker::Create(options.max_side, options.quality, &check));
    rewriters.push_back(shrinker.get());
  }
  std::optional<prepare::SeekableJpegWriter> seekable;
  if (options.seekable_jpeg) rewriters.push_back(&seekable.emplace());
  const prepare::RewriterChain chain(std::move(rewriters));
  return pack_internal::PackWith(source, out_dir, options, &chain);
}

}  // namespace stoker
