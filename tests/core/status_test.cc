#include "stoker/status.h"

#include <cerrno>

#include <gtest/gtest.h>

namespace stoker {
namespace {

Result<int> Half(int x) {
  if (x % 2 != 0) return Status::InvalidArgument("odd");
  return x / 2;
}

Result<int> Quarter(int x) {
  STOKER_ASSIGN_OR_RETURN(int half, Half(x));
  STOKER_ASSIGN_OR_RETURN(int quarter, Half(half));
  return quarter;
}

Status CheckEven(int x) {
  STOKER_RETURN_IF_ERROR(Half(x).status());
  return Status::Ok();
}

TEST(Status, DefaultIsOk) {
  Status s;
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.ToString(), "ok");
}

TEST(Status, CarriesCodeAndMessage) {
  Status s = Status::Corruption("a.tar:512: bad header");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kCorruption);
  EXPECT_EQ(s.ToString(), "corruption: a.tar:512: bad header");
  EXPECT_EQ(s.WithContext("verify").message(), "verify: a.tar:512: bad header");
  EXPECT_EQ(s.WithContext("verify").code(), StatusCode::kCorruption);
}

TEST(Status, FromErrnoMapsCodes) {
  EXPECT_EQ(Status::FromErrno(ENOENT, "open 'x'").code(), StatusCode::kNotFound);
  EXPECT_EQ(Status::FromErrno(ENOSPC, "write 'x'").code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(Status::FromErrno(EACCES, "open 'x'").code(), StatusCode::kIOError);
  EXPECT_NE(Status::FromErrno(ENOENT, "open 'x'").message().find("open 'x': "), std::string::npos);
}

TEST(Result, ValueAndErrorPropagate) {
  auto q = Quarter(8);
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(*q, 2);
  auto bad = Quarter(6);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(CheckEven(4).ok());
  EXPECT_FALSE(CheckEven(3).ok());
}

// A Result holds a value or an error; built from an OK status (a bug) it
// holds an internal error in every build type, never "neither".
TEST(Result, BuiltFromAnOkStatusHoldsAnInternalError) {
  Result<int> r = Status::Ok();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), StatusCode::kInternal);
  EXPECT_NE(r.error().message().find("OK status"), std::string::npos);
}

TEST(Status, NewCodesHaveNames) {
  EXPECT_EQ(Status::DeadlineExceeded("x").ToString(), "deadline exceeded: x");
  EXPECT_EQ(Status::FailedPrecondition("x").ToString(), "failed precondition: x");
}

TEST(Result, MoveOnlyValues) {
  auto make = []() -> Result<std::unique_ptr<int>> { return std::make_unique<int>(7); };
  auto r = make();
  ASSERT_TRUE(r.ok());
  std::unique_ptr<int> p = std::move(r).value();
  EXPECT_EQ(*p, 7);
}

}  // namespace
}  // namespace stoker
