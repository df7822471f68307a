// write_file_atomically: content, replacement, no temp files left behind, and
// a clear Runtime error that leaves nothing when the folder does not exist.
#include "common/atomic_file.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/error.h"

namespace moed {
namespace {

namespace fs = std::filesystem;

class AtomicFile : public ::testing::Test {
 protected:
  void SetUp() override {
    static int counter = 0;
    dir_ = fs::temp_directory_path() /
           ("moed_atomic_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  static std::string read(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
  }
  std::vector<std::string> entries() const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir_)) names.push_back(e.path().filename());
    std::sort(names.begin(), names.end());
    return names;
  }

  fs::path dir_;
};

TEST_F(AtomicFile, WritesTheContent) {
  const std::string content("line 1\nbinary \0 byte\n", 21);
  write_file_atomically(dir_ / "out.toml", content);
  EXPECT_EQ(read(dir_ / "out.toml"), content);
  EXPECT_EQ(entries(), (std::vector<std::string>{"out.toml"}));  // no temp file left
}

TEST_F(AtomicFile, OverwriteReplacesTheWholeFile) {
  write_file_atomically(dir_ / "out.toml", std::string(1000, 'x'));
  write_file_atomically(dir_ / "out.toml", "short");
  EXPECT_EQ(read(dir_ / "out.toml"), "short");
  write_file_atomically(dir_ / "out.toml", "");
  EXPECT_EQ(read(dir_ / "out.toml"), "");
  EXPECT_TRUE(fs::exists(dir_ / "out.toml"));
  EXPECT_EQ(entries(), (std::vector<std::string>{"out.toml"}));
}

TEST_F(AtomicFile, MissingFolderIsARuntimeErrorNamingThePath) {
  const fs::path target = dir_ / "missing" / "out.toml";
  try {
    write_file_atomically(target, "content");
    ADD_FAILURE() << "no error thrown";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_EQ(e.kind(), ErrorKind::Runtime) << msg;
    EXPECT_NE(msg.find(target.string()), std::string::npos) << msg;
  }
  EXPECT_FALSE(fs::exists(dir_ / "missing"));
  EXPECT_TRUE(entries().empty());
}

}  // namespace
}  // namespace moed
