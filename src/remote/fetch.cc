#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <ctime>

#include <fmt/format.h>

#include "core/rng.h"
#include "remote/http.h"
#include "stoker/text.h"

namespace stoker::remote {
namespace {

// Less time than this left before the deadline: no attempt starts, and a
// failure this close to it was the deadline's.
constexpr double kShortestAttemptSeconds = 0.05;

bool Retryable(long status) {
  return status == 408 || status == 429 || status >= 500;
}

std::string Describe(const HttpResponse& r) {
  std::string text = fmt::format("HTTP {}", r.status);
  if (r.status >= 300 && r.status < 400) {
    text += r.location.empty() ? " (a redirect without a Location)"
                               : fmt::format(
                                     " (a redirect to {}; stoker does not follow redirects: use that URL, or "
                                     "serve the dataset where it is named)",
                                     RedactUrl(r.location));
    return text;
  }
  if (!r.error_body.empty()) {
    std::string body = r.error_body.substr(0, 200);
    std::replace(body.begin(), body.end(), '\n', ' ');
    text += fmt::format(" ({})", body);
  }
  return text;
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\r' || s.back() == '\n' || s.back() == '\t'))
    s.remove_suffix(1);
  return s;
}

bool EqualsIgnoringCase(std::string_view a, std::string_view lower) {
  return a.size() == lower.size() && std::equal(a.begin(), a.end(), lower.begin(), [](char x, char y) {
           return static_cast<char>(std::tolower(static_cast<unsigned char>(x))) == y;
         });
}

std::optional<std::uint64_t> ParseU64(std::string_view s) {
  if (s.empty() || s.size() > 19) return std::nullopt;  // 19 digits cannot overflow
  std::uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + static_cast<std::uint64_t>(c - '0');
  }
  return v;
}

}  // namespace

void ParseHeaderLine(std::string_view line, double now_unix, HttpResponse* response) {
  if (line.starts_with("HTTP/")) {
    // A new response (after 100 Continue, say): start afresh.
    *response = HttpResponse{};
    const auto space = line.find(' ');
    if (space != std::string_view::npos) {
      const std::string_view code = line.substr(space + 1, 3);
      if (code.size() == 3 && std::all_of(code.begin(), code.end(), [](char c) { return c >= '0' && c <= '9'; }))
        response->status = (code[0] - '0') * 100 + (code[1] - '0') * 10 + (code[2] - '0');
    }
    return;
  }
  const auto colon = line.find(':');
  if (colon == std::string_view::npos) return;
  const std::string_view name = Trim(line.substr(0, colon));
  const std::string_view value = Trim(line.substr(colon + 1));
  if (EqualsIgnoringCase(name, "etag")) {
    response->etag = std::string(value);
  } else if (EqualsIgnoringCase(name, "content-length")) {
    response->content_length = ParseU64(value);
  } else if (EqualsIgnoringCase(name, "content-range")) {
    // bytes START-END/TOTAL; anything else leaves both unset
    response->range_start.reset();
    response->total_size.reset();
    if (!value.starts_with("bytes ")) return;
    const std::string_view spec = Trim(value.substr(6));
    const auto dash = spec.find('-'), slash = spec.find('/');
    if (dash == std::string_view::npos || slash == std::string_view::npos || dash > slash) return;
    const auto start = ParseU64(spec.substr(0, dash));
    const auto end = ParseU64(spec.substr(dash + 1, slash - dash - 1));
    const auto total = ParseU64(spec.substr(slash + 1));
    if (!start || !end || !total || *start > *end || *end >= *total) return;
    response->range_start = start;
    response->total_size = total;
  } else if (EqualsIgnoringCase(name, "retry-after")) {
    response->retry_after_seconds = ParseRetryAfter(value, now_unix);
  } else if (EqualsIgnoringCase(name, "location")) {
    response->location = std::string(value.substr(0, 2048));
  }
}

std::optional<double> ParseRetryAfter(std::string_view value, double now_unix) {
  while (!value.empty() && value.front() == ' ') value.remove_prefix(1);
  while (!value.empty() && (value.back() == ' ' || value.back() == '\r' || value.back() == '\n'))
    value.remove_suffix(1);
  if (value.empty()) return std::nullopt;
  if (std::all_of(value.begin(), value.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    if (value.size() > 9) return std::nullopt;
    return std::stod(std::string(value));
  }
  // IMF-fixdate: "Sun, 06 Nov 1994 08:49:37 GMT".
  std::tm tm{};
  const std::string text(value);
  const char* end = ::strptime(text.c_str(), "%a, %d %b %Y %H:%M:%S GMT", &tm);
  if (end == nullptr || *end != '\0') return std::nullopt;
  const double at = static_cast<double>(::timegm(&tm));
  return std::max(0.0, at - now_unix);
}

Status FetchObject(HttpTransport& transport, const HttpRequest& request, std::optional<std::uint64_t> expected_size,
                   const std::function<Status(std::span<const std::byte>)>& sink,
                   const std::function<Status()>& restart, const RetryPolicy& policy, FetchStats* stats) {
  FetchStats local;
  FetchStats& st = stats ? *stats : local;
  Clock& clock = policy.clock ? *policy.clock : *Clock::Real();
  const Clock::TimePoint started = clock.Now();
  const std::string url = RedactUrl(request.url);  // what messages show
  Rng jitter(policy.jitter_seed, std::hash<std::string>{}(request.url));
  std::uint64_t received = 0;  // bytes the sink has, in order from 0
  std::string etag;            // of the object those bytes came from
  std::string last_error;
  int changes = 0;
  const std::uint32_t attempts = std::max<std::uint32_t>(1, policy.max_attempts);
  // Whether the deadline, not the count of attempts, ended the download:
  // what the final error names.
  bool deadline_ended = false;
  const auto deadline_left = [&] { return policy.deadline_seconds - SecondsBetween(started, clock.Now()); };

  auto start_over = [&]() -> Status {
    ++st.restarts;
    received = 0;
    etag.clear();
    return restart();
  };
  // The object is not the one whose first bytes we have: start over, unless
  // that keeps happening.
  auto object_changed = [&]() -> Status {
    if (++changes > 2) return Status::Unavailable(fmt::format("{}: {}; it keeps changing", url, last_error));
    return start_over();
  };

  // A part of the object: [base, range_end].
  const bool ranged = request.range_start.has_value() && request.range_end.has_value();
  const std::uint64_t base = ranged ? *request.range_start : 0;
  for (std::uint32_t attempt = 0; attempt < attempts; ++attempt) {
    HttpRequest req = request;
    if (policy.deadline_seconds > 0) {
      const double left = deadline_left();
      // Another attempt with a few milliseconds left could only time out
      // (the first runs whatever the deadline).
      if (attempt > 0 && left < kShortestAttemptSeconds) {
        deadline_ended = true;
        break;
      }
      req.timeout_seconds = req.timeout_seconds > 0 ? std::min(req.timeout_seconds, left) : left;
    }
    ++st.attempts;
    if (received > 0) {
      req.range_start = base + received;
      req.if_match = etag;
    }
    // Bytes of this response to skip: a server that ignores our range sends
    // the object from byte 0.
    std::uint64_t skip = 0;
    bool checked_head = false;
    bool changed = false;  // resuming, but the object is not the one we started
    const BodySink body = [&](const HttpResponse& head, std::span<const std::byte> data) -> Status {
      if (!checked_head) {
        checked_head = true;
        if (received > 0 && !etag.empty() && !head.etag.empty() && head.etag != etag) {
          // Not the object whose first bytes we have (a server that ignores
          // If-Match, or one that changed it between checks).
          changed = true;
          return Status::Unavailable(fmt::format("{}: object changed (ETag {} -> {})", url, etag, head.etag));
        }
        if (head.status == 206) {
          if (!req.range_start || head.range_start.value_or(UINT64_MAX) != *req.range_start) {
            return Status::Unavailable(fmt::format("{}: 206 with an unexpected Content-Range", url));
          }
        } else if (head.status == 200 && ranged) {
          return Status::Unimplemented(
              fmt::format("{}: the server ignores Range requests (it answered 200 to bytes={}-{}); reading part of "
                          "an object needs them",
                          url, *req.range_start, *req.range_end));
        } else if (head.status == 200 && received > 0) {
          skip = received;  // range ignored: the whole object again
        }
        if (etag.empty()) etag = head.etag;
      }
      if (skip > 0) {
        const std::uint64_t n = std::min<std::uint64_t>(skip, data.size());
        skip -= n;
        data = data.subspan(n);
      }
      if (data.empty()) return Status::Ok();
      if (expected_size && received + data.size() > *expected_size)
        return Status::Corruption(
            fmt::format("{}: the object is larger than the {} bytes the index records", url, *expected_size));
      STOKER_RETURN_IF_ERROR(sink(data));
      received += data.size();
      return Status::Ok();
    };
    auto response = transport.Get(req, body);
    if (response.ok()) st.connections += response->new_connections;
    double retry_after = -1;
    if (!response.ok()) {
      const Status& e = response.error();
      // Not the network's: the sink's own error (disk full, corrupt).
      if (!changed && e.code() != StatusCode::kUnavailable) return e;
      last_error = std::string(e.message());
      if (last_error.starts_with(url + ": ")) last_error.erase(0, url.size() + 2);
      // A transfer cut by the deadline's timeout ends a little before it
      // (the transport counts whole milliseconds): near enough is the deadline.
      if (e.code() == StatusCode::kUnavailable && policy.deadline_seconds > 0 &&
          deadline_left() < kShortestAttemptSeconds) {
        deadline_ended = true;
        break;
      }
      if (changed) STOKER_RETURN_IF_ERROR(object_changed());
    } else {
      const HttpResponse& r = *response;
      if (r.status == 200 || r.status == 206) {
        const std::uint64_t total = ranged            ? *request.range_end + 1 - base
                                    : r.status == 206 ? r.total_size.value_or(0)
                                                      : r.content_length.value_or(expected_size.value_or(received));
        const bool complete = ranged            ? received == total
                              : r.status == 206 ? (r.total_size && received == *r.total_size)
                                                : (!r.content_length || received == *r.content_length);
        if (complete && (!expected_size || received == *expected_size)) return Status::Ok();
        if (complete && expected_size)
          return Status::Corruption(
              fmt::format("{}: the object has {} bytes, the index records {}", url, received, *expected_size));
        last_error = fmt::format("truncated body ({} of {} bytes)", received, total);
      } else if (r.status == 412) {
        last_error = fmt::format("object changed (If-Match {} failed)", etag);
        STOKER_RETURN_IF_ERROR(object_changed());
      } else if (r.status == 416) {
        last_error = "range not satisfiable";
        STOKER_RETURN_IF_ERROR(start_over());
      } else if (r.status == 404) {
        return Status::NotFound(fmt::format("{}: {}", url, Describe(r)));
      } else if (r.status == 401 || r.status == 403) {
        return Status::Unavailable(fmt::format("{}: access denied, {} (check the credentials)", url, Describe(r)));
      } else if (!Retryable(r.status)) {
        return Status::Unavailable(fmt::format("{}: {}", url, Describe(r)));
      } else {
        last_error = Describe(r);
        if (r.retry_after_seconds) retry_after = std::min(*r.retry_after_seconds, policy.retry_after_max_seconds);
      }
    }
    if (attempt + 1 == attempts) break;
    ++st.retries;
    const double cap = std::min(policy.backoff_max_seconds,
                                policy.backoff_initial_seconds * std::ldexp(1.0, static_cast<int>(attempt)));
    double delay = cap * jitter.Uniform01();  // full jitter
    if (retry_after >= 0) delay = std::max(delay, retry_after);
    if (policy.deadline_seconds > 0 && delay + kShortestAttemptSeconds > deadline_left()) {
      deadline_ended = true;  // the next attempt could not start in time
      break;
    }
    if (request.cancel == nullptr) {
      clock.SleepFor(Clock::Seconds(delay));
      continue;
    }
    // In slices, so that a closing cache does not wait out a long backoff.
    for (double left = delay; left > 0; left -= 0.1) {
      if (request.cancel != nullptr && request.cancel->load(std::memory_order_acquire))
        return Status::Cancelled(fmt::format("{}: download abandoned (closing)", url));
      clock.SleepFor(Clock::Seconds(std::min(left, 0.1)));
    }
  }
  const double spent = SecondsBetween(started, clock.Now());
  if (deadline_ended)
    return Status::Unavailable(
        fmt::format("{}: gave up after {} attempts in {:.1f} s (the deadline is {:.0f} s); last: {}", url, st.attempts,
                    spent, policy.deadline_seconds, last_error));
  return Status::Unavailable(
      fmt::format("{}: gave up after {} attempts in {:.1f} s; last: {}", url, st.attempts, spent, last_error));
}

}  // namespace stoker::remote
