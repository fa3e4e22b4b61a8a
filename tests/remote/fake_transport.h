// A scripted HttpTransport for the remote layer's tests: serves objects from
// memory with ranges and ETags, applies queued faults, records requests.
#pragma once

#include <atomic>
#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "remote/http.h"

namespace stoker::remote::testing {

struct Fault {
  // kStall: nothing arrives until the request's cancel flag is set (then
  // Cancelled, as the libcurl transport answers) or 30 s pass.
  enum class Kind { kStatus, kReset, kTruncate, kIgnoreRange, kChangeEtag, kCorrupt, kStall } kind = Kind::kStatus;
  long status = 503;
  std::optional<double> retry_after;
  std::uint64_t at = 0;  // bytes before a reset or truncation; offset for corruption
  std::string location;  // kStatus: the Location header (redirects)
};

inline Fault MakeFault(Fault::Kind kind, std::uint64_t at = 0) {
  Fault f;
  f.kind = kind;
  f.at = at;
  return f;
}
inline Fault StatusFault(long status, std::optional<double> retry_after = std::nullopt) {
  Fault f;
  f.status = status;
  f.retry_after = retry_after;
  return f;
}

class FakeTransport final : public HttpTransport {
 public:
  void Put(const std::string& url, std::vector<std::byte> data) {
    std::lock_guard lock(mu_);
    objects_[url] = {std::make_shared<const std::vector<std::byte>>(std::move(data)),
                     fmt::format("\"v{}\"", ++version_)};
  }
  void AddFault(const std::string& url, Fault f) {
    std::lock_guard lock(mu_);
    faults_[url].push_back(f);
  }
  std::vector<HttpRequest> requests(const std::string& url) {
    std::lock_guard lock(mu_);
    return log_[url];
  }
  // Every request waits this long before its first byte (a remote store's
  // latency), outside the lock: requests overlap as they would.
  void SetLatency(std::chrono::milliseconds latency) { latency_ = latency; }
  std::size_t request_count() {
    std::lock_guard lock(mu_);
    std::size_t n = 0;
    for (const auto& [url, v] : log_) n += v.size();
    return n;
  }

  Result<HttpResponse> Get(const HttpRequest& request, const BodySink& sink) override {
    if (latency_.load().count() > 0) std::this_thread::sleep_for(latency_.load());
    // Shared, not copied: a ranged request of a few KiB must not copy the whole object (the token tests' corpus
    // is many MiB, read in chunks).
    std::shared_ptr<const std::vector<std::byte>> object;
    std::string etag;
    std::optional<Fault> fault;
    {
      std::lock_guard lock(mu_);
      log_[request.url].push_back(request);
      auto it = objects_.find(request.url);
      if (it == objects_.end()) {
        HttpResponse r;
        r.status = 404;
        r.error_body = "no such object";
        return r;
      }
      object = it->second.data;
      etag = it->second.etag;
      auto& queue = faults_[request.url];
      if (!queue.empty()) {
        fault = queue.front();
        queue.pop_front();
      }
    }
    if (fault && fault->kind == Fault::Kind::kStall) {
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
      while (!(request.cancel && request.cancel->load()) && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      return Status::Cancelled(fmt::format("{}: download abandoned (closing)", request.url));
    }
    const std::vector<std::byte>& data = *object;
    HttpResponse r;
    r.etag = etag;
    if (fault && fault->kind == Fault::Kind::kStatus) {
      r.status = fault->status;
      r.retry_after_seconds = fault->retry_after;
      r.location = fault->location;
      return r;
    }
    if (fault && fault->kind == Fault::Kind::kChangeEtag) r.etag = "\"changed\"";
    if (!request.if_match.empty() && request.if_match != r.etag) {
      r.status = 412;
      return r;
    }
    std::uint64_t start = 0;
    if (request.range_start && !(fault && fault->kind == Fault::Kind::kIgnoreRange)) {
      if (*request.range_start >= data.size()) {
        r.status = 416;
        return r;
      }
      start = *request.range_start;
      r.status = 206;
      r.range_start = start;
      r.total_size = data.size();
    } else {
      r.status = 200;
    }
    std::uint64_t end = data.size();  // exclusive
    if (r.status == 206 && request.range_end) end = std::min<std::uint64_t>(end, *request.range_end + 1);
    r.content_length = end - start;
    std::span<const std::byte> body(data.data() + start, end - start);
    std::vector<std::byte> corrupted;
    if (fault && fault->kind == Fault::Kind::kCorrupt && fault->at >= start && fault->at < data.size()) {
      corrupted.assign(body.begin(), body.end());
      corrupted[fault->at - start] ^= std::byte{0xFF};
      body = corrupted;
    }
    bool cut = fault && (fault->kind == Fault::Kind::kReset || fault->kind == Fault::Kind::kTruncate);
    if (cut) body = body.subspan(0, std::min<std::size_t>(body.size(), fault->at));
    // Deliver in pieces, as a network would.
    for (std::size_t off = 0; off < body.size(); off += 4096) {
      STOKER_RETURN_IF_ERROR(sink(r, body.subspan(off, std::min<std::size_t>(4096, body.size() - off))));
      r.body_bytes += std::min<std::size_t>(4096, body.size() - off);
    }
    if (cut && fault->kind == Fault::Kind::kReset)
      return Status::Unavailable(fmt::format("{}: Connection reset by peer", request.url));
    if (cut) return Status::Unavailable(fmt::format("{}: transfer closed with bytes remaining", request.url));
    return r;
  }

 private:
  struct Object {
    std::shared_ptr<const std::vector<std::byte>> data;  // replaced whole by Put, never changed
    std::string etag;
  };
  std::atomic<std::chrono::milliseconds> latency_{std::chrono::milliseconds(0)};
  std::mutex mu_;
  int version_ = 0;
  std::map<std::string, Object> objects_;
  std::map<std::string, std::deque<Fault>> faults_;
  std::map<std::string, std::vector<HttpRequest>> log_;
};

// Forwards to a FakeTransport the test keeps (what it is handed is owned by
// a RemoteFileSystem).
class SharedTransport final : public HttpTransport {
 public:
  explicit SharedTransport(FakeTransport* fake) : fake_(fake) {}
  Result<HttpResponse> Get(const HttpRequest& request, const BodySink& sink) override {
    return fake_->Get(request, sink);
  }

 private:
  FakeTransport* fake_;
};

inline std::vector<std::byte> Pattern(std::size_t n, unsigned seed) {
  std::vector<std::byte> v(n);
  std::uint32_t x = seed * 2654435761u + 1;
  for (auto& b : v) {
    x = x * 1664525u + 1013904223u;
    b = static_cast<std::byte>(x >> 24);
  }
  return v;
}

}  // namespace stoker::remote::testing
