// Running the pagoda binary from a test (PAGODA_BINARY), as a user would: its exit code and
// everything it printed, and a fresh temporary folder per test.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>

namespace pagoda::testing {

struct ProcessResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

inline ProcessResult run_pagoda(const std::string& args) {
  ProcessResult r;
  const std::string command = std::string(PAGODA_BINARY) + " " + args + " 2>&1 </dev/null";
  FILE* pipe = ::popen(command.c_str(), "r");
  if (!pipe) return r;
  char buffer[4096];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0) r.output.append(buffer, n);
  const int status = ::pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

// A clean failure: a non-zero exit that is not a crash, and the message.
inline void expect_pagoda_error(const std::string& args, const std::string& message) {
  const ProcessResult r = run_pagoda(args);
  EXPECT_NE(r.exit_code, 0) << args << "\n" << r.output;
  EXPECT_LT(r.exit_code, 128) << "killed by a signal: " << args << "\n" << r.output;
  EXPECT_NE(r.output.find(message), std::string::npos) << args << "\n" << r.output;
}

// An empty folder under the system's temporary directory, unique to this process and name.
inline std::filesystem::path fresh_temp_dir(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / ("pagoda_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

}  // namespace pagoda::testing
