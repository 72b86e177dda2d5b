#include "coordinator/scheduler.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <sstream>

#include "common/status_macros.h"
#include "model/tensor_table.h"
#include "placement/byte_size.h"
#include "placement/plan_request.h"
#include "placement/planner.h"
#include "placement/serve_memory.h"
#include "spdlog/spdlog.h"

namespace shardline::coordinator {
namespace {

// Why an elastic job below its min_actors waits: "waiting for 2 more cpu devices: 2 free of 2
// alive, min 4".
std::string WaitingForMore(const std::string& kind, int free, int alive, int min_actors) {
  const int more = std::max(1, min_actors - free);
  return "waiting for " + std::to_string(more) + " more " + kind + " device" +
         (more == 1 ? "" : "s") + ": " + std::to_string(free) + " free of " +
         std::to_string(alive) + " alive, min " + std::to_string(min_actors);
}

StartChoice Wait(std::string reason) { return {StartChoice::Verdict::kWait, {}, std::move(reason)}; }
StartChoice Fail(std::string reason) { return {StartChoice::Verdict::kFail, {}, std::move(reason)}; }
StartChoice Start(Placement placement) {
  return {StartChoice::Verdict::kStart, std::move(placement), ""};
}

}  // namespace

DeviceInfo::Kind DeviceKindOf(const placement::JobSpec& spec) {
  return spec.devices == placement::DeviceKind::kCuda ? DeviceInfo::Kind::kCuda
                                                      : DeviceInfo::Kind::kCpu;
}

DeviceCount CountDevices(const Membership& membership, DeviceInfo::Kind kind) {
  DeviceCount count;
  for (const auto& [node_id, node] : membership.nodes()) {
    if (!node.alive) continue;
    for (const DeviceInfo& device : node.devices) {
      if (device.kind != kind) continue;
      ++count.alive;
      count.free += device.busy_job.empty() ? 1 : 0;
      count.trusted += device.busy_job.empty() && device.avoided.empty() ? 1 : 0;
    }
  }
  return count;
}

std::string PlanSummary(const placement::JobSpec& spec) {
  const auto& p = spec.parallel;
  if (spec.kind == placement::JobKind::kServe) {
    return "tp " + std::to_string(p.tp) + " x pp " + std::to_string(p.pp);
  }
  return "tp " + std::to_string(p.tp) + " x pp " + std::to_string(p.pp) + " x dp " +
         std::to_string(p.dp) + ", zero " + std::to_string(p.zero) +
         placement::ScheduleAndRecomputeSuffix(p) +
         placement::DataParallelSuffix(spec.data_parallel);
}

int AutoMaxActors(const placement::JobSpec& spec) {
  return spec.elastic.enabled ? spec.elastic.max_actors : spec.actors;
}

void ForgetAutoPlan(Job& job) {
  const int64_t micro_batch = job.spec.parallel.micro_batch;  // the spec's, which a plan keeps
  job.spec.parallel = placement::ParallelSpec();
  job.spec.parallel.micro_batch = micro_batch;
  job.spec.actors = job.auto_max_actors;
  job.plan.planned = false;
  job.plan.failed_on.clear();
}

StartChoice Scheduler::Choose(Job& job) const {
  if (job.spec.kind == placement::JobKind::kServe) return ChooseServe(job);
  if (job.spec.kind == placement::JobKind::kTrain && job.spec.parallel_auto) {
    StartChoice choice = ChooseAuto(job, true, true);
    const DeviceCount devices = CountDevices(membership_, DeviceKindOf(job.spec));
    if (choice.verdict == StartChoice::Verdict::kStart || devices.trusted == devices.free) {
      return choice;
    }
    return ChooseAuto(job, false, true);
  }
  return ChooseFixed(job);
}

StartChoice Scheduler::ChooseFixed(Job& job, int64_t min_memory) const {
  const DeviceInfo::Kind wanted = DeviceKindOf(job.spec);
  const std::string kind(placement::DeviceKindName(job.spec.devices));
  // The free devices, those no fault pointed at first, each kind in node order.
  Placement trusted, avoided;
  int alive_total = 0;
  for (const auto& [node_id, node] : membership_.nodes()) {
    if (!node.alive) continue;
    for (size_t d = 0; d < node.devices.size(); ++d) {
      const DeviceInfo& device = node.devices[d];
      if (device.kind != wanted) continue;
      if (static_cast<int64_t>(device.memory_bytes) < min_memory) continue;
      ++alive_total;
      if (!device.busy_job.empty()) continue;
      (device.avoided.empty() ? trusted : avoided).emplace_back(node_id, static_cast<int>(d));
    }
  }
  const int free = static_cast<int>(trusted.size() + avoided.size());
  if (job.Elastic() && job.spec.kind == placement::JobKind::kTrain) {
    // dp follows the devices: the largest layout within min..max that the trusted devices hold,
    // or when they hold none, the smallest that takes as few avoided ones as it can.
    auto layout = placement::ElasticLayout(job.spec, static_cast<int>(trusted.size()));
    for (int n = static_cast<int>(trusted.size()) + 1; !layout.ok() && n <= free; ++n) {
      layout = placement::ElasticLayout(job.spec, n);
    }
    if (!layout.ok()) {
      return Wait(std::string(job.phase == Phase::kRestarting
                                  ? "restarting after generation " +
                                        std::to_string(job.generation) + ": "
                                  : "") +
                  WaitingForMore(kind, free, alive_total, job.spec.elastic.min_actors));
    }
    job.spec.parallel = *layout;
    job.spec.actors = layout->world();
  }
  const auto world = static_cast<size_t>(job.World());
  if (trusted.size() + avoided.size() < world) {
    return Wait("waiting for " + std::to_string(job.World()) + " free " + kind + " devices (" +
                std::to_string(free) + " free of " + std::to_string(alive_total) + " alive)");
  }
  Placement placement = trusted;
  placement.resize(std::min(world, trusted.size()));
  for (size_t i = 0; placement.size() < world; ++i) placement.push_back(avoided[i]);
  // Ranks fill one node's devices before the next (membership lists nodes in id order).
  std::sort(placement.begin(), placement.end());
  return Start(std::move(placement));
}

StartChoice Scheduler::ChooseAuto(Job& job, bool avoid, bool announce) const {
  const DeviceInfo::Kind wanted = DeviceKindOf(job.spec);
  const std::string kind(placement::DeviceKindName(job.spec.devices));
  int alive_total = 0;
  for (const auto& node : PlannableNodes(membership_, calibration_, wanted, false, nullptr)) {
    alive_total += node.devices;
  }
  // The plan is made for the devices free now, a job's `actors` capping how many it may take
  // (the first in node order, as fixed layouts fill them).
  std::map<std::string, std::vector<int>> slots;
  std::vector<PlannableNode> free_nodes =
      PlannableNodes(membership_, calibration_, wanted, true, &slots, avoid);
  int free_total = 0;
  std::string devices_key;
  for (auto node = free_nodes.begin(); node != free_nodes.end();) {
    if (job.auto_max_actors > 0 && free_total + node->devices > job.auto_max_actors) {
      node->devices = job.auto_max_actors - free_total;
      slots[node->node_id].resize(static_cast<size_t>(std::max(node->devices, 0)));
    }
    if (node->devices <= 0) {
      slots.erase(node->node_id);
      node = free_nodes.erase(node);
      continue;
    }
    free_total += node->devices;
    devices_key += node->node_id + ":" + std::to_string(node->devices) + " ";
    ++node;
  }
  if (free_total == 0) {
    return Wait("waiting for free " + kind + " devices to plan on (0 free of " +
                std::to_string(alive_total) + " alive)");
  }
  if (job.Elastic() && free_total < job.spec.elastic.min_actors) {
    return Wait(WaitingForMore(kind, free_total, alive_total, job.spec.elastic.min_actors));
  }
  // The same devices give the same verdict: a job that waits for more is not re-planned on
  // every turn of the event loop.
  if (job.plan.failed_on.count(devices_key)) return Wait(job.waiting_reason);

  const std::string on = std::to_string(free_total) + " free " + kind + " device" +
                         (free_total == 1 ? "" : "s") + " of " + std::to_string(free_nodes.size()) +
                         " node" + (free_nodes.size() == 1 ? "" : "s");
  auto cluster = BuildClusterSpec(cluster_id_, free_nodes);
  if (!cluster.ok()) {
    return Fail("cannot plan on the " + on + ": " + ToString(cluster.status().message()));
  }
  auto report = placement::Plan(placement::PlanRequestForJob(job.spec, *cluster));
  if (!report.ok()) {
    const std::string why = "no plan fits the " + on + ": " + ToString(report.status().message());
    // Out of memory on what is free now, while other devices are busy: once they free, a plan
    // over more devices may fit, so the job waits for them (first come, first served, like a
    // fixed layout waiting for its devices). On every device it could ever get, it fails.
    const bool more_may_free =
        free_total < alive_total && (job.auto_max_actors == 0 || free_total < job.auto_max_actors);
    if (report.status().code() == absl::StatusCode::kResourceExhausted && more_may_free) {
      job.plan.failed_on.insert(devices_key);
      if (announce) spdlog::info("job {}: {}; waiting for busy devices to free", job.id, why);
      return Wait(why + "; waiting for busy devices to free");
    }
    return Fail(why);
  }
  const placement::PlannedLayout& best = report->best;
  if (auto status = placement::ApplyPlannedLayout(job.spec, best.parallel); !status.ok()) {
    return Fail("the planner's layout cannot run: " + ToString(status.message()));
  }
  job.plan.planned = true;  // from here on the job's world is the plan's
  // Ranks go where the plan put them: its device d of a node is that node's d-th free device.
  Placement placement;
  std::set<std::pair<std::string, int>> taken;
  bool honoured = best.devices.size() == static_cast<size_t>(job.World());
  for (size_t rank = 0; honoured && rank < best.devices.size(); ++rank) {
    const placement::DevicePlace& place = best.devices[rank];
    auto node = slots.find(place.node_id);
    if (node == slots.end() || place.device < 0 ||
        static_cast<size_t>(place.device) >= node->second.size()) {
      honoured = false;
      break;
    }
    const std::pair<std::string, int> slot(place.node_id, node->second[place.device]);
    honoured = taken.insert(slot).second;
    placement.push_back(slot);
  }
  if (!honoured) {
    // Not expected of the planner; the job still runs, on the free devices in node order.
    spdlog::warn("job {}: the plan's rank → device map does not match the free devices; ranks "
                 "fill the nodes in order instead",
                 job.id);
    placement.clear();
    for (const auto& [node_id, node_slots] : slots) {
      for (int slot : node_slots) {
        if (placement.size() < static_cast<size_t>(job.World())) {
          placement.emplace_back(node_id, slot);
        }
      }
    }
  }
  std::set<std::string> nodes_used;
  for (const auto& [node_id, slot] : placement) nodes_used.insert(node_id);
  std::ostringstream summary;
  summary << job.World() << " of " << free_total << " free " << kind << " devices on "
          << nodes_used.size() << " node" << (nodes_used.size() == 1 ? "" : "s") << ", "
          << best.mapping << ", " << report->feasible << " of " << report->candidates
          << " candidates fit, planned in "
          << std::to_string(static_cast<int64_t>(std::ceil(report->planning_seconds * 1e3)))
          << " ms";
  job.plan.step_seconds = best.time.total;
  job.plan.memory_bytes = best.memory.total();
  job.plan.summary = summary.str();
  job.plan.failed_on.clear();
  if (!announce) return Start(std::move(placement));
  spdlog::info("job {}: planned {} ({}): predicted {:.4f} s per step, {} per device\n{}", job.id,
               PlanSummary(job.spec), job.plan.summary, best.time.total,
               placement::FormatApproxByteSize(static_cast<double>(best.memory.total())),
               placement::FormatPlan(*report, false));
  return Start(std::move(placement));
}

namespace {

// The memory of the devices of `kind` that are alive: the largest one's, the smallest one's, and
// the most on one node.
struct DeviceMemory {
  int devices = 0;
  int64_t largest = 0;
  int64_t smallest = 0;
  int most_on_a_node = 0;
};
DeviceMemory AliveDeviceMemory(const Membership& membership, DeviceInfo::Kind kind) {
  DeviceMemory memory;
  for (const auto& [node_id, node] : membership.nodes()) {
    if (!node.alive) continue;
    int here = 0;
    for (const DeviceInfo& device : node.devices) {
      if (device.kind != kind) continue;
      const auto bytes = static_cast<int64_t>(device.memory_bytes);
      memory.largest = std::max(memory.largest, bytes);
      memory.smallest = memory.devices == 0 ? bytes : std::min(memory.smallest, bytes);
      ++memory.devices;
      ++here;
    }
    memory.most_on_a_node = std::max(memory.most_on_a_node, here);
  }
  return memory;
}

// Why no device can hold a rank of the layout: "each rank of tp 2 x pp 1 needs ... per device;
// the largest cpu device has 1 GiB: 200 MiB short".
std::string TooSmall(const placement::JobSpec& spec, const placement::ServeMemory& need,
                     int64_t largest) {
  return "each rank of " + PlanSummary(spec) + " needs " + need.Describe() + "; the largest " +
         std::string(placement::DeviceKindName(spec.devices)) + " device has " +
         placement::FormatApproxByteSize(static_cast<double>(largest)) + ": " +
         placement::FormatApproxByteSize(static_cast<double>(need.total() - largest)) + " short";
}

}  // namespace

absl::Status Scheduler::CheckServeFits(const Job& job) const {
  if (job.serve_model.layers == 0 || job.spec.parallel_auto) return absl::OkStatus();
  const placement::ParallelSpec& layout = job.spec.parallel;
  auto need = placement::EstimateServeMemory(job.serve_model, layout.tp, layout.pp,
                                             job.spec.serve.limits);
  if (!need.ok()) return need.status();
  // Beyond the heads and the MLP the estimate checks, the key/value heads must cut tp ways too
  // (or tp ways share them), or no rank could load its part.
  RETURN_IF_ERROR(Annotate(model::CheckTensorParallel(job.serve_model, layout.tp), "parallel.tp"));
  const DeviceMemory memory = AliveDeviceMemory(membership_, DeviceKindOf(job.spec));
  if (memory.devices > 0 && memory.largest < need->total()) {
    return absl::FailedPreconditionError(TooSmall(job.spec, *need, memory.largest));
  }
  return absl::OkStatus();
}

StartChoice Scheduler::ChooseServe(Job& job) const {
  const DeviceInfo::Kind wanted = DeviceKindOf(job.spec);
  const placement::ServeLimits& limits = job.spec.serve.limits;
  if (job.serve_model.layers == 0) {
    // Not known here (a job taken over after a restart): the ranks check what fits.
    if (job.spec.parallel_auto && !job.plan.planned) {
      return Fail("parallel: auto needs the checkpoint's shape, which the coordinator could not "
                  "read again after its restart; submit the job again");
    }
    return ChooseFixed(job);
  }
  const DeviceMemory memory = AliveDeviceMemory(membership_, wanted);
  if (memory.devices == 0) {
    return Wait("waiting for " + std::string(placement::DeviceKindName(job.spec.devices)) +
                " devices");
  }
  if (job.spec.parallel_auto && !job.plan.planned) {
    // On the devices that are alive, free or not: a plan that needs busy ones waits for them.
    const int most = job.auto_max_actors > 0 ? std::min(job.auto_max_actors, memory.devices)
                                             : memory.devices;
    auto layout = placement::PlanServeLayout(job.serve_model, limits, memory.smallest, most,
                                             memory.most_on_a_node);
    if (!layout.ok()) return Fail(std::string(layout.status().message()));
    job.spec.parallel = *layout;
    job.spec.actors = layout->world();
    job.plan.planned = true;
  }
  const placement::ParallelSpec& layout = job.spec.parallel;
  auto need = placement::EstimateServeMemory(job.serve_model, layout.tp, layout.pp, limits);
  if (!need.ok()) return Fail(std::string(need.status().message()));
  if (job.spec.parallel_auto) {
    job.plan.summary = "parallel: auto: " + PlanSummary(job.spec) + ", " + need->Describe() +
                       " per device";
  }
  if (memory.largest < need->total()) return Fail(TooSmall(job.spec, *need, memory.largest));
  return ChooseFixed(job, need->total());
}

std::optional<int> Scheduler::GrowTarget(const Job& job) const {
  const int max_actors = job.spec.elastic.max_actors;  // 0 (`parallel: auto` only): any
  if (!job.Elastic() || job.spec.kind != placement::JobKind::kTrain ||
      job.phase != Phase::kRunning ||
      job.train.last_committed_step >= job.spec.train.steps ||
      (max_actors > 0 && job.World() >= max_actors)) {
    return std::nullopt;
  }
  const int free = CountDevices(membership_, DeviceKindOf(job.spec)).trusted;
  if (free == 0) return std::nullopt;
  if (job.spec.parallel_auto) {
    // What the planner would choose at a restart now, on the devices the job holds and the free
    // ones: a plan over more devices is one the planner prices faster.
    Membership widened = membership_;
    FreeDevices(widened, job.id);
    const Scheduler planner(widened, calibration_, cluster_id_);
    Job restarted = job;
    ForgetAutoPlan(restarted);
    const StartChoice choice = planner.ChooseAuto(restarted, true, false);
    if (choice.verdict != StartChoice::Verdict::kStart || restarted.World() <= job.World()) {
      return std::nullopt;
    }
    return restarted.World();
  }
  auto larger = placement::ElasticLayout(job.spec, job.World() + free);
  if (!larger.ok() || larger->world() <= job.World()) return std::nullopt;
  return larger->world();
}

void Scheduler::PredictLayout(Job& job) const {
  const DeviceInfo::Kind wanted = DeviceKindOf(job.spec);
  std::map<std::string, int> placed;  // devices per node
  for (const ActorRecord& actor : job.actors) ++placed[actor.node_id];
  std::vector<PlannableNode> nodes;
  for (PlannableNode& node : PlannableNodes(membership_, calibration_, wanted, false, nullptr)) {
    auto it = placed.find(node.node_id);
    if (it == placed.end()) continue;
    node.devices = it->second;
    nodes.push_back(std::move(node));
  }
  auto cluster = BuildClusterSpec(cluster_id_, nodes);
  absl::StatusOr<placement::PlanReport> report =
      cluster.ok() ? placement::Plan(placement::PlanRequestForLayout(job.spec, *cluster))
                   : absl::StatusOr<placement::PlanReport>(cluster.status());
  if (!report.ok()) {
    spdlog::warn("job {}: no prediction for {}: {}", job.id, PlanSummary(job.spec),
                 ToString(report.status().message()));
    job.plan.step_seconds = 0;
    job.plan.memory_bytes = 0;
    return;
  }
  job.plan.step_seconds = report->best.time.total;
  job.plan.memory_bytes = report->best.memory.total();
  const placement::StepTime& t = report->best.time;
  spdlog::info("job {}: {} predicted at {:.4f} s per step (compute {:.4f}, tp {:.4f}, pp {:.4f}, "
               "bubble {:.4f}, dp {:.4f}, optimizer {:.4f}), {} per device{}",
               job.id, PlanSummary(job.spec), t.total, t.compute, t.tp, t.pp, t.bubble, t.dp,
               t.optimizer,
               placement::FormatApproxByteSize(static_cast<double>(job.plan.memory_bytes)),
               job.PredictionCalibrated() ? ", with its ranks' own calibration" : "");
}

void AvoidDevice(Membership& membership, const ActorRecord& actor, const std::string& why) {
  NodeInfo* node = membership.Find(actor.node_id);
  if (node == nullptr) return;
  for (DeviceInfo& device : node->devices) {
    if (device.kind == actor.device.kind && device.index == actor.device.index) {
      device.avoided = why;
    }
  }
}

void HoldDevices(Membership& membership, const std::string& job_id, const Placement& placement) {
  for (const auto& [node_id, slot] : placement) {
    if (NodeInfo* node = membership.Find(node_id)) node->devices.at(slot).busy_job = job_id;
  }
}

void FreeDevices(Membership& membership, const std::string& job_id) {
  for (auto& [node_id, node] : membership.mutable_nodes()) {
    for (auto& device : node.devices) {
      if (device.busy_job == job_id) device.busy_job.clear();
    }
  }
}

}  // namespace shardline::coordinator
