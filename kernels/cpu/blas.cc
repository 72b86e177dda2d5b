#include "kernels/cpu/blas.h"

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>

namespace shardline::kernels::cpu {

SgemmFn Sgemm() {
  static SgemmFn sgemm = nullptr;
  static std::once_flag once;
  std::call_once(once, [] {
    // The Debian soname of OpenBLAS, then the generic BLAS that the alternatives system may point
    // at OpenBLAS too.
    for (const char* name : {"libopenblas.so.0", "libcblas.so.3", "libblas.so.3"}) {
      void* library = dlopen(name, RTLD_NOW | RTLD_LOCAL);
      if (library == nullptr) continue;
      sgemm = reinterpret_cast<SgemmFn>(dlsym(library, "cblas_sgemm"));
      if (sgemm != nullptr) return;
    }
    std::fprintf(stderr,
                 "shardline: no BLAS with cblas_sgemm could be loaded (tried libopenblas.so.0, "
                 "libcblas.so.3, libblas.so.3); run scripts/install-deps.sh\n");
    std::abort();
  });
  return sgemm;
}

}  // namespace shardline::kernels::cpu
