#include "remote/http.h"

#include <gtest/gtest.h>

#include <cmath>

#include "fake_clock.h"
#include "remote/fake_transport.h"

namespace stoker::remote {
namespace {

using testing::FakeTransport;
using testing::Fault;
using testing::MakeFault;
using testing::Pattern;
using testing::StatusFault;

constexpr const char* kUrl = "http://store/data/shard-000000.tar";

struct Download {
  std::vector<std::byte> bytes;
  int restarts = 0;
  std::vector<double> sleeps;
  FetchStats stats;
  Status status;
};

Download Fetch(FakeTransport& t, std::optional<std::uint64_t> expected, std::uint32_t attempts = 8,
               double deadline_seconds = 0, std::optional<std::uint64_t> range_start = {},
               std::optional<std::uint64_t> range_end = {}) {
  Download d;
  stoker::testing::FakeClock clock;
  RetryPolicy policy;
  policy.max_attempts = attempts;
  policy.clock = &clock;
  policy.deadline_seconds = deadline_seconds;
  HttpRequest request;
  request.url = kUrl;
  request.range_start = range_start;
  request.range_end = range_end;
  d.status = FetchObject(
      t, request, expected,
      [&](std::span<const std::byte> data) {
        d.bytes.insert(d.bytes.end(), data.begin(), data.end());
        return Status::Ok();
      },
      [&] {
        d.bytes.clear();
        ++d.restarts;
        return Status::Ok();
      },
      policy, &d.stats);
  d.sleeps = clock.sleeps();
  return d;
}

TEST(Fetch, APartOfAnObjectResumesWithinItsRangeAndNeedsRanges) {
  FakeTransport t;
  const auto data = Pattern(100000, 4);
  t.Put(kUrl, data);
  t.AddFault(kUrl, MakeFault(Fault::Kind::kTruncate, 5000));
  Download d = Fetch(t, 20000, 8, 0, 40000, 59999);
  ASSERT_TRUE(d.status.ok()) << d.status.ToString();
  EXPECT_EQ(d.bytes, std::vector<std::byte>(data.begin() + 40000, data.begin() + 60000));
  const auto requests = t.requests(kUrl);
  ASSERT_EQ(requests.size(), 2u);
  EXPECT_EQ(requests[1].range_start.value_or(0), 45000u);  // resumed inside the part
  EXPECT_EQ(requests[1].range_end.value_or(0), 59999u);

  FakeTransport plain;
  plain.Put(kUrl, data);
  plain.AddFault(kUrl, MakeFault(Fault::Kind::kIgnoreRange));
  Download whole = Fetch(plain, 20000, 8, 0, 40000, 59999);
  ASSERT_FALSE(whole.status.ok());
  EXPECT_EQ(whole.status.code(), StatusCode::kUnimplemented);
  EXPECT_NE(whole.status.message().find("ignores Range requests"), std::string::npos) << whole.status.ToString();
  EXPECT_EQ(plain.requests(kUrl).size(), 1u);  // not retried
}

TEST(Fetch, TruncatedBodiesResumeByRangeUnderIfMatch) {
  FakeTransport t;
  const auto data = Pattern(100000, 1);
  t.Put(kUrl, data);
  t.AddFault(kUrl, MakeFault(Fault::Kind::kTruncate, 30000));
  t.AddFault(kUrl, MakeFault(Fault::Kind::kReset, 20000));
  Download d = Fetch(t, data.size());
  ASSERT_TRUE(d.status.ok()) << d.status.ToString();
  EXPECT_EQ(d.bytes, data);
  EXPECT_EQ(d.restarts, 0);
  const auto requests = t.requests(kUrl);
  ASSERT_EQ(requests.size(), 3u);
  EXPECT_FALSE(requests[0].range_start.has_value());
  EXPECT_EQ(requests[1].range_start.value_or(0), 30000u);
  EXPECT_EQ(requests[2].range_start.value_or(0), 50000u);
  EXPECT_EQ(requests[1].if_match, "\"v1\"");
  EXPECT_EQ(d.stats.retries, 2u);
}

TEST(Fetch, AServerIgnoringTheRangeIsSkippedThrough) {
  FakeTransport t;
  const auto data = Pattern(50000, 2);
  t.Put(kUrl, data);
  t.AddFault(kUrl, MakeFault(Fault::Kind::kTruncate, 12345));
  t.AddFault(kUrl, MakeFault(Fault::Kind::kIgnoreRange));
  Download d = Fetch(t, data.size());
  ASSERT_TRUE(d.status.ok()) << d.status.ToString();
  EXPECT_EQ(d.bytes, data);
  EXPECT_EQ(d.restarts, 0);
}

TEST(Fetch, AnObjectChangedWhileResumingStartsOver) {
  FakeTransport t;
  auto data = Pattern(40000, 3);
  t.Put(kUrl, data);
  t.AddFault(kUrl, MakeFault(Fault::Kind::kTruncate, 10000));
  t.AddFault(kUrl, MakeFault(Fault::Kind::kChangeEtag));  // If-Match fails: 412
  Download d = Fetch(t, data.size());
  ASSERT_TRUE(d.status.ok()) << d.status.ToString();
  EXPECT_EQ(d.bytes, data);
  EXPECT_EQ(d.restarts, 1);
}

TEST(Fetch, RetryAfterIsHonouredAndBackoffIsCappedWithJitter) {
  FakeTransport t;
  t.Put(kUrl, Pattern(1000, 4));
  t.AddFault(kUrl, StatusFault(429, 7.0));
  for (int i = 0; i < 4; ++i) t.AddFault(kUrl, StatusFault(503));
  Download d = Fetch(t, 1000);
  ASSERT_TRUE(d.status.ok()) << d.status.ToString();
  ASSERT_EQ(d.sleeps.size(), 5u);
  EXPECT_GE(d.sleeps[0], 7.0);
  for (std::size_t k = 1; k < d.sleeps.size(); ++k) {
    EXPECT_GE(d.sleeps[k], 0.0);
    EXPECT_LE(d.sleeps[k], 0.1 * (1 << k));  // full jitter under the exponential cap
  }
}

TEST(Fetch, NotFoundIsFinalAndGivingUpNamesTheUrl) {
  FakeTransport t;
  Download missing = Fetch(t, std::nullopt);
  EXPECT_EQ(missing.status.code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status.message().find(kUrl), std::string::npos);
  EXPECT_EQ(t.requests(kUrl).size(), 1u);

  t.Put(kUrl, Pattern(1000, 5));
  for (int i = 0; i < 5; ++i) t.AddFault(kUrl, StatusFault(500));
  Download failed = Fetch(t, 1000, 3);
  EXPECT_EQ(failed.status.code(), StatusCode::kUnavailable);
  EXPECT_NE(failed.status.message().find("gave up after 3 attempts"), std::string::npos) << failed.status.message();
  EXPECT_NE(failed.status.message().find("HTTP 500"), std::string::npos);
  EXPECT_NE(failed.status.message().find(kUrl), std::string::npos);
}

TEST(Fetch, AnObjectOfAnotherSizeThanTheIndexSaysIsRefused) {
  FakeTransport t;
  t.Put(kUrl, Pattern(1000, 6));
  Download shorter = Fetch(t, 2000);
  EXPECT_EQ(shorter.status.code(), StatusCode::kCorruption) << shorter.status.ToString();
  Download longer = Fetch(t, 500);
  EXPECT_EQ(longer.status.code(), StatusCode::kCorruption) << longer.status.ToString();
}

TEST(Fetch, RetryAfterParsesSecondsAndDates) {
  EXPECT_EQ(ParseRetryAfter("120", 0).value_or(-1), 120);
  EXPECT_EQ(ParseRetryAfter(" 3 ", 0).value_or(-1), 3);
  // Sun, 06 Nov 1994 08:49:37 GMT = 784111777.
  EXPECT_EQ(ParseRetryAfter("Sun, 06 Nov 1994 08:49:37 GMT", 784111770).value_or(-1), 7);
  EXPECT_EQ(ParseRetryAfter("Sun, 06 Nov 1994 08:49:37 GMT", 784111790).value_or(-1), 0);
  EXPECT_FALSE(ParseRetryAfter("soon", 0).has_value());
  EXPECT_FALSE(ParseRetryAfter("", 0).has_value());
}

TEST(Fetch, HeaderLinesAreParsedStrictly) {
  HttpResponse r;
  ParseHeaderLine("HTTP/1.1 206 Partial Content\r\n", 0, &r);
  EXPECT_EQ(r.status, 206);
  ParseHeaderLine("content-RANGE:  bytes 100-199/1000 \r\n", 0, &r);
  EXPECT_EQ(r.range_start, 100u);
  EXPECT_EQ(r.total_size, 1000u);
  ParseHeaderLine("ETag: \"abc\"\r\n", 0, &r);
  EXPECT_EQ(r.etag, "\"abc\"");
  ParseHeaderLine("Content-Length: 100\r\n", 0, &r);
  EXPECT_EQ(r.content_length, 100u);
  ParseHeaderLine("Retry-After: 7\r\n", 0, &r);
  EXPECT_EQ(r.retry_after_seconds.value_or(-1), 7);
  // Inconsistent or malformed values are not half-read.
  for (const char* bad :
       {"Content-Range: bytes 200-100/1000", "Content-Range: bytes 100-1000/1000", "Content-Range: bytes */1000",
        "Content-Range: items 1-2/3", "Content-Range: bytes 1-2/99999999999999999999", "Content-Range: bytes -1-2/3"}) {
    ParseHeaderLine(bad, 0, &r);
    EXPECT_FALSE(r.range_start.has_value() || r.total_size.has_value()) << bad;
  }
  ParseHeaderLine("Content-Length: 12x", 0, &r);
  EXPECT_FALSE(r.content_length.has_value());
  // A new status line (after 100 Continue, say) starts afresh.
  ParseHeaderLine("HTTP/2 200\r\n", 0, &r);
  EXPECT_EQ(r.status, 200);
  EXPECT_TRUE(r.etag.empty() && !r.retry_after_seconds && !r.content_length);
  ParseHeaderLine("HTTP/1.1 2x0 Odd", 0, &r);
  EXPECT_EQ(r.status, 0);
  ParseHeaderLine("Location: https://elsewhere/x.tar\r\n", 0, &r);
  EXPECT_EQ(r.location, "https://elsewhere/x.tar");
}

// A deadline bounds the whole download, waits included: a server that keeps
// answering 503 with long Retry-After values is given up on in time, and
// the error says so.
TEST(Fetch, TheDeadlineBoundsEveryAttemptAndWait) {
  FakeTransport t;
  t.Put(kUrl, Pattern(1000, 3));
  for (int i = 0; i < 20; ++i) t.AddFault(kUrl, StatusFault(503, 30));
  Download d = Fetch(t, 1000, /*attempts=*/20, /*deadline_seconds=*/100);
  EXPECT_EQ(d.status.code(), StatusCode::kUnavailable);
  EXPECT_NE(d.status.message().find("the deadline is 100 s"), std::string::npos) << d.status.message();
  double slept = 0;
  for (double s : d.sleeps) slept += s;
  EXPECT_LE(slept, 100.0);
  EXPECT_EQ(d.stats.attempts, 4u);  // at 0, 30, 60 and 90 s; the next could not start before 100 s
}

// A transport that counts whole milliseconds ends a transfer cut by the
// deadline's timeout just before the deadline. That is still the deadline
// (the error says so), and no further attempt starts with a millisecond
// left (as one did, and then the error blamed the count of attempts).
TEST(Fetch, ATransferCutByTheDeadlineIsTheDeadlines) {
  struct TimingOut final : HttpTransport {
    stoker::testing::FakeClock* clock = nullptr;
    std::vector<double> timeouts;
    Result<HttpResponse> Get(const HttpRequest& request, const BodySink&) override {
      timeouts.push_back(request.timeout_seconds);
      clock->AdvanceSeconds(std::floor(request.timeout_seconds * 1000) / 1000 - 0.0004);
      return Status::Unavailable(fmt::format("{}: Operation timed out (Timeout was reached)", request.url));
    }
  };
  for (double timeout : {0.0, 2.0}) {
    stoker::testing::FakeClock clock;
    TimingOut t;
    t.clock = &clock;
    RetryPolicy policy;
    policy.max_attempts = 2;
    policy.clock = &clock;
    policy.deadline_seconds = 3;
    HttpRequest request;
    request.url = kUrl;
    request.timeout_seconds = timeout;
    const Status s = FetchObject(
        t, request, std::nullopt, [](std::span<const std::byte>) { return Status::Ok(); }, [] { return Status::Ok(); },
        policy, nullptr);
    ASSERT_EQ(s.code(), StatusCode::kUnavailable);
    EXPECT_NE(s.message().find("the deadline is 3 s"), std::string::npos) << s.message();
    for (double seconds : t.timeouts) EXPECT_GE(seconds, 0.05) << "an attempt that could only time out";
    EXPECT_EQ(t.timeouts.size(), timeout == 0 ? 1u : 2u) << "timeout " << timeout;
    EXPECT_NE(s.message().find(fmt::format("after {} attempts", t.timeouts.size())), std::string::npos)
        << s.message();  // the attempts made, not one more
  }
}

// A redirect is not followed, and the error says where it points (secrets
// in that URL hidden).
TEST(Fetch, RedirectsAreNamedWithTheirTarget) {
  FakeTransport t;
  t.Put(kUrl, Pattern(10, 1));
  Fault redirect = StatusFault(302);
  redirect.location = "https://cdn.example/x.tar?X-Amz-Signature=secret";
  t.AddFault(kUrl, redirect);
  Download d = Fetch(t, 10);
  EXPECT_EQ(d.status.code(), StatusCode::kUnavailable);
  EXPECT_NE(d.status.message().find("HTTP 302 (a redirect to https://cdn.example/x.tar?X-Amz-Signature=***"),
            std::string::npos)
      << d.status.message();
  EXPECT_EQ(d.status.message().find("secret"), std::string::npos);
}

// URLs in messages never carry passwords or signatures.
TEST(Fetch, MessagesHideSecretsInTheUrl) {
  FakeTransport t;
  const std::string url = "https://user:hunter2@store/data/a.tar?token=abc&part=1";
  t.Put(url, Pattern(10, 1));
  t.AddFault(url, StatusFault(404));
  stoker::testing::FakeClock clock;
  RetryPolicy policy;
  policy.clock = &clock;
  HttpRequest request;
  request.url = url;
  Status s = FetchObject(
      t, request, 10, [](std::span<const std::byte>) { return Status::Ok(); }, [] { return Status::Ok(); }, policy);
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_NE(s.message().find("https://user:***@store/data/a.tar?token=***&part=1"), std::string::npos) << s.message();
  EXPECT_EQ(s.message().find("hunter2"), std::string::npos);
  EXPECT_EQ(s.message().find("abc"), std::string::npos);
}

}  // namespace
}  // namespace stoker::remote
