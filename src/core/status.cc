#include "stoker/status.h"

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

namespace stoker {

std::string_view StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "ok";
    case StatusCode::kInvalidArgument:
      return "invalid argument";
    case StatusCode::kNotFound:
      return "not found";
    case StatusCode::kAlreadyExists:
      return "already exists";
    case StatusCode::kCorruption:
      return "corruption";
    case StatusCode::kIOError:
      return "I/O error";
    case StatusCode::kUnavailable:
      return "unavailable";
    case StatusCode::kResourceExhausted:
      return "resource exhausted";
    case StatusCode::kUnimplemented:
      return "unimplemented";
    case StatusCode::kInternal:
      return "internal error";
    case StatusCode::kCancelled:
      return "cancelled";
    case StatusCode::kDeadlineExceeded:
      return "deadline exceeded";
    case StatusCode::kFailedPrecondition:
      return "failed precondition";
  }
  return "unknown";
}

Status Status::FromErrno(int error_number, std::string_view context) {
  std::string message = fmt::format("{}: {}", context, std::strerror(error_number));
  switch (error_number) {
    case ENOENT:
      return NotFound(std::move(message));
    case EEXIST:
      return AlreadyExists(std::move(message));
    case ENOSPC:
    case EDQUOT:
    case ENOMEM:
      return ResourceExhausted(std::move(message));
    case EINVAL:
      return InvalidArgument(std::move(message));
    default:
      return IOError(std::move(message));
  }
}

std::string Status::ToString() const {
  if (ok()) return "ok";
  return fmt::format("{}: {}", StatusCodeName(code_), message_);
}

Status Status::WithContext(std::string_view context) const {
  if (ok()) return *this;
  return {code_, fmt::format("{}: {}", context, message_)};
}

}  // namespace stoker
