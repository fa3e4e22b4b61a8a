// stoker/status.h: the error convention of the whole public API.
//
// Every fallible function returns Status (no value) or Result<T> (a value or
// a Status). Both are [[nodiscard]]. No exception crosses the public API.
// A Status message always says what was expected and where: a file, a
// shard:offset, a sample key.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#if __has_include(<expected>)
#include <expected>
#endif

namespace stoker {

enum class StatusCode : std::uint8_t {
  kOk = 0,
  kInvalidArgument,    // the caller asked for something malformed
  kNotFound,           // a file, shard, sample or field does not exist
  kAlreadyExists,      // refusing to overwrite
  kCorruption,         // bytes on storage are not what the format says
  kIOError,            // the operating system refused a read or write
  kUnavailable,        // a transient condition; retrying may succeed
  kResourceExhausted,  // disk full, out of memory
  kUnimplemented,
  kInternal,  // a bug in stoker
  kCancelled,
  kDeadlineExceeded,    // a wait ran out of time; nothing was lost
  kFailedPrecondition,  // the object is not in a state to do this (e.g. used after fork)
};

// Returns a stable lower-case name for a code, e.g. "corruption".
std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return {}; }
  static Status InvalidArgument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
  static Status NotFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
  static Status AlreadyExists(std::string m) { return {StatusCode::kAlreadyExists, std::move(m)}; }
  static Status Corruption(std::string m) { return {StatusCode::kCorruption, std::move(m)}; }
  static Status IOError(std::string m) { return {StatusCode::kIOError, std::move(m)}; }
  static Status Unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
  static Status ResourceExhausted(std::string m) { return {StatusCode::kResourceExhausted, std::move(m)}; }
  static Status Unimplemented(std::string m) { return {StatusCode::kUnimplemented, std::move(m)}; }
  static Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }
  static Status Cancelled(std::string m) { return {StatusCode::kCancelled, std::move(m)}; }
  static Status DeadlineExceeded(std::string m) { return {StatusCode::kDeadlineExceeded, std::move(m)}; }
  static Status FailedPrecondition(std::string m) { return {StatusCode::kFailedPrecondition, std::move(m)}; }

  // Builds a Status from an errno value: ENOENT -> NotFound, ENOSPC/EDQUOT ->
  // ResourceExhausted, anything else -> IOError. `context` says what was being
  // done to what, e.g. "open 'a/b.jpg' for reading".
  static Status FromErrno(int error_number, std::string_view context);

  [[nodiscard]] bool ok() const { return code_ == StatusCode::kOk; }
  [[nodiscard]] StatusCode code() const { return code_; }
  [[nodiscard]] const std::string& message() const { return message_; }
  // "corruption: shard-000001.tar:1536: ..." or "ok".
  [[nodiscard]] std::string ToString() const;

  // Returns a copy whose message is "context: message"; keeps the code.
  [[nodiscard]] Status WithContext(std::string_view context) const;

  friend bool operator==(const Status& a, const Status& b) = default;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

namespace internal {

// A Result holds a value or an error: built from an OK status it would hold
// neither, so it holds an internal error instead, in every build type.
inline Status NotOk(Status status) {
  if (status.ok()) return Status::Internal("a Result was built from an OK status (a bug in stoker)");
  return status;
}

// A minimal stand-in for std::expected<T, Status>, used only by compilers
// whose standard library lacks <expected> (clang 14 with libstdc++ 12, which
// builds the fuzzers and the thread-safety analysis).
template <typename T>
class FallbackExpected {
 public:
  template <typename U = T>
  requires std::is_constructible_v<T, U&&> FallbackExpected(U&& value)
      : has_value_(true) {  // NOLINT(google-explicit-constructor)
    new (&value_) T(std::forward<U>(value));
  }
  FallbackExpected(const FallbackExpected& other) : has_value_(other.has_value_), error_(other.error_) {
    if (has_value_) new (&value_) T(other.value_);
  }
  FallbackExpected(FallbackExpected&& other) noexcept : has_value_(other.has_value_), error_(std::move(other.error_)) {
    if (has_value_) new (&value_) T(std::move(other.value_));
  }
  FallbackExpected& operator=(FallbackExpected other) noexcept {
    Destroy();
    has_value_ = other.has_value_;
    error_ = std::move(other.error_);
    if (has_value_) new (&value_) T(std::move(other.value_));
    return *this;
  }
  ~FallbackExpected() { Destroy(); }

  [[nodiscard]] bool has_value() const { return has_value_; }
  explicit operator bool() const { return has_value_; }
  T& value() & { return value_; }
  const T& value() const& { return value_; }
  T&& value() && { return std::move(value_); }
  T& operator*() & { return value_; }
  const T& operator*() const& { return value_; }
  T&& operator*() && { return std::move(value_); }
  T* operator->() { return &value_; }
  const T* operator->() const { return &value_; }
  const Status& error() const& { return error_; }
  Status&& error() && { return std::move(error_); }

 protected:
  struct ErrorTag {};
  FallbackExpected(ErrorTag, Status error) : has_value_(false), error_(std::move(error)) {}

 private:
  void Destroy() {
    if (has_value_) value_.~T();
    has_value_ = false;
  }
  bool has_value_;
  union {
    T value_;
  };
  Status error_;
};

}  // namespace internal

// Result<T> holds either a T or a non-OK Status. A Status converts to a
// Result implicitly, so `return Status::NotFound(...)` works in a function
// returning Result<T>.
#if defined(__cpp_lib_expected)
template <typename T>
class [[nodiscard]] Result : public std::expected<T, Status> {
  using Base = std::expected<T, Status>;

 public:
  using Base::Base;
  Result(Status status)  // NOLINT(google-explicit-constructor)
      : Base(std::unexpect, internal::NotOk(std::move(status))) {}
  [[nodiscard]] bool ok() const { return this->has_value(); }
  // The error, or OK when a value is held.
  [[nodiscard]] Status status() const { return this->has_value() ? Status() : this->error(); }
};
#else
template <typename T>
class [[nodiscard]] Result : public internal::FallbackExpected<T> {
  using Base = internal::FallbackExpected<T>;

 public:
  using Base::Base;
  Result(Status status)  // NOLINT(google-explicit-constructor)
      : Base(typename Base::ErrorTag{}, internal::NotOk(std::move(status))) {}
  [[nodiscard]] bool ok() const { return this->has_value(); }
  [[nodiscard]] Status status() const { return this->has_value() ? Status() : this->error(); }
};
#endif

}  // namespace stoker

#define STOKER_CONCAT_INNER_(a, b) a##b
#define STOKER_CONCAT_(a, b) STOKER_CONCAT_INNER_(a, b)

// Returns the Status from the enclosing function when `expr` is not OK.
#define STOKER_RETURN_IF_ERROR(expr)                 \
  do {                                               \
    ::stoker::Status stoker_status_ = (expr);        \
    if (!stoker_status_.ok()) return stoker_status_; \
  } while (false)

// `STOKER_ASSIGN_OR_RETURN(auto x, MakeX());` declares x from the Result's
// value, or returns its Status from the enclosing function.
#define STOKER_ASSIGN_OR_RETURN(lhs, expr) \
  STOKER_ASSIGN_OR_RETURN_IMPL_(STOKER_CONCAT_(stoker_result_, __LINE__), lhs, expr)
#define STOKER_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr)  \
  auto tmp = (expr);                                   \
  if (!tmp.has_value()) return std::move(tmp).error(); \
  lhs = std::move(tmp).value()
