// The placement planner's benchmark.
//
//   planner_bench [--runs N] [--json]
//
// 1. Planning time: a 1T-parameter GPT (Narayanan et al. 2021's: 128 layers, d_model 25600, 160
//    heads) on 2,048 nodes × 8 H100 (16,384 devices), global batch 4096 × 2048 tokens, bf16.
//    Target: under 1 s in a Release build. Reports every run, the minimum and the median.
// 2. The table of plans chosen for dense GPTs from 1B to 1T on A100-80GB and H100 clusters of
//    8-GPU NVLink nodes with InfiniBand between them, with the predicted throughput and memory
//    per GPU. The model shapes are GPT-3's (Brown et al. 2020, Table 2.1) up to 175B, MT-NLG's
//    for 530B (Smith et al. 2022) and Megatron-LM's 1T (Narayanan et al. 2021, Table 1); cluster
//    sizes and batches are of the order those runs used.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "placement/cluster_spec.h"
#include "placement/cost_model.h"
#include "placement/planner.h"

namespace sp = shardline::placement;

namespace {

struct GptShape {
  const char* name;
  int64_t layers, d_model, heads;
  int64_t batch;   // global batch, sequences of 2048 tokens
  int a100_nodes;  // cluster sizes, 8 GPUs per node
  int h100_nodes;
};

constexpr GptShape kShapes[] = {
    {"gpt-1.3b", 24, 2048, 16, 512, 8, 8},       {"gpt-6.7b", 32, 4096, 32, 1024, 16, 16},
    {"gpt-13b", 40, 5120, 40, 1024, 32, 32},     {"gpt-65b", 80, 8192, 64, 1536, 64, 64},
    {"gpt-175b", 96, 12288, 96, 1536, 128, 128}, {"gpt-530b", 105, 20480, 128, 1920, 280, 280},
    {"gpt-1t", 128, 25600, 160, 3072, 384, 384},
};

shardline::model::ModelConfig Gpt(int64_t layers, int64_t d_model, int64_t heads) {
  shardline::model::ModelConfig m;
  m.layers = layers;
  m.d_model = d_model;
  m.heads = heads;
  m.kv_heads = heads;
  m.d_ff = 4 * d_model;
  m.vocab = 51200;
  m.max_seq_len = 2048;
  m.tied_embeddings = true;
  return m;
}

sp::ClusterSpec Cluster(const std::string& kind, int nodes) {
  std::vector<sp::NodeReport> reports;
  for (int i = 0; i < nodes; ++i) {
    sp::NodeReport r;
    r.node_id = kind + "-" + std::to_string(i);
    r.device_kind = kind;
    r.devices = 8;
    reports.push_back(r);
  }
  auto spec = sp::ClusterSpecFromNodes(kind + "-" + std::to_string(nodes) + "x8", reports);
  if (!spec.ok()) {
    std::fprintf(stderr, "%s\n", std::string(spec.status().message()).c_str());
    std::exit(1);
  }
  return *spec;
}

sp::PlanRequest Request(const shardline::model::ModelConfig& model, const sp::ClusterSpec& cluster,
                        int64_t batch) {
  sp::PlanRequest r;
  r.model = model;
  r.cluster = cluster;
  r.train.global_batch = batch;
  r.train.seq_len = 2048;
  r.train.precision = sp::Precision::kBf16;
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  int runs = 5;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--runs") == 0 && i + 1 < argc) runs = std::atoi(argv[++i]);
  }

  // 1. Planning time.
  {
    const sp::PlanRequest request = Request(Gpt(128, 25600, 160), Cluster("h100-sxm", 2048), 4096);
    std::vector<double> ms;
    absl::StatusOr<sp::PlanReport> report;
    for (int i = 0; i < runs; ++i) {
      const auto start = std::chrono::steady_clock::now();
      report = sp::Plan(request);
      ms.push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
              .count());
      if (!report.ok()) {
        std::fprintf(stderr, "plan failed: %s\n", std::string(report.status().message()).c_str());
        return 1;
      }
    }
    std::vector<double> sorted = ms;
    std::sort(sorted.begin(), sorted.end());
    std::printf("planning time, 1T GPT on 2048 x 8 H100 (16384 devices), batch 4096 x 2048:\n ");
    for (const double t : ms) std::printf(" %.1f", t);
    std::printf(
        " ms\n  min %.1f ms, median %.1f ms (target < 1000 ms); %lld candidates, %lld fit\n",
        sorted.front(), sorted[sorted.size() / 2], static_cast<long long>(report->candidates),
        static_cast<long long>(report->feasible));
    std::printf("%s\n", sp::FormatPlan(*report, /*explain=*/true).c_str());
  }

  // 2. The table.
  std::printf(
      "| model | params | GPUs | batch | tp | pp | dp | zero | mb | recompute | mapping | "
      "step s | tokens/s/GPU | TFLOP/s/GPU | MFU | GiB/GPU | plan ms |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const char* kind : {"a100-80gb", "h100-sxm"}) {
    for (const GptShape& shape : kShapes) {
      const shardline::model::ModelConfig model = Gpt(shape.layers, shape.d_model, shape.heads);
      const int nodes = std::string(kind) == "a100-80gb" ? shape.a100_nodes : shape.h100_nodes;
      const sp::PlanRequest request = Request(model, Cluster(kind, nodes), shape.batch);
      const absl::StatusOr<sp::PlanReport> report = sp::Plan(request);
      if (!report.ok()) {
        std::printf("| %s on %s | | %d | %lld | %s |\n", shape.name, kind, nodes * 8,
                    static_cast<long long>(shape.batch),
                    std::string(report.status().message()).c_str());
        continue;
      }
      const sp::PlannedLayout& b = report->best;
      const double tflops = b.model_flops_per_step / b.time.total / b.parallel.world() / 1e12;
      std::printf(
          "| %s %s | %.1fB | %d | %lld | %d | %d | %d | %d | %lld | %s | %s | %.2f | %.0f | %.0f | "
          "%.1f%% | %.1f | %.1f |\n",
          shape.name, kind, static_cast<double>(report->model.params) / 1e9, b.parallel.world(),
          static_cast<long long>(shape.batch), b.parallel.tp, b.parallel.pp, b.parallel.dp,
          b.parallel.zero, static_cast<long long>(b.parallel.micro_batch),
          std::string(sp::RecomputeModeName(b.parallel.recompute)).c_str(), b.mapping.c_str(),
          b.time.total, b.tokens_per_s_per_device, tflops, 100 * b.mfu,
          static_cast<double>(b.memory.total()) / (1 << 30), report->planning_seconds * 1e3);
    }
  }
  return 0;
}
