// `shardline up`: a whole cluster on this machine (a coordinator and one agent as child
// processes on loopback), the default job run on it with live progress, then a clean shutdown.
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <thread>

#include "cli/commands.h"
#include "cli/coordinator_client.h"
#include "cli/coordinator_start.h"
#include "cli/status_view.h"
#include "common/process.h"
#include "common/status_macros.h"
#include "placement/job_spec.h"

namespace shardline::cli {
namespace {

// Where the default job writes its checkpoints, relative to the current directory (kept after
// `up` exits, for `shardline generate`).
constexpr std::string_view kDefaultCheckpointDir = "checkpoints/shardline-up";

using protocol::Str;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

// The child daemons of one `up`; stopping them is the destructor's job, so that every way out
// (success, failure, Ctrl-C) leaves no process behind.
class LocalCluster {
 public:
  explicit LocalCluster(fs::path dir) : dir_(std::move(dir)) {}
  ~LocalCluster() { Stop(); }

  // `curve`: the key dir both daemons use (the coordinator's pair, the agent's node key), or
  // --insecure.
  absl::Status Start(int devices, const std::string& log_level, const protocol::CurveSetup& curve) {
    const std::string self = SelfExecutable();
    const std::vector<std::string> curve_flags = curve.Flags();
    SpawnOptions coordinator;
    coordinator.argv = {self, "coordinator", "--listen", "tcp://127.0.0.1:0",
                        "--endpoint-file", (dir_ / "endpoint").string(),
                        "--metrics", "127.0.0.1:0", "--state-dir", (dir_ / "state").string(),
                        "--log-level", log_level};
    coordinator.argv.insert(coordinator.argv.end(), curve_flags.begin(), curve_flags.end());
    coordinator.log_path = (dir_ / "coordinator.log").string();
    ASSIGN_OR_RETURN(coordinator_pid_, Spawn(coordinator));
    ASSIGN_OR_RETURN(endpoint_, AwaitCoordinatorEndpoint(coordinator_pid_, dir_ / "endpoint", 15s,
                                                         dir_ / "coordinator.log"));
    SpawnOptions agent;
    agent.argv = {self, "agent", "--coordinator", endpoint_, "--devices",
                  "cpu:" + std::to_string(devices), "--node-id", "local", "--metrics",
                  "127.0.0.1:0", "--log-dir", (dir_ / "actors").string(), "--log-level",
                  log_level};
    agent.argv.insert(agent.argv.end(), curve_flags.begin(), curve_flags.end());
    agent.log_path = (dir_ / "agent.log").string();
    ASSIGN_OR_RETURN(agent_pid_, Spawn(agent));
    return absl::OkStatus();
  }

  void Stop() {
    // The agent first: it kills its actors on the way out.
    if (agent_pid_ > 0) Terminate(agent_pid_, 5s);
    if (coordinator_pid_ > 0) Terminate(coordinator_pid_, 5s);
    agent_pid_ = coordinator_pid_ = 0;
  }

  const std::string& endpoint() const { return endpoint_; }
  const fs::path& dir() const { return dir_; }

 private:
  fs::path dir_;
  std::string endpoint_;
  pid_t coordinator_pid_ = 0;
  pid_t agent_pid_ = 0;
};

// What of the job's progress has been printed already.
struct Shown {
  size_t results = 0;
  std::string phase;
  uint64_t train_step = 0;
  int64_t committed_step = -1;
  bool start = false;  // where a train job started from
  size_t generations_ended = 0;  // of a train or serve job: the ended generations already shown
  // A serve job: its service as last shown (URL and readiness), and its counters' last line.
  std::string serving;
  uint64_t tokens_generated = 0;
  std::chrono::steady_clock::time_point counters_shown;
};

void PrintProgress(wire::JobStatus::Reader job, Shown* shown,
                   std::chrono::steady_clock::time_point started) {
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  char stamp[32];
  std::snprintf(stamp, sizeof(stamp), "[%6.1fs] ", elapsed);
  const std::string phase = Str(job.getState()) + (job.getPhase().size() ? "/" + Str(job.getPhase()) : "");
  if (phase != shown->phase) {
    std::cout << stamp << "job " << Str(job.getJobId()) << " " << phase;
    if (Str(job.getState()) == "pending" && job.getError().size()) std::cout << " (" << Str(job.getError()) << ")";
    std::cout << std::endl;
    shown->phase = phase;
  }
  // A train job: one line per newly reported step (the actors report every log_interval steps)
  // or newly committed checkpoint.
  if (job.hasTrain()) {
    const auto train = job.getTrain();
    if (!shown->start && Str(job.getState()) == "running") {
      for (const std::string& line : FormatTrainStart(job)) std::cout << stamp << line << std::endl;
      shown->start = true;
    }
    for (const std::string& line : NewlyEndedGenerations(job, &shown->generations_ended)) {
      std::cout << stamp << line << std::endl;
    }
    if (train.getLoggedStep() != shown->train_step ||
        train.getLastCommittedStep() != shown->committed_step) {
      shown->train_step = train.getLoggedStep();
      shown->committed_step = train.getLastCommittedStep();
      std::cout << stamp << FormatTrainProgress(job) << std::endl;
    }
  }
  // A serve job: a line when its service changes (loading, listening, ready, restarted), and its
  // counters at most every 10 s while it generates.
  if (job.hasServing() && Str(job.getState()) == "running") {
    const auto serving = job.getServing();
    for (const std::string& line : NewlyEndedGenerations(job, &shown->generations_ended)) {
      std::cout << stamp << line << std::endl;
    }
    const std::string state = serving.getUrl().size() == 0 ? "loading"
                              : serving.getReady()         ? "ready " + Str(serving.getUrl())
                                                           : "not ready";
    const auto now = std::chrono::steady_clock::now();
    if (state != shown->serving ||
        (serving.getTokensGenerated() != shown->tokens_generated &&
         now - shown->counters_shown >= 10s)) {
      std::cout << stamp << FormatServing(serving) << std::endl;
      if (state != shown->serving && serving.getReady()) {
        std::cout << stamp << "try: curl " << Str(serving.getUrl())
                  << "/v1/completions -H 'Content-Type: application/json' -d '{\"model\": \""
                  << Str(serving.getModel())
                  << "\", \"prompt\": \"the cat \", \"max_tokens\": 16}'   (Ctrl-C stops it)"
                  << std::endl;
      }
      shown->serving = state;
      shown->tokens_generated = serving.getTokensGenerated();
      shown->counters_shown = now;
    }
  }
  auto results = job.getResults();
  // One line per finished op: its largest size, the figure people compare.
  for (; shown->results < results.size(); ++shown->results) {
    auto r = results[shown->results];
    const bool last_of_op = shown->results + 1 == results.size() ||
                            Str(results[shown->results + 1].getOp()) != Str(r.getOp());
    if (!last_of_op) continue;
    char line[200];
    if (r.getBytes() > 0) {
      std::snprintf(line, sizeof(line), "%-15s up to %-9s bus bandwidth %7.3f GB/s  %s",
                    Str(r.getOp()).c_str(), FormatBytes(r.getBytes()).c_str(), r.getBusGBps(),
                    r.getOk() ? "verified" : "MISMATCH");
    } else {
      std::snprintf(line, sizeof(line), "%-15s %8.1f us  %s", Str(r.getOp()).c_str(),
                    r.getSeconds() * 1e6, r.getOk() ? "ok" : "FAILED");
    }
    std::cout << stamp << line << std::endl;
  }
}

}  // namespace

namespace {

// The layout of the default job on `actors` CPU devices: tensor parallelism of 2 and a pipeline of
// 2 when the devices allow it (4 devices: tp=2 × pp=2), data parallelism for the rest.
placement::ParallelSpec DefaultLayout(int actors) {
  placement::ParallelSpec layout;
  layout.tp = actors % 2 == 0 ? 2 : 1;
  layout.pp = (actors / layout.tp) % 2 == 0 ? 2 : 1;
  layout.dp = actors / (layout.tp * layout.pp);
  return layout;
}

}  // namespace

absl::StatusOr<std::string> DefaultTrainingTextPath() {
  std::vector<fs::path> tried;
  std::error_code error;
  const fs::path exe = fs::read_symlink("/proc/self/exe", error);
  if (!error) {
    for (fs::path dir = exe.parent_path(); !dir.empty(); dir = dir.parent_path()) {
      tried.push_back(dir / kDefaultTrainingText);
      if (fs::exists(tried.back())) return tried.back().string();
      if (dir == dir.root_path() || tried.size() >= 4) break;
    }
  }
  tried.push_back(fs::current_path() / kDefaultTrainingText);
  if (fs::exists(tried.back())) return tried.back().string();
  std::string looked;
  for (const fs::path& path : tried) looked += "\n  " + path.string();
  return absl::NotFoundError(absl::StrCat("the default job trains on ", kDefaultTrainingText,
                                          " of the source tree, found in none of:", looked,
                                          "\n(run from the source tree, or give --job)"));
}

std::string DefaultJobYaml(int actors, const std::string& text) {
  const placement::ParallelSpec layout = DefaultLayout(actors);
  // 16 sequences of 128 bytes per data-parallel rank, in micro-batches of 4: 4 micro-batches fill
  // the pipeline.
  const int batch = 16 * layout.dp;
  return "# The default job of `shardline up`: a small Llama (RMSNorm, SwiGLU, rotary positions,\n"
         "# grouped-query attention) trained on a public-domain book, sharded over every local "
         "CPU\n"
         "# device.\n"
         "name: shardline-up\n"
         "kind: train\n"
         "devices: cpu\n"
         "parallel: {tp: " +
         std::to_string(layout.tp) + ", pp: " + std::to_string(layout.pp) +
         ", dp: " + std::to_string(layout.dp) +
         ", zero: 0}\n"
         "model:\n"
         "  arch: llama\n"
         "  layers: 4\n"
         "  heads: 4\n"
         "  kv_heads: 2\n"
         "  d_model: 128\n"
         "  max_seq_len: 128\n"
         "data:\n"
         "  path: " +
         text +
         "\n"
         "optimizer:\n"
         "  lr: 2.0e-3\n"
         "  warmup_steps: 30\n"
         "  weight_decay: 0.0\n"
         "steps: 600\n"
         "batch: " +
         std::to_string(batch) +
         "\n"
         "micro_batch: 4\n"
         "seq_len: 128\n"
         "seed: 1\n"
         "checkpoint:\n"
         "  dir: " +
         std::string(kDefaultCheckpointDir) +
         "\n"
         "  interval: 200\n"
         "log_interval: 50\n";
}

int DefaultUpDevices(int cores) { return cores >= 4 ? 4 : 2; }

int Up(const UpOptions& given) {
  UpOptions options = given;
  if (options.devices == 0) options.devices = DefaultUpDevices(UsableCpus());
  if (options.devices < 2 || options.devices > 256) {
    std::cerr << "error: --devices must be in 2..256, got " << options.devices << "\n";
    return 2;
  }
  std::string yaml;
  if (options.job_path.empty()) {
    const absl::StatusOr<std::string> text = DefaultTrainingTextPath();
    if (!text.ok()) {
      std::cerr << "error: " << text.status().message() << "\n";
      return 2;
    }
    yaml = DefaultJobYaml(options.devices, *text);
  }
  std::string source = "the default job";
  // The default job's relative paths resolve against the current directory, like a spec file's
  // in it.
  SubmitFolders folders = FoldersOf("./default-job.yaml");
  if (!options.job_path.empty()) {
    std::ifstream in(options.job_path);
    if (!in) {
      std::cerr << "error: cannot read job spec " << options.job_path << "\n";
      return 2;
    }
    yaml = ReadWholeFile(options.job_path);
    source = options.job_path;
    folders = FoldersOf(options.job_path);
  }
  auto spec = placement::ParseJobSpec(yaml, source,
                                      placement::PathBase{folders.spec_dir, folders.work_dir});
  if (!spec.ok()) {
    std::cerr << "error: " << spec.status().message() << "\n";
    return 2;
  }
  if (spec->actors > options.devices) {
    std::cerr << "error: " << source << " wants " << spec->actors << " actors but --devices is "
              << options.devices << "\n";
    return 2;
  }

  fs::path dir = options.work_dir;
  if (dir.empty()) {
    std::string tmpl = (fs::temp_directory_path() / "shardline-up-XXXXXX").string();
    if (!mkdtemp(tmpl.data())) {
      std::cerr << "error: cannot create a work directory under /tmp\n";
      return 1;
    }
    dir = tmpl;
  }
  fs::create_directories(dir);
  // Throwaway keys of this cluster alone: the local case stays one command, and is as closed to
  // other users of this machine as a cluster of many hosts (its keys are mode 0600). A work dir
  // of an earlier run keeps its keys.
  ClientOptions client_options;
  client_options.curve.insecure = options.insecure;
  if (!options.insecure) {
    client_options.curve.key_dir = (dir / "keys").string();
    if (!fs::exists(protocol::KeyDir{dir / "keys"}.Allowlist())) {
      if (auto status = protocol::MakeKeyDir(dir / "keys"); !status.ok()) {
        std::cerr << "error: " << status.message() << "\n";
        return 1;
      }
    }
  }
  InstallStopHandlers();
  const auto started = std::chrono::steady_clock::now();
  int exit_code = 1;
  {
    LocalCluster cluster(dir);
    std::cout << "Starting a local cluster: coordinator + 1 agent with " << options.devices
              << " CPU devices (logs in " << dir.string() << ")" << std::endl;
    if (options.insecure) {
      std::cout << "warning: --insecure: the coordinator's port takes anyone on this machine "
                   "(no CURVE keys)"
                << std::endl;
    }
    if (auto status = cluster.Start(options.devices, options.log_level, client_options.curve);
        !status.ok()) {
      std::cerr << "error: " << status.message() << "\n";
      return 1;
    }
    client_options.coordinator = cluster.endpoint();
    auto client = ConnectToCoordinator(client_options);
    if (!client.ok()) {
      std::cerr << "error: " << client.status().message() << "\n";
      return 1;
    }
    auto message = (*client)->NewMessage();
    auto submit = message->payload().initSubmitJob();
    submit.setSpecYaml(yaml);
    submit.setSourceName(source);
    submit.setSpecDir(folders.spec_dir);
    submit.setWorkDir(folders.work_dir);
    auto reply = (*client)->Call(*message, 10s);
    if (!reply.ok()) {
      std::cerr << "error: submitting " << source << ": " << reply.status().message() << "\n";
      return 1;
    }
    const std::string job_id = Str((*reply)->envelope().getPayload().getSubmitJobReply().getJobId());
    std::cout << "Coordinator " << cluster.endpoint() << "; submitted " << source << " as job "
              << job_id << " (" << spec->actors << " actors)" << std::endl;
    if (!options.insecure) {
      std::cout << "CURVE keys of this cluster: " << client_options.curve.key_dir
                << " (shardline status --coordinator " << cluster.endpoint() << " --keys "
                << client_options.curve.key_dir << ")" << std::endl;
    }

    Shown shown;
    std::string final_state;
    while (final_state.empty()) {
      if (StopRequested().load()) {
        std::cout << "\nInterrupted: cancelling job " << job_id << " and stopping the cluster"
                  << std::endl;
        auto cancel = (*client)->NewMessage();
        cancel->payload().initCancelJob().setJobId(job_id);
        (void)(*client)->Call(*cancel, 2s);
        // A service runs until it is stopped: Ctrl-C is its normal end.
        return spec->kind == placement::JobKind::kServe ? 0 : 130;
      }
      auto status = FetchStatus(**client, job_id, 5s);
      if (!status.ok()) {
        std::cerr << "error: " << status.status().message() << "\n";
        return 1;
      }
      auto job = (*status)->envelope().getPayload().getClusterStatus().getJobs()[0];
      PrintProgress(job, &shown, started);
      const std::string state = Str(job.getState());
      if (state == "succeeded" || state == "failed" || state == "cancelled") {
        final_state = state;
        std::cout << "\n" << FormatJob(job) << std::endl;
        exit_code = state == "succeeded" ? 0 : 1;
      } else {
        std::this_thread::sleep_for(200ms);
      }
    }
    cluster.Stop();
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  if (exit_code == 0) {
    std::cout << "Done in " << static_cast<int>(seconds + 0.5) << " s; the cluster is shut down."
              << std::endl;
    if (spec->kind == placement::JobKind::kTrain && !spec->train.checkpoint.dir.empty()) {
      // A sample from the checkpoint the job committed, greedy, as `shardline generate` would.
      GenerateCommandOptions sample;
      sample.checkpoint = spec->train.checkpoint.dir;
      // Sampled (temperature 0.7, a fixed seed): a small model's greedy text repeats itself.
      sample.prompt = "The hacker ";
      // As much as the context holds after the prompt (bytes: the most tokens it can be).
      sample.max_new_tokens = static_cast<int>(std::min<int64_t>(
          100, spec->train.model.max_seq_len - static_cast<int64_t>(sample.prompt.size())));
      sample.temperature = 0.7;
      sample.seed = 1;
      std::cout << "\nA sample from the trained model (shardline generate --checkpoint "
                << spec->train.checkpoint.dir << " --prompt \"" << sample.prompt
                << "\" --temperature 0.7 --seed 1):\n  " << std::flush;
      if (Generate(sample) != 0) exit_code = 1;
    }
    if (!options.keep && options.work_dir.empty()) fs::remove_all(dir);
  } else {
    std::cout << "The job did not succeed; logs kept in " << dir.string() << std::endl;
  }
  return exit_code;
}

}  // namespace shardline::cli
