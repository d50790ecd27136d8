// pagoda quantize: a model (GGUF file or Hugging Face folder) written as a GGUF file with its
// weights in another type, so random checkpoints of real shapes (make-model) and real models can
// be run and benchmarked quantized, by pagoda and by llama.cpp.
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include "pagoda/cli/commands.h"
#include "pagoda/core/error.h"
#include "pagoda/format/quantize.h"
#include "pagoda/model/gguf_export.h"

namespace pagoda::cli {
namespace {

constexpr GgmlType kWritableTypes[] = {GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0,
                                       GgmlType::kQ5_1, GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K,
                                       GgmlType::kF16,  GgmlType::kBF16, GgmlType::kF32};

GgmlType parse_type(const std::string& name) {
  std::string names;
  for (GgmlType t : kWritableTypes) {
    const std::string_view n = ggml_type_traits(uint32_t(t)).name;
    if (n == name) return t;
    names += (names.empty() ? "" : ", ") + std::string(n);
  }
  fail(ErrorKind::kInvalidArgument, "--type must be one of {}, not '{}'", names, name);
}

}  // namespace

void register_quantize(CLI::App& app) {
  struct Flags {
    std::string in, out, type;
  };
  auto flags = std::make_shared<Flags>();
  CLI::App* cmd = app.add_subcommand("quantize", "write a model as GGUF with its weights quantized");
  cmd->add_option("IN", flags->in, "a .gguf file or a Hugging Face folder")->required();
  cmd->add_option("OUT", flags->out, "the .gguf file to write")->required();
  cmd->add_option("--type", flags->type, "q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k, q6_k, f16, bf16 or f32")->required();
  cmd->callback([flags] {
    const GgmlType type = parse_type(flags->type);
    const auto start = std::chrono::steady_clock::now();
    const GgufExportResult r = export_gguf(flags->in, flags->out, type);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("wrote %s: %d tensors as %s, %.2f GB -> %.2f GB in %.1f s\n", flags->out.c_str(), r.tensors,
                flags->type.c_str(), double(r.bytes_in) / 1e9, double(r.bytes_out) / 1e9, seconds);
  });
}

}  // namespace pagoda::cli
