#include "pagoda/backend/cuda/gemm.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "pagoda/backend/cuda/check.h"
#include "pagoda/core/error.h"

namespace pagoda::cuda {
namespace {

constexpr size_t kWorkspaceBytes = size_t(32) << 20;
constexpr int64_t kTunedRows = 256;    // decode batches: the m whose algorithm is timed
constexpr int kCandidates = 32;        // heuristic picks timed (the heuristic may return fewer)
constexpr int kTimedRuns = 3;          // per candidate; the median counts
constexpr size_t kL2FlushBytes = size_t(256) << 20;  // several times any GPU's L2
// The alignment promised to the heuristic for every operand (its default assumes 256 bytes, which
// a weight sliced out of a larger buffer need not have); run() checks it.
constexpr uint32_t kAlignmentBytes = 16;

void check_cublas(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) fail(ErrorKind::kInternal, "cuBLASLt {}: {}", what, cublasLtGetStatusString(status));
}

cudaDataType_t cuda_type(DType dtype) {
  switch (dtype) {
    case DType::kF16: return CUDA_R_16F;
    case DType::kBF16: return CUDA_R_16BF;
    case DType::kF32: return CUDA_R_32F;
    default: fail(ErrorKind::kUnsupported, "gemm: no cuBLASLt type for {}", dtype_name(dtype));
  }
}

template <typename T>
void set_desc(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attribute, const T& value) {
  check_cublas(cublasLtMatmulDescSetAttribute(desc, attribute, &value, sizeof(value)), "cublasLtMatmulDescSetAttribute");
}

bool aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % kAlignmentBytes == 0; }

}  // namespace

Gemm::Gemm() {
  check_cublas(cublasLtCreate(&handle_), "cublasLtCreate");
  check_cuda(cudaMalloc(&workspace_, kWorkspaceBytes), "cudaMalloc (gemm workspace)");
}

Gemm::~Gemm() {
  plans_.clear();
  cudaFree(l2_flush_);
  cudaFree(workspace_);
  cublasLtDestroy(handle_);
}

Gemm::Plan::~Plan() {
  // Any of them may be missing: a plan whose creation failed part-way.
  if (out_layout) cublasLtMatrixLayoutDestroy(out_layout);
  if (x_layout) cublasLtMatrixLayoutDestroy(x_layout);
  if (w_layout) cublasLtMatrixLayoutDestroy(w_layout);
  if (desc) cublasLtMatmulDescDestroy(desc);
}

// cuBLASLt is column-major; a row-major [r, c] matrix is a column-major [c, r] one. So
// out^T [n, m] = w [n, k] (column-major [k, n], transposed) @ x^T [k, m]: the "TN" GEMM, the case
// cuBLASLt's kernels serve best, and the bias (one per row of the column-major output) is the
// per-output-feature bias.
Gemm::Plan& Gemm::plan_for(const Shape& shape, const void* x, const void* w, const void* bias, void* out,
                           cudaStream_t stream) {
  if (auto found = plans_.find(shape); found != plans_.end()) return *found->second;
  // Built aside and cached only once complete: a failure leaves nothing half-made in the map.
  auto made = std::make_unique<Plan>();
  Plan& plan = *made;
  const cudaDataType_t in_type = cuda_type(shape.dtype);
  const cudaDataType_t out_type = cuda_type(shape.out_dtype);
  check_cublas(cublasLtMatmulDescCreate(&plan.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
  set_desc(plan.desc, CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T);
  set_desc(plan.desc, CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N);
  if (shape.bias) {
    set_desc(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_BIAS);
    // The heuristic reads the bias pointer's value (never its memory) to learn its alignment:
    // promise kAlignmentBytes, as for the matrices. run() sets the real pointer per call.
    set_desc(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, reinterpret_cast<const void*>(uintptr_t(kAlignmentBytes)));
  }
  check_cublas(cublasLtMatrixLayoutCreate(&plan.w_layout, in_type, uint64_t(shape.k), uint64_t(shape.n), shape.k),
               "cublasLtMatrixLayoutCreate (w)");
  check_cublas(cublasLtMatrixLayoutCreate(&plan.x_layout, in_type, uint64_t(shape.k), uint64_t(shape.m), shape.k),
               "cublasLtMatrixLayoutCreate (x)");
  check_cublas(cublasLtMatrixLayoutCreate(&plan.out_layout, out_type, uint64_t(shape.n), uint64_t(shape.m), shape.n),
               "cublasLtMatrixLayoutCreate (out)");

  cublasLtMatmulPreference_t raw_preference = nullptr;
  check_cublas(cublasLtMatmulPreferenceCreate(&raw_preference), "cublasLtMatmulPreferenceCreate");
  const std::unique_ptr<cublasLtMatmulPreferenceOpaque_t, decltype(&cublasLtMatmulPreferenceDestroy)> preference(
      raw_preference, &cublasLtMatmulPreferenceDestroy);
  const uint64_t workspace_bytes = kWorkspaceBytes;
  check_cublas(cublasLtMatmulPreferenceSetAttribute(preference.get(), CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                    &workspace_bytes, sizeof(workspace_bytes)),
               "cublasLtMatmulPreferenceSetAttribute");
  for (auto attribute : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                         CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
    check_cublas(cublasLtMatmulPreferenceSetAttribute(preference.get(), attribute, &kAlignmentBytes, sizeof(kAlignmentBytes)),
                 "cublasLtMatmulPreferenceSetAttribute");
  }
  std::vector<cublasLtMatmulHeuristicResult_t> results(kCandidates);
  int found = 0;
  const cublasStatus_t status =
      cublasLtMatmulAlgoGetHeuristic(handle_, plan.desc, plan.w_layout, plan.x_layout, plan.out_layout,
                                     plan.out_layout, preference.get(), kCandidates, results.data(), &found);
  if (status != CUBLAS_STATUS_SUCCESS || found == 0) {
    fail(ErrorKind::kUnsupported, "gemm: cuBLASLt has no algorithm for m={} n={} k={} {} -> {}{} ({})", shape.m,
         shape.n, shape.k, dtype_name(shape.dtype), dtype_name(shape.out_dtype), shape.bias ? " with bias" : "",
         cublasLtGetStatusString(status));
  }
  results.resize(size_t(found));
  plan.algo = results[0].algo;
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  check_cuda(cudaStreamIsCapturing(stream, &capturing), "cudaStreamIsCapturing");
  if (shape.tune && shape.m <= kTunedRows && found > 1 && capturing == cudaStreamCaptureStatusNone) {
    if (bias) set_desc(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
    plan.algo = fastest(plan, results, x, w, out, stream);
  }
  return *plans_.emplace(shape, std::move(made)).first->second;
}

cublasLtMatmulAlgo_t Gemm::fastest(Plan& plan, const std::vector<cublasLtMatmulHeuristicResult_t>& candidates,
                                   const void* x, const void* w, void* out, cudaStream_t stream) {
  if (!l2_flush_) check_cuda(cudaMalloc(&l2_flush_, kL2FlushBytes), "cudaMalloc (gemm L2 flush)");
  cudaEvent_t start = nullptr, stop = nullptr;
  check_cuda(cudaEventCreate(&start), "cudaEventCreate");
  check_cuda(cudaEventCreate(&stop), "cudaEventCreate");
  const float alpha = 1.f, beta = 0.f;
  float best_ms = INFINITY;
  cublasLtMatmulAlgo_t best = candidates[0].algo;
  for (const cublasLtMatmulHeuristicResult_t& candidate : candidates) {
    std::vector<float> times;
    for (int run = 0; run < kTimedRuns; ++run) {
      check_cuda(cudaMemsetAsync(l2_flush_, run, kL2FlushBytes, stream), "cudaMemsetAsync (L2 flush)");
      check_cuda(cudaEventRecord(start, stream), "cudaEventRecord");
      // A candidate the heuristic offered may still refuse these operands: it is skipped.
      if (cublasLtMatmul(handle_, plan.desc, &alpha, w, plan.w_layout, x, plan.x_layout, &beta, out, plan.out_layout,
                         out, plan.out_layout, &candidate.algo, workspace_, kWorkspaceBytes,
                         stream) != CUBLAS_STATUS_SUCCESS)
        break;
      check_cuda(cudaEventRecord(stop, stream), "cudaEventRecord");
      check_cuda(cudaEventSynchronize(stop), "cudaEventSynchronize");
      float ms = 0;
      check_cuda(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
      times.push_back(ms);
    }
    if (times.size() != size_t(kTimedRuns)) continue;
    std::nth_element(times.begin(), times.begin() + kTimedRuns / 2, times.end());
    if (times[kTimedRuns / 2] < best_ms) {
      best_ms = times[kTimedRuns / 2];
      best = candidate.algo;
    }
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return best;
}

void Gemm::run(const void* x, const void* w, const void* bias, void* out, int64_t m, int64_t n, int64_t k,
               DType dtype, DType out_dtype, cudaStream_t stream, bool tune) {
  if (dtype != DType::kF16 && dtype != DType::kBF16) {
    fail(ErrorKind::kUnsupported, "gemm: operands must be f16 or bf16, not {}", dtype_name(dtype));
  }
  if (out_dtype != dtype && out_dtype != DType::kF32) {
    fail(ErrorKind::kUnsupported, "gemm: output must be {} or f32, not {}", dtype_name(dtype), dtype_name(out_dtype));
  }
  if (bias && out_dtype != dtype) fail(ErrorKind::kUnsupported, "gemm: a bias needs the output in {}", dtype_name(dtype));
  if (m < 0 || n <= 0 || k <= 0 || n % 8 != 0 || k % 8 != 0) {
    fail(ErrorKind::kInvalidArgument, "gemm: shape m={} n={} k={} (n and k must be positive multiples of 8)", m, n, k);
  }
  if (!aligned(x) || !aligned(w) || !aligned(out) || (bias && !aligned(bias))) {
    fail(ErrorKind::kInvalidArgument, "gemm: operands must be {}-byte aligned", kAlignmentBytes);
  }
  if (m == 0) return;
  Plan& plan = plan_for(Shape{m, n, k, dtype, out_dtype, bias != nullptr, tune}, x, w, bias, out, stream);
  if (bias) set_desc(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
  const float alpha = 1.f, beta = 0.f;
  check_cublas(cublasLtMatmul(handle_, plan.desc, &alpha, w, plan.w_layout, x, plan.x_layout, &beta, out,
                              plan.out_layout, out, plan.out_layout, &plan.algo, workspace_, kWorkspaceBytes, stream),
               "cublasLtMatmul");
}

}  // namespace pagoda::cuda
