#include "coordinator/job_history.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "checkpoint/file_system.h"
#include "common/status_macros.h"
#include "coordinator/scheduler.h"
#include "placement/parallel_layout.h"
#include "spdlog/spdlog.h"

namespace shardline::coordinator {
namespace {

nlohmann::json GenerationToJson(const GenerationRecord& g) {
  nlohmann::json entry = {{"generation", g.generation},
                          {"started_unix_ms", g.started_unix_ms},
                          {"ended_unix_ms", g.ended_unix_ms},
                          {"plan", g.plan},
                          {"world", g.world},
                          {"resumed_step", g.resumed_step},
                          {"resumed_from", g.resumed_from},
                          {"resume_note", g.resume_note},
                          {"last_step", g.last_step},
                          {"ending", EndingName(g.ending)},
                          {"consequences", g.consequences},
                          {"steps_lost", g.steps_lost},
                          {"recovery_seconds", g.recovery_seconds},
                          {"detection_seconds", g.detection_seconds},
                          {"abort_seconds", g.abort_seconds}};
  if (g.cause) {
    entry["cause"] = {{"kind", FaultKindName(g.cause->kind)}, {"unix_ms", g.cause->unix_ms},
                      {"rank", g.cause->rank},  {"node", g.cause->node},
                      {"step", g.cause->step},  {"detail", g.cause->detail}};
  }
  return entry;
}

// Throws on a malformed entry (JobFromRecord reports it).
GenerationRecord GenerationFromJson(const nlohmann::json& entry) {
  GenerationRecord g;
  g.generation = entry.at("generation").get<uint32_t>();
  g.started_unix_ms = entry.value("started_unix_ms", int64_t{0});
  g.ended_unix_ms = entry.value("ended_unix_ms", int64_t{0});
  g.plan = entry.value("plan", "");
  g.world = entry.value("world", 0);
  g.resumed_step = entry.value("resumed_step", int64_t{0});
  g.resumed_from = entry.value("resumed_from", std::string());
  g.resume_note = entry.value("resume_note", std::string());
  g.last_step = entry.value("last_step", int64_t{0});
  g.ending = ParseEnding(entry.value("ending", "failed")).value_or(Ending::kFailed);
  g.consequences = entry.value("consequences", std::vector<std::string>{});
  g.steps_lost = entry.value("steps_lost", int64_t{0});
  g.recovery_seconds = entry.value("recovery_seconds", -1.0);
  g.detection_seconds = entry.value("detection_seconds", -1.0);
  g.abort_seconds = entry.value("abort_seconds", -1.0);
  if (entry.contains("cause")) {
    const auto& cause = entry["cause"];
    Fault fault;
    fault.kind = ParseFaultKind(cause.value("kind", "")).value_or(FaultKind::kActorError);
    fault.unix_ms = cause.value("unix_ms", int64_t{0});
    fault.rank = cause.value("rank", -1);
    fault.node = cause.value("node", "");
    fault.step = cause.value("step", int64_t{-1});
    fault.detail = cause.value("detail", "");
    g.cause = fault;
  }
  return g;
}

// A running elastic job whose coordinator restarted: the generation that ran is over (its agents
// kill its actors when they register with the new coordinator, and its messages are fenced by
// generation); the job restarts from its newest committed step as the next one.
void TakeOverElasticJob(Job& job, TimePoint now, int64_t unix_ms) {
  job.state = JobState::kRunning;
  job.phase = Phase::kRestarting;
  job.restart_waiting_since = now;
  job.recovering_since = now;
  if (job.generations.empty() || job.generations.back().generation != job.generation) {
    GenerationRecord lost;
    lost.generation = job.generation;
    job.generations.push_back(lost);
  }
  GenerationRecord& ended = job.generations.back();
  if (ended.ending == Ending::kRunning) {
    ended.ending = Ending::kFault;
    ended.ended_unix_ms = unix_ms;
    Fault fault;
    fault.kind = FaultKind::kCoordinatorRestart;
    fault.at = now;
    fault.unix_ms = unix_ms;
    fault.step = job.train.step;
    fault.detail = "ended: the coordinator restarted";
    ended.cause = fault;
    ended.last_step = std::max(ended.last_step, job.train.step);
  }
  job.waiting_reason = "restarting after generation " + std::to_string(job.generation) +
                       " (the coordinator restarted)";
  if (job.spec.parallel_auto) ForgetAutoPlan(job);
}

}  // namespace

nlohmann::json JobRecord(const Job& job) {
  nlohmann::json record = {
      {"id", job.id},
      {"spec_yaml", job.spec_yaml},
      {"spec_dir", job.spec_dir},
      {"work_dir", job.work_dir},
      {"state", JobStateName(job.state)},
      {"error", job.error},
      {"generation", job.generation},
      {"submitted_unix_ms", job.submitted_unix_ms},
      {"finished_unix_ms", job.finished_unix_ms},
  };
  nlohmann::json results = nlohmann::json::array();
  for (const auto& r : job.results) {
    results.push_back({{"op", r.op}, {"bytes", r.bytes}, {"ranks", r.ranks},
                       {"seconds", r.seconds}, {"algorithm_gbps", r.algorithm_gbps},
                       {"bus_gbps", r.bus_gbps}, {"ok", r.ok}, {"detail", r.detail}});
  }
  record["results"] = results;
  if (job.spec.kind == placement::JobKind::kCommCheck) return record;
  nlohmann::json generations = nlohmann::json::array();
  for (const GenerationRecord& g : job.generations) generations.push_back(GenerationToJson(g));
  record["generations"] = std::move(generations);
  if (job.plan.planned) {
    // The spec says only `parallel: auto`: the history keeps what the planner chose.
    const placement::ParallelSpec& p = job.spec.parallel;
    record["plan"] = {{"tp", p.tp},
                      {"pp", p.pp},
                      {"dp", p.dp},
                      {"zero", p.zero},
                      {"micro_batch", p.micro_batch},
                      {"stage_layers", p.stage_layers},
                      {"schedule", std::string(placement::PipelineScheduleName(p.schedule))},
                      {"virtual_stages", p.virtual_stages},
                      {"recompute", std::string(placement::RecomputeModeName(p.recompute))},
                      {"step_seconds", job.plan.step_seconds},
                      {"memory_bytes", job.plan.memory_bytes},
                      {"summary", job.plan.summary}};
  }
  if (job.spec.kind == placement::JobKind::kServe) {
    // What a coordinator taking the job over cannot get from the spec: the checkpoint's shape read
    // at submit (the memory model, `parallel: auto`) and the address a generation listened on
    // (a port 0 resolved: clients keep using it).
    const model::ModelConfig& m = job.serve_model;
    record["serve"] = {{"listen", job.serve_listen},
                       {"model",
                        {{"layers", m.layers},
                         {"heads", m.heads},
                         {"d_model", m.d_model},
                         {"d_ff", m.d_ff},
                         {"vocab", m.vocab},
                         {"max_seq_len", m.max_seq_len},
                         {"tied_embeddings", m.tied_embeddings}}}};
    return record;
  }
  // NaN has no JSON spelling: a loss not yet reported is null.
  const nlohmann::json loss =
      std::isnan(job.train.loss) ? nlohmann::json() : nlohmann::json(job.train.loss);
  nlohmann::json skipped = nlohmann::json::array();
  for (const checkpoint::SkippedStep& step : job.train.skipped) {
    skipped.push_back({{"step", step.step}, {"reason", step.reason}});
  }
  record["train"] = {{"step", job.train.step},
                     {"loss", loss},
                     {"last_committed_step", job.train.last_committed_step},
                     {"committed_here", job.train.committed_here},
                     {"resumed_step", job.train.resumed_step},
                     {"skipped_checkpoints", skipped}};
  return record;
}

absl::StatusOr<Job> JobFromRecord(const nlohmann::json& record, const std::string& where,
                                  TimePoint now, int64_t unix_ms) try {
  Job job;
  job.id = record.at("id").get<std::string>();
  job.spec_yaml = record.at("spec_yaml").get<std::string>();
  // Records from before the folders were kept resolve against the coordinator's.
  job.spec_dir = record.value("spec_dir", AbsoluteDir("."));
  job.work_dir = record.value("work_dir", AbsoluteDir("."));
  auto spec = placement::ParseJobSpec(job.spec_yaml, where,
                                      placement::PathBase{job.spec_dir, job.work_dir});
  if (!spec.ok()) return spec.status();
  job.spec = *spec;
  job.backend = std::string(placement::BackendName(placement::ResolveBackend(job.spec)));
  if (job.spec.parallel_auto) job.auto_max_actors = AutoMaxActors(job.spec);
  if (job.spec.kind == placement::JobKind::kTrain) {
    job.train.saving_dir = ResolveUnder(job.work_dir, job.spec.train.checkpoint.dir);
    const auto train = record.value("train", nlohmann::json::object());
    job.train.step = train.value("step", int64_t{0});
    if (train.contains("loss") && train["loss"].is_number()) {
      job.train.loss = train["loss"].get<double>();
    }
    job.train.last_committed_step = train.value("last_committed_step", int64_t{-1});
    job.train.committed_here = train.value("committed_here", false);
    job.train.resumed_step = train.value("resumed_step", int64_t{0});
    for (const auto& skipped : train.value("skipped_checkpoints", nlohmann::json::array())) {
      job.train.skipped.push_back(
          {skipped.at("step").get<int64_t>(), skipped.at("reason").get<std::string>()});
    }
  }
  for (const auto& entry : record.value("generations", nlohmann::json::array())) {
    job.generations.push_back(GenerationFromJson(entry));
  }
  if (job.spec.kind == placement::JobKind::kServe && record.contains("serve")) {
    const auto& serve = record["serve"];
    job.serve_listen = serve.value("listen", "");
    const auto& m = serve.at("model");
    job.serve_model.layers = m.at("layers").get<int64_t>();
    job.serve_model.heads = m.at("heads").get<int64_t>();
    job.serve_model.d_model = m.at("d_model").get<int64_t>();
    job.serve_model.d_ff = m.at("d_ff").get<int64_t>();
    job.serve_model.vocab = m.at("vocab").get<int64_t>();
    job.serve_model.max_seq_len = m.at("max_seq_len").get<int64_t>();
    job.serve_model.tied_embeddings = m.at("tied_embeddings").get<bool>();
  }
  const std::string state = record.at("state").get<std::string>();
  if (job.spec.parallel_auto && state != "pending" && record.contains("plan")) {
    // What ran (or was about to): a job still pending plans afresh when it starts.
    const auto& plan = record["plan"];
    placement::ParallelSpec layout;
    layout.tp = plan.at("tp").get<int>();
    layout.pp = plan.at("pp").get<int>();
    layout.dp = plan.at("dp").get<int>();
    layout.zero = plan.at("zero").get<int>();
    layout.micro_batch = plan.value("micro_batch", int64_t{0});
    layout.stage_layers = plan.value("stage_layers", std::vector<int>{});
    // Records from before the schedules and recomputation ran 1F1B without recomputing.
    auto schedule = placement::ParsePipelineSchedule(plan.value("schedule", "1f1b"));
    if (!schedule.ok()) return Annotate(schedule.status(), where + ": plan.schedule");
    layout.schedule = *schedule;
    layout.virtual_stages = plan.value("virtual_stages", 1);
    auto recompute = placement::ParseRecomputeMode(plan.value("recompute", "none"));
    if (!recompute.ok()) return Annotate(recompute.status(), where + ": plan.recompute");
    layout.recompute = *recompute;
    absl::Status applied = absl::OkStatus();
    if (job.spec.kind == placement::JobKind::kServe) {
      // A serve plan is its tp × pp, as the scheduler sets it (ChooseServe).
      job.spec.parallel = layout;
      job.spec.actors = layout.world();
    } else {
      applied = placement::ApplyPlannedLayout(job.spec, layout);
    }
    if (applied.ok()) {
      job.plan.planned = true;
      job.plan.step_seconds = plan.value("step_seconds", 0.0);
      job.plan.memory_bytes = plan.value("memory_bytes", int64_t{0});
      job.plan.summary = plan.value("summary", "");
    } else {
      spdlog::warn("{}: the recorded plan does not apply: {}", where,
                   std::string(applied.message()));
    }
  }
  job.error = record.value("error", "");
  job.generation = record.value("generation", 0u);
  job.submitted_unix_ms = record.value("submitted_unix_ms", int64_t{0});
  job.finished_unix_ms = record.value("finished_unix_ms", int64_t{0});
  for (const auto& r : record.value("results", nlohmann::json::array())) {
    job.results.push_back({r.at("op"), r.at("bytes"), r.at("ranks"), r.at("seconds"),
                           r.at("algorithm_gbps"), r.at("bus_gbps"), r.at("ok"),
                           r.value("detail", "")});
  }
  if (state == "succeeded") {
    job.state = JobState::kSucceeded;
  } else if (state == "cancelled") {
    job.state = JobState::kCancelled;
  } else if (state == "pending") {
    job.state = JobState::kPending;  // still wanted: it starts when devices come
  } else if (state == "running" && job.Elastic()) {
    TakeOverElasticJob(job, now, unix_ms);
  } else {
    job.state = JobState::kFailed;
    if (state == "running") {
      job.error = "the coordinator restarted while generation " + std::to_string(job.generation) +
                  " was running";
      job.finished_unix_ms = unix_ms;
    }
  }
  return job;
} catch (const std::exception& e) {
  return absl::InvalidArgumentError(where + ": " + e.what());
}

void JobHistory::Save(const Job& job) const {
  if (state_dir_.empty()) return;
  const auto path = std::filesystem::path(state_dir_) / "jobs" / (job.id + ".json");
  auto status = checkpoint::WriteFileAtomically(checkpoint::DefaultFileSystem(), path.string(),
                                                JobRecord(job).dump(2));
  if (!status.ok()) spdlog::error("persisting job {}: {}", job.id, std::string(status.message()));
}

std::vector<Job> JobHistory::Load(TimePoint now) const {
  std::vector<Job> loaded;
  if (state_dir_.empty()) return loaded;
  const auto dir = std::filesystem::path(state_dir_) / "jobs";
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    if (entry.path().extension() != ".json") continue;
    const std::string where = entry.path().string();
    nlohmann::json record;
    try {
      std::ifstream in(entry.path());
      record = nlohmann::json::parse(in);
    } catch (const std::exception& e) {
      spdlog::error("skipping unreadable job record {}: {}", where, e.what());
      continue;
    }
    auto job = JobFromRecord(record, where, now, UnixMillis());
    if (!job.ok()) {
      spdlog::error("skipping {}: {}", where, std::string(job.status().message()));
      continue;
    }
    loaded.push_back(std::move(*job));
  }
  if (ec) spdlog::error("reading the job history in {}: {}", dir.string(), ec.message());
  std::sort(loaded.begin(), loaded.end(), [](const Job& a, const Job& b) {
    return a.submitted_unix_ms < b.submitted_unix_ms;
  });
  return loaded;
}

}  // namespace shardline::coordinator
