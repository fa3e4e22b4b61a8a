// `stoker gpu device-plugin` (run by its own program) and `stoker gpu
// scheduler-extender`: the Kubernetes side of GPU sharing, running until
// SIGTERM or SIGINT.
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <filesystem>
#include <vector>

#include <atomic>

#include <fmt/format.h>

#include "commands.h"
#include "stoker/gpu_kube.h"

namespace stoker_cli {
namespace {

std::atomic<bool> g_extender_stop{false};

void OnSignal(int) {
  g_extender_stop = true;
}

void StopOnSignals() {
  struct sigaction action {};
  action.sa_handler = OnSignal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
}

}  // namespace

// The device plugin links gRPC, which this program does not load: it is a
// program of its own beside this one, run in this one's place.
int RunGpuDevicePluginCommand(int argc, char** argv) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  const fs::path companion = self.parent_path() / "stoker-device-plugin";
  if (ec || !fs::is_regular_file(companion, ec))
    return Fail(stoker::Status::NotFound(fmt::format(
        "stoker gpu device-plugin runs {}, which is not there: it is built where gRPC is found (libgrpc++-dev, "
        "libprotobuf-dev, protobuf-compiler-grpc)",
        companion.string())));
  std::vector<char*> args = {const_cast<char*>("stoker gpu device-plugin")};
  for (int i = 0; i < argc; ++i) args.push_back(argv[i]);
  args.push_back(nullptr);
  ::execv(companion.c_str(), args.data());
  return Fail(stoker::Status::FromErrno(errno, fmt::format("running {}", companion.string())));
}

int RunGpuExtenderCommand(const GpuExtenderArgs& args) {
  stoker::GpuExtenderSettings s;
  s.listen = args.listen;
  auto policy = stoker::ParseGpuPolicy(args.policy);
  if (!policy.ok()) return Fail(policy.error().WithContext("--policy"));
  s.policy = *policy;
  s.node_url = args.node_url;
  s.fetch_timeout_seconds = args.fetch_timeout;
  s.cache_seconds = args.cache_seconds;
  StopOnSignals();
  const stoker::Status status = stoker::RunGpuSchedulerExtender(s, [] { return g_extender_stop.load(); });
  return status.ok() ? 0 : Fail(status);
}

}  // namespace stoker_cli
