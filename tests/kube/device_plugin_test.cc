// The device plugin against a fake kubelet that speaks the kubelet's real
// gRPC APIs over Unix sockets (Registration, and the DevicePlugin client
// side; pod-resources List), on the fake NVML (tests/share/fake_nvml.cc):
// registration, the device list and its updates when a card is lost,
// preferred allocations, Allocate's environment and mounts, re-registration
// after a kubelet restart, and the card state the extender reads.
#include "kube/device_plugin.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>
#include <thread>

#include <nlohmann/json.hpp>

#include "deviceplugin_v1beta1.grpc.pb.h"
#include "fake_gpu_state.h"
#include "podresources_v1.grpc.pb.h"

namespace stoker::kube {
namespace {

using namespace std::chrono_literals;
namespace api = ::v1beta1;

constexpr std::uint64_t kOneGiB = std::uint64_t{1} << 30;

// The kubelet's side: its Registration service and pod-resources API.
class FakeKubelet final : public api::Registration::Service, public ::v1::PodResourcesLister::Service {
 public:
  explicit FakeKubelet(const std::string& dir) : dir_(dir) { Start(); }
  ~FakeKubelet() override {
    registration_->Shutdown();
    pod_resources_->Shutdown();
  }

  grpc::Status Register(grpc::ServerContext*, const api::RegisterRequest* request, api::Empty*) override {
    std::lock_guard lock(mu_);
    if (request->version() != "v1beta1") return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "unsupported version");
    registrations_.push_back(*request);
    cv_.notify_all();
    return grpc::Status::OK;
  }
  grpc::Status List(grpc::ServerContext*, const ::v1::ListPodResourcesRequest*,
                    ::v1::ListPodResourcesResponse* out) override {
    std::lock_guard lock(mu_);
    *out = allocated_;
    return grpc::Status::OK;
  }

  // Waits for the n-th registration.
  std::vector<api::RegisterRequest> WaitForRegistrations(std::size_t n) {
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, 20s, [&] { return registrations_.size() >= n; });
    return registrations_;
  }
  void SetAllocated(const ::v1::ListPodResourcesResponse& r) {
    std::lock_guard lock(mu_);
    allocated_ = r;
  }
  // The kubelet's client of a registered plugin.
  std::unique_ptr<api::DevicePlugin::Stub> Connect(const std::string& endpoint) {
    return api::DevicePlugin::NewStub(
        grpc::CreateChannel("unix://" + dir_ + "/" + endpoint, grpc::InsecureChannelCredentials()));
  }
  std::string pod_resources_socket() const { return dir_ + "/pod-resources.sock"; }

 private:
  void Start() {
    grpc::ServerBuilder a;
    a.AddListeningPort("unix://" + dir_ + "/kubelet.sock", grpc::InsecureServerCredentials());
    a.RegisterService(static_cast<api::Registration::Service*>(this));
    registration_ = a.BuildAndStart();
    grpc::ServerBuilder b;
    b.AddListeningPort("unix://" + pod_resources_socket(), grpc::InsecureServerCredentials());
    b.RegisterService(static_cast<::v1::PodResourcesLister::Service*>(this));
    pod_resources_ = b.BuildAndStart();
  }
  std::string dir_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<api::RegisterRequest> registrations_;
  ::v1::ListPodResourcesResponse allocated_;
  std::unique_ptr<grpc::Server> registration_, pod_resources_;
};

// Reads ListAndWatch in the background, keeping every list sent.
class Watcher {
 public:
  explicit Watcher(api::DevicePlugin::Stub* stub) {
    reader_ = stub->ListAndWatch(&context_, api::Empty());
    thread_ = std::thread([this] {
      api::ListAndWatchResponse r;
      while (reader_->Read(&r)) {
        std::lock_guard lock(mu_);
        lists_.push_back(r);
        cv_.notify_all();
      }
    });
  }
  ~Watcher() {
    context_.TryCancel();
    thread_.join();
  }
  api::ListAndWatchResponse WaitFor(const std::function<bool(const api::ListAndWatchResponse&)>& pred) {
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, 20s, [&] { return !lists_.empty() && pred(lists_.back()); });
    return lists_.empty() ? api::ListAndWatchResponse() : lists_.back();
  }

 private:
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReader<api::ListAndWatchResponse>> reader_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<api::ListAndWatchResponse> lists_;
  std::thread thread_;
};

std::string HttpGet(int port, const std::string& path) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) return "";
  const std::string request = "GET " + path + " HTTP/1.1\r\nHost: x\r\n\r\n";
  (void)!::write(fd, request.data(), request.size());
  std::string response;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof(buf))) > 0) response.append(buf, static_cast<std::size_t>(n));
  ::close(fd);
  return response;
}

int Unhealthy(const api::ListAndWatchResponse& r) {
  int n = 0;
  for (const auto& d : r.devices()) n += d.health() == "Unhealthy";
  return n;
}

class DevicePluginTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // One fake node for the whole binary: 2 cards of 16 GiB, NUMA nodes 0 and 1.
    static const std::string state = "/dev/shm/stoker-fake-gpu-kube-" + std::to_string(::getpid());
    ::setenv("FAKE_GPU_STATE", state.c_str(), 1);
    ::setenv("FAKE_GPU_DEVICES", "2", 1);
    ::setenv("FAKE_GPU_MEMORY", std::to_string(16 * kOneGiB).c_str(), 1);
    ::setenv("FAKE_GPU_NUMA", "0,1", 1);
  }
  static void TearDownTestSuite() { ::unlink(std::getenv("FAKE_GPU_STATE")); }

  void SetUp() override {
    for (auto& lost : fake_gpu::Shared()->lost) lost = 0;
    static int counter = 0;  // Unix socket paths are short (107 bytes)
    dir_ = "/tmp/stoker-kubelet-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    kubelet_ = std::make_unique<FakeKubelet>(dir_);
    options_.kubelet_dir = dir_;
    options_.settings.ledger_host_dir = dir_ + "/state";
    options_.pod_resources_socket = kubelet_->pod_resources_socket();
    options_.status_address = "127.0.0.1:0";
    options_.node_name = "node-a";
    options_.health_interval_seconds = 0.1;
  }
  void TearDown() override {
    plugin_.reset();
    kubelet_.reset();
    std::filesystem::remove_all(dir_);
  }
  void StartPlugin() {
    auto plugin = DevicePlugin::Start(options_);
    ASSERT_TRUE(plugin.ok()) << plugin.error().ToString();
    plugin_ = std::move(*plugin);
  }

  std::string dir_;
  std::unique_ptr<FakeKubelet> kubelet_;
  DevicePluginOptions options_;
  std::unique_ptr<DevicePlugin> plugin_;
};

TEST_F(DevicePluginTest, RegistersEachResourceAndListsTheCardsAsDevices) {
  StartPlugin();
  // It keeps the node's compute schedule: containers read it and ask its
  // broker for turns.
  struct stat st {};
  ASSERT_EQ(::stat((options_.settings.ledger_host_dir + "/turns").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0644u);
  ASSERT_EQ(::stat((options_.settings.ledger_host_dir + "/broker/turns.sock").c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  const auto registrations = kubelet_->WaitForRegistrations(2);
  ASSERT_EQ(registrations.size(), 2u);
  EXPECT_EQ(registrations[0].resource_name(), "stoker.io/gpu-memory");
  EXPECT_EQ(registrations[1].resource_name(), "stoker.io/gpu-compute");
  for (const auto& r : registrations) {
    EXPECT_EQ(r.version(), "v1beta1");
    EXPECT_TRUE(r.options().get_preferred_allocation_available());
    EXPECT_TRUE(std::filesystem::exists(dir_ + "/" + r.endpoint())) << r.endpoint();
  }
  auto memory = kubelet_->Connect(registrations[0].endpoint());
  grpc::ClientContext context;
  api::DevicePluginOptions plugin_options;
  ASSERT_TRUE(memory->GetDevicePluginOptions(&context, api::Empty(), &plugin_options).ok());
  EXPECT_TRUE(plugin_options.get_preferred_allocation_available());
  Watcher watcher(memory.get());
  const auto list = watcher.WaitFor([](const auto& r) { return r.devices_size() > 0; });
  ASSERT_EQ(list.devices_size(), 32) << "16 GiB in 1 GiB units on each of 2 cards";
  EXPECT_EQ(list.devices(0).id(), "GPU-10111213-1415-1617-1819-1a1b1c1d1e1f_m0");
  EXPECT_EQ(list.devices(0).health(), "Healthy");
  EXPECT_EQ(list.devices(0).topology().nodes(0).id(), 0);
  EXPECT_EQ(list.devices(31).topology().nodes(0).id(), 1);
  auto compute = kubelet_->Connect(registrations[1].endpoint());
  Watcher compute_watcher(compute.get());
  EXPECT_EQ(compute_watcher.WaitFor([](const auto& r) { return r.devices_size() > 0; }).devices_size(), 200);
}

TEST_F(DevicePluginTest, ALostOrVanishedCardTurnsUnhealthyInTheList) {
  StartPlugin();
  const auto registrations = kubelet_->WaitForRegistrations(2);
  auto memory = kubelet_->Connect(registrations[0].endpoint());
  Watcher watcher(memory.get());
  ASSERT_EQ(Unhealthy(watcher.WaitFor([](const auto& r) { return r.devices_size() > 0; })), 0);
  fake_gpu::Shared()->lost[1] = 1;
  const auto start = std::chrono::steady_clock::now();
  const auto list = watcher.WaitFor([](const auto& r) { return Unhealthy(r) > 0; });
  EXPECT_EQ(Unhealthy(list), 16) << "card 1's 16 units";
  EXPECT_EQ(list.devices_size(), 32) << "the kubelet keeps the capacity; the units stop being given";
  std::printf("a lost card was reported Unhealthy after %.0f ms\n",
              std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  fake_gpu::Shared()->lost[1] = 0;
  EXPECT_EQ(Unhealthy(watcher.WaitFor([](const auto& r) { return Unhealthy(r) == 0; })), 0) << "and it comes back";
  // A card that disappears from the node altogether: kept in the list, unhealthy.
  fake_gpu::Shared()->lost[1] = 2;
  const auto gone = watcher.WaitFor([](const auto& r) { return Unhealthy(r) > 0; });
  EXPECT_EQ(Unhealthy(gone), 16);
  EXPECT_EQ(gone.devices_size(), 32);
  fake_gpu::Shared()->lost[1] = 0;
  EXPECT_EQ(Unhealthy(watcher.WaitFor([](const auto& r) { return Unhealthy(r) == 0; })), 0);
}

TEST_F(DevicePluginTest, PreferredAllocationsKeepAContainerOnOneCardAndPairItsResources) {
  StartPlugin();
  const auto registrations = kubelet_->WaitForRegistrations(2);
  auto memory = kubelet_->Connect(registrations[0].endpoint());
  auto compute = kubelet_->Connect(registrations[1].endpoint());
  const std::string card0 = "GPU-10111213-1415-1617-1819-1a1b1c1d1e1f",
                    card1 = "GPU-20212223-2425-2627-2829-2a2b2c2d2e2f";
  // The kubelet offers card 0's units 10-15 and all of card 1's: binpack takes the fuller card 0.
  api::PreferredAllocationRequest request;
  auto* c = request.add_container_requests();
  for (int k = 10; k < 16; ++k) c->add_available_deviceids(card0 + "_m" + std::to_string(k));
  for (int k = 0; k < 16; ++k) c->add_available_deviceids(card1 + "_m" + std::to_string(k));
  c->set_allocation_size(4);
  api::PreferredAllocationResponse preferred;
  {
    grpc::ClientContext context;
    ASSERT_TRUE(memory->GetPreferredAllocation(&context, request, &preferred).ok());
  }
  ASSERT_EQ(preferred.container_responses(0).deviceids_size(), 4);
  for (const auto& id : preferred.container_responses(0).deviceids()) EXPECT_EQ(id.rfind(card0, 0), 0u) << id;
  // Too big for card 0's six: all on card 1, not split.
  c->set_allocation_size(8);
  {
    grpc::ClientContext context;
    ASSERT_TRUE(memory->GetPreferredAllocation(&context, request, &preferred).ok());
  }
  for (const auto& id : preferred.container_responses(0).deviceids()) EXPECT_EQ(id.rfind(card1, 0), 0u) << id;
  // Allocate those 8 on card 1: the container sees card 1, held to 8 GiB.
  api::AllocateRequest allocate;
  auto* ids = allocate.add_container_requests();
  for (const auto& id : preferred.container_responses(0).deviceids()) ids->add_devices_ids(id);
  api::AllocateResponse granted;
  {
    grpc::ClientContext context;
    ASSERT_TRUE(memory->Allocate(&context, allocate, &granted).ok());
  }
  const auto& envs = granted.container_responses(0).envs();
  EXPECT_EQ(envs.at("CUDA_VISIBLE_DEVICES"), card1);
  EXPECT_EQ(envs.at("NVIDIA_VISIBLE_DEVICES"), card1);
  EXPECT_EQ(envs.at("STOKER_GPU_MEMORY_LIMIT"), std::to_string(8 * kOneGiB));
  EXPECT_EQ(envs.at("LD_PRELOAD"), "/usr/local/stoker/libstoker-share.so");
  EXPECT_EQ(envs.at("STOKER_GPU_LEDGER"), "/run/stoker/ledger");
  const std::string tenant = envs.at("STOKER_GPU_TENANT");
  EXPECT_EQ(tenant.rfind("k8s-", 0), 0u);
  const auto& response = granted.container_responses(0);
  ASSERT_EQ(response.mounts_size(), 5);
  EXPECT_EQ(response.mounts(0).host_path(), "/opt/stoker/lib");
  EXPECT_TRUE(response.mounts(0).read_only());
  // The tenant's own folder, made on the host before the answer: no other container sees it.
  EXPECT_EQ(response.mounts(1).container_path(), "/run/stoker");
  EXPECT_EQ(response.mounts(1).host_path(), dir_ + "/state/tenants/" + tenant);
  EXPECT_FALSE(response.mounts(1).read_only());
  struct stat st {};
  ASSERT_EQ(::stat(response.mounts(1).host_path().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 01777u);
  // The node's compute schedule, read-only: the container takes turns
  // beside compute grants on its card.
  EXPECT_EQ(response.mounts(2).container_path(), "/run/stoker-turns");
  EXPECT_TRUE(response.mounts(2).read_only());
  EXPECT_EQ(response.mounts(3).container_path(), "/run/stoker-turns.d");
  EXPECT_TRUE(response.mounts(3).read_only());
  // The pinned limits: root's, read-only in the container, what the environment says.
  EXPECT_EQ(response.mounts(4).container_path(), "/etc/stoker/gpu-limits.d/memory");
  EXPECT_TRUE(response.mounts(4).read_only());
  ASSERT_EQ(::stat(response.mounts(4).host_path().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0644u);
  std::ifstream pinned(response.mounts(4).host_path());
  const std::string text((std::istreambuf_iterator<char>(pinned)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("STOKER_GPU_MEMORY_LIMIT=" + std::to_string(8 * kOneGiB) + "\n"), std::string::npos) << text;
  EXPECT_NE(text.find("STOKER_GPU_TENANT=" + tenant + "\n"), std::string::npos) << text;
  // The same container's compute now prefers card 1, though binpack alone would pick card 0.
  api::PreferredAllocationRequest compute_request;
  auto* cc = compute_request.add_container_requests();
  for (const auto& card : {card0, card1})
    for (int k = 0; k < 100; ++k) cc->add_available_deviceids(card + "_c" + std::to_string(k));
  cc->set_allocation_size(30);
  {
    grpc::ClientContext context;
    ASSERT_TRUE(compute->GetPreferredAllocation(&context, compute_request, &preferred).ok());
  }
  ASSERT_EQ(preferred.container_responses(0).deviceids_size(), 30);
  for (const auto& id : preferred.container_responses(0).deviceids()) EXPECT_EQ(id.rfind(card1, 0), 0u) << id;
  api::AllocateRequest compute_allocate;
  auto* compute_ids = compute_allocate.add_container_requests();
  for (const auto& id : preferred.container_responses(0).deviceids()) compute_ids->add_devices_ids(id);
  {
    grpc::ClientContext context;
    ASSERT_TRUE(compute->Allocate(&context, compute_allocate, &granted).ok());
  }
  EXPECT_EQ(granted.container_responses(0).envs().at("STOKER_GPU_COMPUTE_SHARE"), "30");
  // The pairing is used up: the next container's compute follows the policy again.
  {
    grpc::ClientContext context;
    ASSERT_TRUE(compute->GetPreferredAllocation(&context, compute_request, &preferred).ok());
  }
  EXPECT_EQ(preferred.container_responses(0).deviceids(0).rfind(card0, 0), 0u);
  // IDs that are not ours are refused, naming them.
  api::AllocateRequest bad;
  bad.add_container_requests()->add_devices_ids("nvidia0");
  grpc::ClientContext context;
  const grpc::Status refused = memory->Allocate(&context, bad, &granted);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(refused.error_message().find("'nvidia0' is not a stoker.io/gpu-memory device"), std::string::npos);
}

TEST_F(DevicePluginTest, AfterAKubeletRestartThePluginRegistersAgain) {
  StartPlugin();
  const auto first = kubelet_->WaitForRegistrations(2);
  ASSERT_EQ(first.size(), 2u);
  // A restarting kubelet removes every socket in its folder.
  kubelet_.reset();
  for (const auto& entry : std::filesystem::directory_iterator(dir_))
    if (entry.is_socket()) std::filesystem::remove(entry.path());
  kubelet_ = std::make_unique<FakeKubelet>(dir_);
  const auto again = kubelet_->WaitForRegistrations(2);
  ASSERT_EQ(again.size(), 2u);
  auto memory = kubelet_->Connect(again[0].endpoint());
  Watcher watcher(memory.get());
  EXPECT_EQ(watcher.WaitFor([](const auto& r) { return r.devices_size() > 0; }).devices_size(), 32);
}

TEST_F(DevicePluginTest, TheCardStateCountsWhatTheKubeletGaveOut) {
  StartPlugin();
  (void)kubelet_->WaitForRegistrations(2);
  ::v1::ListPodResourcesResponse allocated;
  auto* container = allocated.add_pod_resources()->add_containers();
  auto* mem = container->add_devices();
  mem->set_resource_name("stoker.io/gpu-memory");
  for (int k = 0; k < 4; ++k) mem->add_device_ids("GPU-10111213-1415-1617-1819-1a1b1c1d1e1f_m" + std::to_string(k));
  auto* cmp = container->add_devices();
  cmp->set_resource_name("stoker.io/gpu-compute");
  for (int k = 0; k < 30; ++k) cmp->add_device_ids("GPU-10111213-1415-1617-1819-1a1b1c1d1e1f_c" + std::to_string(k));
  auto* other = container->add_devices();
  other->set_resource_name("nvidia.com/gpu");
  other->add_device_ids("GPU-20212223-2425-2627-2829-2a2b2c2d2e2f");  // not ours: not counted
  kubelet_->SetAllocated(allocated);
  const std::string response = HttpGet(plugin_->status_port(), "/cards");
  ASSERT_NE(response.find("HTTP/1.1 200 OK"), std::string::npos) << response;
  const auto j = nlohmann::json::parse(response.substr(response.find("\r\n\r\n") + 4));
  EXPECT_EQ(j["node"], "node-a");
  EXPECT_EQ(j["mode"], "shared");
  EXPECT_EQ(j["cards"][0]["memory_units"], 16);
  EXPECT_EQ(j["cards"][0]["memory_units_used"], 4);
  EXPECT_EQ(j["cards"][0]["compute_used"], 30);
  EXPECT_EQ(j["cards"][1]["memory_units_used"], 0);
  EXPECT_FALSE(j["cards"][1]["whole_used"]);
  EXPECT_NE(HttpGet(plugin_->status_port(), "/nope").find("404"), std::string::npos);
  EXPECT_NE(HttpGet(plugin_->status_port(), "/healthz").find("ok"), std::string::npos);
}

TEST_F(DevicePluginTest, AnEndedContainersTenantFolderAndLimitsAreSwept) {
  options_.tenant_sweep_seconds = 0.1;
  // Some grace: a sweep between the Allocate below and the kubelet's list
  // being set (a window a loaded machine widens) must not take the tenant
  // that stays listed.
  options_.tenant_grace_seconds = 2;
  StartPlugin();
  const auto registrations = kubelet_->WaitForRegistrations(2);
  auto memory = kubelet_->Connect(registrations[0].endpoint());
  const std::string card0 = "GPU-10111213-1415-1617-1819-1a1b1c1d1e1f";
  api::AllocateRequest allocate;
  for (int k = 0; k < 2; ++k) allocate.add_container_requests()->add_devices_ids(card0 + "_m" + std::to_string(k));
  api::AllocateResponse granted;
  {
    grpc::ClientContext context;
    ASSERT_TRUE(memory->Allocate(&context, allocate, &granted).ok());
  }
  const std::string kept = granted.container_responses(0).envs().at("STOKER_GPU_TENANT");
  const std::string ended = granted.container_responses(1).envs().at("STOKER_GPU_TENANT");
  const std::string state = dir_ + "/state";
  ASSERT_TRUE(std::filesystem::exists(state + "/tenants/" + ended));
  ASSERT_TRUE(std::filesystem::exists(state + "/limits/" + ended + ".memory"));
  // The kubelet lists the first container only, its device on its own line.
  ::v1::ListPodResourcesResponse listed;
  auto* devices = listed.add_pod_resources()->add_containers()->add_devices();
  devices->set_resource_name("stoker.io/gpu-memory");
  devices->add_device_ids(card0 + "_m0");
  kubelet_->SetAllocated(listed);
  // A sweep removes the folder, then the limits: wait for both (checking
  // the limits as soon as the folder went raced the sweep's second step).
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  while ((std::filesystem::exists(state + "/tenants/" + ended) ||
          std::filesystem::exists(state + "/limits/" + ended + ".memory")) &&
         std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(50ms);
  EXPECT_FALSE(std::filesystem::exists(state + "/tenants/" + ended));
  EXPECT_FALSE(std::filesystem::exists(state + "/limits/" + ended + ".memory"));
  std::this_thread::sleep_for(300ms);  // more sweeps: the listed one stays
  EXPECT_TRUE(std::filesystem::exists(state + "/tenants/" + kept));
  EXPECT_TRUE(std::filesystem::exists(state + "/limits/" + kept + ".memory"));
  // Without the kubelet's answer nothing is removed.
  kubelet_.reset();
  std::this_thread::sleep_for(500ms);
  EXPECT_TRUE(std::filesystem::exists(state + "/tenants/" + kept));
}

TEST_F(DevicePluginTest, WholeCardModeAdvertisesCardsAndRefusalsAreNamed) {
  options_.settings.whole_cards = true;
  StartPlugin();
  const auto registrations = kubelet_->WaitForRegistrations(1);
  ASSERT_EQ(registrations.size(), 1u);
  EXPECT_EQ(registrations[0].resource_name(), "stoker.io/gpu");
  auto gpu = kubelet_->Connect(registrations[0].endpoint());
  Watcher watcher(gpu.get());
  const auto list = watcher.WaitFor([](const auto& r) { return r.devices_size() > 0; });
  ASSERT_EQ(list.devices_size(), 2);
  api::AllocateRequest allocate;
  allocate.add_container_requests()->add_devices_ids(list.devices(1).id());
  api::AllocateResponse granted;
  grpc::ClientContext context;
  ASSERT_TRUE(gpu->Allocate(&context, allocate, &granted).ok());
  EXPECT_EQ(granted.container_responses(0).envs().at("CUDA_VISIBLE_DEVICES"), list.devices(1).id());
  EXPECT_EQ(granted.container_responses(0).envs().count("STOKER_GPU_MEMORY_LIMIT"), 0u);
  plugin_.reset();
  // No kubelet to register with: the error names its socket.
  kubelet_.reset();
  std::filesystem::remove(dir_ + "/kubelet.sock");
  auto failed = DevicePlugin::Start(options_);
  ASSERT_FALSE(failed.ok());
  EXPECT_NE(failed.error().message().find(dir_ + "/kubelet.sock"), std::string::npos) << failed.error().message();
}

}  // namespace
}  // namespace stoker::kube
