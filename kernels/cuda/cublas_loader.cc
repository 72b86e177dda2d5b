#include "kernels/cuda/cublas_loader.h"

#include <dlfcn.h>

#include <mutex>
#include <string>

#include "absl/status/status.h"

namespace shardline::kernels::cuda {
namespace {

#define SHARDLINE_STRINGIFY_INNER(x) #x
#define SHARDLINE_STRINGIFY(x) SHARDLINE_STRINGIFY_INNER(x)
// The soname of the cuBLAS whose headers this was compiled against: its ABI is the one we call.
constexpr const char* kSoname = "libcublas.so." SHARDLINE_STRINGIFY(CUBLAS_VER_MAJOR);

template <typename Fn>
bool Resolve(void* library, const char* name, Fn& fn, std::string& missing) {
  fn = reinterpret_cast<Fn>(dlsym(library, name));
  if (fn == nullptr) missing += std::string(missing.empty() ? "" : ", ") + name;
  return fn != nullptr;
}

absl::StatusOr<const CublasApi*> Load() {
  static CublasApi api;
  std::string tried;
  void* library = nullptr;
  // The loader's search path first (LD_LIBRARY_PATH, ldconfig, the binary's RUNPATH), then the
  // toolkit's library directory this build found.
  for (const std::string& name :
       {std::string(kSoname), std::string(SHARDLINE_CUDA_LIBRARY_DIR) + "/" + kSoname}) {
    library = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (library != nullptr) break;
    const char* error = dlerror();
    tried += (tried.empty() ? "" : "; ") + name + ": " + (error != nullptr ? error : "not found");
  }
  if (library == nullptr) {
    return absl::FailedPreconditionError("cannot load cuBLAS (" + tried + ")");
  }
  std::string missing;
  Resolve(library, "cublasCreate_v2", api.create, missing);
  Resolve(library, "cublasDestroy_v2", api.destroy, missing);
  Resolve(library, "cublasSetStream_v2", api.set_stream, missing);
  Resolve(library, "cublasSgemm_v2", api.sgemm, missing);
  Resolve(library, "cublasGemmEx", api.gemm_ex, missing);
  Resolve(library, "cublasGetStatusName", api.status_name, missing);
  Resolve(library, "cublasGetStatusString", api.status_string, missing);
  if (!missing.empty()) {
    return absl::FailedPreconditionError(std::string(kSoname) + " lacks " + missing);
  }
  return &api;
}

}  // namespace

absl::StatusOr<const CublasApi*> Cublas() {
  static absl::StatusOr<const CublasApi*> api = absl::InternalError("not loaded");
  static std::once_flag once;
  std::call_once(once, [] { api = Load(); });
  return api;
}

}  // namespace shardline::kernels::cuda
