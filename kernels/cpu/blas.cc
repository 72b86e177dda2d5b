#include "kernels/cpu/blas.h"

#include <dlfcn.h>
#include <omp.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "common/status_macros.h"
#include "spdlog/spdlog.h"

#ifndef SHARDLINE_MKL_DIR
#define SHARDLINE_MKL_DIR "/opt/shardline/deps/mkl"
#endif

namespace shardline::kernels::cpu {
namespace {

struct Loaded {
  SgemmFn sgemm = nullptr;
  std::string description;
  // MKL's packed GEMM (null with OpenBLAS, which has none).
  size_t (*pack_get_size)(int identifier, int m, int n, int k) = nullptr;
  void (*pack)(int layout, int identifier, int trans, int m, int n, int k, float alpha,
               const float* src, int ld, float* dest) = nullptr;
  void (*compute)(int layout, int transa, int transb, int m, int n, int k, const float* a, int lda,
                  const float* b, int ldb, float beta, float* c, int ldc) = nullptr;
};

// CBLAS_IDENTIFIER and the packed "transpose" of mkl_cblas.h (part of its ABI).
constexpr int kMklBMatrix = 162;
constexpr int kMklPacked = 151;

void Note(std::string& tried, const std::string& what) {
  tried += (tried.empty() ? "" : "; ") + what;
}

void* Open(const std::string& name, std::string& tried) {
  void* library = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    const char* error = dlerror();
    Note(tried, error != nullptr ? error : name + ": cannot be loaded");
  }
  return library;
}

// mkl_service.h, as of oneMKL 2021-2026 (the values are part of its ABI).
constexpr int kMklInterfaceLp64 = 0;
constexpr int kMklThreadingGnu = 3;
struct MklVersion {
  int major, minor, update, patch;
  const char* product_status;
  const char* build;
  const char* processor;
  const char* platform;
};

// MKL called from inside one of our OpenMP parallel regions (the attention kernels give each
// thread its own tiles and multiply them with sgemm) opens a nested region, and libgomp creates
// fresh threads for every nested team: 13,441 thread creations in 42 steps of a tiny model, which
// ran 35x slower than with one MKL thread on a 2-vCPU EPYC. Inside a region (even one its `if`
// made a team of one) MKL gets one thread (its thread-local setting, put back after): the region
// already uses the cores, or its problem is too small to share.
SgemmFn mkl_sgemm = nullptr;
int (*mkl_set_num_threads_local)(int) = nullptr;

void MklSgemm(const enum CBLAS_ORDER order, const enum CBLAS_TRANSPOSE trans_a,
              const enum CBLAS_TRANSPOSE trans_b, const blasint m, const blasint n, const blasint k,
              const float alpha, const float* a, const blasint lda, const float* b,
              const blasint ldb, const float beta, float* c, const blasint ldc) {
  // omp_get_level, not omp_in_parallel: a region its `if` made a team of one is inactive, and
  // MKL's region inside it is still a nested team of fresh threads.
  if (omp_get_level() == 0) {
    mkl_sgemm(order, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  const int before = mkl_set_num_threads_local(1);
  mkl_sgemm(order, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  mkl_set_num_threads_local(before);
}

// Intel oneMKL through its single dynamic library, libmkl_rt, from the prefix that
// scripts/install-deps.sh fills (SHARDLINE_MKL_DIR, a CMake cache variable). libmkl_rt finds its
// other libraries beside itself. Before any other MKL call it is told: LP64 integers (CBLAS's int,
// as cblas.h declares) and GNU OpenMP threads (libmkl_gnu_thread: the libgomp pool our own kernels
// use, sized by OMP_NUM_THREADS; MKL_NUM_THREADS, if set, wins for MKL). Nothing else of Intel's
// runtime (libiomp5, TBB) is installed or loaded.
bool LoadMkl(Loaded& out, std::string& tried) {
  const std::string dir = std::string(SHARDLINE_MKL_DIR) + "/lib/";
  for (const char* soname : {"libmkl_rt.so.3", "libmkl_rt.so.2"}) {
    const std::string path = dir + soname;
    if (access(path.c_str(), R_OK) != 0) {
      Note(tried, path + ": not installed");
      continue;
    }
    // The threading layer is loaded on the first BLAS call, where a missing one would end the
    // process in MKL's own error: check it is there first.
    const std::string suffix = std::strchr(soname, '.');  // ".so.N"
    const std::string thread_layer = dir + "libmkl_gnu_thread" + suffix;
    if (access(thread_layer.c_str(), R_OK) != 0) {
      Note(tried, thread_layer + ": not installed");
      continue;
    }
    void* library = Open(path, tried);
    if (library == nullptr) continue;
    auto set_interface = reinterpret_cast<int (*)(int)>(dlsym(library, "MKL_Set_Interface_Layer"));
    auto set_threading = reinterpret_cast<int (*)(int)>(dlsym(library, "MKL_Set_Threading_Layer"));
    auto get_version = reinterpret_cast<void (*)(MklVersion*)>(dlsym(library, "MKL_Get_Version"));
    auto sgemm = reinterpret_cast<SgemmFn>(dlsym(library, "cblas_sgemm"));
    auto set_local = reinterpret_cast<int (*)(int)>(dlsym(library, "MKL_Set_Num_Threads_Local"));
    if (set_interface == nullptr || set_threading == nullptr || get_version == nullptr ||
        sgemm == nullptr || set_local == nullptr) {
      Note(tried, path + ": not the MKL interface expected");
      dlclose(library);
      continue;
    }
    if (set_interface(kMklInterfaceLp64) != kMklInterfaceLp64 ||
        set_threading(kMklThreadingGnu) != kMklThreadingGnu) {
      Note(tried, path + ": refused the LP64 interface or GNU OpenMP threading");
      continue;  // MKL is set up now and cannot be unloaded cleanly; leave it loaded
    }
    // One small product, so that a broken installation fails here and not in a training step.
    const float a[4] = {1, 2, 3, 4}, b[4] = {5, 6, 7, 8};
    float c[4] = {0, 0, 0, 0};
    sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, 2, 2, 2, 1.0f, a, 2, b, 2, 0.0f, c, 2);
    if (c[0] != 19 || c[1] != 22 || c[2] != 43 || c[3] != 50) {
      Note(tried, path + ": a 2x2 sgemm gave a wrong result");
      continue;
    }
    MklVersion v{};
    get_version(&v);
    mkl_sgemm = sgemm;
    mkl_set_num_threads_local = set_local;
    out.sgemm = &MklSgemm;
    out.pack_get_size =
        reinterpret_cast<decltype(out.pack_get_size)>(dlsym(library, "cblas_sgemm_pack_get_size"));
    out.pack = reinterpret_cast<decltype(out.pack)>(dlsym(library, "cblas_sgemm_pack"));
    out.compute = reinterpret_cast<decltype(out.compute)>(dlsym(library, "cblas_sgemm_compute"));
    if (out.pack_get_size == nullptr || out.pack == nullptr || out.compute == nullptr) {
      out.pack_get_size = nullptr;
      out.pack = nullptr;
      out.compute = nullptr;
    }
    // oneMKL numbers its releases YEAR.UPDATE ("2026.2"); the minor field stays 0.
    out.description = "Intel oneMKL " + std::to_string(v.major) + "." + std::to_string(v.update) +
                      (v.build != nullptr ? std::string(" build ") + v.build : "") + " (" + path +
                      ", GNU OpenMP threads, " +
                      (v.processor != nullptr ? v.processor : "unknown code path") + ")";
    return true;
  }
  return false;
}

// OpenBLAS's cores with AVX2 kernels or better (its DYNAMIC_ARCH names, openblas_get_corename()).
// A CPU that its table of models does not know gets an older core (Prescott's SSE3 kernels on
// current Xeons, for Debian's 0.3.21), a fifth of the CPU's speed or less.
bool KnowsThisCpu(const char* core) {
  for (const char* fast : {"Haswell", "Zen", "SkylakeX", "Cooperlake", "SapphireRapids"}) {
    if (std::strcmp(core, fast) == 0) return true;
  }
  return false;
}

// OpenBLAS built for OpenMP runs its threads on libgomp's pool, ours; its calls from inside one of
// our parallel regions must stay on their caller's thread for the reason MklSgemm gives. In an
// active region OpenBLAS already uses one thread (omp_in_parallel); in one its `if` made a team of
// one it would ask omp_get_max_threads() and open a nested team, so that is set to 1 for the call
// (omp_set_num_threads changes only the calling task's setting).
SgemmFn openblas_sgemm = nullptr;

void OpenBlasOpenMpSgemm(const enum CBLAS_ORDER order, const enum CBLAS_TRANSPOSE trans_a,
                         const enum CBLAS_TRANSPOSE trans_b, const blasint m, const blasint n,
                         const blasint k, const float alpha, const float* a, const blasint lda,
                         const float* b, const blasint ldb, const float beta, float* c,
                         const blasint ldc) {
  if (omp_get_level() == 0) {
    openblas_sgemm(order, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  const int before = omp_get_max_threads();
  omp_set_num_threads(1);
  openblas_sgemm(order, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  omp_set_num_threads(before);
}

// The system's OpenBLAS: Debian's libopenblas0-openmp first (GNU OpenMP threads, the pool our
// kernels and MKL's GNU layer use), else whatever the alternatives system points libopenblas.so.0,
// libcblas.so.3 or libblas.so.3 at (Debian's default is the pthreads build, with its own threads,
// OPENBLAS_NUM_THREADS). With `preferred_only` only the build that item 3 of blas.h chooses is
// taken: OpenMP threads and kernels for this CPU (KnowsThisCpu); the reason another is refused is
// noted in `tried`.
bool LoadSystem(Loaded& out, std::string& tried, bool preferred_only) {
  for (const char* name : {"/usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas.so.0",
                           "libopenblas.so.0", "libcblas.so.3", "libblas.so.3"}) {
    void* library = Open(name, tried);  // dlerror names a missing file
    if (library == nullptr) continue;
    auto sgemm = reinterpret_cast<SgemmFn>(dlsym(library, "cblas_sgemm"));
    if (sgemm == nullptr) {
      Note(tried, std::string(name) + ": no cblas_sgemm");
      continue;
    }
    auto config = reinterpret_cast<const char* (*)()>(dlsym(library, "openblas_get_config"));
    auto core = reinterpret_cast<const char* (*)()>(dlsym(library, "openblas_get_corename"));
    auto parallel = reinterpret_cast<int (*)()>(dlsym(library, "openblas_get_parallel"));
    // openblas_get_parallel(): 0 sequential, 1 its own pthreads, 2 OpenMP.
    const int threading = parallel != nullptr ? parallel() : -1;
    if (preferred_only) {
      std::string refused;
      if (core == nullptr) {
        refused = "not OpenBLAS";
      } else if (!KnowsThisCpu(core())) {
        refused = std::string("core ") + core() + " has no AVX2 kernels";
      } else if (threading != 2) {
        refused = "not its OpenMP build";
      }
      if (!refused.empty()) {
        Note(tried, std::string(name) + ": " + refused);
        dlclose(library);
        continue;
      }
    }
    if (threading == 2) {
      openblas_sgemm = sgemm;
      out.sgemm = &OpenBlasOpenMpSgemm;
    } else {
      out.sgemm = sgemm;
    }
    out.description = std::string(config != nullptr ? config() : "a CBLAS") + " (" + name;
    if (core != nullptr) {
      out.description += std::string(", core ") + core();
      if (!KnowsThisCpu(core()) && __builtin_cpu_supports("avx2")) {
        out.description += ": generic kernels on an AVX2 CPU";
      }
    }
    out.description += threading == 2   ? ", GNU OpenMP threads"
                       : threading == 1 ? ", its own pthreads"
                       : threading == 0 ? ", one thread"
                                        : "";
    out.description += ")";
    return true;
  }
  return false;
}

// oneDNN's sgemm (Debian's libdnnl2, built on GNU OpenMP: our pool) behind CBLAS's signature.
// Its signature is row-major: a column-major product is the row-major one of the transposes. It
// takes its thread count from omp_get_max_threads(), and inside a region its `if` made a team of
// one it would open a nested team of fresh threads, as OpenBLAS would: 1 for such a call.
using DnnlSgemmFn = int (*)(char, char, int64_t, int64_t, int64_t, float, const float*, int64_t,
                            const float*, int64_t, float, float*, int64_t);
DnnlSgemmFn dnnl_sgemm = nullptr;

void OneDnnSgemm(const enum CBLAS_ORDER order, const enum CBLAS_TRANSPOSE trans_a,
                 const enum CBLAS_TRANSPOSE trans_b, const blasint m, const blasint n,
                 const blasint k, const float alpha, const float* a, const blasint lda,
                 const float* b, const blasint ldb, const float beta, float* c, const blasint ldc) {
  const char ta = trans_a == CblasNoTrans ? 'N' : 'T';
  const char tb = trans_b == CblasNoTrans ? 'N' : 'T';
  const int before = omp_get_max_threads();
  if (omp_get_level() > 0) omp_set_num_threads(1);
  const int status = order == CblasRowMajor
                         ? dnnl_sgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
                         : dnnl_sgemm(tb, ta, n, m, k, alpha, b, ldb, a, lda, beta, c, ldc);
  if (omp_get_level() > 0) omp_set_num_threads(before);
  if (status != 0) {
    // Only arguments our kernels got wrong make it fail (its workspace is on the stack).
    std::fprintf(stderr, "shardline: dnnl_sgemm(%c, %c, %d, %d, %d) failed with status %d\n", ta,
                 tb, m, n, k, status);
    std::abort();
  }
}

struct DnnlVersion {
  int major, minor, patch;
  const char* hash;
  unsigned cpu_runtime, gpu_runtime;
};
constexpr unsigned kDnnlRuntimeOmp = 2;  // DNNL_RUNTIME_OMP (dnnl_config.h)

// Debian's oneDNN (libdnnl2): its OpenMP build only, checked on a 2x2 product.
bool LoadOneDnn(Loaded& out, std::string& tried) {
  void* library = Open("libdnnl.so.2", tried);
  if (library == nullptr) return false;
  auto sgemm = reinterpret_cast<DnnlSgemmFn>(dlsym(library, "dnnl_sgemm"));
  auto version = reinterpret_cast<const DnnlVersion* (*)()>(dlsym(library, "dnnl_version"));
  if (sgemm == nullptr || version == nullptr) {
    Note(tried, "libdnnl.so.2: no dnnl_sgemm");
    dlclose(library);
    return false;
  }
  const DnnlVersion* v = version();
  if (v->cpu_runtime != kDnnlRuntimeOmp) {
    Note(tried, "libdnnl.so.2: not its OpenMP build");
    dlclose(library);
    return false;
  }
  dnnl_sgemm = sgemm;
  const float a[4] = {1, 2, 3, 4}, b[4] = {5, 6, 7, 8};
  float c[4] = {0, 0, 0, 0};
  OneDnnSgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, 2, 2, 2, 1.0f, a, 2, b, 2, 0.0f, c, 2);
  if (c[0] != 19 || c[1] != 22 || c[2] != 43 || c[3] != 50) {
    Note(tried, "libdnnl.so.2: a 2x2 sgemm gave a wrong result");
    dnnl_sgemm = nullptr;  // its OpenMP threads may hold the library's code: not dlclosed
    return false;
  }
  out.sgemm = &OneDnnSgemm;
  out.description = "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." +
                    std::to_string(v->patch) + " (libdnnl.so.2, GNU OpenMP threads)";
  return true;
}

// The library this CPU gets when SHARDLINE_BLAS does not force one (blas.h has the measurements):
// on AMD, where MKL takes its generic code path, oneDNN where the CPU has AVX-512 and OpenBLAS
// (if its kernels are for this CPU) where it has not; MKL everywhere else.
bool IsAmd() { return __builtin_cpu_is("amd"); }
bool PrefersOneDnn() { return IsAmd() && __builtin_cpu_supports("avx512f"); }

// SHARDLINE_BLAS forced `name`, which this installation cannot give: a run must not quietly
// compare or test another library.
[[noreturn]] void ForcedButUnusable(const std::string& want, const char* name,
                                    const std::string& tried) {
  std::fprintf(stderr, "shardline: SHARDLINE_BLAS=%s but %s cannot be used (%s)\n", want.c_str(),
               name, tried.c_str());
  std::abort();
}

const Loaded& Load() {
  static Loaded loaded;
  static std::once_flag once;
  std::call_once(once, [] {
    std::string tried;
    const char* choice = std::getenv("SHARDLINE_BLAS");
    const std::string want = choice != nullptr ? choice : "";
    if (want != "" && want != "mkl" && want != "openblas" && want != "onednn") {
      std::fprintf(stderr,
                   "shardline: SHARDLINE_BLAS=%s: expected mkl, openblas or onednn (or unset)\n",
                   want.c_str());
      std::abort();
    }
    if (want == "onednn" || (want == "" && PrefersOneDnn())) {
      if (LoadOneDnn(loaded, tried)) {
        if (want == "") loaded.description += ", chosen on an AMD CPU with AVX-512";
        spdlog::debug("CPU BLAS: {}", loaded.description);
        return;
      }
      if (want == "onednn") ForcedButUnusable(want, "oneDNN", tried);
    }
    // Why a CPU that prefers oneDNN runs another library, for its description.
    const std::string onednn_note = tried.empty() ? "" : "; not oneDNN: " + tried;
    tried.clear();
    // Debug, not info: the library a GEMM runs on is the installation's, not news for every
    // `shardline generate`; the actors log BlasDescription() with their calibration. The
    // fallback to OpenBLAS where MKL is wanted is a warning: the installation lacks its BLAS.
    if (want == "" && IsAmd()) {
      if (LoadSystem(loaded, tried, /*preferred_only=*/true)) {
        loaded.description += ", chosen on an AMD CPU" + onednn_note;
        spdlog::debug("CPU BLAS: {}", loaded.description);
        return;
      }
    }
    const std::string amd_note = tried;
    if (want != "openblas" && LoadMkl(loaded, tried)) {
      if (!amd_note.empty()) loaded.description += "; not OpenBLAS on this AMD CPU: " + amd_note;
      loaded.description += onednn_note;
      spdlog::debug("CPU BLAS: {}", loaded.description);
      return;
    }
    if (want == "mkl") ForcedButUnusable(want, "MKL", tried);
    if (LoadSystem(loaded, tried, /*preferred_only=*/false)) {
      if (want == "openblas") {
        spdlog::debug("CPU BLAS: {} (SHARDLINE_BLAS=openblas)", loaded.description);
      } else {
        spdlog::warn("CPU BLAS: {}, as MKL is missing ({}); scripts/install-deps.sh installs it",
                     loaded.description, tried);
      }
      return;
    }
    std::fprintf(stderr,
                 "shardline: no BLAS with cblas_sgemm could be loaded (%s); run "
                 "scripts/install-deps.sh\n",
                 tried.c_str());
    std::abort();
  });
  return loaded;
}

}  // namespace

SgemmFn Sgemm() { return Load().sgemm; }

std::string BlasDescription() { return Load().description; }

absl::StatusOr<std::unique_ptr<PackedWeight>> PackedWeight::Pack(const float* weight, int C, int OC,
                                                                 int max_rows,
                                                                 Allocator& allocator) {
  const Loaded& blas = Load();
  if (blas.pack == nullptr || C < 1 || OC < 1 || max_rows < 1) return nullptr;
  const size_t bytes = blas.pack_get_size(kMklBMatrix, max_rows, OC, C);
  std::unique_ptr<PackedWeight> packed(new PackedWeight(C, OC, max_rows));
  ASSIGN_OR_RETURN(
      packed->buffer_,
      Tensor::Zeros({static_cast<int64_t>((bytes + sizeof(float) - 1) / sizeof(float))},
                    DType::kFloat32, allocator));
  // B = weightᵀ (C by OC) of out = inp · B, the weight row-major (OC, C).
  blas.pack(CblasRowMajor, kMklBMatrix, CblasTrans, max_rows, OC, C, 1.0f, weight, C,
            packed->buffer_.data<float>());
  return packed;
}

void PackedWeight::Multiply(float* out, const float* inp, int N, float beta) const {
  const Loaded& blas = Load();
  blas.compute(CblasRowMajor, CblasNoTrans, kMklPacked, N, OC_, C_, inp, C_, buffer_.data<float>(),
               C_, beta, out, OC_);
}

int CpuThreads() { return omp_get_max_threads(); }

}  // namespace shardline::kernels::cpu
