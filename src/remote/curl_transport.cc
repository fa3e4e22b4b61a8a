// The libcurl transport: one easy handle per thread, reused so that
// connections (and TLS sessions) are kept alive between requests.
#include <curl/curl.h>

#include <algorithm>
#include <cctype>
#include <ctime>
#include <memory>
#include <mutex>

#include <fmt/format.h>

#include "remote/http.h"

namespace stoker::remote {
namespace {

struct CurlDeleter {
  void operator()(CURL* c) const { curl_easy_cleanup(c); }
};
struct SlistDeleter {
  void operator()(curl_slist* l) const { curl_slist_free_all(l); }
};

std::string Lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\r' || s.back() == '\n' || s.back() == '\t'))
    s.remove_suffix(1);
  return s;
}

std::optional<std::uint64_t> ParseU64(std::string_view s) {
  if (s.empty() || s.size() > 19) return std::nullopt;
  std::uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + static_cast<std::uint64_t>(c - '0');
  }
  return v;
}

struct Transfer {
  const BodySink* sink = nullptr;
  HttpResponse response;
  Status sink_status;
};

std::size_t OnHeader(char* data, std::size_t size, std::size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const std::string_view line(data, size * n);
  if (line.starts_with("HTTP/")) {
    // A new response (after 100 Continue, say): start afresh.
    t->response = HttpResponse{};
    const auto space = line.find(' ');
    if (space != std::string_view::npos) t->response.status = std::atol(std::string(line.substr(space + 1, 3)).c_str());
    return size * n;
  }
  const auto colon = line.find(':');
  if (colon == std::string_view::npos) return size * n;
  const std::string name = Lower(Trim(line.substr(0, colon)));
  const std::string_view value = Trim(line.substr(colon + 1));
  if (name == "etag") {
    t->response.etag = std::string(value);
  } else if (name == "content-length") {
    t->response.content_length = ParseU64(value);
  } else if (name == "content-range") {
    // bytes START-END/TOTAL
    if (value.starts_with("bytes ")) {
      const std::string_view spec = value.substr(6);
      const auto dash = spec.find('-'), slash = spec.find('/');
      if (dash != std::string_view::npos && slash != std::string_view::npos && dash < slash) {
        t->response.range_start = ParseU64(spec.substr(0, dash));
        t->response.total_size = ParseU64(spec.substr(slash + 1));
      }
    }
  } else if (name == "retry-after") {
    t->response.retry_after_s = ParseRetryAfter(value, static_cast<double>(std::time(nullptr)));
  }
  return size * n;
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

class CurlTransport final : public HttpTransport {
 public:
  Result<HttpResponse> Get(const HttpRequest& request, const BodySink& sink) override {
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
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, OnHeader);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, &t);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, OnBody);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &t);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(request.connect_timeout_s * 1000));
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1024L);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, std::max(1L, static_cast<long>(request.stall_timeout_s)));
    curl_easy_setopt(c, CURLOPT_HTTP_VERSION, static_cast<long>(CURL_HTTP_VERSION_2TLS));  // h2 where offered
    curl_easy_setopt(c, CURLOPT_ACCEPT_ENCODING, "identity");
    std::string range;
    if (request.range_start) {
      range = fmt::format("{}-", *request.range_start);
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
    const CURLcode code = curl_easy_perform(c);
    if (code == CURLE_WRITE_ERROR && !t.sink_status.ok()) return t.sink_status;
    if (code != CURLE_OK) {
      return Status::Unavailable(fmt::format("{}: {} ({})", request.url, error[0] ? error : curl_easy_strerror(code),
                                             curl_easy_strerror(code)));
    }
    long status = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    t.response.status = status;
    return t.response;
  }
};

}  // namespace

std::unique_ptr<HttpTransport> MakeCurlTransport(std::string* /*why*/) {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
  return std::make_unique<CurlTransport>();
}

}  // namespace stoker::remote
