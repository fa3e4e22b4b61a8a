// The public face of the Kubernetes side (stoker/gpu_kube.h): running the
// device plugin and the extender until told to stop, and fetching node card
// state over HTTP (libcurl) for the extender.
#include <unistd.h>

#include <chrono>
#include <ctime>
#include <map>
#include <mutex>
#include <thread>

#include <curl/curl.h>
#include <fmt/format.h>

#include "kube/device_plugin.h"
#include "kube/extender.h"
#include "kube/http_server.h"
#include "stoker/gpu_kube.h"

namespace stoker {
namespace {

void Log(const std::string& what, const std::string& line) {
  const std::time_t now = std::time(nullptr);
  char stamp[32];
  std::strftime(stamp, sizeof(stamp), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  fmt::print(stderr, "{} stoker {}: {}\n", stamp, what, line);
}

std::string HostName() {
  char name[256] = {};
  ::gethostname(name, sizeof(name) - 1);
  return name;
}

void WaitUntil(const std::function<bool()>& stop) {
  while (!stop()) std::this_thread::sleep_for(std::chrono::milliseconds(200));
}

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

Status RunGpuDevicePlugin(const GpuDevicePluginSettings& settings, const std::function<bool()>& stop) {
  kube::DevicePluginOptions options;
  options.settings.whole_cards = settings.whole_cards;
  options.settings.memory_unit = settings.memory_unit;
  options.settings.policy = settings.policy;
  options.settings.interposer_host_dir = settings.interposer_host_dir;
  options.settings.interposer_container_dir = settings.interposer_container_dir;
  options.settings.ledger_host_dir = settings.ledger_host_dir;
  options.settings.ledger_container_dir = settings.ledger_container_dir;
  options.kubelet_dir = settings.kubelet_dir;
  options.pod_resources_socket = settings.pod_resources_socket;
  options.status_address = settings.status_address;
  const char* env_node = std::getenv("NODE_NAME");
  options.node_name =
      !settings.node_name.empty() ? settings.node_name : (env_node && *env_node ? env_node : HostName());
  if (!(settings.health_interval_seconds > 0))
    return Status::InvalidArgument("the health interval must be above zero seconds");
  options.health_interval_seconds = settings.health_interval_seconds;
  options.log = [](const std::string& line) { Log("device-plugin", line); };
  auto plugin = kube::DevicePlugin::Start(std::move(options));
  if (!plugin.ok()) return plugin.error();
  if ((*plugin)->status_port())
    Log("device-plugin",
        fmt::format("card state at http://{}/cards (port {})", settings.status_address, (*plugin)->status_port()));
  WaitUntil(stop);
  Log("device-plugin", "stopping");
  return Status::Ok();
}

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
  Log("scheduler-extender", fmt::format("listening on {} (port {}), policy {}, node state from {}", settings.listen,
                                        (*server)->port(), GpuPolicyName(settings.policy), settings.node_url));
  WaitUntil(stop);
  Log("scheduler-extender", "stopping");
  return Status::Ok();
}

}  // namespace stoker
