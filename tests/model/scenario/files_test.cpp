// The input policy (model/scenario/files.hpp) in one process: what is not a regular file is refused at once (a FIFO
// with no writer included: the open does not wait for one), a file past its cap is refused, a file is read whole, and
// an output is told from an input by device and inode, through a symbolic or a hard link.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "model/scenario/errors.hpp"
#include "model/scenario/files.hpp"

namespace twin::model {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

fs::path scratch(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("twin-files-test-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  return dir / name;
}

std::string refusal(const std::string& path, std::uint64_t max_bytes) {
  try {
    read_input_file(path, "--input", max_bytes);
  } catch (const UserError& error) {
    return error.what();
  }
  return "";
}

TEST(InputFiles, WhatIsNotARegularFileIsRefusedWithoutWaiting) {
  const fs::path fifo = scratch("in.fifo");
  fs::remove(fifo);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  EXPECT_THAT(refusal(fifo, kMiB), HasSubstr("--input '" + fifo.string() + "' is a named pipe (FIFO)"));
  EXPECT_THAT(refusal("/dev/zero", kMiB), HasSubstr("'/dev/zero' is a character device, not a regular file"));
  EXPECT_THAT(refusal(fifo.parent_path(), kMiB), HasSubstr("is a directory, not a regular file"));
  EXPECT_THAT(refusal(scratch("missing").string(), kMiB), HasSubstr("cannot open: No such file or directory"));
  EXPECT_THAT(refusal("", kMiB), HasSubstr("--input: the file name is empty"));
}

TEST(InputFiles, AFileIsReadWholeWithinItsCapAndRefusedPastIt) {
  const fs::path file = scratch("in.txt");
  std::ofstream(file) << std::string(1000, 'x');
  EXPECT_EQ(read_input_file(file, "--input", 1000), std::string(1000, 'x'));
  EXPECT_THAT(refusal(file, 999), HasSubstr("has 1000 bytes, more than the 999 bytes a file of this kind may have"));
  std::ofstream(file, std::ios::trunc).flush();
  EXPECT_EQ(read_input_file(file, "--input", 1000), "");  // an empty file is read as empty
}

TEST(InputFiles, AnOutputIsToldFromAnInputThroughLinks) {
  const fs::path input = scratch("input.txt"), soft = scratch("soft.txt"), hard = scratch("hard.txt"),
                 other = scratch("other.txt");
  std::ofstream(input) << "input";
  std::ofstream(other) << "other";
  fs::remove(soft);
  fs::remove(hard);
  fs::create_symlink(input, soft);
  fs::create_hard_link(input, hard);
  for (const fs::path& output : {input, soft, hard}) {
    EXPECT_THROW(require_output_is_not_an_input("--json", output, {{"--data", input}}), UserError) << output;
  }
  EXPECT_NO_THROW(require_output_is_not_an_input("--json", other, {{"--data", input}}));
  EXPECT_NO_THROW(require_output_is_not_an_input("--json", scratch("new.txt"), {{"--data", input}}));
  fs::remove_all(input.parent_path());
}

}  // namespace
}  // namespace twin::model
