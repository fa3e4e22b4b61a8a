#include "kube/device_plugin.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include <fmt/format.h>
#include <grpcpp/grpcpp.h>
#include <nlohmann/json.hpp>

#include "deviceplugin_v1beta1.grpc.pb.h"
#include "kube/http_server.h"
#include "kube/tenant_sweep.h"
#include "podresources_v1.grpc.pb.h"
#include "share/ledger_host_pids.h"
#include "stoker/gpu_share.h"

namespace stoker::kube {
namespace {

using Clock = std::chrono::steady_clock;
namespace api = ::v1beta1;

constexpr char kApiVersion[] = "v1beta1";
constexpr auto kPairingWindow = std::chrono::seconds(30);

std::string SocketName(Resource r) {
  std::string name = ResourceName(r);
  for (char& c : name)
    if (c == '/' || c == '.') c = '-';
  return name + ".sock";  // stoker-io-gpu-memory.sock
}

}  // namespace

// The node's cards and the plugin's memory of its last grants, shared by
// the resources' servers.
class DevicePlugin::Impl {
 public:
  explicit Impl(DevicePluginOptions options) : options_(std::move(options)) {}
  ~Impl() { Shutdown(); }

  Status Begin();
  void Shutdown();
  Result<std::string> CardsJson();
  int status_port() const { return http_ ? http_->port() : 0; }

  // Service side.
  std::vector<GpuCard> Cards() {
    std::lock_guard lock(mu_);
    return cards_;
  }
  std::uint64_t WaitForChange(std::uint64_t seen, std::chrono::milliseconds limit) {
    std::unique_lock lock(mu_);
    changed_.wait_for(lock, limit, [&] { return generation_ != seen || stopping_; });
    return generation_;
  }
  std::uint64_t generation() {
    std::lock_guard lock(mu_);
    return generation_;
  }
  bool stopping() {
    std::lock_guard lock(mu_);
    return stopping_;
  }
  const PluginSettings& settings() const { return options_.settings; }
  // The card the same container's other resource just went to, if recent.
  std::string PairedCard(Resource asking) {
    std::lock_guard lock(mu_);
    if (last_grant_.card.empty() || last_grant_.resource == asking || Clock::now() - last_grant_.at > kPairingWindow)
      return "";
    return last_grant_.card;
  }
  void RecordGrant(Resource resource, const ContainerGrant& grant) {
    std::lock_guard lock(mu_);
    if (grant.cards.size() != 1) return;
    if (!last_grant_.card.empty() && last_grant_.resource != resource && last_grant_.card == grant.cards[0] &&
        Clock::now() - last_grant_.at <= kPairingWindow) {
      last_grant_ = {};  // the pair is complete
      return;
    }
    last_grant_ = {grant.cards[0], resource, Clock::now()};
  }
  void Log(const std::string& line) { options_.log(line); }

 private:
  class Service;
  struct Served {
    Resource resource;
    std::string socket;
    std::unique_ptr<Service> service;
    std::unique_ptr<grpc::Server> server;
  };
  Status Serve(Served& served);
  Status Register(const Served& served);
  void HealthLoop();
  void Refresh();
  // What the kubelet has given out (its pod-resources API).
  Result<::v1::ListPodResourcesResponse> ListPodResources();
  void SweepEndedTenants();

  DevicePluginOptions options_;
  std::mutex mu_;
  std::condition_variable changed_;
  std::vector<GpuCard> cards_;  // every card ever seen; gone ones unhealthy
  std::uint64_t generation_ = 0;
  bool stopping_ = false;
  struct {
    std::string card;
    Resource resource = Resource::kMemory;
    Clock::time_point at;
  } last_grant_;
  std::vector<Served> served_;
  std::unique_ptr<HttpServer> http_;
  std::unique_ptr<GpuTurnsBroker> turns_broker_;  // with compute shares advertised
  std::thread health_;
};

class DevicePlugin::Impl::Service final : public api::DevicePlugin::Service {
 public:
  Service(Impl* plugin, Resource resource) : plugin_(plugin), resource_(resource) {}

  grpc::Status GetDevicePluginOptions(grpc::ServerContext*, const api::Empty*, api::DevicePluginOptions* out) override {
    out->set_pre_start_required(false);
    out->set_get_preferred_allocation_available(true);
    return grpc::Status::OK;
  }

  grpc::Status ListAndWatch(grpc::ServerContext* context, const api::Empty*,
                            grpc::ServerWriter<api::ListAndWatchResponse>* writer) override {
    std::uint64_t sent = ~std::uint64_t{0};
    std::uint64_t now = plugin_->generation();
    while (!context->IsCancelled() && !plugin_->stopping()) {
      if (now != sent) {
        api::ListAndWatchResponse response;
        for (const AdvertisedDevice& d : DevicesOf(resource_, plugin_->Cards(), plugin_->settings())) {
          api::Device* device = response.add_devices();
          device->set_id(d.id);
          device->set_health(d.healthy ? "Healthy" : "Unhealthy");
          if (d.numa_node >= 0) device->mutable_topology()->add_nodes()->set_id(d.numa_node);
        }
        if (!writer->Write(response)) break;
        sent = now;
      }
      now = plugin_->WaitForChange(sent, std::chrono::milliseconds(500));
    }
    return grpc::Status::OK;
  }

  grpc::Status GetPreferredAllocation(grpc::ServerContext*, const api::PreferredAllocationRequest* request,
                                      api::PreferredAllocationResponse* out) override {
    const auto cards = plugin_->Cards();
    for (const auto& container : request->container_requests()) {
      std::vector<std::string> available(container.available_deviceids().begin(),
                                         container.available_deviceids().end());
      std::vector<std::string> must(container.must_include_deviceids().begin(),
                                    container.must_include_deviceids().end());
      auto chosen = PreferredDevices(resource_, available, must, container.allocation_size(), cards,
                                     plugin_->settings(), plugin_->PairedCard(resource_));
      if (!chosen.ok()) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, chosen.error().message());
      auto* response = out->add_container_responses();
      for (const std::string& id : *chosen) response->add_deviceids(id);
    }
    return grpc::Status::OK;
  }

  grpc::Status Allocate(grpc::ServerContext*, const api::AllocateRequest* request,
                        api::AllocateResponse* out) override {
    const auto cards = plugin_->Cards();
    for (const auto& container : request->container_requests()) {
      std::vector<std::string> ids(container.devices_ids().begin(), container.devices_ids().end());
      auto grant = GrantFor(resource_, ids, cards, plugin_->settings());
      if (!grant.ok()) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, grant.error().message());
      // Before the kubelet mounts them: the tenant's folder, its pinned
      // limits, the schedule. A container is never started unlimited.
      if (Status s = PrepareHost(*grant); !s.ok()) {
        plugin_->Log("cannot allocate: " + s.message());
        return grpc::Status(grpc::StatusCode::INTERNAL, s.message());
      }
      auto* response = out->add_container_responses();
      for (const auto& [k, v] : grant->envs) (*response->mutable_envs())[k] = v;
      for (const auto& [k, v] : grant->annotations) (*response->mutable_annotations())[k] = v;
      for (const auto& m : grant->mounts) {
        api::Mount* mount = response->add_mounts();
        mount->set_container_path(m.container_path);
        mount->set_host_path(m.host_path);
        mount->set_read_only(m.read_only);
      }
      plugin_->RecordGrant(resource_, *grant);
      plugin_->Log(
          fmt::format("allocated {} {} on {}", ids.size(), ResourceName(resource_), fmt::join(grant->cards, ",")));
    }
    return grpc::Status::OK;
  }

  grpc::Status PreStartContainer(grpc::ServerContext*, const api::PreStartContainerRequest*,
                                 api::PreStartContainerResponse*) override {
    return grpc::Status::OK;
  }

 private:
  Impl* plugin_;
  Resource resource_;
};

Status DevicePlugin::Impl::Begin() {
  if (Status s = CheckPluginSettings(options_.settings); !s.ok()) return s;
  auto inventory = options_.inventory();
  if (!inventory.ok()) return inventory.error().WithContext("reading the node's GPUs");
  if (inventory->cards.empty()) return Status::NotFound(fmt::format("{} found no GPU on this node", inventory->source));
  cards_ = inventory->cards;
  const auto advertised = Advertised(options_.settings);
  if (std::find(advertised.begin(), advertised.end(), Resource::kCompute) != advertised.end()) {
    // The node's compute schedule, kept by this process: containers read it
    // (mounted read-only) and ask for turns over the broker's socket, whose
    // folder they mount read-only (a socket made anew is seen there).
    const std::string& host = options_.settings.ledger_host_dir;
    std::error_code ec;
    std::filesystem::create_directories(host + "/broker", ec);
    if (ec) return Status::IOError(fmt::format("making {}/broker: {}", host, ec.message()));
    GpuTurnsBrokerOptions turns;
    turns.turns_path = host + "/turns";
    turns.socket_path = host + "/broker/turns.sock";
    turns.limits_dir = host + "/limits";
    turns.log = [log = options_.log](const std::string& line) {
      if (log) log("turns: " + line);
    };
    auto broker = StartGpuTurnsBroker(turns);
    if (!broker.ok()) return broker.error();
    turns_broker_ = std::move(*broker);
  }
  for (Resource r : advertised) {
    served_.push_back({r, options_.kubelet_dir + "/" + SocketName(r), nullptr, nullptr});
    if (Status s = Serve(served_.back()); !s.ok()) return s;
    if (Status s = Register(served_.back()); !s.ok()) return s;
  }
  if (!options_.status_address.empty()) {
    auto http = HttpServer::Start(options_.status_address, [this](const HttpRequest& request) -> HttpResponse {
      if (request.method != "GET") return {405, "text/plain", "GET only\n"};
      if (request.path == "/healthz") return {200, "text/plain", "ok\n"};
      if (request.path != "/cards") return {404, "text/plain", "GET /cards or /healthz\n"};
      auto json = CardsJson();
      if (!json.ok()) return {500, "text/plain", json.error().ToString() + "\n"};
      return {200, "application/json", *json};
    });
    if (!http.ok()) return http.error().WithContext("the card-state endpoint");
    http_ = std::move(*http);
  }
  health_ = std::thread([this] { HealthLoop(); });
  return Status::Ok();
}

Status DevicePlugin::Impl::Serve(Served& served) {
  if (served.socket.size() > 107)
    return Status::InvalidArgument(
        fmt::format("the socket path {} is longer than a Unix socket allows (107 bytes)", served.socket));
  ::unlink(served.socket.c_str());  // a previous run's
  served.service = std::make_unique<Service>(this, served.resource);
  grpc::ServerBuilder builder;
  builder.AddListeningPort("unix://" + served.socket, grpc::InsecureServerCredentials());
  builder.RegisterService(served.service.get());
  served.server = builder.BuildAndStart();
  if (!served.server) return Status::Unavailable(fmt::format("could not serve on {}", served.socket));
  return Status::Ok();
}

Status DevicePlugin::Impl::Register(const Served& served) {
  const std::string kubelet = options_.kubelet_dir + "/kubelet.sock";
  auto channel = grpc::CreateChannel("unix://" + kubelet, grpc::InsecureChannelCredentials());
  auto stub = api::Registration::NewStub(channel);
  api::RegisterRequest request;
  request.set_version(kApiVersion);
  request.set_endpoint(SocketName(served.resource));
  request.set_resource_name(ResourceName(served.resource));
  request.mutable_options()->set_get_preferred_allocation_available(true);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  api::Empty empty;
  const grpc::Status status = stub->Register(&context, request, &empty);
  if (!status.ok())
    return Status::Unavailable(fmt::format("registering {} with the kubelet at {}: {}", ResourceName(served.resource),
                                           kubelet, status.error_message()));
  Log(fmt::format("registered {} ({}) with the kubelet", ResourceName(served.resource), served.socket));
  return Status::Ok();
}

void DevicePlugin::Impl::Refresh() {
  auto inventory = options_.inventory();
  if (inventory.ok()) {
    // NVML lists the node's PIDs; containers' processes learn theirs
    // through their ledgers (needs the host's PID namespace: hostPID).
    std::vector<int> pids;
    for (const GpuCard& c : inventory->cards)
      for (const auto& p : c.processes) pids.push_back(p.pid);
    (void)share::RecordHostPids(pids);
  }
  std::lock_guard lock(mu_);
  std::vector<GpuCard> next = cards_;
  for (GpuCard& known : next) {
    bool present = false;
    if (inventory.ok())
      for (const GpuCard& c : inventory->cards)
        if (c.uuid == known.uuid) {
          present = true;
          known.healthy = c.healthy;
          known.used_bytes = c.used_bytes;
        }
    if (!present) known.healthy = false;  // the kubelet keeps its capacity; it stops being given out
  }
  if (inventory.ok())
    for (const GpuCard& c : inventory->cards) {
      bool known = false;
      for (const GpuCard& k : next) known = known || k.uuid == c.uuid;
      if (!known && c.uuid.rfind("GPU-", 0) == 0) next.push_back(c);
    }
  bool changed = next.size() != cards_.size();
  for (std::size_t i = 0; !changed && i < next.size(); ++i) changed = next[i].healthy != cards_[i].healthy;
  if (changed) {
    for (std::size_t i = 0; i < next.size(); ++i)
      if (i >= cards_.size() || next[i].healthy != cards_[i].healthy)
        options_.log(fmt::format("card {} is now {}", next[i].uuid, next[i].healthy ? "healthy" : "unhealthy"));
    cards_ = std::move(next);
    ++generation_;
    changed_.notify_all();
  }
}

void DevicePlugin::Impl::HealthLoop() {
  const auto interval = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::duration<double>(options_.health_interval_seconds));
  auto last_sweep = Clock::now();
  const auto sweep_every = std::chrono::duration<double>(options_.tenant_sweep_seconds);
  for (;;) {
    {
      std::unique_lock lock(mu_);
      if (changed_.wait_for(lock, interval, [&] { return stopping_; })) return;
    }
    Refresh();
    if (options_.tenant_sweep_seconds > 0 && Clock::now() - last_sweep >= sweep_every) {
      last_sweep = Clock::now();
      SweepEndedTenants();
    }
    // A kubelet that restarted removed our sockets: serve anew, register again.
    for (Served& served : served_) {
      struct stat st {};
      if (::stat(served.socket.c_str(), &st) == 0) continue;
      options_.log(fmt::format("{} is gone (the kubelet restarted?): registering again", served.socket));
      served.server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
      served.server.reset();
      if (Status s = Serve(served); !s.ok()) {
        options_.log(s.ToString());
        continue;
      }
      if (Status s = Register(served); !s.ok()) {
        options_.log(s.ToString());
        ::unlink(served.socket.c_str());  // try again next round
      }
    }
  }
}

void DevicePlugin::Impl::Shutdown() {
  {
    std::lock_guard lock(mu_);
    if (stopping_) return;
    stopping_ = true;
    changed_.notify_all();
  }
  if (health_.joinable()) health_.join();
  http_.reset();
  for (Served& served : served_) {
    if (served.server) served.server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
    ::unlink(served.socket.c_str());
  }
}

Result<::v1::ListPodResourcesResponse> DevicePlugin::Impl::ListPodResources() {
  auto channel = grpc::CreateChannel("unix://" + options_.pod_resources_socket, grpc::InsecureChannelCredentials());
  auto stub = ::v1::PodResourcesLister::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  ::v1::ListPodResourcesRequest request;
  ::v1::ListPodResourcesResponse response;
  const grpc::Status status = stub->List(&context, request, &response);
  if (!status.ok())
    return Status::Unavailable(fmt::format("the kubelet's pod-resources API at {}: {}", options_.pod_resources_socket,
                                           status.error_message()));
  return response;
}

void DevicePlugin::Impl::SweepEndedTenants() {
  auto listed = ListPodResources();
  if (!listed.ok()) {
    // Without the kubelet's word nothing is removed.
    options_.log("tenant sweep skipped: " + listed.error().message());
    return;
  }
  // A container's tenant per resource: the digest of all its IDs of that
  // resource (the kubelet may list them one device at a time).
  std::set<std::string> live;
  for (const auto& pod : listed->pod_resources())
    for (const auto& container : pod.containers()) {
      std::map<Resource, std::vector<std::string>> ids;
      for (const auto& devices : container.devices()) {
        const auto resource = ResourceFromName(devices.resource_name());
        if (!resource) continue;
        for (const auto& id : devices.device_ids()) ids[*resource].push_back(id);
      }
      for (auto& [resource, list] : ids) live.insert(TenantOf(std::move(list)));
    }
  const auto grace = std::chrono::seconds(static_cast<std::int64_t>(options_.tenant_grace_seconds));
  auto swept = kube::SweepEndedTenants(options_.settings.ledger_host_dir, live, grace);
  if (!swept.ok()) {
    options_.log("tenant sweep: " + swept.error().message());
    return;
  }
  for (const auto& tenant : swept->removed) options_.log("removed the state of ended tenant " + tenant);
  for (const auto& note : swept->notes) options_.log("tenant sweep: " + note);
}

Result<std::string> DevicePlugin::Impl::CardsJson() {
  // What the kubelet has given out, per card and resource.
  std::map<std::string, std::map<Resource, std::uint64_t>> used;
  auto response = ListPodResources();
  if (!response.ok()) return response.error();
  for (const auto& pod : response->pod_resources())
    for (const auto& container : pod.containers())
      for (const auto& devices : container.devices())
        for (const auto& id : devices.device_ids()) {
          auto parsed = ParseDeviceId(id);
          if (parsed && ResourceFromName(devices.resource_name()) == parsed->resource)
            ++used[parsed->uuid][parsed->resource];
        }
  const auto cards = Cards();
  const PluginSettings& s = options_.settings;
  nlohmann::json j = {{"format", "stoker-node-cards"},      {"version", 1},
                      {"node", options_.node_name},         {"mode", s.whole_cards ? "whole" : "shared"},
                      {"memory_unit_bytes", s.memory_unit}, {"cards", nlohmann::json::array()}};
  for (const GpuCard& c : cards) {
    auto& u = used[c.uuid];
    j["cards"].push_back({{"uuid", c.uuid},
                          {"index", c.index},
                          {"numa_node", c.numa_node},
                          {"healthy", c.healthy},
                          {"total_bytes", c.total_bytes},
                          {"memory_units", c.total_bytes / s.memory_unit},
                          {"memory_units_used", u[Resource::kMemory]},
                          {"compute_used", u[Resource::kCompute]},
                          {"whole_used", u[Resource::kWholeCards] > 0}});
  }
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

Result<std::unique_ptr<DevicePlugin>> DevicePlugin::Start(DevicePluginOptions options) {
  auto impl = std::make_unique<Impl>(std::move(options));
  if (Status s = impl->Begin(); !s.ok()) return s;
  return std::unique_ptr<DevicePlugin>(new DevicePlugin(std::move(impl)));
}

DevicePlugin::DevicePlugin(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DevicePlugin::~DevicePlugin() = default;
int DevicePlugin::status_port() const {
  return impl_->status_port();
}
Result<std::string> DevicePlugin::CardsJson() {
  return impl_->CardsJson();
}

}  // namespace stoker::kube
