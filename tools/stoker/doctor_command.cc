// `stoker doctor [--out DIR] [--prometheus-port N] -- COMMAND...`: the doctor
// lives in the Python package (it hooks the training loop's Python), so this
// runs `python3 -m stoker.doctor` with the same arguments: the Python from
// $STOKER_PYTHON, else python3 on PATH.
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#include "commands.h"

namespace stoker_cli {

int RunDoctor(const DoctorArgs& args) {
  const char* env = std::getenv("STOKER_PYTHON");
  const std::string python = env != nullptr && *env != '\0' ? env : "python3";
  std::vector<std::string> argv = {python, "-m", "stoker.doctor"};
  if (!args.out.empty()) argv.insert(argv.end(), {"--out", args.out});
  if (args.prometheus_port) argv.insert(argv.end(), {"--prometheus-port", std::to_string(*args.prometheus_port)});
  argv.push_back("--");
  argv.insert(argv.end(), args.command.begin(), args.command.end());
  std::vector<char*> c_argv;
  for (auto& a : argv) c_argv.push_back(a.data());
  c_argv.push_back(nullptr);
  ::execvp(c_argv[0], c_argv.data());
  return Fail(stoker::Status::NotFound(
      fmt::format("cannot run {}: {} (the doctor is in stoker's Python package: set STOKER_PYTHON to the Python "
                  "that imports stoker)",
                  python, std::strerror(errno))));
}

}  // namespace stoker_cli
