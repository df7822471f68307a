// write_file_atomically and AtomicFileWriter: content (whole or in pieces),
// replacement, no temp files left behind (also when the writer is dropped before
// commit, which leaves the old target as it was), and a clear error that leaves
// nothing when the folder does not exist.
#include "common/atomic_file.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/error.h"
#include "tests/unit/test_support.h"

namespace moed {
namespace {

namespace fs = std::filesystem;

class AtomicFile : public ::testing::Test {
 protected:
  static std::string read(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
  }
  std::vector<std::string> entries() const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(tmp_.path())) names.push_back(e.path().filename());
    std::sort(names.begin(), names.end());
    return names;
  }

  test::TempDir tmp_{"moed_atomic"};
};

TEST_F(AtomicFile, WritesTheContent) {
  const std::string content("line 1\nbinary \0 byte\n", 21);
  write_file_atomically(tmp_.path() / "out.toml", content);
  EXPECT_EQ(read(tmp_.path() / "out.toml"), content);
  EXPECT_EQ(entries(), (std::vector<std::string>{"out.toml"}));  // no temp file left
}

TEST_F(AtomicFile, OverwriteReplacesTheWholeFile) {
  write_file_atomically(tmp_.path() / "out.toml", std::string(1000, 'x'));
  write_file_atomically(tmp_.path() / "out.toml", "short");
  EXPECT_EQ(read(tmp_.path() / "out.toml"), "short");
  write_file_atomically(tmp_.path() / "out.toml", "");
  EXPECT_EQ(read(tmp_.path() / "out.toml"), "");
  EXPECT_TRUE(fs::exists(tmp_.path() / "out.toml"));
  EXPECT_EQ(entries(), (std::vector<std::string>{"out.toml"}));
}

TEST_F(AtomicFile, MissingFolderIsARuntimeErrorNamingThePath) {
  const fs::path target = tmp_.path() / "missing" / "out.toml";
  test::expect_error([&] { write_file_atomically(target, "content"); }, ErrorKind::Runtime,
                     {target.string()});
  EXPECT_FALSE(fs::exists(tmp_.path() / "missing"));
  EXPECT_TRUE(entries().empty());
}

TEST_F(AtomicFile, WriterAppendsPiecesAndCommits) {
  const fs::path target = tmp_.path() / "out.bin";
  AtomicFileWriter out(target);
  const std::uint64_t n = 0x0102030405060708u;
  out.append(&n, sizeof n);
  out.append("text");
  out.append(nullptr, 0);
  EXPECT_FALSE(fs::exists(target)) << "visible before commit";
  out.commit();
  EXPECT_EQ(read(target), std::string("\x08\x07\x06\x05\x04\x03\x02\x01text", 12));
  EXPECT_EQ(entries(), (std::vector<std::string>{"out.bin"}));
  test::expect_error([&] { out.append("more"); }, ErrorKind::Internal, {"append after commit"});
  test::expect_error([&] { out.commit(); }, ErrorKind::Internal, {"committed twice"});
}

TEST_F(AtomicFile, WriterDroppedBeforeCommitLeavesTheOldFile) {
  const fs::path target = tmp_.path() / "out.bin";
  write_file_atomically(target, "old");
  {
    AtomicFileWriter out(target);
    out.append("new, half written");
  }
  EXPECT_EQ(read(target), "old");
  EXPECT_EQ(entries(), (std::vector<std::string>{"out.bin"}));
}

TEST_F(AtomicFile, WriterCreateErrorHasTheCallersKind) {
  const fs::path target = tmp_.path() / "missing" / "out.bin";
  test::expect_error([&] { AtomicFileWriter out(target, ErrorKind::Input); }, ErrorKind::Input,
                     {target.string(), "cannot create"});
  test::expect_error([&] { AtomicFileWriter out(target); }, ErrorKind::Runtime, {target.string()});
  EXPECT_TRUE(entries().empty());
}

}  // namespace
}  // namespace moed
