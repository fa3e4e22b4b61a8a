// The process that made an object which runs threads of its own. A child
// forked from it (DataLoader workers, multiprocessing with "fork") copies the
// object but not its threads, and may copy its locks held by them: the
// child's calls must fail at once rather than wait forever.
#pragma once

#include <unistd.h>

#include <fmt/format.h>

#include "stoker/status.h"

namespace stoker {

class OwnerProcess {
 public:
  OwnerProcess() : pid_(::getpid()) {}

  [[nodiscard]] bool IsCurrent() const { return ::getpid() == pid_; }

  // FailedPrecondition in a forked child, naming `what` ("this loader") and both processes.
  [[nodiscard]] Status Check(std::string_view what) const {
    if (IsCurrent()) return Status::Ok();
    return Status::FailedPrecondition(
        fmt::format("{} was created in process {}; a forked child (process {}) cannot use it, since its threads did "
                    "not survive the fork: create a new one in the child",
                    what, pid_, ::getpid()));
  }

 private:
  pid_t pid_;
};

}  // namespace stoker
