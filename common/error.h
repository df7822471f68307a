// Errors with their origin (file, line) and a kind that decides the exit code.
//
// Usage and Input errors are the operator's to fix (a config key, a flag, a
// weights or trace file): the process exits with code 2 and the message names
// what was wrong. Runtime and Internal errors exit with code 1 and are logged
// with the file and line that raised them.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace moed {

enum class ErrorKind {
  Usage,     // bad flag or config value
  Input,     // a file named by the invocation is unusable
  Runtime,   // the environment failed (MPI, I/O, timeout)
  Internal,  // a broken invariant: a bug in moed
};

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& message, const char* file, int line)
      : std::runtime_error(message), kind_(kind), file_(file), line_(line) {}

  ErrorKind kind() const { return kind_; }
  const char* file() const { return file_; }
  int line() const { return line_; }
  // 2 for what the operator must fix, 1 for everything else.
  int exit_code() const { return kind_ == ErrorKind::Usage || kind_ == ErrorKind::Input ? 2 : 1; }
  // "message (at runtime/engine/engine.cc:120)" for Runtime/Internal, the bare message otherwise.
  std::string describe() const;

 private:
  ErrorKind kind_;
  const char* file_;
  int line_;
};

const char* to_string(ErrorKind kind);

}  // namespace moed

#define MOED_THROW(kind, ...) \
  throw ::moed::Error(::moed::ErrorKind::kind, ::fmt::format(__VA_ARGS__), __FILE__, __LINE__)

// An invariant that must hold whatever the input; failing it is a bug.
#define MOED_CHECK(cond, ...)                                                              \
  do {                                                                                     \
    if (!(cond))                                                                           \
      throw ::moed::Error(::moed::ErrorKind::Internal,                                     \
                          "check failed: " #cond ": " + ::fmt::format(__VA_ARGS__), __FILE__, \
                          __LINE__);                                                       \
  } while (0)
