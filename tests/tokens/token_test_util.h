// Token datasets written for the tests: `docs` as DIR/corpus.idx + .bin.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string_view>
#include <vector>

#include "stoker/tokens.h"
#include "test_util.h"

namespace stoker::testing {

inline std::shared_ptr<const TokenDataset> WriteTokenCorpus(const TempDir& dir,
                                                            const std::vector<std::vector<std::int64_t>>& docs,
                                                            std::string_view type = "uint16", bool overwrite = false) {
  auto writer = TokenDatasetWriter::Create(dir / "corpus", type, overwrite);
  EXPECT_TRUE(writer.ok()) << writer.error().ToString();
  for (const auto& d : docs) EXPECT_TRUE((*writer)->AddDocument(d).ok());
  EXPECT_TRUE((*writer)->Finish().ok());
  auto opened = TokenDataset::Open(dir / "corpus");
  EXPECT_TRUE(opened.ok()) << opened.error().ToString();
  return std::move(opened).value();
}

}  // namespace stoker::testing
