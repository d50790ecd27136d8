#include "pagoda/core/mapped_file.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "pagoda/core/error.h"

namespace pagoda {
namespace {

TEST(MappedFile, MapsContents) {
  const auto path = std::filesystem::temp_directory_path() / "pagoda_mapped_file_test.bin";
  {
    std::ofstream out(path, std::ios::binary);
    out << "hello";
  }
  MappedFile file(path.string());
  ASSERT_EQ(file.size(), 5u);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(file.data()), 5), "hello");
  std::filesystem::remove(path);
}

TEST(MappedFile, MissingFileIsNotFound) {
  try {
    MappedFile file("/nonexistent/pagoda/model.gguf");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kNotFound);
    EXPECT_NE(std::string(e.what()).find("/nonexistent/pagoda/model.gguf"), std::string::npos);
  }
}

TEST(MappedFile, DirectoryIsRejected) {
  EXPECT_THROW(MappedFile("/tmp"), Error);
}

}  // namespace
}  // namespace pagoda
