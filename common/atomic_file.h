// Writing a file so that readers see the old content or the new, never half:
// write a temp file beside it, fsync, rename over the target, fsync the folder.
#pragma once

#include <string>
#include <string_view>

namespace moed {

// Throws a Runtime error naming the path on any failure; the target is untouched then.
void write_file_atomically(const std::string& path, std::string_view content);

}  // namespace moed
