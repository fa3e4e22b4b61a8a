// The libcurl transport: the multi interface, one event loop for every
// request, connections kept alive and shared (HTTP/2 streams where offered).
#include <curl/curl.h>

#include <algorithm>
#include <cstdlib>
#include <ctime>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "core/mutex.h"
#include "remote/http.h"
#include "stoker/text.h"

namespace stoker::remote {
namespace {

struct CurlDeleter {
  void operator()(CURL* c) const { curl_easy_cleanup(c); }
};
struct SlistDeleter {
  void operator()(curl_slist* l) const { curl_slist_free_all(l); }
};

struct Transfer {
  const BodySink* sink = nullptr;
  HttpResponse response;
  Status sink_status;
  // Set by the event loop under the transport's mutex.
  bool done = false;
  CURLcode result = CURLE_OK;
};

std::size_t OnHeader(char* data, std::size_t size, std::size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const std::string_view line(data, size * n);
  ParseHeaderLine(line, static_cast<double>(std::time(nullptr)), &t->response);
  return size * n;
}

int OnProgress(void* user, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  const auto* cancel = static_cast<const std::atomic<bool>*>(user);
  return cancel->load(std::memory_order_acquire) ? 1 : 0;  // nonzero aborts (CURLE_ABORTED_BY_CALLBACK)
}

std::size_t OnBody(char* data, std::size_t size, std::size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const std::size_t bytes = size * n;
  if (t->response.status < 200 || t->response.status >= 300) {
    if (t->response.error_body.size() < 512)
      t->response.error_body.append(data, std::min<std::size_t>(bytes, 512 - t->response.error_body.size()));
    return bytes;
  }
  t->sink_status = (*t->sink)(t->response, std::span(reinterpret_cast<const std::byte*>(data), bytes));
  if (!t->sink_status.ok()) return 0;  // aborts the transfer (CURLE_WRITE_ERROR)
  t->response.body_bytes += bytes;
  return bytes;
}

// One libcurl multi handle serves every request, driven by one event-loop
// thread: callers (the cache's download threads) hand it an easy handle and
// wait. The multi handle keeps one connection pool, so connections are reused
// across callers, and with HTTP/2 (negotiated over TLS) concurrent requests to
// one host are multiplexed as streams of a single connection (CURLOPT_PIPEWAIT,
// set for https only, makes a new request wait for that connection rather than
// open another).
// Body callbacks run on the loop thread; the cache's sink only appends to a
// file and hashes, so it never blocks another transfer.
class CurlTransport final : public HttpTransport {
 public:
  CurlTransport() : multi_(curl_multi_init()) {
    if (const char* bundle = std::getenv("CURL_CA_BUNDLE"); bundle && *bundle) ca_bundle_ = bundle;
    if (!multi_) return;
    curl_multi_setopt(multi_.get(), CURLMOPT_PIPELINING, CURLPIPE_MULTIPLEX);
    // Idle connections kept for reuse. libcurl's default follows the handles
    // added at the moment (4 per handle), which closes connections whenever
    // few downloads are running, and each new one costs a round trip or three.
    curl_multi_setopt(multi_.get(), CURLMOPT_MAXCONNECTS, 64L);
    loop_ = std::thread([this] { Loop(); });
  }

  ~CurlTransport() override {
    {
      MutexLock lock(mu_);
      stopping_ = true;
    }
    if (multi_) curl_multi_wakeup(multi_.get());
    if (loop_.joinable()) loop_.join();
  }

  Result<HttpResponse> Get(const HttpRequest& request, const BodySink& sink) override {
    if (!multi_) return Status::Internal("curl_multi_init failed");
    // Reused by this thread's requests (its buffers; connections live in the multi handle).
    thread_local std::unique_ptr<CURL, CurlDeleter> handle;
    if (!handle) handle.reset(curl_easy_init());
    if (!handle) return Status::Internal("curl_easy_init failed");
    CURL* c = handle.get();
    curl_easy_reset(c);
    Transfer t;
    t.sink = &sink;
    char error[CURL_ERROR_SIZE] = {};
    std::unique_ptr<curl_slist, SlistDeleter> headers;
    auto add_header = [&](const std::string& h) { headers.reset(curl_slist_append(headers.release(), h.c_str())); };
    curl_easy_setopt(c, CURLOPT_URL, request.url.c_str());
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, error);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_PRIVATE, &t);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, OnHeader);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, &t);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, OnBody);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &t);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(request.connect_timeout_seconds * 1000));
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1024L);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, std::max(1L, static_cast<long>(request.stall_timeout_seconds)));
    if (request.timeout_seconds > 0)
      curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, std::max(1L, static_cast<long>(request.timeout_seconds * 1000)));
    curl_easy_setopt(c, CURLOPT_HTTP_VERSION, static_cast<long>(CURL_HTTP_VERSION_2TLS));  // h2 where offered
    // Only where HTTP/2 can be negotiated: over plain HTTP a new request would
    // wait for the first connection's response to learn it cannot multiplex,
    // so one silent server would serialise every download to its host.
    if (request.url.starts_with("https://")) curl_easy_setopt(c, CURLOPT_PIPEWAIT, 1L);
    curl_easy_setopt(c, CURLOPT_ACCEPT_ENCODING, "identity");
    if (!ca_bundle_.empty()) curl_easy_setopt(c, CURLOPT_CAINFO, ca_bundle_.c_str());
    if (request.cancel != nullptr) {
      // Called about once a second even while nothing arrives.
      curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
      curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, OnProgress);
      curl_easy_setopt(c, CURLOPT_XFERINFODATA, request.cancel);
    }
    std::string range;
    if (request.range_start) {
      range = request.range_end ? fmt::format("{}-{}", *request.range_start, *request.range_end)
                                : fmt::format("{}-", *request.range_start);
      curl_easy_setopt(c, CURLOPT_RANGE, range.c_str());
    }
    if (!request.if_match.empty()) add_header("If-Match: " + request.if_match);
    if (!request.aws_sigv4.empty()) {
      curl_easy_setopt(c, CURLOPT_AWS_SIGV4, request.aws_sigv4.c_str());
      curl_easy_setopt(c, CURLOPT_USERPWD, request.aws_credentials.c_str());
      add_header("x-amz-content-sha256: UNSIGNED-PAYLOAD");
      if (!request.aws_session_token.empty()) add_header("x-amz-security-token: " + request.aws_session_token);
    }
    if (headers) curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers.get());

    {
      MutexLock lock(mu_);
      if (stopping_) return Status::Cancelled(fmt::format("{}: the transport is closing", RedactUrl(request.url)));
      to_add_.push_back(c);
    }
    curl_multi_wakeup(multi_.get());
    {
      MutexLock lock(mu_);
      done_cv_.Wait(mu_, [&] { return t.done; });
    }
    const CURLcode code = t.result;
    if (code == CURLE_WRITE_ERROR && !t.sink_status.ok()) return t.sink_status;
    if (code != CURLE_OK) {
      const std::string url = RedactUrl(request.url);
      std::string what = fmt::format("{}: {} ({})", url, RedactUrlsIn(error[0] ? error : curl_easy_strerror(code)),
                                     curl_easy_strerror(code));
      switch (code) {
        // Repeating these cannot help: final, not retried.
        case CURLE_ABORTED_BY_CALLBACK:
          return Status::Cancelled(fmt::format("{}: download abandoned (closing)", url));
        case CURLE_UNSUPPORTED_PROTOCOL:
        case CURLE_URL_MALFORMAT:
          return Status::InvalidArgument(std::move(what));
        case CURLE_PEER_FAILED_VERIFICATION:
        case CURLE_SSL_CACERT_BADFILE:
        case CURLE_SSL_ISSUER_ERROR:
          return Status::IOError(what + "; to trust a private CA, name its certificate file in CURL_CA_BUNDLE");
        default:
          return Status::Unavailable(std::move(what));  // retried: timeouts, resets, refused connections
      }
    }
    long status = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    t.response.status = status;
    long connects = 0;
    curl_easy_getinfo(c, CURLINFO_NUM_CONNECTS, &connects);
    t.response.new_connections = static_cast<std::uint32_t>(std::max(0L, connects));
    return t.response;
  }

 private:
  struct MultiDeleter {
    void operator()(CURLM* m) const { curl_multi_cleanup(m); }
  };

  void Loop() {
    std::size_t active = 0;
    for (;;) {
      std::vector<CURL*> added;
      {
        MutexLock lock(mu_);
        // Requests in flight finish first; Get refuses new ones once stopping.
        if (stopping_ && active == 0 && to_add_.empty()) break;
        added.swap(to_add_);
      }
      for (CURL* c : added) {
        if (const CURLMcode code = curl_multi_add_handle(multi_.get(), c); code != CURLM_OK) {
          Finish(c, CURLE_FAILED_INIT);
          continue;
        }
        ++active;
      }
      int running = 0;
      curl_multi_perform(multi_.get(), &running);
      int left = 0;
      while (CURLMsg* msg = curl_multi_info_read(multi_.get(), &left)) {
        if (msg->msg != CURLMSG_DONE) continue;
        CURL* c = msg->easy_handle;
        const CURLcode result = msg->data.result;  // msg dies with the removal
        curl_multi_remove_handle(multi_.get(), c);
        --active;
        Finish(c, result);
      }
      curl_multi_poll(multi_.get(), nullptr, 0, 1000, nullptr);
    }
  }

  void Finish(CURL* c, CURLcode result) {
    Transfer* t = nullptr;
    curl_easy_getinfo(c, CURLINFO_PRIVATE, &t);
    MutexLock lock(mu_);
    t->result = result;
    t->done = true;
    done_cv_.NotifyAll();
  }

  std::unique_ptr<CURLM, MultiDeleter> multi_;
  std::string ca_bundle_;
  Mutex mu_;
  CondVar done_cv_;
  std::vector<CURL*> to_add_ GUARDED_BY(mu_);
  bool stopping_ GUARDED_BY(mu_) = false;
  std::thread loop_;
};

}  // namespace

std::unique_ptr<HttpTransport> MakeCurlTransport(std::string* /*why*/) {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
  return std::make_unique<CurlTransport>();
}

}  // namespace stoker::remote
