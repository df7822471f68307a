// Writing a file so that readers see the old content or the new, never half:
// write a temp file beside it, fsync, rename over the target, fsync the folder.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "common/error.h"

namespace moed {

// A file written in pieces (too large to build in memory first), put in place
// by commit(). The pieces go to "<path>.tmp.<pid>"; destroyed before commit()
// (an error on the way), it removes that temp file and the target is untouched.
// Every failure is a Runtime error naming the path, except creating the temp
// file, whose kind the caller picks: Input where the path is one the operator
// named and must fix.
class AtomicFileWriter {
 public:
  explicit AtomicFileWriter(std::string path, ErrorKind create_error = ErrorKind::Runtime);
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  void append(const void* data, std::size_t bytes);
  void append(std::string_view text) { append(text.data(), text.size()); }
  // fsync, close, rename over the target, fsync the folder. At most once.
  void commit();

 private:
  std::string path_, tmp_;
  int fd_ = -1;  // open until commit()
  bool committed_ = false;
};

// The whole content at once. Throws a Runtime error naming the path on any
// failure; the target is untouched then.
void write_file_atomically(const std::string& path, std::string_view content);

}  // namespace moed
