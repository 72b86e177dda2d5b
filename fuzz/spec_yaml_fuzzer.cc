// The YAML spec loaders (placement/: job, cluster, model, train and plan-train specs) on arbitrary
// text. All share yaml_reader.h, so one harness gives each the same document: each must accept it
// or refuse it with InvalidArgument, never throw (yaml-cpp's exceptions stop at ParseYamlDocument)
// or crash.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz/fuzz_support.h"
#include "placement/cluster_spec.h"
#include "placement/job_spec.h"
#include "placement/plan_request.h"
#include "placement/train_spec.h"

namespace {

template <typename T>
void CheckParsed(const absl::StatusOr<T>& parsed, const char* loader) {
  FUZZ_CHECK(parsed.ok() || absl::IsInvalidArgument(parsed.status()),
             std::string(loader) + ": not InvalidArgument: " + parsed.status().ToString());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace shardline::placement;
  const std::string text(reinterpret_cast<const char*>(data), size);
  CheckParsed(ParseJobSpec(text, "job.yaml"), "ParseJobSpec");
  CheckParsed(ParseClusterSpec(text, "cluster.yaml"), "ParseClusterSpec");
  CheckParsed(ParseModelConfig(text, "model.yaml"), "ParseModelConfig");
  CheckParsed(ParseTrainSpec(text, "train.yaml"), "ParseTrainSpec");
  CheckParsed(ParsePlanTrainSpec(text, "plan.yaml"), "ParsePlanTrainSpec");
  return 0;
}
