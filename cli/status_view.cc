#include "cli/status_view.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>
#include <utility>
#include <vector>

#include "cli/coordinator_client.h"
#include "placement/byte_size.h"
#include "protocol/envelope.h"
#include "worker/actor/layout_wire.h"

namespace shardline::cli {
namespace {

using protocol::Str;

std::string DeviceLabel(wire::Device::Reader d) {
  return std::string(d.getKind() == wire::DeviceKind::CUDA ? "cuda:" : "cpu:") +
         std::to_string(d.getIndex());
}

std::string Fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", digits, v);
  return buf;
}

// A plain text table: columns padded to their widest cell.
class Table {
 public:
  explicit Table(std::vector<std::string> header) { rows_.push_back(std::move(header)); }
  void Add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  std::string Render() const {
    std::vector<size_t> width;
    for (const auto& row : rows_) {
      if (width.size() < row.size()) width.resize(row.size(), 0);
      for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
    }
    std::string out;
    for (const auto& row : rows_) {
      std::string line;
      for (size_t c = 0; c < row.size(); ++c) {
        line += row[c];
        if (c + 1 < row.size()) line += std::string(width[c] - row[c].size() + 2, ' ');
      }
      out += line + "\n";
    }
    return out;
  }

 private:
  std::vector<std::vector<std::string>> rows_;
};

// "45 s", "3m20s", "1h02m".
std::string FormatDuration(double seconds) {
  const auto s = static_cast<int64_t>(std::llround(std::max(seconds, 0.0)));
  char buf[64];
  if (s < 60) {
    std::snprintf(buf, sizeof(buf), "%lld s", static_cast<long long>(s));
  } else if (s < 3600) {
    std::snprintf(buf, sizeof(buf), "%lldm%02llds", static_cast<long long>(s / 60),
                  static_cast<long long>(s % 60));
  } else {
    std::snprintf(buf, sizeof(buf), "%lldh%02lldm", static_cast<long long>(s / 3600),
                  static_cast<long long>(s / 60 % 60));
  }
  return buf;
}

// "812", "12.3k", "4.56M".
std::string FormatRate(double v) {
  if (v < 1e3) return Fixed(v, 0);
  if (v < 1e6) return Fixed(v / 1e3, 1) + "k";
  return Fixed(v / 1e6, 2) + "M";
}

std::string Percent(double part, double whole) {
  return std::to_string(static_cast<int>(std::lround(100.0 * part / whole))) + "%";
}


// "12.3 GB/s", "812 MB/s": a measured bandwidth.
std::string FormatBandwidth(double bytes_per_second) {
  if (bytes_per_second >= 1e9) return Fixed(bytes_per_second / 1e9, 2) + " GB/s";
  return Fixed(bytes_per_second / 1e6, 1) + " MB/s";
}

// "12.3 MB", "640 kB": a count of bytes in decimal units, as network rates are quoted.
std::string FormatBytes(double bytes) {
  if (bytes >= 1e9) return Fixed(bytes / 1e9, 2) + " GB";
  if (bytes >= 1e6) return Fixed(bytes / 1e6, 1) + " MB";
  if (bytes >= 1e3) return Fixed(bytes / 1e3, 0) + " kB";
  return Fixed(bytes, 0) + " B";
}

// "network 12.3 MB/step (dp 12.1 MB, tp 0.2 MB)": what the busiest rank sent plus received over
// the network per step, the kinds that moved any in decreasing order; "" until measured.
std::string FormatNetwork(wire::TrainProgress::Reader t) {
  if (!t.hasNetworkBytesPerStep()) return "";
  const auto n = t.getNetworkBytesPerStep();
  std::vector<std::pair<double, std::string>> kinds = {
      {n.getDp(), "dp"}, {n.getTp(), "tp"}, {n.getPp(), "pp"}, {n.getWorld(), "world"}};
  std::stable_sort(kinds.begin(), kinds.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  double total = 0;
  std::string parts;
  for (const auto& [bytes, kind] : kinds) {
    total += bytes;
    if (bytes <= 0) continue;
    parts += (parts.empty() ? "" : ", ") + kind + " " + FormatBytes(bytes);
  }
  return "network " + FormatBytes(total) + "/step" + (parts.empty() ? "" : " (" + parts + ")");
}

// One step of the slowest rank, as its last progress report averaged it: what the planner's
// prediction is compared with.
double MeasuredStepSeconds(wire::TrainProgress::Reader t) {
  return t.getComputeSeconds() + t.getCommSeconds() + t.getBubbleSeconds();
}

// The plan of a train job: "tp 2 x pp 2 x dp 1, zero 1, micro-batch 4 (2 per step)", with the
// schedule and the recomputation when they are not the defaults (", interleaved x2, recompute
// selective"), then the planner's prediction: ", predicted 0.120 s/step calibrated
// (measured 0.131 s, +9%), 34.1 MiB per device" (", auto: predicted …" when the planner chose the
// layout; "calibrated" once the job's own ranks' measurements priced it).
std::string FormatPlan(wire::TrainProgress::Reader t) {
  if (t.getAutoPlan() && t.getTp() == 0) return "auto (not planned yet)";
  std::string plan = "tp " + std::to_string(t.getTp()) + " x pp " + std::to_string(t.getPp()) +
                     " x dp " + std::to_string(t.getDp()) + ", zero " +
                     std::to_string(t.getZero()) + ", micro-batch " +
                     std::to_string(t.getMicroBatch()) + " (" +
                     std::to_string(t.getMicroBatches()) + " per step)";
  if (t.hasLayout()) {
    // A layout this build cannot read (a newer coordinator's enumerant) shows the rest only.
    if (const auto layout = actor::ParallelSpecFromWire(t.getLayout()); layout.ok()) {
      plan += placement::ScheduleAndRecomputeSuffix(*layout);
    }
  }
  const double predicted = t.getPredictedStepSeconds();
  if (predicted > 0) {
    plan += (t.getAutoPlan() ? ", auto: predicted " : ", predicted ") + Fixed(predicted, 3) +
            " s/step";
    if (t.getPredictionCalibrated()) plan += " calibrated";
    const double measured = MeasuredStepSeconds(t);
    if (t.getStep() > 0 && measured > 0) {
      const long off = std::lround(100.0 * (measured / predicted - 1.0));
      plan += " (measured " + Fixed(measured, 3) + " s, " + (off >= 0 ? "+" : "") +
              std::to_string(off) + "%)";
    }
    plan += ", " +
            placement::FormatApproxByteSize(static_cast<double>(t.getPredictedMemoryBytes())) +
            " per device";
  }
  return plan;
}

// A node's calibration on one line: "layers 42.1 GFLOP/s, intra 1.20 GB/s, inter 450.0 MB/s".
std::string FormatCalibration(wire::NodeStatus::Reader node) {
  if (!node.hasCalibration() || node.getCalibration().getMeasuredUnixMs() == 0) return "-";
  const auto c = node.getCalibration();
  std::string line;
  if (c.getComputeFlops() > 0) line = "layers " + Fixed(c.getComputeFlops() / 1e9, 1) + " GFLOP/s";
  if (c.getIntraBusBytesPerSecond() > 0) {
    line += (line.empty() ? "" : ", ") + std::string("intra ") +
            FormatBandwidth(c.getIntraBusBytesPerSecond());
  }
  if (c.getInterBusBytesPerSecond() > 0) {
    line += (line.empty() ? "" : ", ") + std::string("inter ") +
            FormatBandwidth(c.getInterBusBytesPerSecond());
  }
  return line.empty() ? "-" : line;
}

}  // namespace

std::string FormatTrainProgress(wire::JobStatus::Reader job) {
  const auto t = job.getTrain();
  std::string line = "step " + std::to_string(t.getStep()) + "/" + std::to_string(t.getSteps());
  if (t.getStep() == 0) {
    line += " (no report yet)";
  } else {
    line += "  loss " + (std::isnan(t.getLoss()) ? std::string("-") : Fixed(t.getLoss(), 4));
    line += "  " + FormatRate(t.getTokensPerSecond()) + " tok/s";
    if (t.getEtaSeconds() > 0) line += "  ETA " + FormatDuration(t.getEtaSeconds());
    const double step_seconds = t.getComputeSeconds() + t.getCommSeconds() + t.getBubbleSeconds();
    if (step_seconds > 0) {
      // comm is the time the step waited on collectives (exposed), not the time the network
      // was busy: a reduction hidden behind compute does not count.
      line += "  compute " + Percent(t.getComputeSeconds(), step_seconds) + " / waiting on comm " +
              Percent(t.getCommSeconds(), step_seconds) + " / bubble " +
              Percent(t.getBubbleSeconds(), step_seconds) + " of " + Fixed(step_seconds, 3) + " s";
    }
    if (const std::string network = FormatNetwork(t); !network.empty()) line += "  " + network;
  }
  if (t.getCheckpointDir().size() == 0) {
    line += "  checkpoints off";
  } else if (t.getLastCommittedStep() < 0) {
    line += "  checkpoint: none committed yet";
  } else {
    line += "  checkpoint: step " + std::to_string(t.getLastCommittedStep()) + " in " +
            Str(t.getCheckpointDir());
  }
  if (t.getLastMemoryStep() >= 0) {
    line += "  in memory: step " + std::to_string(t.getLastMemoryStep()) + " (" +
            FormatBytes(static_cast<double>(t.getMemoryStoreBytes())) + " on the fullest node)";
  }
  return line + "  plan " + FormatPlan(t);
}

std::vector<std::string> FormatTrainStart(wire::JobStatus::Reader job) {
  std::vector<std::string> lines;
  const auto t = job.getTrain();
  for (auto skipped : t.getSkippedCheckpoints()) {
    lines.push_back("skipped checkpoint step " + std::to_string(skipped.getStep()) + ": " +
                    Str(skipped.getReason()));
  }
  if (t.getResumedFromStep() > 0) {
    lines.push_back("resumed after step " + std::to_string(t.getResumedFromStep()) + " of " +
                    Str(t.getCheckpointDir()));
  } else if (t.getInitializedFrom().size()) {
    lines.push_back("started from the parameters of " + Str(t.getInitializedFrom()));
  }
  return lines;
}

namespace {

// "22:51:03" in local time, for a Unix-millisecond timestamp.
std::string ClockTime(int64_t unix_ms) {
  const time_t seconds = static_cast<time_t>(unix_ms / 1000);
  struct tm local {};
  localtime_r(&seconds, &local);
  char buf[16];
  strftime(buf, sizeof(buf), "%H:%M:%S", &local);
  return buf;
}

}  // namespace

namespace {

// The generations of a train or serve job (none for a comm-check).
capnp::List<wire::GenerationStatus>::Reader GenerationsOf(wire::JobStatus::Reader job) {
  if (job.hasTrain()) return job.getTrain().getGenerations();
  if (job.hasServing()) return job.getServing().getGenerations();
  return {};
}

}  // namespace

std::vector<std::string> FormatGenerations(wire::JobStatus::Reader job) {
  std::vector<std::string> lines;
  if (!job.hasTrain() && !job.hasServing()) return lines;
  const bool serving = job.hasServing();
  const bool elastic = serving ? job.getServing().getElastic() : job.getTrain().getElastic();
  const auto generations = GenerationsOf(job);
  // One generation that runs or ran to its end has nothing to tell beyond the job's own lines.
  if (generations.size() < 2 && !elastic) return lines;
  for (auto g : generations) {
    std::string line = "generation " + std::to_string(g.getGeneration()) + "  " +
                       (g.getStartedUnixMs() ? ClockTime(g.getStartedUnixMs()) : "?") + "-" +
                       (g.getEndedUnixMs() ? ClockTime(g.getEndedUnixMs()) : "") + "  " +
                       Str(g.getPlan());
    if (!serving) {
      line += "  " +
              (g.getResumedStep() > 0
                   ? "resumed after step " + std::to_string(g.getResumedStep()) +
                         (g.getResumedFrom().size() ? " (" + Str(g.getResumedFrom()) + ")" : "")
                   : std::string("from the start")) +
              ", reached step " + std::to_string(g.getLastStep());
    }
    const std::string ending = Str(g.getEnding());
    if (ending == "fault") {
      line += "  ended by " + Str(g.getCause());
      if (g.getConsequences().size()) {
        line += " (" + std::to_string(g.getConsequences().size()) + " consequence" +
                (g.getConsequences().size() == 1 ? "" : "s") + ")";
      }
    } else if (ending == "grow") {
      line += "  ended to grow onto more devices";
    } else {
      line += "  " + ending;
    }
    if (ending == "fault" || ending == "grow") {
      std::vector<std::string> parts;
      if (!serving) parts.push_back(std::to_string(g.getStepsLost()) + " steps lost");
      if (g.getAbortSeconds() >= 0) {
        parts.push_back("aborted in " + Fixed(g.getAbortSeconds(), 2) + " s");
      }
      if (g.getRecoverySeconds() >= 0) {
        parts.push_back((serving ? "serving again " : "next step ") +
                        Fixed(g.getRecoverySeconds(), 2) + " s after the fault");
      }
      for (size_t i = 0; i < parts.size(); ++i) line += (i == 0 ? "; " : ", ") + parts[i];
    }
    lines.push_back(line);
    if (g.getResumeNote().size()) lines.push_back("  " + Str(g.getResumeNote()));
  }
  return lines;
}

std::vector<std::string> NewlyEndedGenerations(wire::JobStatus::Reader job, size_t* shown) {
  const std::vector<std::string> lines = FormatGenerations(job);
  std::vector<std::string> ended;
  for (; *shown < lines.size(); ++*shown) {
    if (Str(GenerationsOf(job)[static_cast<unsigned>(*shown)].getEnding()) == "running") {
      break;
    }
    ended.push_back(lines[*shown]);
  }
  return ended;
}

std::string FormatServingNote(wire::ServingStatus::Reader serving) {
  if (serving.getUrl().size() == 0) return "loading shards";
  return Str(serving.getUrl()) + (serving.getReady() ? "" : " (not ready)");
}

std::string FormatServing(wire::ServingStatus::Reader serving) {
  std::ostringstream out;
  out << "serving tp " << serving.getTp() << " x pp " << serving.getPp() << ": ";
  if (serving.getUrl().size() == 0) {
    out << "loading shards";
    return out.str();
  }
  out << Str(serving.getModel()) << " at " << Str(serving.getUrl()) << "/v1"
      << (serving.getReady() ? "" : " (not ready)") << "; " << serving.getRunning()
      << " running (of " << serving.getMaxRunning() << "), " << serving.getWaiting()
      << " waiting, " << serving.getTokensGenerated() << " tokens generated, KV cache "
      << serving.getKvBlocksUsed() << "/" << serving.getKvBlocks() << " blocks of "
      << serving.getBlockSize() << ", " << serving.getPreemptions() << " preemptions";
  return out.str();
}

std::string FormatBytes(uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB"};
  int u = 0;
  uint64_t v = bytes;
  while (u < 3 && v >= 1024 && v % 1024 == 0) {
    v /= 1024;
    ++u;
  }
  return std::to_string(v) + " " + units[u];
}

namespace {

// {"world": .., "tp": .., "pp": .., "dp": .., "total": ..}: bytes per step of the busiest rank;
// null until a rank has measured it.
nlohmann::json NetworkToJson(wire::TrainProgress::Reader t) {
  if (!t.hasNetworkBytesPerStep()) return nullptr;
  const auto n = t.getNetworkBytesPerStep();
  return {{"world", n.getWorld()},
          {"tp", n.getTp()},
          {"pp", n.getPp()},
          {"dp", n.getDp()},
          {"total", n.getWorld() + n.getTp() + n.getPp() + n.getDp()}};
}

nlohmann::json GenerationsToJson(capnp::List<wire::GenerationStatus>::Reader list) {
  nlohmann::json generations = nlohmann::json::array();
  for (auto g : list) {
    nlohmann::json consequences = nlohmann::json::array();
    for (auto c : g.getConsequences()) consequences.push_back(Str(c));
    generations.push_back({{"generation", g.getGeneration()},
                           {"started_unix_ms", g.getStartedUnixMs()},
                           {"ended_unix_ms", g.getEndedUnixMs()},
                           {"plan", Str(g.getPlan())},
                           {"resumed_step", g.getResumedStep()},
                           {"resumed_from", Str(g.getResumedFrom())},
                           {"resume_note", Str(g.getResumeNote())},
                           {"last_step", g.getLastStep()},
                           {"ending", Str(g.getEnding())},
                           {"cause", Str(g.getCause())},
                           {"cause_kind", Str(g.getCauseKind())},
                           {"consequences", consequences},
                           {"steps_lost", g.getStepsLost()},
                           {"recovery_seconds", g.getRecoverySeconds()},
                           {"detection_seconds", g.getDetectionSeconds()},
                           {"abort_seconds", g.getAbortSeconds()}});
  }
  return generations;
}

}  // namespace

nlohmann::json StatusToJson(wire::ClusterStatus::Reader status) {
  nlohmann::json out;
  out["cluster_id"] = Str(status.getClusterId());
  out["coordinator_uptime_ms"] = status.getCoordinatorUptimeMs();
  out["metrics_address"] = Str(status.getMetricsAddress());
  out["nodes"] = nlohmann::json::array();
  for (auto node : status.getNodes()) {
    nlohmann::json n = {{"node_id", Str(node.getNodeId())},
                        {"hostname", Str(node.getHostname())},
                        {"address", Str(node.getAddress())},
                        {"address_chosen_by", Str(node.getAddressChosenBy())},
                        {"state", Str(node.getState())},
                        {"last_heartbeat_ago_ms", node.getLastHeartbeatAgoMs()},
                        {"metrics_address", Str(node.getMetricsAddress())},
                        {"busy_devices", node.getActors()}};
    n["devices"] = nlohmann::json::array();
    for (auto d : node.getDevices()) {
      n["devices"].push_back({{"device", DeviceLabel(d)},
                              {"memory_bytes", d.getMemoryBytes()},
                              {"name", Str(d.getName())},
                              {"avoided", Str(d.getAvoided())}});
    }
    // What the node's actors measured at their start-up (0: not measured); null before any.
    if (node.hasCalibration() && node.getCalibration().getMeasuredUnixMs() != 0) {
      const auto c = node.getCalibration();
      nlohmann::json devices = nlohmann::json::array();
      for (auto d : c.getDevices()) {
        devices.push_back({{"device", DeviceLabel(d.getDevice())},
                           {"compute_flops", d.getComputeFlops()},
                           {"compute_half_dim", d.getComputeHalfDim()},
                           {"optimizer_bytes_per_second", d.getOptimizerBytesPerSecond()}});
      }
      n["calibration"] = {{"compute_flops", c.getComputeFlops()},
                          {"compute_half_dim", c.getComputeHalfDim()},
                          {"optimizer_bytes_per_second", c.getOptimizerBytesPerSecond()},
                          {"intra_bus_bytes_per_second", c.getIntraBusBytesPerSecond()},
                          {"intra_latency_seconds", c.getIntraLatencySeconds()},
                          {"inter_bus_bytes_per_second", c.getInterBusBytesPerSecond()},
                          {"inter_latency_seconds", c.getInterLatencySeconds()},
                          {"job_id", Str(c.getJobId())},
                          {"measured_unix_ms", c.getMeasuredUnixMs()},
                          {"devices", devices}};
    } else {
      n["calibration"] = nullptr;
    }
    out["nodes"].push_back(n);
  }
  out["jobs"] = nlohmann::json::array();
  for (auto job : status.getJobs()) {
    nlohmann::json j = {{"job_id", Str(job.getJobId())},
                        {"name", Str(job.getName())},
                        {"kind", Str(job.getKind())},
                        {"state", Str(job.getState())},
                        {"phase", Str(job.getPhase())},
                        {"generation", job.getGeneration()},
                        {"world_size", job.getWorldSize()},
                        {"backend", Str(job.getBackend())},
                        {"error", Str(job.getError())},
                        {"submitted_unix_ms", job.getSubmittedUnixMs()},
                        {"finished_unix_ms", job.getFinishedUnixMs()}};
    j["actors"] = nlohmann::json::array();
    for (auto a : job.getActors()) {
      j["actors"].push_back({{"rank", a.getRank()},
                             {"node_id", Str(a.getNodeId())},
                             {"device", DeviceLabel(a.getDevice())},
                             {"pid", a.getPid()},
                             {"state", Str(a.getState())},
                             {"detail", Str(a.getDetail())},
                             {"metrics_address", Str(a.getMetricsAddress())},
                             {"address", Str(a.getAddress())}});
    }
    j["results"] = nlohmann::json::array();
    for (auto r : job.getResults()) {
      j["results"].push_back({{"op", Str(r.getOp())},
                              {"bytes", r.getBytes()},
                              {"ranks", r.getRanks()},
                              {"seconds", r.getSeconds()},
                              {"algorithm_gbps", r.getAlgorithmGBps()},
                              {"bus_gbps", r.getBusGBps()},
                              {"ok", r.getOk()},
                              {"detail", Str(r.getDetail())}});
    }
    if (job.hasTrain()) {
      const auto t = job.getTrain();
      // A loss not yet reported is NaN, which JSON spells null.
      const nlohmann::json loss =
          std::isnan(t.getLoss()) ? nlohmann::json() : nlohmann::json(t.getLoss());
      nlohmann::json skipped = nlohmann::json::array();
      for (auto step : t.getSkippedCheckpoints()) {
        skipped.push_back({{"step", step.getStep()}, {"reason", Str(step.getReason())}});
      }
      const nlohmann::json generations = GenerationsToJson(t.getGenerations());
      j["train"] = {{"step", t.getStep()},
                    {"steps", t.getSteps()},
                    {"loss", loss},
                    {"tokens_per_second", t.getTokensPerSecond()},
                    {"compute_seconds", t.getComputeSeconds()},
                    {"comm_seconds", t.getCommSeconds()},
                    {"network_bytes_per_step", NetworkToJson(t)},
                    {"bubble_seconds", t.getBubbleSeconds()},
                    {"step_seconds", MeasuredStepSeconds(t)},
                    {"eta_seconds", t.getEtaSeconds()},
                    {"last_committed_step", t.getLastCommittedStep()},
                    {"last_memory_step", t.getLastMemoryStep()},
                    {"memory_store_bytes", t.getMemoryStoreBytes()},
                    {"checkpoint_dir", Str(t.getCheckpointDir())},
                    {"resumed_from_step", t.getResumedFromStep()},
                    {"initialized_from", Str(t.getInitializedFrom())},
                    {"skipped_checkpoints", skipped},
                    {"elastic", t.getElastic()},
                    {"min_actors", t.getMinActors()},
                    {"max_actors", t.getMaxActors()},
                    {"generations", generations},
                    {"plan",
                     {{"tp", t.getTp()},
                      {"pp", t.getPp()},
                      {"dp", t.getDp()},
                      {"zero", t.getZero()},
                      {"micro_batch", t.getMicroBatch()},
                      {"micro_batches", t.getMicroBatches()},
                      {"batch", t.getBatch()},
                      {"seq_len", t.getSeqLen()},
                      {"auto", t.getAutoPlan()},
                      {"predicted_step_seconds", t.getPredictedStepSeconds()},
                      {"prediction_calibrated", t.getPredictionCalibrated()},
                      {"predicted_memory_bytes", t.getPredictedMemoryBytes()},
                      {"summary", Str(t.getPlanSummary())}}}};
    }
    if (job.hasServing()) {
      const auto v = job.getServing();
      j["serving"] = {{"url", Str(v.getUrl())},
                      {"model", Str(v.getModel())},
                      {"ready", v.getReady()},
                      {"tp", v.getTp()},
                      {"pp", v.getPp()},
                      {"running", v.getRunning()},
                      {"waiting", v.getWaiting()},
                      {"tokens_generated", v.getTokensGenerated()},
                      {"kv_blocks", v.getKvBlocks()},
                      {"kv_blocks_used", v.getKvBlocksUsed()},
                      {"preemptions", v.getPreemptions()},
                      {"max_running", v.getMaxRunning()},
                      {"max_tokens_per_step", v.getMaxTokensPerStep()},
                      {"block_size", v.getBlockSize()},
                      {"elastic", v.getElastic()},
                      {"plan_summary", Str(v.getPlanSummary())},
                      {"generations", GenerationsToJson(v.getGenerations())}};
    }
    out["jobs"].push_back(j);
  }
  return out;
}

std::string FormatCluster(wire::ClusterStatus::Reader status, const std::string& endpoint) {
  std::ostringstream out;
  out << "Cluster " << Str(status.getClusterId()) << " (coordinator " << endpoint << ", up "
      << Fixed(status.getCoordinatorUptimeMs() / 1000.0, 1) << " s)\n\n";
  Table nodes({"NODE", "STATE", "ADDRESS", "DEVICES", "BUSY", "LAST HEARTBEAT", "METRICS",
               "CALIBRATION"});
  for (auto node : status.getNodes()) {
    std::map<std::string, int> kinds;
    for (auto d : node.getDevices()) kinds[d.getKind() == wire::DeviceKind::CUDA ? "cuda" : "cpu"]++;
    std::string devices;
    for (const auto& [kind, count] : kinds) {
      devices += (devices.empty() ? "" : ", ") + std::to_string(count) + " " + kind;
    }
    nodes.Add({Str(node.getNodeId()), Str(node.getState()), Str(node.getAddress()), devices,
               std::to_string(node.getActors()),
               Fixed(node.getLastHeartbeatAgoMs() / 1000.0, 1) + " s ago",
               Str(node.getMetricsAddress()), FormatCalibration(node)});
  }
  out << "Nodes\n" << (status.getNodes().size() ? nodes.Render() : "  (none registered)\n");
  for (auto node : status.getNodes()) {
    for (auto d : node.getDevices()) {
      if (d.getAvoided().size() == 0) continue;
      out << "  " << DeviceLabel(d) << " of " << Str(node.getNodeId())
          << " is avoided until the node registers again: " << Str(d.getAvoided()) << "\n";
    }
  }
  Table jobs({"JOB", "KIND", "STATE", "PHASE", "GEN", "ACTORS", "BACKEND", "NOTE"});
  for (auto job : status.getJobs()) {
    std::map<std::string, int> states;
    for (auto a : job.getActors()) states[Str(a.getState())]++;
    std::string actors;
    for (const auto& [state, count] : states) {
      actors += (actors.empty() ? "" : " ") + std::to_string(count) + " " + state;
    }
    if (actors.empty()) actors = std::to_string(job.getWorldSize()) + " wanted";
    std::string note = Str(job.getError());
    if (note.empty() && job.hasTrain()) {
      const auto t = job.getTrain();
      note = "step " + std::to_string(t.getStep()) + "/" + std::to_string(t.getSteps());
      if (t.getStep() > 0 && !std::isnan(t.getLoss())) note += ", loss " + Fixed(t.getLoss(), 4);
    }
    if (note.empty() && job.hasServing()) note = FormatServingNote(job.getServing());
    jobs.Add({Str(job.getJobId()), Str(job.getKind()), Str(job.getState()), Str(job.getPhase()),
              std::to_string(job.getGeneration()), actors, Str(job.getBackend()), note});
  }
  out << "\nJobs\n" << (status.getJobs().size() ? jobs.Render() : "  (none)\n");
  return out.str();
}

std::string FormatJob(wire::JobStatus::Reader job) {
  std::ostringstream out;
  out << "Job " << Str(job.getJobId()) << ": " << Str(job.getState());
  if (job.getPhase().size()) out << " (" << Str(job.getPhase()) << ")";
  out << ", generation " << job.getGeneration() << ", " << job.getWorldSize() << " actors, "
      << Str(job.getBackend()) << "\n";
  if (job.getError().size()) out << "  " << Str(job.getError()) << "\n";
  if (job.hasTrain()) {
    out << "  " << FormatTrainProgress(job) << "\n";
    for (const std::string& line : FormatTrainStart(job)) out << "  " << line << "\n";
    for (const std::string& line : FormatGenerations(job)) out << "  " << line << "\n";
  }
  if (job.hasServing()) {
    out << "  " << FormatServing(job.getServing()) << "\n";
    if (job.getServing().getPlanSummary().size()) {
      out << "  planned " << Str(job.getServing().getPlanSummary()) << "\n";
    }
    for (const std::string& line : FormatGenerations(job)) out << "  " << line << "\n";
  }
  if (job.hasTrain() && job.getTrain().getPlanSummary().size()) {
    out << "  planned (parallel: auto): " << Str(job.getTrain().getPlanSummary()) << "\n";
  }
  Table actors({"RANK", "NODE", "DEVICE", "PID", "STATE", "DETAIL"});
  for (auto a : job.getActors()) {
    actors.Add({std::to_string(a.getRank()), Str(a.getNodeId()), DeviceLabel(a.getDevice()),
                a.getPid() ? std::to_string(a.getPid()) : "-", Str(a.getState()),
                Str(a.getDetail())});
  }
  if (job.getActors().size()) out << "\n" << actors.Render();
  if (job.getResults().size()) out << "\n" << FormatResults(job);
  return out.str();
}

std::string FormatResults(wire::JobStatus::Reader job) {
  Table table({"OP", "SIZE", "RANKS", "TIME (us)", "ALGBW (GB/s)", "BUSBW (GB/s)", "CHECK"});
  for (auto r : job.getResults()) {
    const bool timed = r.getBytes() > 0;
    table.Add({Str(r.getOp()), timed ? FormatBytes(r.getBytes()) : "-",
               std::to_string(r.getRanks()), Fixed(r.getSeconds() * 1e6, 1),
               timed ? Fixed(r.getAlgorithmGBps(), 3) : "-", timed ? Fixed(r.getBusGBps(), 3) : "-",
               r.getOk() ? "ok" : "FAILED " + Str(r.getDetail())});
  }
  return table.Render();
}

}  // namespace shardline::cli
