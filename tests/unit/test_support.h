// Helpers shared by the unit tests (tests/unit/<part>/*.cc):
//   expect_error: run a callable, expecting a moed::Error of a given kind whose
//                 message contains given substrings;
//   TempDir:      a fresh empty directory under temp_directory_path(), removed
//                 with everything in it when the TempDir goes;
//   heap_in_use:  the bytes malloc has handed out and not yet taken back, to
//                 check that a long-lived object does not grow;
//   random_floats: n floats uniform in [-1, 1) from a counter-based key;
//   wait_until:   wait for a state another thread brings about (not for a time).
// Header only: each test binary is built from the .cc files of one part.
#pragma once

#include <gtest/gtest.h>
#include <malloc.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <source_location>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <vector>

#include "common/error.h"
#include "common/rng.h"

namespace moed::test {

// Runs `f` and expects it to throw a moed::Error of `kind` whose what() contains
// every one of `parts`. Adds a (non-fatal) failure when `f` returns normally,
// throws anything else, throws another kind, or a part is missing; each failure
// says what was expected, shows the actual message and points at the caller.
inline void expect_error(const std::function<void()>& f, ErrorKind kind,
                         const std::vector<std::string>& parts,
                         std::source_location where = std::source_location::current()) {
  ::testing::ScopedTrace trace(where.file_name(), static_cast<int>(where.line()),
                               "expect_error called here");
  std::ostringstream wanted;
  wanted << "a moed::Error of kind " << to_string(kind);
  if (!parts.empty()) {
    wanted << " whose message contains";
    for (std::size_t i = 0; i < parts.size(); ++i) wanted << (i ? ", '" : " '") << parts[i] << "'";
  }
  try {
    f();
  } catch (const Error& e) {
    const std::string message = e.what();
    if (e.kind() != kind)
      ADD_FAILURE() << "expected " << wanted.str() << "; got kind " << to_string(e.kind())
                    << ": " << message;
    for (const auto& p : parts)
      if (message.find(p) == std::string::npos)
        ADD_FAILURE() << "expected '" << p << "' in: " << message;
    return;
  } catch (const std::exception& other) {
    ADD_FAILURE() << "expected " << wanted.str() << "; got another exception: " << other.what();
    return;
  } catch (...) {
    ADD_FAILURE() << "expected " << wanted.str() << "; got an exception not from std::exception";
    return;
  }
  ADD_FAILURE() << "no error thrown; expected " << wanted.str();
}

// A unique, empty directory under std::filesystem::temp_directory_path(),
// created by the constructor and removed recursively by the destructor.
class TempDir {
 public:
  explicit TempDir(std::string_view prefix = "moed_test") {
    namespace fs = std::filesystem;
    static std::atomic<unsigned> counter{0};
    const std::string stem = std::string(prefix) + "_" + std::to_string(::getpid()) + "_";
    // create_directory is false when the name is taken (say, left by an earlier
    // process with the same pid): take the next one rather than reuse it.
    do {
      path_ = fs::temp_directory_path() / (stem + std::to_string(counter++));
    } while (!fs::create_directory(path_));
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }

  // path()/name as a string; `name` may hold subfolders ("a/b.txt").
  std::string file(const std::string& name) const { return (path_ / name).string(); }

  // Writes `bytes` to path()/name in binary mode (replacing any such file) and
  // returns its path as file(name) does. A failed write is a test failure.
  std::string write(const std::string& name, std::string_view bytes) const {
    const std::string target = file(name);
    std::ofstream out(target, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.close();
    if (!out) ADD_FAILURE() << "cannot write " << target;
    return target;
  }

 private:
  std::filesystem::path path_;
};

inline std::vector<float> random_floats(std::size_t n, std::uint64_t key) {
  CounterRng g(key);
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = g.symmetric(i);
  return v;
}

// Heap bytes in use (glibc: small blocks plus mmapped large ones), process-wide.
inline std::size_t heap_in_use() {
  const struct mallinfo2 info = ::mallinfo2();
  return info.uordblks + info.hblkhd;
}

// Waits until `state()` holds, looking every millisecond: for a test that must
// wait for a server thread to have done something, seen through its counters
// (sleeping "long enough" instead fails at random on a loaded machine). The
// deadline is far beyond what any machine needs; reaching it is a test failure
// at the caller naming `what`, the state waited for. Returns whether it held.
template <class State>
bool wait_until(State state, std::string_view what, std::chrono::milliseconds deadline = std::chrono::seconds(60),
                std::source_location where = std::source_location::current()) {
  const auto give_up = std::chrono::steady_clock::now() + deadline;
  while (!state()) {
    if (std::chrono::steady_clock::now() > give_up) {
      ADD_FAILURE_AT(where.file_name(), static_cast<int>(where.line()))
          << "still waiting after " << deadline.count() << " ms for: " << what;
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

}  // namespace moed::test
