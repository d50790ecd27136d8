#include "pagoda/bench/bench_report.h"

#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "pagoda/core/error.h"

namespace pagoda::bench {

std::string git_commit() {
  std::string commit;
  if (FILE* pipe = ::popen("git describe --always --dirty 2>/dev/null", "r")) {
    char buffer[64];
    if (std::fgets(buffer, sizeof buffer, pipe)) commit = buffer;
    ::pclose(pipe);
  }
  while (!commit.empty() && commit.back() == '\n') commit.pop_back();
  return commit.empty() ? "unknown" : commit;
}

std::string device_slug(std::string_view name) {
  std::string slug;
  for (char c : name) {
    if (std::isalnum(static_cast<unsigned char>(c))) {
      slug += char(std::tolower(static_cast<unsigned char>(c)));
    } else if (!slug.empty() && slug.back() != '-') {
      slug += '-';
    }
  }
  while (!slug.empty() && slug.back() == '-') slug.pop_back();
  return slug.empty() ? "unknown-device" : slug;
}

void write_json_file(const std::string& path, const nlohmann::json& j) {
  const std::filesystem::path file(path);
  std::error_code ec;
  if (file.has_parent_path()) std::filesystem::create_directories(file.parent_path(), ec);
  if (ec) fail(ErrorKind::kInternal, "cannot create the folder {}: {}", file.parent_path().string(), ec.message());
  std::ofstream out(file);
  out << j.dump(2) << "\n";
  out.close();
  if (!out) fail(ErrorKind::kInternal, "cannot write {}", path);
}

}  // namespace pagoda::bench
