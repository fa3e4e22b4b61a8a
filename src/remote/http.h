// HTTP GETs for remote datasets: a transport seam (one attempt; libcurl in
// production, fault-injecting doubles in tests) and FetchObject, which turns
// attempts into a reliable download: resumes truncated bodies by range under
// If-Match, restarts when the object changed, retries timeouts, resets, 5xx
// and 429 with exponential backoff and full jitter (honouring Retry-After),
// and gives up with an error naming the URL and what happened.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "core/clock.h"
#include "stoker/status.h"

namespace stoker::remote {

struct HttpRequest {
  std::string url;
  // Bytes from `range_start` to the end (RFC 9110 "bytes=N-"), when set;
  // to `range_end` (inclusive, "bytes=N-M") when that is set too.
  std::optional<std::uint64_t> range_start;
  std::optional<std::uint64_t> range_end;
  std::string if_match;  // an ETag, when set
  // AWS Signature V4 (CURLOPT_AWS_SIGV4), when `aws_sigv4` is set:
  // "aws:amz:REGION:s3", with "KEY:SECRET" and an optional session token.
  std::string aws_sigv4;
  std::string aws_credentials;
  std::string aws_session_token;
  double connect_timeout_seconds = 10;
  double stall_timeout_seconds = 30;  // below 1 KiB/s for this long: a stalled transfer
  double timeout_seconds = 0;         // the whole attempt at most this long (0: no limit)
  // When set and true, the transfer is abandoned within about a second
  // (Cancelled, not retried): the cache is closing.
  const std::atomic<bool>* cancel = nullptr;
};

struct HttpResponse {
  long status = 0;
  std::string etag;
  std::optional<std::uint64_t> content_length;
  // From Content-Range: "bytes START-END/TOTAL".
  std::optional<std::uint64_t> range_start;
  std::optional<std::uint64_t> total_size;
  std::optional<double> retry_after_seconds;
  std::string location;               // of a redirect (3xx)
  std::uint64_t body_bytes = 0;       // what arrived (2xx only)
  std::string error_body;             // the start of a non-2xx body, for messages
  std::uint32_t new_connections = 0;  // connections this request opened (0: reused one)
};

// Receives a 2xx response's body as it arrives; `head` holds its headers.
// An error stops the transfer and is returned by Get as is.
using BodySink = std::function<Status(const HttpResponse& head, std::span<const std::byte> data)>;

class HttpTransport {
 public:
  virtual ~HttpTransport() = default;
  // One attempt. Connection failures, timeouts and resets are Unavailable
  // (naming the URL); any HTTP status is a response. Thread-safe.
  [[nodiscard]] virtual Result<HttpResponse> Get(const HttpRequest& request, const BodySink& sink) = 0;
};

// libcurl; nullptr (and `why`) when stoker was built without it.
[[nodiscard]] std::unique_ptr<HttpTransport> MakeCurlTransport(std::string* why);

struct RetryPolicy {
  std::uint32_t max_attempts = 8;
  double backoff_initial_seconds = 0.1;
  double backoff_max_seconds = 10;
  double retry_after_max_seconds = 120;
  // The whole download, every attempt and wait included, at most this long
  // (0: no limit beyond max_attempts).
  double deadline_seconds = 0;
  // Time and sleeps between attempts (tests pass a fake clock); nullptr: real.
  Clock* clock = nullptr;
  std::uint64_t jitter_seed = 0;
};

struct FetchStats {
  std::uint32_t attempts = 0;
  std::uint32_t retries = 0;
  std::uint32_t restarts = 0;     // started over from byte 0 (object changed, bad range)
  std::uint32_t connections = 0;  // new connections the attempts opened
};

// Downloads the whole object at request.url, or the bytes [range_start,
// range_end] of it when the request names both (a server that ignores the
// range is then an error: Unimplemented). `sink` gets its bytes in order
// (each byte once, unless `restart` is called: then start over). When
// `expected_size` is set, a body of another size is an error (truncated
// bodies are resumed first). Errors name the URL.
[[nodiscard]] Status FetchObject(HttpTransport& transport, const HttpRequest& request,
                                 std::optional<std::uint64_t> expected_size,
                                 const std::function<Status(std::span<const std::byte>)>& sink,
                                 const std::function<Status()>& restart, const RetryPolicy& policy,
                                 FetchStats* stats = nullptr);

// Applies one response header line to `response`: a status line ("HTTP/1.1
// 206 ...") starts a new response; ETag, Content-Length, Content-Range
// ("bytes START-END/TOTAL", consistent, else unset), Retry-After and
// Location are read; other lines and malformed values are ignored.
void ParseHeaderLine(std::string_view line, double now_unix, HttpResponse* response);

// Parses an HTTP Retry-After value: delay-seconds or an HTTP-date (relative
// to `now_unix`); nullopt when unparseable.
[[nodiscard]] std::optional<double> ParseRetryAfter(std::string_view value, double now_unix);

}  // namespace stoker::remote
