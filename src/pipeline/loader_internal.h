// Loader internals shared with the device layer: a loader whose batch
// buffers a different SampleFinisher lays out (the GPU-finishing one).
#pragma once

#include <memory>

#include "pipeline/sample_finisher.h"
#include "stoker/loader.h"

namespace stoker::pipeline {

// As Loader::Create, with `finisher` deciding what each batch buffer holds.
[[nodiscard]] Result<std::unique_ptr<Loader>> CreateLoader(std::shared_ptr<const Dataset> dataset,
                                                           const LoaderOptions& options,
                                                           std::shared_ptr<SampleFinisher> finisher);

}  // namespace stoker::pipeline
