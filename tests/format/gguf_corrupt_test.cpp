// Corrupt, truncated and hostile GGUF files: each must throw pagoda::Error naming the problem,
// never crash, read out of bounds (ASan) or allocate what a count claims.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "gguf_builder.h"
#include "pagoda/core/error.h"
#include "pagoda/format/gguf.h"

namespace pagoda {
namespace {

using testing::array_value;
using testing::Bytes;
using testing::GgufBuilder;
using VT = GgufValueType;

constexpr uint64_t kHuge = uint64_t(1) << 60;

void expect_error(const std::vector<uint8_t>& bytes, ErrorKind kind, const std::string& needle) {
  try {
    GgufFile::parse(bytes, "x.gguf");
    ADD_FAILURE() << "expected an error containing '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), kind) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

GgufBuilder small_valid_file() {
  GgufBuilder b;
  b.kv_string("general.architecture", "llama");
  b.kv_pod<uint32_t>("llama.block_count", VT::kU32, 2);
  b.kv("tokens", VT::kArray, array_value(VT::kString, 2, Bytes().str("a").str("bc")));
  const Bytes inner = array_value(VT::kI8, 2, Bytes().pod<int8_t>(1).pod<int8_t>(-1));
  b.kv("nested", VT::kArray, array_value(VT::kArray, 1, inner));
  b.kv_pod<double>("f64", VT::kF64, 2.5);
  b.kv_pod<uint8_t>("bool", VT::kBool, 0);
  b.tensor("a", {4}, GgmlType::kF32, testing::f32_bytes({1, 2, 3, 4}));
  b.tensor("q", {32}, GgmlType::kQ4_1, std::vector<uint8_t>(20, 0x11));
  return b;
}

TEST(GgufCorrupt, EveryTruncationThrows) {
  const std::vector<uint8_t> full = small_valid_file().build();
  ASSERT_NO_THROW(GgufFile::parse(full));
  for (size_t n = 0; n < full.size(); ++n) {
    // A copy of exactly n bytes, so ASan sees any read past the end.
    const std::vector<uint8_t> prefix(full.begin(), full.begin() + n);
    try {
      GgufFile::parse(prefix, "x.gguf");
      ADD_FAILURE() << "prefix of " << n << " bytes parsed";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kCorrupt) << n << ": " << e.what();
    }
  }
}

TEST(GgufCorrupt, BadMagic) {
  std::vector<uint8_t> bytes = small_valid_file().build();
  bytes[0] = 'X';
  expect_error(bytes, ErrorKind::kCorrupt, "bad magic");
}

TEST(GgufCorrupt, UnsupportedVersions) {
  for (uint32_t version : {0u, 1u, 4u, 0xffffffffu}) {
    GgufBuilder b = small_valid_file();
    b.version = version;
    expect_error(b.build(), ErrorKind::kUnsupported, "version " + std::to_string(version));
  }
  GgufBuilder b = small_valid_file();
  b.version = 0x03000000;  // 3, written big-endian
  expect_error(b.build(), ErrorKind::kUnsupported, "big-endian");
}

// The example from the spec of this reader: the message says what, where and the file size.
TEST(GgufCorrupt, StringLengthPastEnd) {
  GgufBuilder b;
  b.kv("s", VT::kString, Bytes().pod<uint64_t>(123456789));
  const std::vector<uint8_t> bytes = b.build();
  const size_t at = 24 + 8 + 1 + 4;  // header, key length, key, value type
  expect_error(bytes, ErrorKind::kCorrupt,
               "corrupt GGUF file 'x.gguf': string length 123456789 at offset " +
                   std::to_string(at) + " runs past end of file (size " +
                   std::to_string(bytes.size()) + ")");
}

TEST(GgufCorrupt, HugeCountsDoNotAllocate) {
  {
    GgufBuilder b = small_valid_file();
    b.kv_count = kHuge;
    expect_error(b.build(), ErrorKind::kCorrupt, "runs past end of file");
  }
  {
    GgufBuilder b;
    b.kv("a", VT::kArray, array_value(VT::kU8, kHuge, Bytes().pod<uint8_t>(1)));
    expect_error(b.build(), ErrorKind::kCorrupt, "array of 1152921504606846976 u8 values");
  }
  {
    GgufBuilder b;
    b.kv("a", VT::kArray, array_value(VT::kString, kHuge, Bytes()));
    expect_error(b.build(), ErrorKind::kCorrupt, "array of");
  }
  {
    GgufBuilder b;
    b.kv("a", VT::kArray, array_value(VT::kArray, ~uint64_t(0), Bytes()));
    expect_error(b.build(), ErrorKind::kCorrupt, "array of");
  }
  {
    std::vector<uint8_t> bytes = small_valid_file().build();
    const uint64_t huge = kHuge;
    std::memcpy(bytes.data() + 8, &huge, 8);  // tensor count
    expect_error(bytes, ErrorKind::kCorrupt, "x.gguf");
  }
  {
    GgufBuilder b;
    b.kv_bytes.str("").pod<uint32_t>(uint32_t(VT::kString)).pod<uint64_t>(~uint64_t(0));
    b.kv_count = 1;
    expect_error(b.build(), ErrorKind::kCorrupt, "string length 18446744073709551615");
  }
}

TEST(GgufCorrupt, BadValues) {
  {
    GgufBuilder b;
    b.kv_pod<uint32_t>("x", VT(13), 0);
    expect_error(b.build(), ErrorKind::kCorrupt, "unknown metadata value type 13");
  }
  {
    GgufBuilder b;
    b.kv("x", VT::kArray, array_value(VT(99), 0, Bytes()));
    expect_error(b.build(), ErrorKind::kCorrupt, "unknown array element type 99");
  }
  {
    GgufBuilder b;
    b.kv_pod<uint8_t>("x", VT::kBool, 2);
    expect_error(b.build(), ErrorKind::kCorrupt, "bool value 2");
  }
  {
    GgufBuilder b;
    b.kv_string("k", "1").kv_string("k", "2");
    expect_error(b.build(), ErrorKind::kCorrupt, "duplicate metadata key 'k'");
  }
}

TEST(GgufCorrupt, NestingDepth) {
  auto nested = [](int depth) {
    Bytes v = array_value(VT::kU8, 1, Bytes().pod<uint8_t>(7));
    for (int i = 1; i < depth; ++i) v = array_value(VT::kArray, 1, v);
    GgufBuilder b;
    b.kv("deep", VT::kArray, v);
    return b.build();
  };
  EXPECT_NO_THROW(GgufFile::parse(nested(8)));
  expect_error(nested(9), ErrorKind::kCorrupt, "nested deeper than 8");
  expect_error(nested(10000), ErrorKind::kCorrupt, "nested deeper than 8");
}

TEST(GgufCorrupt, BadAlignment) {
  for (uint32_t alignment : {0u, 3u, 48u}) {
    GgufBuilder b = small_valid_file();
    b.kv_pod<uint32_t>("general.alignment", VT::kU32, alignment);
    expect_error(b.build(), ErrorKind::kCorrupt,
                 "general.alignment must be a nonzero power of two");
  }
  GgufBuilder b = small_valid_file();
  b.kv_string("general.alignment", "32");
  expect_error(b.build(), ErrorKind::kCorrupt, "general.alignment");
  GgufBuilder negative = small_valid_file();
  negative.kv_pod<int32_t>("general.alignment", VT::kI32, -32);
  expect_error(negative.build(), ErrorKind::kCorrupt, "general.alignment");
}

TEST(GgufCorrupt, BadTensorInfos) {
  {
    GgufBuilder b;
    b.tensor("t", {1, 1, 1, 1, 1}, GgmlType::kF32, std::vector<uint8_t>(4));
    expect_error(b.build(), ErrorKind::kCorrupt, "tensor 't' has 5 dimensions");
  }
  {
    GgufBuilder b;
    b.tensor("t", {uint64_t(1) << 40, uint64_t(1) << 40}, GgmlType::kF32, {});
    expect_error(b.build(), ErrorKind::kCorrupt, "overflow");
  }
  {
    GgufBuilder b;
    b.tensor("t", {0, uint64_t(1) << 63}, GgmlType::kF32, {});  // product 0, second dim negative
    expect_error(b.build(), ErrorKind::kCorrupt, "overflow");
  }
  {
    GgufBuilder b;  // 2^62 elements fit in int64, their 2^64 bytes do not
    b.tensor("t", {uint64_t(1) << 62}, GgmlType::kF32, {});
    expect_error(b.build(), ErrorKind::kCorrupt, "byte size that overflows");
  }
  {
    GgufBuilder b;
    b.tensor("t", {33}, GgmlType::kQ4_0, std::vector<uint8_t>(18));
    expect_error(b.build(), ErrorKind::kCorrupt, "not a multiple of the q4_0 block size 32");
  }
  {
    GgufBuilder b;
    b.tensor("t", {4}, GgmlType(1000), std::vector<uint8_t>(16));
    expect_error(b.build(), ErrorKind::kCorrupt, "tensor 't' has unknown type 1000");
  }
  {
    GgufBuilder b;
    b.tensor("t", {4}, GgmlType::kF32, std::vector<uint8_t>(16))
        .tensor("t", {4}, GgmlType::kF32, std::vector<uint8_t>(16));
    expect_error(b.build(), ErrorKind::kCorrupt, "duplicate tensor name 't'");
  }
}

// Patches the data offset of the last tensor (the file's last 8 header bytes before padding).
std::vector<uint8_t> with_last_offset(GgufBuilder b, uint64_t offset) {
  const Bytes header = b.header();
  std::vector<uint8_t> bytes = b.build();
  std::memcpy(bytes.data() + header.b.size() - 8, &offset, 8);
  return bytes;
}

TEST(GgufCorrupt, BadTensorOffsets) {
  GgufBuilder b;
  b.tensor("a", {4}, GgmlType::kF32, std::vector<uint8_t>(16))
      .tensor("b", {4}, GgmlType::kF32, std::vector<uint8_t>(16));
  ASSERT_NO_THROW(GgufFile::parse(with_last_offset(b, 32)));
  expect_error(with_last_offset(b, 33), ErrorKind::kCorrupt,
               "data offset 33 is not a multiple of the alignment 32");
  expect_error(with_last_offset(b, 64), ErrorKind::kCorrupt,
               "tensor 'b' data (16 bytes at data offset 64");
  expect_error(with_last_offset(b, ~uint64_t(31)), ErrorKind::kCorrupt, "runs past end of file");
}

}  // namespace
}  // namespace pagoda
