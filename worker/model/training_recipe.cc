#include "worker/model/training_recipe.h"

#include "worker/model/counter_rng.h"

namespace shardline::model {

void FillGpt2Init(const ParamLayout& layout, int layers, uint64_t seed, std::span<float> params) {
  for (const ParamTensorInfo& t : layout.tensors()) {
    const TensorInit init = TensorInit::Of(t.name, t.init, layers);
    float* p = params.data() + t.offset;
    const int64_t n = t.numel;
#pragma omp parallel for schedule(static) if (n >= (int64_t{1} << 15))
    for (int64_t i = 0; i < n; ++i) p[i] = init.Value(seed, static_cast<uint64_t>(i));
  }
}

}  // namespace shardline::model
