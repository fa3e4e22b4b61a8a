// The process that made an object which runs threads of its own. A child
// forked from it (DataLoader workers, multiprocessing with "fork") copies the
// object but not its threads, and may copy its locks held by them: the
// child's calls must fail at once rather than wait forever.
#pragma once

#include <unistd.h>

#include <cstdint>

#include <fmt/format.h>

#include "stoker/status.h"

namespace stoker {

namespace internal {
// How many forks lie between the process's first program and this process:
// a pthread_atfork handler adds one in each child. Reading it costs a load,
// where getpid() is a system call (2.9% of a writer's time per sample).
[[nodiscard]] std::uint64_t ForkGeneration();
}  // namespace internal

class OwnerProcess {
 public:
  OwnerProcess() : generation_(internal::ForkGeneration()), pid_(::getpid()) {}

  [[nodiscard]] bool IsCurrent() const { return internal::ForkGeneration() == generation_; }

  // FailedPrecondition in a forked child, naming `what` ("this loader") and both processes.
  [[nodiscard]] Status Check(std::string_view what) const {
    if (IsCurrent()) return Status::Ok();
    return Status::FailedPrecondition(
        fmt::format("{} was created in process {}; a forked child (process {}) cannot use it, since its threads did "
                    "not survive the fork: create a new one in the child",
                    what, pid_, ::getpid()));
  }

 private:
  std::uint64_t generation_;
  pid_t pid_;  // for messages
};

}  // namespace stoker
