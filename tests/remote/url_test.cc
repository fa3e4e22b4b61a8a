// Remote locations: the index of a dataset URL, shards beside it, and a
// query string (an access token) kept on each.
#include "remote/url.h"

#include <gtest/gtest.h>

#include "test_util.h"

namespace stoker::remote {
namespace {

TEST(Url, TheIndexGoesBeforeTheQueryString) {
  EXPECT_EQ(IndexUrl("https://h/data"), "https://h/data/index.stoker");
  EXPECT_EQ(IndexUrl("https://h/data/"), "https://h/data/index.stoker");
  EXPECT_EQ(IndexUrl("https://h/data/index.stoker"), "https://h/data/index.stoker");
  EXPECT_EQ(IndexUrl("https://h/data?X-Amz-Signature=s&token=t/x"),
            "https://h/data/index.stoker?X-Amz-Signature=s&token=t/x");
  EXPECT_EQ(IndexUrl("s3://bucket/prefix"), "s3://bucket/prefix/index.stoker");
}

TEST(Url, ShardsLieBesideTheIndexWithItsQueryString) {
  EXPECT_EQ(SiblingUrl("https://h/data/index.stoker", "shard-000000.tar"), "https://h/data/shard-000000.tar");
  EXPECT_EQ(SiblingUrl("https://h/data/index.stoker?token=a/b", "sub/shard-1.tar"),
            "https://h/data/sub/shard-1.tar?token=a/b");
  EXPECT_EQ(SiblingUrl("https://h/data/index.stoker?t=1", "/abs/s.tar"), "https://h/abs/s.tar?t=1");
  EXPECT_EQ(SiblingUrl("https://h/data/index.stoker", "https://other/s.tar"), "https://other/s.tar");
  EXPECT_EQ(SiblingUrl("https://h/data/index.stoker", "./s.tar"), "https://h/data/s.tar");
}

TEST(Url, RequestsCarryTheTimeoutsAndS3IsSigned) {
  RemoteOptions o;
  o.connect_timeout_seconds = 3;
  o.stall_timeout_seconds = 4;
  ASSERT_OK_AND_ASSIGN(auto r, RequestFor("https://h/x", o));
  EXPECT_EQ(r.url, "https://h/x");
  EXPECT_EQ(r.connect_timeout_seconds, 3);
  EXPECT_EQ(r.stall_timeout_seconds, 4);
  EXPECT_TRUE(r.aws_sigv4.empty());
  EXPECT_FALSE(RequestFor("ftp://h/x", o).ok());
  EXPECT_EQ(RetryFor(o).deadline_seconds, o.fetch_deadline_seconds);
}

}  // namespace
}  // namespace stoker::remote
