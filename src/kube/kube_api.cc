// The scheduler extender's public face (stoker/gpu_kube.h): serving the
// webhook until told to stop, fetching each node's card state over HTTP
// (libcurl). The device plugin's is in device_plugin_run.cc.
#include <unistd.h>

#include <chrono>
#include <ctime>
#include <map>
#include <mutex>
#include <thread>

#include <curl/curl.h>
#include <fmt/format.h>

#include "kube/extender.h"
#include "kube/http_server.h"
#include "kube/run_util.h"
#include "stoker/gpu_kube.h"

namespace stoker {
namespace {

size_t Collect(char* data, size_t size, size_t n, void* out) {
  auto* body = static_cast<std::string*>(out);
  if (body->size() + size * n > (std::size_t{4} << 20)) return 0;  // a card list is small
  body->append(data, size * n);
  return size * n;
}

Result<std::string> HttpGet(const std::string& url, double timeout_seconds) {
  CURL* curl = curl_easy_init();
  if (!curl) return Status::Internal("curl_easy_init failed");
  std::string body;
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, Collect);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &body);
  curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, static_cast<long>(timeout_seconds * 1000));
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "http,https");
  const CURLcode rc = curl_easy_perform(curl);
  long code = 0;
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &code);
  curl_easy_cleanup(curl);
  if (rc != CURLE_OK) return Status::Unavailable(fmt::format("GET {}: {}", url, curl_easy_strerror(rc)));
  if (code != 200) return Status::Unavailable(fmt::format("GET {}: HTTP {}: {}", url, code, body.substr(0, 200)));
  return body;
}

std::string Expand(std::string pattern, const std::string& node, const std::string& address) {
  for (auto [key, value] : {std::pair<std::string, std::string>{"{node}", node}, {"{address}", address}}) {
    for (std::size_t at; (at = pattern.find(key)) != std::string::npos;) pattern.replace(at, key.size(), value);
  }
  return pattern;
}

}  // namespace

Status RunGpuSchedulerExtender(const GpuExtenderSettings& settings, const std::function<bool()>& stop) {
  if (!(settings.fetch_timeout_seconds > 0)) return Status::InvalidArgument("the fetch timeout must be above zero");
  if (settings.node_url.find("{address}") == std::string::npos && settings.node_url.find("{node}") == std::string::npos)
    return Status::InvalidArgument(
        fmt::format("the node URL '{}' names no node: put {{node}} or {{address}} in it", settings.node_url));
  curl_global_init(CURL_GLOBAL_DEFAULT);
  struct Cached {
    std::chrono::steady_clock::time_point at;
    Result<kube::NodeCards> cards;
  };
  auto cache = std::make_shared<std::pair<std::mutex, std::map<std::string, Cached>>>();
  kube::NodeCardsSource source = [settings, cache](const std::string& node,
                                                   const std::string& address) -> Result<kube::NodeCards> {
    const std::string url = Expand(settings.node_url, node, address.empty() ? node : address);
    const auto now = std::chrono::steady_clock::now();
    {
      std::lock_guard lock(cache->first);
      auto it = cache->second.find(url);
      if (it != cache->second.end() && now - it->second.at < std::chrono::duration<double>(settings.cache_seconds))
        return it->second.cards;
    }
    auto body = HttpGet(url, settings.fetch_timeout_seconds);
    Result<kube::NodeCards> cards =
        body.ok() ? kube::ParseNodeCards(*body, url) : Result<kube::NodeCards>(body.error());
    std::lock_guard lock(cache->first);
    cache->second.insert_or_assign(url, Cached{now, cards});
    return cards;
  };
  kube::ExtenderOptions options;
  options.policy = settings.policy;
  auto server = kube::HttpServer::Start(settings.listen, [source, options](const kube::HttpRequest& r) {
    if (r.method == "GET" && r.path == "/healthz") return kube::HttpResponse{200, "text/plain", "ok\n"};
    if (r.method != "POST") return kube::HttpResponse{405, "text/plain", "POST /filter or /prioritize\n"};
    if (r.path == "/filter")
      return kube::HttpResponse{200, "application/json", kube::ExtenderFilter(r.body, source, options)};
    if (r.path == "/prioritize")
      return kube::HttpResponse{200, "application/json", kube::ExtenderPrioritize(r.body, source, options)};
    return kube::HttpResponse{404, "text/plain", "POST /filter or /prioritize\n"};
  });
  if (!server.ok()) return server.error();
  kube::Log("scheduler-extender",
            fmt::format("listening on {} (port {}), policy {}, node state from {}", settings.listen, (*server)->port(),
                        GpuPolicyName(settings.policy), settings.node_url));
  kube::WaitUntil(stop);
  kube::Log("scheduler-extender", "stopping");
  return Status::Ok();
}

}  // namespace stoker
