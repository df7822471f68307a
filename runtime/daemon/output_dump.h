// `moed --dump-output PATH`: the final hidden states of every token of the
// run, in global token order (step by step), gathered on rank 0. Two runs
// compare with `cmp`.
//
// File: "MOEDOUT1", then u64 hidden, u64 tokens_per_step, u64 steps (little
// endian), then steps x tokens_per_step rows of `hidden` fp32.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace moed::runtime {

struct OutputHeader {
  std::uint64_t hidden = 0, tokens_per_step = 0, steps = 0;
};

class OutputDump {
 public:
  // Writes to PATH.partial and renames at finish(), so PATH is whole or absent.
  OutputDump(const std::string& path, const OutputHeader& header);
  ~OutputDump();
  OutputDump(const OutputDump&) = delete;
  OutputDump& operator=(const OutputDump&) = delete;

  void append(const void* rows, std::size_t bytes);
  // The header then gives the steps actually written (a run stopped early by
  // `moectl shutdown` serves fewer than configured).
  void finish();

 private:
  void write(const void* data, std::size_t bytes);

  std::string path_, partial_;
  std::FILE* file_ = nullptr;
  OutputHeader header_;
  std::uint64_t row_bytes_ = 0;
};

// For tests and tools: the header and all rows.
struct OutputFile {
  OutputHeader header;
  std::vector<float> rows;
};
OutputFile read_output_dump(const std::string& path);

}  // namespace moed::runtime
