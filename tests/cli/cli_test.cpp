// The pagoda binary as a user meets it: bad input gets one clear line on stderr and a non-zero
// exit, never a crash; good input streams text and reports speed.
#include <gtest/gtest.h>

#include "pagoda_process.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

namespace {

using Result = pagoda::testing::ProcessResult;

Result run(const std::string& args) { return pagoda::testing::run_pagoda(args); }
// A clean failure: exit code 1 (or CLI11's parse-error code), the message, and no crash.
void expect_error(const std::string& args, const std::string& message) {
  pagoda::testing::expect_pagoda_error(args, message);
}

std::string temp_file(const std::string& name, const std::string& contents) {
  const auto path = std::filesystem::temp_directory_path() / name;
  std::ofstream(path, std::ios::binary) << contents;
  return path.string();
}

TEST(Cli, GenerateStreamsTextAndReportsSpeed) {
  const Result r = run("generate -p 'The capital of France is' -n 8 --temp 0");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("The capital of France is Paris"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("decode: 7 tokens"), std::string::npos) << r.output;
}

// A beam search prints its best hypotheses, best first, at the end; its flags are checked.
// KV pages carry int2 codes, metadata and the V tail; the default int2's fp8 keys and f16 sink
// tokens live elsewhere, so a disaggregated server refuses them at start-up.
TEST(Cli, DisaggregatedInt2NeedsThePapersFormat) {
  expect_error("serve --role prefill --kv-cache-dtype int2 --peer-key 0123456789abcdef01 --port 0 --peer-port 0",
               "int2 KV with fp8 keys or sink tokens does not travel between servers");
}

TEST(Cli, GenerateBeamSearch) {
  const Result r = run("generate -p 'The capital of France is' -n 8 --beam-width 4 --num-return 2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const size_t first = r.output.find("[beam 1: score "), second = r.output.find("[beam 2: score ");
  ASSERT_NE(first, std::string::npos) << r.output;
  ASSERT_NE(second, std::string::npos) << r.output;
  EXPECT_LT(first, second);
  EXPECT_EQ(r.output.find("[beam 3:"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("The capital of France is Paris", first), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("tokens generated over all beams"), std::string::npos) << r.output;

  expect_error("generate -p hi --beam-width 65", "beam_width must be in [1, 64]");
  expect_error("generate -p hi --beam-width 2 --num-return 3", "num_return must be in [1, beam_width = 2]");
  expect_error("generate -p hi --beam-width 2 --temp 0.7", "temperature must be 0");
  expect_error("generate -p hi --beam-width 2 --early-stopping maybe", "--early-stopping must be true, false or never");
  expect_error("generate -p hi --length-penalty 2", "need --beam-width");
  expect_error("bench throughput --batch 1 --input 8 --output 4 --beam-width 65", "--beam-width is for offline runs, in [1, 64]");
}

TEST(Cli, ChatOnceAnswers) {
  const Result r = run("chat --once 'What is 2 + 2? Reply with the number only.' -n 16 --temp 0");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("4"), std::string::npos) << r.output;
}

TEST(Cli, MissingModelFile) { expect_error("generate -m /nonexistent/model.gguf -p hi", "does not exist"); }

TEST(Cli, CorruptModelFile) {
  expect_error("generate -m " + temp_file("pagoda_cli_corrupt.gguf", "GGUF\x03garbage") + " -p hi", "GGUF");
  expect_error("generate -m " + temp_file("pagoda_cli_notgguf.gguf", "not a model at all") + " -p hi", "GGUF");
}

TEST(Cli, UnsupportedArchitecture) {
  // A GGUF v3 file whose only metadata is general.architecture = "gpt2".
  std::string bytes = "GGUF";
  auto u32 = [&](uint32_t v) { bytes.append(reinterpret_cast<const char*>(&v), 4); };
  auto u64 = [&](uint64_t v) { bytes.append(reinterpret_cast<const char*>(&v), 8); };
  auto str = [&](const std::string& s) { u64(s.size()); bytes += s; };
  u32(3);  // version
  u64(0);  // tensors
  u64(1);  // metadata entries
  str("general.architecture");
  u32(8);  // string
  str("gpt2");
  expect_error("generate -m " + temp_file("pagoda_cli_gpt2.gguf", bytes) + " -p hi", "architecture 'gpt2' is not supported");
}

TEST(Cli, PromptLongerThanContext) {
  std::string prompt;
  for (int i = 0; i < 9000; ++i) prompt += " word";
  const std::string file = temp_file("pagoda_cli_long_prompt.txt", prompt);
  expect_error("generate -n 4 -p \"$(cat " + file + ")\"", "context");
}

TEST(Cli, BadFlags) {
  expect_error("generate -p hi -n 0", "max_tokens");
  expect_error("generate -p hi --temp -1", "temperature");
  expect_error("generate -p hi --top-p 0", "top_p");
  expect_error("generate -p hi --top-p 1.5", "top_p");
  expect_error("chat --once hi --chat-template nonsense", "nonsense");
  expect_error("generate -p hi --weight-dtype q9", "weight-dtype");
  expect_error("generate -p hi --threads -3", "threads");
  expect_error("generate -p hi -n many", "many");
  expect_error("frobnicate", "frobnicate");
}

// A CUDA build checks the flags before it looks for a GPU (CI has none); without CUDA the
// command says so.
TEST(Cli, BenchAttentionRejectsBadFlags) {
#if PAGODA_HAVE_CUDA
  expect_error("bench attention --heads 32x8", "q_heads/kv_heads");
  expect_error("bench attention --heads 32/5", "do not divide");
  expect_error("bench attention --variants fast", "unknown variant");
  expect_error("bench attention --head-dim 96", "head_dim must be");
  expect_error("bench attention --min-split-tokens 0", "min-split-tokens");
  expect_error("bench attention --kv-cache-dtype f16,int4 --block-size 64", "not f16, fp8 or int2");
  expect_error("bench attention --kv-cache-dtype int2,f16 --block-size 64", "f16 first");
  expect_error("bench attention --kv-cache-dtype f16,int2", "--block-size 64");
#else
  expect_error("bench attention", "without CUDA");
  expect_error("bench attention --kv-cache-dtype f16,int2 --block-size 64", "without CUDA");
#endif
}

// The planner's figures need no GPU: unique KV, the bytes the plan reads, planning times.
TEST(Cli, BenchPrefixAttentionPlansWithoutAGpu) {
  const Result r = run("bench prefix-attention --plan-only --tree '1,4,16_128,256,1024;256_64' --heads 32/8");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // Unique KV of 1,4,16_128,256,1024 at 8 kv heads: (128 + 4 x 256 + 16 x 1024) tokens x 8 heads x
  // 128 dims x 2 bytes x (K and V) = 71.8 MB.
  EXPECT_NE(r.output.find("1,4,16_128,256,1024"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(" 71.8 "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("256_64"), std::string::npos) << r.output;
}

TEST(Cli, BenchPrefixAttentionListsItsNamedTreeSets) {
  const Result listed = run("bench prefix-attention --list-trees");
  ASSERT_EQ(listed.exit_code, 0) << listed.output;
  EXPECT_EQ(listed.output,
            "1,10_4096,416;1,4,256_32,256,32;1,8,512_32,2048,256;1,4,16,512_1024,256,128,32;"
            "1,16,32,64,128,1024_256,128,64,32,32,32;2,8,16,256_256,256,32,32;8,16,32,256_512,512,256,32;256_4096\n");
  const Result pat = run("bench prefix-attention --tree 'pat;1_16' --list-trees");
  ASSERT_EQ(pat.exit_code, 0) << pat.output;
  EXPECT_EQ(std::count(pat.output.begin(), pat.output.end(), ';'), 20) << pat.output;
  EXPECT_TRUE(pat.output.ends_with(";256_1024;256_4096;1_16\n")) << pat.output;
}

TEST(Cli, BenchPrefixAttentionRejectsBadFlags) {
  expect_error("bench prefix-attention --plan-only --tree 1,4", "COUNTS_LENGTHS");
  expect_error("bench prefix-attention --tree listd --list-trees", "nor `listed` or `pat`");
  expect_error("bench prefix-attention --plan-only --tree 1,4_16", "2 counts but 1 lengths");
  expect_error("bench prefix-attention --plan-only --tree 2,3_16,16", "not a multiple");
  expect_error("bench prefix-attention --plan-only --tree 1,2_20,16", "whole blocks");
  expect_error("bench prefix-attention --plan-only --heads 64/4", "GQA groups");
  expect_error("bench prefix-attention --plan-only --tree 1,65536_524288,1", "more than 1073741824 KV tokens");
  expect_error("bench prefix-attention --plan-only --head-dim 96", "--head-dim");
  expect_error("bench prefix-attention --plan-only --block-size 8", "--block-size");
  expect_error("bench prefix-attention --plan-only --workers 0", "--runs and --workers");
  expect_error("bench prefix-attention --plan-only --dtype fp8", "--dtype");
  expect_error("generate -p hi --attention fast", "--attention must be auto, paged or prefix");
#if !PAGODA_HAVE_CUDA
  expect_error("bench prefix-attention", "without CUDA");
#endif
}

TEST(Cli, ServeRejectsBadFlags) {
  expect_error("serve --port 70000", "--port");
  expect_error("serve --max-queue 0", "--max-queue");
  expect_error("serve --max-body-bytes 10", "--max-body-bytes");
  expect_error("serve --max-connections 0", "--max-connections");
  expect_error("serve --chat-template nonsense", "nonsense");
  expect_error("serve --host 999.1.1.1 --port 0", "cannot listen");
}

// Split over ranks, serve says so at start-up (here before it fails to listen on a bad address).
TEST(Cli, ServeLogsItsTensorParallelRanks) {
  const Result r = run("serve --backend cpu --threads 2 --tensor-parallel 2 --host 999.1.1.1 --port 0");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("pagoda serve: tensor parallel: 2 ranks on the CPU"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("cannot listen"), std::string::npos) << r.output;
}

// A port someone else holds: one line saying so, not a crash.
TEST(Cli, ServePortInUse) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  ASSERT_EQ(listen(fd, 1), 0);
  socklen_t length = sizeof(address);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length), 0);
  expect_error("serve --port " + std::to_string(ntohs(address.sin_port)), "in use");
  close(fd);
}

}  // namespace
