// What the long-running Kubernetes commands share: a timestamped log line
// on stderr, and waiting until told to stop.
#pragma once

#include <chrono>
#include <ctime>
#include <functional>
#include <string>
#include <thread>

#include <fmt/format.h>

namespace stoker::kube {

inline void Log(const std::string& what, const std::string& line) {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char stamp[32];
  std::strftime(stamp, sizeof(stamp), "%Y-%m-%dT%H:%M:%SZ", &utc);
  fmt::print(stderr, "{} stoker {}: {}\n", stamp, what, line);
}

inline void WaitUntil(const std::function<bool()>& stop) {
  while (!stop()) std::this_thread::sleep_for(std::chrono::milliseconds(200));
}

}  // namespace stoker::kube
