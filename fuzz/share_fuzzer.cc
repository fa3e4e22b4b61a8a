// The GPU-sharing parsers: the interposer's settings (every variable from
// one input), the ledger file (opened as a ledger, any bytes), program
// headers (CheckPreloadable reads ELF and #! lines), and the pinned limits
// file (KEY=VALUE lines over the environment's settings), and the node
// agent's turns broker (requests of up to three processes, of two users,
// any bytes: afterwards, every place they took is given back), and the
// code image formats module loads are keyed by (fatbin, ELF, PTX).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>

#include "share/code_image.h"
#include "share/ledger.h"
#include "share/pinned_limits.h"
#include "share/share_config.h"
#include "share/turns_broker.h"
#include "share/turns_protocol.h"
#include "stoker/gpu_share.h"

namespace {

std::string TempPath(const char* what) {
  return "/tmp/stoker-share-fuzz-" + std::to_string(::getpid()) + "-" + what;
}

void WriteFile(const std::string& path, const std::uint8_t* data, std::size_t size, mode_t mode) {
  ::unlink(path.c_str());
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return;
  if (size) std::fwrite(data, 1, size, f);
  std::fclose(f);
  ::chmod(path.c_str(), mode);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::uint8_t what = data[0] % 6;
  ++data;
  --size;
  if (what == 0) {
    // Settings: NUL-separated values for the variables, in order.
    static const char* kNames[] = {"STOKER_GPU_MEMORY_LIMIT",    "STOKER_GPU_MEMORY_LIMIT_0",
                                   "STOKER_GPU_MEMORY_LIMIT_7",  "STOKER_GPU_COMPUTE_SHARE",
                                   "STOKER_GPU_TENANT",          "STOKER_GPU_LEDGER",
                                   "STOKER_GPU_COMPUTE_MODE",    "STOKER_GPU_COMPUTE_PERIOD_MS",
                                   "STOKER_GPU_COMPUTE_SHARE_1", "STOKER_GPU_COMPUTE_SHARES"};
    std::map<std::string, std::string> env;
    std::string text(reinterpret_cast<const char*>(data), size);
    std::size_t at = 0;
    for (const char* name : kNames) {
      if (at > text.size()) break;
      const std::size_t end = text.find('\0', at);
      env[name] = text.substr(at, end == std::string::npos ? std::string::npos : end - at);
      at = end == std::string::npos ? text.size() + 1 : end + 1;
    }
    stoker::share::ShareConfig config;
    std::string error;
    const bool ok = stoker::share::ParseShareConfig(
        [&](const char* name) -> const char* {
          auto it = env.find(name);
          return it == env.end() ? nullptr : it->second.c_str();
        },
        &config, &error);
    if (!ok && error.empty()) __builtin_trap();  // a refusal always says why
    if (ok && config.compute_share > 100) __builtin_trap();
    if (ok) {
      for (const auto& [card, share] : config.card_shares)
        if (card.empty() || share < 1 || share > 100) __builtin_trap();
      for (std::uint32_t ordinal = 0; ordinal < 3; ++ordinal)
        if (config.ShareFor(ordinal, "GPU-aa") > 100) __builtin_trap();
    }
  } else if (what == 1) {
    const std::string path = TempPath("ledger");
    WriteFile(path, data, size, 0600);
    std::string error;
    std::unique_ptr<stoker::share::Ledger> ledger(stoker::share::Ledger::Open(path, &error));
    if (!ledger && error.empty()) __builtin_trap();
    stoker::share::LedgerReport report;
    if (ledger) (void)ledger->Snapshot(&report, &error);
    ::unlink(path.c_str());
  } else if (what == 3) {
    // A folder of our own (0700): trusted when we are root, refused otherwise.
    static const std::string dir = [] {
      char name[] = "/tmp/stoker-share-fuzz-pinned-XXXXXX";
      return std::string(::mkdtemp(name));
    }();
    const std::string path = dir + "/gpu-limits";
    WriteFile(path, data, size, 0644);
    stoker::share::ShareConfig config;
    std::string error;
    const bool ok = stoker::share::EffectiveShareConfig(
        [](const char* name) -> const char* {
          return std::strcmp(name, "STOKER_GPU_MEMORY_LIMIT") == 0 ? "4GiB" : nullptr;
        },
        path, &config, &error);
    if (!ok && error.empty()) __builtin_trap();  // a refusal always says why
    if (ok && (config.compute_share > 100 || config.LimitFor(0) > (4ull << 30))) __builtin_trap();  // never looser
    ::unlink(path.c_str());
  } else if (what == 4) {
    namespace share = stoker::share;
    static const std::string dir = [] {
      char name[] = "/tmp/stoker-share-fuzz-turns-XXXXXX";
      std::string made = ::mkdtemp(name);
      ::mkdir((made + "/limits").c_str(), 0700);
      if (FILE* f = std::fopen((made + "/limits/k8s-a.compute").c_str(), "w")) std::fclose(f);
      return made;
    }();
    const std::string turns = dir + "/turns";
    const int pinned = ::open((dir + "/limits/k8s-a.compute").c_str(), O_RDONLY | O_CLOEXEC);
    std::unique_ptr<share::TurnsSession> sessions[3];
    for (int i = 0; i < 3; ++i)
      sessions[i] = std::make_unique<share::TurnsSession>(turns, dir + "/limits", i == 2 ? 1001 : 0, 100 + i);
    // Each request: a byte naming the session (and whether the pinned file
    // comes along), then a request's bytes; the version made right most of
    // the time, so that the calls behind it are reached.
    std::uint64_t now = 1'000'000'000;
    while (size >= 1 + sizeof(share::TurnsRequest)) {
      const std::uint8_t who = data[0];
      share::TurnsRequest request;
      std::memcpy(&request, data + 1, sizeof(request));
      if (who & 0x80) request.version = share::kTurnsProtocolVersion;
      data += 1 + sizeof(request);
      size -= 1 + sizeof(request);
      now += 1'000'000 * (who & 0x0f);
      share::TurnsReply reply;
      std::string refusal;
      const bool keep = sessions[who % 3]->Handle(request, (who & 0x40) ? pinned : -1, now, &reply, &refusal);
      if (reply.error[sizeof(reply.error) - 1] != '\0') __builtin_trap();  // always terminated
      if (!keep) sessions[who % 3] = std::make_unique<share::TurnsSession>(turns, dir + "/limits", 0, 200);
    }
    for (auto& s : sessions) s->Close();
    if (pinned >= 0) ::close(pinned);
    share::LedgerReport report;
    std::string error;
    if (::access(turns.c_str(), F_OK) == 0) {
      if (!share::Ledger::Report(turns, &report, &error)) __builtin_trap();
      if (!report.tenants.empty()) __builtin_trap();  // every place given back
    }
  } else if (what == 5) {
    // Read only within the image, as the driver would; a length past it is refused.
    const std::uint64_t length = stoker::share::CodeImageLength(data, size);
    if (length > size) __builtin_trap();
    if (length > 0 && stoker::share::CodeBytesKey(data, length) == 0) __builtin_trap();
  } else {
    const std::string path = TempPath("program");
    WriteFile(path, data, size, 0755);
    auto checked = stoker::CheckPreloadable(path);
    if (!checked.ok() && checked.error().message().empty()) __builtin_trap();
    ::unlink(path.c_str());
  }
  return 0;
}
