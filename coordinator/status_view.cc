#include "coordinator/status_view.h"

#include <chrono>

#include "coordinator/checkpoint_tracker.h"
#include "coordinator/layout_wire.h"
#include "coordinator/progress.h"
#include "coordinator/supervisor.h"
#include "placement/parallel_layout.h"

namespace shardline::coordinator {
namespace {

using protocol::Str;

capnp::Text::Reader CapText(const std::string& s) { return capnp::Text::Reader(s.data(), s.size()); }

}  // namespace

void FillDevice(wire::Device::Builder out, const DeviceInfo& device) {
  out.setKind(device.kind == DeviceInfo::Kind::kCuda ? wire::DeviceKind::CUDA
                                                     : wire::DeviceKind::CPU);
  out.setIndex(static_cast<uint32_t>(device.index));
  out.setMemoryBytes(device.memory_bytes);
  out.setName(CapText(device.name));
  if (!device.avoided.empty()) out.setAvoided(CapText(device.avoided));
}

DeviceInfo ReadDevice(wire::Device::Reader in) {
  DeviceInfo device;
  device.kind = in.getKind() == wire::DeviceKind::CUDA ? DeviceInfo::Kind::kCuda
                                                       : DeviceInfo::Kind::kCpu;
  device.index = static_cast<int>(in.getIndex());
  device.memory_bytes = in.getMemoryBytes();
  device.name = Str(in.getName());
  return device;
}

void FillStatus(wire::ClusterStatus::Builder status, const StatusSource& source,
                const std::string& job_id, TimePoint now) {
  status.setClusterId(CapText(source.cluster_id));
  status.setMetricsAddress(CapText(source.metrics_address));
  status.setCoordinatorUptimeMs(static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::milliseconds>(now - source.started).count()));
  const auto& nodes = source.membership.nodes();
  auto node_list = status.initNodes(static_cast<unsigned>(nodes.size()));
  unsigned n = 0;
  for (const auto& [id, node] : nodes) {
    auto out = node_list[n++];
    out.setNodeId(CapText(node.node_id));
    out.setHostname(CapText(node.hostname));
    out.setAddress(CapText(node.address));
    out.setAddressChosenBy(CapText(node.address_chosen_by));
    out.setState(node.alive ? "alive" : "dead");
    out.setMetricsAddress(CapText(node.metrics_address));
    out.setLastHeartbeatAgoMs(static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::milliseconds>(now - node.last_heartbeat).count()));
    auto devices = out.initDevices(static_cast<unsigned>(node.devices.size()));
    uint32_t busy = 0;
    for (size_t d = 0; d < node.devices.size(); ++d) {
      FillDevice(devices[d], node.devices[d]);
      busy += node.devices[d].busy_job.empty() ? 0 : 1;
    }
    out.setActors(busy);
    if (const NodeCalibration* measured = source.calibration.Find(node.node_id)) {
      auto calibration = out.initCalibration();
      const ComputeRate compute = measured->Compute();
      calibration.setComputeFlops(compute.flops);
      calibration.setComputeHalfDim(compute.half_dim);
      calibration.setOptimizerBytesPerSecond(compute.optimizer_bytes_per_second);
      calibration.setIntraBusBytesPerSecond(measured->intra.bus_bytes_per_second);
      calibration.setIntraLatencySeconds(measured->intra.latency_seconds);
      calibration.setInterBusBytesPerSecond(measured->inter.bus_bytes_per_second);
      calibration.setInterLatencySeconds(measured->inter.latency_seconds);
      calibration.setJobId(CapText(measured->job_id));
      calibration.setMeasuredUnixMs(measured->measured_unix_ms);
      // The node's devices that were measured (one it no longer reports is left out).
      std::vector<std::pair<const DeviceInfo*, ComputeRate>> rates;
      for (const DeviceInfo& device : node.devices) {
        auto it = measured->device_compute.find(DeviceLabel(device));
        if (it != measured->device_compute.end()) rates.emplace_back(&device, it->second);
      }
      auto list = calibration.initDevices(static_cast<unsigned>(rates.size()));
      for (unsigned i = 0; i < rates.size(); ++i) {
        FillDevice(list[i].initDevice(), *rates[i].first);
        list[i].setComputeFlops(rates[i].second.flops);
        list[i].setComputeHalfDim(rates[i].second.half_dim);
        list[i].setOptimizerBytesPerSecond(rates[i].second.optimizer_bytes_per_second);
      }
    }
  }
  std::vector<const Job*> selected;
  for (const auto& id : source.job_order) {
    if (job_id.empty() || id == job_id) selected.push_back(&source.jobs.at(id));
  }
  auto job_list = status.initJobs(static_cast<unsigned>(selected.size()));
  for (size_t j = 0; j < selected.size(); ++j) {
    const Job& job = *selected[j];
    auto out = job_list[j];
    out.setJobId(CapText(job.id));
    out.setName(CapText(job.spec.name));
    out.setKind(CapText(std::string(placement::JobKindName(job.spec.kind))));
    out.setState(CapText(std::string(JobStateName(job.state))));
    out.setGeneration(job.generation);
    out.setWorldSize(static_cast<uint32_t>(job.World()));
    out.setError(CapText(job.WantsDevices() ? job.waiting_reason : job.error));
    out.setSubmittedUnixMs(job.submitted_unix_ms);
    out.setFinishedUnixMs(job.finished_unix_ms);
    out.setPhase(CapText(std::string(PhaseName(job.phase))));
    out.setBackend(CapText(job.backend));
    auto actors = out.initActors(static_cast<unsigned>(job.actors.size()));
    for (size_t a = 0; a < job.actors.size(); ++a) {
      const ActorRecord& actor = job.actors[a];
      actors[a].setRank(static_cast<uint32_t>(actor.rank));
      actors[a].setNodeId(CapText(actor.node_id));
      FillDevice(actors[a].initDevice(), actor.device);
      actors[a].setPid(actor.pid);
      actors[a].setState(CapText(std::string(ActorStateName(actor.state))));
      actors[a].setDetail(CapText(actor.detail));
      actors[a].setMetricsAddress(CapText(actor.metrics_address));
      actors[a].setAddress(CapText(actor.address));
    }
    auto results = out.initResults(static_cast<unsigned>(job.results.size()));
    for (size_t r = 0; r < job.results.size(); ++r) {
      const auto& result = job.results[r];
      results[r].setOp(CapText(result.op));
      results[r].setBytes(result.bytes);
      results[r].setRanks(result.ranks);
      results[r].setSeconds(result.seconds);
      results[r].setAlgorithmGBps(result.algorithm_gbps);
      results[r].setBusGBps(result.bus_gbps);
      results[r].setOk(result.ok);
      results[r].setDetail(CapText(result.detail));
    }
    if (job.spec.kind == placement::JobKind::kTrain) FillTrainProgress(out.initTrain(), job);
    if (job.spec.kind == placement::JobKind::kServe) FillServing(out.initServing(), job);
  }
}

namespace {

void FillGenerations(capnp::List<wire::GenerationStatus>::Builder generations, const Job& job) {
  for (size_t i = 0; i < job.generations.size(); ++i) {
    const GenerationRecord& record = job.generations[i];
    auto g = generations[static_cast<unsigned>(i)];
    g.setGeneration(record.generation);
    g.setStartedUnixMs(record.started_unix_ms);
    g.setEndedUnixMs(record.ended_unix_ms);
    g.setPlan(CapText(record.plan));
    g.setResumedStep(record.resumed_step);
    g.setResumedFrom(record.resumed_from);
    g.setResumeNote(record.resume_note);
    g.setLastStep(record.last_step);
    g.setEnding(CapText(std::string(EndingName(record.ending))));
    if (record.cause) {
      g.setCause(CapText(DescribeFault(*record.cause)));
      g.setCauseKind(CapText(std::string(FaultKindName(record.cause->kind))));
    }
    auto consequences = g.initConsequences(static_cast<unsigned>(record.consequences.size()));
    for (size_t c = 0; c < record.consequences.size(); ++c) {
      consequences.set(static_cast<unsigned>(c), CapText(record.consequences[c]));
    }
    g.setStepsLost(record.steps_lost);
    g.setRecoverySeconds(record.recovery_seconds);
    g.setDetectionSeconds(record.detection_seconds);
    g.setAbortSeconds(record.abort_seconds);
  }
}

}  // namespace

void FillTrainProgress(wire::TrainProgress::Builder out, const Job& job) {
  const TrainRecord& progress = job.train;
  const placement::TrainSpec& spec = job.spec.train;
  const placement::ParallelSpec& parallel = job.spec.parallel;
  out.setStep(static_cast<uint64_t>(progress.step));
  out.setLoggedStep(static_cast<uint64_t>(progress.logged_step));
  out.setSteps(static_cast<uint64_t>(spec.steps));
  out.setLoss(progress.loss);
  out.setTokensPerSecond(progress.tokens_per_second);
  out.setComputeSeconds(progress.compute_seconds);
  out.setCommSeconds(progress.comm_seconds);
  out.setBubbleSeconds(progress.bubble_seconds);
  if (progress.network_bytes_per_step) {
    auto bytes = out.initNetworkBytesPerStep();
    bytes.setWorld(progress.network_bytes_per_step->world);
    bytes.setTp(progress.network_bytes_per_step->tp);
    bytes.setPp(progress.network_bytes_per_step->pp);
    bytes.setDp(progress.network_bytes_per_step->dp);
  }
  out.setEtaSeconds(EtaSeconds(job));
  out.setLastCommittedStep(progress.last_committed_step);
  if (progress.memory_step) {
    out.setLastMemoryStep(progress.memory_step->manifest.step);
    out.setMemoryStoreBytes(MemoryStoreBytes(*progress.memory_step));
  }
  out.setCheckpointDir(CapText(progress.saving_dir));
  // An auto job not planned yet has no layout: its fields stay 0.
  if (!job.spec.parallel_auto || job.plan.planned) {
    out.setTp(static_cast<uint32_t>(parallel.tp));
    out.setPp(static_cast<uint32_t>(parallel.pp));
    out.setDp(static_cast<uint32_t>(parallel.dp));
    out.setZero(static_cast<uint32_t>(parallel.zero));
    out.setMicroBatch(static_cast<uint64_t>(placement::MicroBatchSize(parallel, spec.batch)));
    out.setMicroBatches(static_cast<uint64_t>(placement::MicroBatchCount(parallel, spec.batch)));
    FillParallelLayout(parallel, out.initLayout());
  }
  out.setBatch(static_cast<uint64_t>(spec.batch));
  out.setSeqLen(static_cast<uint64_t>(spec.seq_len));
  out.setAutoPlan(job.spec.parallel_auto);
  out.setPredictedStepSeconds(job.plan.step_seconds);
  out.setPredictedMemoryBytes(static_cast<uint64_t>(std::max<int64_t>(job.plan.memory_bytes, 0)));
  out.setPlanSummary(CapText(job.plan.summary));
  out.setPredictionCalibrated(job.PredictionCalibrated() && job.plan.step_seconds > 0);
  out.setResumedFromStep(progress.resumed_step);
  auto skipped = out.initSkippedCheckpoints(static_cast<unsigned>(progress.skipped.size()));
  for (size_t i = 0; i < progress.skipped.size(); ++i) {
    skipped[static_cast<unsigned>(i)].setStep(progress.skipped[i].step);
    skipped[static_cast<unsigned>(i)].setReason(CapText(progress.skipped[i].reason));
  }
  // init_from is used only by a start that resumes nothing, once that is decided.
  if (progress.start == TrainRecord::Start::kDecided && progress.resume_manifest.empty()) {
    out.setInitializedFrom(CapText(spec.init_from));
  }
  out.setElastic(job.Elastic());
  out.setMinActors(static_cast<uint32_t>(std::max(job.spec.elastic.min_actors, 0)));
  out.setMaxActors(static_cast<uint32_t>(std::max(job.spec.elastic.max_actors, 0)));
  FillGenerations(out.initGenerations(static_cast<unsigned>(job.generations.size())), job);
}

void FillServing(wire::ServingStatus::Builder out, const Job& job) {
  const ServingRecord& serving = job.serving;
  out.setUrl(CapText(serving.url));
  out.setModel(CapText(serving.model));
  out.setReady(serving.ready);
  out.setTp(static_cast<uint32_t>(job.spec.parallel.tp));
  out.setPp(static_cast<uint32_t>(job.spec.parallel.pp));
  out.setRunning(static_cast<uint64_t>(serving.running));
  out.setWaiting(static_cast<uint64_t>(serving.waiting));
  out.setTokensGenerated(static_cast<uint64_t>(serving.tokens_generated));
  out.setKvBlocks(static_cast<uint64_t>(serving.kv_blocks));
  out.setKvBlocksUsed(static_cast<uint64_t>(serving.kv_blocks_used));
  out.setPreemptions(static_cast<uint64_t>(serving.preemptions));
  const placement::ServeLimits& limits = job.spec.serve.limits;
  out.setMaxRunning(static_cast<uint32_t>(limits.max_running));
  out.setMaxTokensPerStep(static_cast<uint32_t>(limits.max_tokens_per_step));
  out.setBlockSize(static_cast<uint32_t>(limits.block_size));
  out.setElastic(job.Elastic());
  out.setPlanSummary(CapText(job.plan.summary));
  FillGenerations(out.initGenerations(static_cast<unsigned>(job.generations.size())), job);
}

ClusterGauges CountGauges(const Membership& membership, const std::map<std::string, Job>& jobs) {
  ClusterGauges gauges;
  for (const auto& [id, node] : membership.nodes()) {
    gauges.nodes[node.alive ? "alive" : "dead"] += 1;
    for (const auto& device : node.devices) {
      const std::string kind = device.kind == DeviceInfo::Kind::kCuda ? "cuda" : "cpu";
      const std::string state = !node.alive ? "dead" : device.busy_job.empty() ? "free" : "busy";
      gauges.devices[{kind, state}] += 1;
    }
  }
  for (const auto& [id, job] : jobs) {
    gauges.jobs[std::string(JobStateName(job.state))] += 1;
    if (job.state != JobState::kRunning) continue;
    for (const auto& actor : job.actors) {
      gauges.actors[std::string(ActorStateName(actor.state))] += 1;
    }
    if (job.spec.kind == placement::JobKind::kTrain) {
      gauges.train[id] = {static_cast<double>(job.train.step), job.train.loss,
                          job.train.tokens_per_second, static_cast<double>(job.generation),
                          static_cast<double>(job.train.last_committed_step)};
    }
  }
  return gauges;
}

}  // namespace shardline::coordinator
