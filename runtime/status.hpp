// Errors as values for the project's own failures. No CAF here: the controller
// core and the tools share this header, and it must stay cheap to include.
#pragma once

#include <cassert>
#include <string>
#include <utility>
#include <variant>

namespace troupe {

// One code per kind of failure a caller may want to react to differently.
enum class errc {
  ok = 0,
  invalid_argument,   // bad input from a user or a config: nothing was changed
  not_found,          // an unknown application, deployment, node, replica
  already_exists,     // a duplicate name
  conflict,           // e.g. prev_version does not match the current version
  unavailable,        // a peer cannot be reached right now; retrying may help
  io_error,           // a file or database operation failed
  corrupt,            // stored data cannot be decoded
  version_mismatch,   // peers speak different wire protocol versions
  permission_denied,  // the caller's role may not do this
  timeout,            // no answer within the deadline
  internal,           // a bug: an invariant did not hold
  overloaded,         // a replica refused work at its max_ongoing_requests: try another
  not_leader,         // a head candidate that does not lead: ask the leader (named if known)
};

const char* to_string(errc code);

// An error code with a message a user understands ("num_replicas: -1 must be
// >= 0"). A default-constructed Status is success. [[nodiscard]]: a failure
// nobody looks at is a bug; a caller that may ignore one casts the call to
// void and says why.
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(errc code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok() { return {}; }

  bool is_ok() const { return code_ == errc::ok; }
  explicit operator bool() const { return is_ok(); }
  errc code() const { return code_; }
  const std::string& message() const { return message_; }
  // "invalid_argument: num_replicas: -1 must be >= 0"
  std::string to_string() const;

 private:
  errc code_ = errc::ok;
  std::string message_;
};

// A value or the Status that explains why there is none ([[nodiscard]] as
// Status).
template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status error) : value_(std::move(error)) { assert(!std::get<Status>(value_).is_ok()); }
  Result(errc code, std::string message) : Result(Status(code, std::move(message))) {}

  bool has_value() const { return std::holds_alternative<T>(value_); }
  explicit operator bool() const { return has_value(); }

  T& value() & { return std::get<T>(value_); }
  const T& value() const& { return std::get<T>(value_); }
  T&& value() && { return std::get<T>(std::move(value_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  // The error; Status::ok() when a value is held.
  Status status() const { return has_value() ? Status() : std::get<Status>(value_); }

 private:
  std::variant<T, Status> value_;
};

}  // namespace troupe
