#include "remote/url.h"

#include <unistd.h>

#include <cctype>
#include <cstdlib>

#include <fmt/format.h>

#include "stoker/dataset.h"
#include "stoker/text.h"

namespace stoker::remote {
namespace {

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

// Percent-encodes an S3 key, keeping '/' (RFC 3986 unreserved characters pass).
std::string EncodeKey(std::string_view key) {
  std::string out;
  for (unsigned char c : key) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' || c == '/') {
      out += static_cast<char>(c);
    } else {
      out += fmt::format("%{:02X}", c);
    }
  }
  return out;
}

// (path part, "?query#fragment" part) of a URL.
std::pair<std::string_view, std::string_view> SplitQuery(std::string_view url) {
  const auto scheme = url.find("://");
  const auto q = url.find_first_of("?#", scheme == std::string_view::npos ? 0 : scheme + 3);
  if (q == std::string_view::npos) return {url, {}};
  return {url.substr(0, q), url.substr(q)};
}

}  // namespace

bool IsRemoteUrl(std::string_view location) {
  return location.starts_with("http://") || location.starts_with("https://") || location.starts_with("s3://");
}

std::string IndexUrl(std::string_view location) {
  auto [path, query] = SplitQuery(location);
  while (path.ends_with('/')) path.remove_suffix(1);
  if (path.ends_with(".stoker")) return std::string(path) + std::string(query);
  return fmt::format("{}/{}{}", path, kIndexFileName, query);
}

std::string SiblingUrl(std::string_view url, std::string_view name) {
  if (name.find("://") != std::string_view::npos) return std::string(name);
  const auto [path, query] = SplitQuery(url);
  const auto slash = path.rfind('/');
  const std::string_view folder = slash == std::string_view::npos ? path : path.substr(0, slash);
  while (name.starts_with("./")) name.remove_prefix(2);
  if (name.starts_with('/')) {
    // An absolute path: on the same host.
    const auto scheme = path.find("://");
    const auto host_end = path.find('/', scheme == std::string_view::npos ? 0 : scheme + 3);
    return fmt::format("{}{}{}", path.substr(0, host_end), name, query);
  }
  return fmt::format("{}/{}{}", folder, name, query);
}

Result<HttpRequest> RequestFor(const std::string& location, const RemoteOptions& options) {
  HttpRequest r;
  r.connect_timeout_seconds = options.connect_timeout_seconds;
  r.stall_timeout_seconds = options.stall_timeout_seconds;
  if (location.starts_with("http://") || location.starts_with("https://")) {
    r.url = location;
    return r;
  }
  if (!location.starts_with("s3://"))
    return Status::InvalidArgument(fmt::format("not a remote location: {}", RedactUrl(location)));
  const std::string_view rest = std::string_view(location).substr(5);
  const auto slash = rest.find('/');
  const std::string bucket(rest.substr(0, slash));
  const std::string key = slash == std::string_view::npos ? "" : std::string(rest.substr(slash + 1));
  if (bucket.empty()) return Status::InvalidArgument(fmt::format("{}: no bucket name", RedactUrl(location)));
  std::string region = Env("AWS_REGION");
  if (region.empty()) region = Env("AWS_DEFAULT_REGION");
  if (region.empty()) region = "us-east-1";
  std::string endpoint = Env("AWS_ENDPOINT_URL_S3");
  if (endpoint.empty()) endpoint = Env("AWS_ENDPOINT_URL");
  if (endpoint.empty()) endpoint = fmt::format("https://s3.{}.amazonaws.com", region);
  while (endpoint.ends_with('/')) endpoint.pop_back();
  const std::string id = Env("AWS_ACCESS_KEY_ID"), secret = Env("AWS_SECRET_ACCESS_KEY");
  if (id.empty() || secret.empty())
    return Status::InvalidArgument(fmt::format(
        "{}: s3:// locations need AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY in the environment", location));
  r.url = fmt::format("{}/{}/{}", endpoint, bucket, EncodeKey(key));
  r.aws_sigv4 = fmt::format("aws:amz:{}:s3", region);
  r.aws_credentials = id + ":" + secret;
  r.aws_session_token = Env("AWS_SESSION_TOKEN");
  return r;
}

RetryPolicy RetryFor(const RemoteOptions& options) {
  RetryPolicy p;
  p.max_attempts = options.max_attempts;
  p.backoff_initial_seconds = options.backoff_initial_seconds;
  p.backoff_max_seconds = options.backoff_max_seconds;
  p.deadline_seconds = options.fetch_deadline_seconds;
  p.jitter_seed = static_cast<std::uint64_t>(::getpid());
  return p;
}

}  // namespace stoker::remote
