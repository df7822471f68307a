#include "runtime/daemon/output_dump.h"

#include <cerrno>
#include <cstring>
#include <fstream>

#include "common/error.h"

namespace moed::runtime {

namespace {
constexpr char kMagic[8] = {'M', 'O', 'E', 'D', 'O', 'U', 'T', '1'};
}

OutputDump::OutputDump(const std::string& path, const OutputHeader& header)
    : path_(path), partial_(path + ".partial"), header_(header) {
  file_ = std::fopen(partial_.c_str(), "wb");
  if (!file_) MOED_THROW(Usage, "--dump-output {}: cannot create: {}", partial_, std::strerror(errno));
  write(kMagic, sizeof kMagic);
  std::uint64_t fields[3] = {header.hidden, header.tokens_per_step, header.steps};
  write(fields, sizeof fields);
}

OutputDump::~OutputDump() {
  if (file_) {
    std::fclose(file_);
    std::remove(partial_.c_str());  // never finished: leave no half file behind
  }
}

void OutputDump::write(const void* data, std::size_t bytes) {
  if (bytes && std::fwrite(data, 1, bytes, file_) != bytes)
    MOED_THROW(Runtime, "{}: write failed: {}", partial_, std::strerror(errno));
}

void OutputDump::append(const void* rows, std::size_t bytes) {
  write(rows, bytes);
  row_bytes_ += bytes;
}

void OutputDump::finish() {
  const std::uint64_t step_bytes = header_.hidden * header_.tokens_per_step * sizeof(float);
  const std::uint64_t steps = step_bytes ? row_bytes_ / step_bytes : 0;
  if (steps != header_.steps) {
    if (std::fseek(file_, long(sizeof kMagic + 2 * sizeof(std::uint64_t)), SEEK_SET) != 0)
      MOED_THROW(Runtime, "{}: seek failed: {}", partial_, std::strerror(errno));
    write(&steps, sizeof steps);
  }
  if (std::fclose(file_) != 0) MOED_THROW(Runtime, "{}: close failed: {}", partial_, std::strerror(errno));
  file_ = nullptr;
  if (std::rename(partial_.c_str(), path_.c_str()) != 0)
    MOED_THROW(Runtime, "cannot rename {} to {}: {}", partial_, path_, std::strerror(errno));
}

OutputFile read_output_dump(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) MOED_THROW(Input, "{}: cannot open", path);
  char magic[8];
  std::uint64_t fields[3];
  if (!in.read(magic, 8) || std::memcmp(magic, kMagic, 8) != 0 ||
      !in.read(reinterpret_cast<char*>(fields), sizeof fields))
    MOED_THROW(Input, "{}: not a moed output dump", path);
  OutputFile out;
  out.header = {fields[0], fields[1], fields[2]};
  std::uint64_t n = fields[0] * fields[1] * fields[2];
  out.rows.resize(n);
  if (!in.read(reinterpret_cast<char*>(out.rows.data()), std::streamsize(n * sizeof(float))))
    MOED_THROW(Input, "{}: truncated: expected {} floats", path, n);
  return out;
}

}  // namespace moed::runtime
