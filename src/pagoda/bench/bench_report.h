// What every benchmark's result file carries besides its figures: the commit it measured, where
// it goes (bench/results/<device slug>/), and the writing of the JSON itself.
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace pagoda::bench {

// The checkout's commit when run from one ("unknown" otherwise): results name the code they measured.
std::string git_commit();

// A device name as a results folder: lower case, runs of anything but letters and digits as one
// '-', e.g. "NVIDIA H200" -> "nvidia-h200", "NVIDIA H100 80GB HBM3" -> "nvidia-h100-80gb-hbm3".
std::string device_slug(std::string_view name);

// Writes j (indented, newline-terminated) to path, creating its folders. Throws Error(kInternal)
// when the file cannot be written.
void write_json_file(const std::string& path, const nlohmann::json& j);

}  // namespace pagoda::bench
