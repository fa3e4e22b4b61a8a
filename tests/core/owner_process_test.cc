#include "core/owner_process.h"

#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

namespace stoker {
namespace {

TEST(OwnerProcess, AForkedChildIsNotTheOwnerOfItsParentsObjectsButOfItsOwn) {
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "ThreadSanitizer does not support forking; runs in the other builds";
#endif
  const OwnerProcess parents;
  ASSERT_TRUE(parents.IsCurrent());
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Exit codes say which check failed; no gtest in the child.
    if (parents.IsCurrent()) ::_exit(1);
    if (parents.Check("the parent's writer").ok()) ::_exit(2);
    const OwnerProcess own;
    if (!own.IsCurrent()) ::_exit(3);
    const pid_t grandchild = ::fork();
    if (grandchild == 0) ::_exit(own.IsCurrent() || parents.IsCurrent() ? 4 : 0);
    int status = 0;
    ::waitpid(grandchild, &status, 0);
    ::_exit(WIFEXITED(status) ? WEXITSTATUS(status) : 5);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_TRUE(parents.IsCurrent());  // the parent still owns it
}

}  // namespace
}  // namespace stoker
