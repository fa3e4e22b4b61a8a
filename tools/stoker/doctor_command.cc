// `stoker doctor [--out DIR] [--prometheus-port N] -- COMMAND...`,
// `stoker tokenize ...` and `stoker pack X.parquet OUT`: the doctor lives in
// the Python package (it hooks the training loop's Python), and so do
// tokenize (Hugging Face's tokenizers are Python's) and Parquet reading
// (pyarrow), so these run `stoker.doctor.__main__`, `stoker.tokenize` and
// `stoker._parquet` with the same arguments. The
// package is looked for beside this binary (a build tree's <build>/python, an
// install's ../lib/stoker/python) and put first on PYTHONPATH; the Python is
// $STOKER_PYTHON, else (in a build tree) the project's virtual environment
// over the Python the package was built for, else that Python, else
// python3. A Python that cannot import the package says so in one line,
// with the fix.
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>

#include <fmt/format.h>

#include "commands.h"

namespace stoker_cli {
namespace {

namespace fs = std::filesystem;

// The folder holding the `stoker` package, found from this binary's place.
std::optional<std::string> PackageBesideBinary() {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (ec) return std::nullopt;
  const fs::path dir = exe.parent_path();
  for (const fs::path& candidate :
       {dir / "python", dir.parent_path() / "python", dir.parent_path() / "lib" / "stoker" / "python"}) {
    if (fs::exists(candidate / "stoker" / "doctor" / "__main__.py", ec)) return candidate.lexically_normal().string();
  }
  return std::nullopt;
}

// A script that runs `module`'s main(argv) or says in one line why it cannot.
std::string Bootstrap(std::string_view tool, std::string_view module) {
  return fmt::format(
      "import sys\n"
      "try:\n"
      "    from {1} import main\n"
      "except ImportError as e:\n"
      "    sys.stderr.write('stoker {0}: %s cannot import stoker\\'s Python package (%s): set STOKER_PYTHON to a "
      "Python that imports it, or PYTHONPATH to the folder that holds it (a build\\'s <build>/python)\\n' % "
      "(sys.executable, e))\n"
      "    sys.exit(2)\n"
      "sys.exit(main(sys.argv[1:]))\n",
      tool, module);
}

// Replaces this process with the Python that imports stoker running
// `module`'s main with `args`; returns only on failure.
int ExecPythonTool(std::string_view tool, std::string_view module, const std::vector<std::string>& args) {
  const auto package = PackageBesideBinary();
  std::string python = "python3";
  if (const char* env = std::getenv("STOKER_PYTHON"); env != nullptr && *env != '\0') {
    python = env;
  }
#ifdef STOKER_BUILD_VENV_PYTHON
  else if (package && ::access(STOKER_BUILD_VENV_PYTHON, X_OK) == 0) {
    python = STOKER_BUILD_VENV_PYTHON;  // that Python with the packages scripts/deps installed beside it
  }
#endif
#ifdef STOKER_BUILD_PYTHON_EXECUTABLE
  else if (package && ::access(STOKER_BUILD_PYTHON_EXECUTABLE, X_OK) == 0) {
    python = STOKER_BUILD_PYTHON_EXECUTABLE;  // the Python the package's native module was built for
  }
#endif
  if (package) {
    const char* old = std::getenv("PYTHONPATH");
    const std::string path = old != nullptr && *old != '\0' ? *package + ":" + old : *package;
    ::setenv("PYTHONPATH", path.c_str(), 1);
  }
  std::vector<std::string> argv = {python, "-c", Bootstrap(tool, module)};
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<char*> c_argv;
  for (auto& a : argv) c_argv.push_back(a.data());
  c_argv.push_back(nullptr);
  ::execvp(c_argv[0], c_argv.data());
  return Fail(stoker::Status::NotFound(
      fmt::format("cannot run {}: {} (stoker {} is in stoker's Python package: set STOKER_PYTHON to the Python "
                  "that imports stoker)",
                  python, std::strerror(errno), tool)));
}

}  // namespace

int RunDoctor(const DoctorArgs& args) {
  std::vector<std::string> argv;
  if (!args.out.empty()) argv.insert(argv.end(), {"--out", args.out});
  if (args.prometheus_port) argv.insert(argv.end(), {"--prometheus-port", std::to_string(*args.prometheus_port)});
  argv.push_back("--");
  argv.insert(argv.end(), args.command.begin(), args.command.end());
  return ExecPythonTool("doctor", "stoker.doctor.__main__", argv);
}

int RunTokenize(const std::vector<std::string>& args) {
  return ExecPythonTool("tokenize", "stoker.tokenize", args);
}

int RunPackParquet(const PackArgs& args) {
  if (args.threads != 0 || !args.file_columns.empty())
    return Fail(stoker::Status::InvalidArgument(
        fmt::format("--threads and --file-column are for files and manifests, not Parquet ('{}')", args.source)));
  std::vector<std::string> argv = {args.source, args.out, "--shard-size", args.shard_size};
  if (args.force) argv.push_back("--force");
  if (args.max_side > 0)
    argv.insert(argv.end(), {"--max-side", std::to_string(args.max_side), "--quality", std::to_string(args.quality)});
  if (args.shuffle_seed) argv.insert(argv.end(), {"--shuffle", "--shuffle-seed", std::to_string(*args.shuffle_seed)});
  if (args.seekable_jpeg) argv.push_back("--seekable-jpeg");
  if (args.keep_bad_images) argv.push_back("--keep-bad-images");
  return ExecPythonTool("pack", "stoker._parquet", argv);
}

}  // namespace stoker_cli
