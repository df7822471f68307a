#include "common/error.h"

namespace moed {

const char* to_string(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::Usage: return "usage";
    case ErrorKind::Input: return "input";
    case ErrorKind::Runtime: return "runtime";
    case ErrorKind::Internal: return "internal";
  }
  return "unknown";
}

std::string Error::describe() const {
  if (exit_code() == 2) return what();
  return fmt::format("{} (at {}:{})", what(), file_, line_);
}

}  // namespace moed
