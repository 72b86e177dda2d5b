// What a checkpoint save costs training, for the GPT-2-small shape on 2 tensor-parallel ranks
// (forked processes over shared memory, tests/support/forked_world.h), in one run:
//   1. asynchronous: training::TrainSharded, the production loop, saving every --interval steps:
//      per save how long the loop stopped (ShardedTrainResult::save_stall_seconds), per step its
//      time and how much of it a background write overlapped (the writer competes with training
//      for the cores and the disk);
//   2. synchronous: the same job in a loop of our own whose saves wait for the file (CopyState,
//      then AsyncShardWriter Start and WaitIdle), which is what a loop without async saves stalls;
//   3. the writer alone against dd, --write-rounds times, in the synchronous run's processes: both
//      ranks' state written by the writer, and one `dd conv=fsync` per rank of its file's size
//      (all at once, as the ranks write at once), one after the other (in alternating order) into
//      fresh files of the same folder. Side by side, because this VM's disk and page cache drift
//      2-5x within a minute: figures taken minutes apart do not compare.
// Per save it prints both stalls against the time of a step no write overlaps, and the writer's
// bandwidth while training; per round the writer's against dd's; and the verdict against the
// targets: stall ≤ 5% of a step, write ≥ 80% of dd's bandwidth (the median of the rounds' ratios).
// Exits 0 unless something failed to run. Not part of ctest.
//
//   build/bench/checkpoint_bench [--steps 6] [--interval 2] [--batch 4] [--micro-batch B]
//       [--seq-len 256] [--dir /tmp] [--threads T] [--layers 12] [--heads 12] [--d-model 768]
//       [--vocab 50257] [--max-seq-len 1024] [--write-rounds 5]
//
// Threads per rank default to max(1, cores / 2). Checkpoints and dd's files go into a fresh folder
// under --dir (default /tmp), removed at the end; it must have room for every save of one run
// (about 0.75 GB per rank per save for GPT-2 small).
#include <omp.h>
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint/file_system.h"
#include "checkpoint/layout.h"
#include "common/status_macros.h"
#include "kernels/allocator.h"
#include "kernels/cpu/cpu_backend.h"
#include "placement/job_spec.h"
#include "placement/parallel_layout.h"
#include "tests/support/forked_world.h"
#include "worker/checkpoint/shard_writer.h"
#include "worker/model/data/sampler.h"
#include "worker/model/sharded_gpt.h"
#include "worker/training/sharded_trainer.h"
#include "worker/training/starting_point.h"
#include "worker/training/trainer.h"

namespace shardline {
namespace {

namespace fs = std::filesystem;

constexpr int kTp = 2;  // the world: 2 ranks, each holding half of every matrix
constexpr double kStallTarget = 0.05;
constexpr double kWriteTarget = 0.80;
constexpr double kGB = 1e9;

struct BenchOptions {
  int steps = 6;
  int interval = 2;
  int batch = 4;
  int micro_batch = 0;  // 0: the whole batch (no pipeline, so one micro-batch is fastest)
  int seq_len = 256;
  int threads = 0;  // per rank; 0: max(1, cores / kTp)
  int layers = 12;
  int heads = 12;
  int d_model = 768;
  int vocab = 50257;
  int max_seq_len = 1024;
  int write_rounds = 5;  // of the writer against dd
  std::string dir = "/tmp";
};

// Seconds on the monotonic clock, which every process of the machine shares: the ranks' write
// windows and steps are compared across processes.
double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string JobYaml(const BenchOptions& o, const std::string& checkpoint_dir) {
  std::ostringstream yaml;
  yaml << "name: checkpoint-bench\nkind: train\ndevices: cpu\n"
       << "micro_batch: " << (o.micro_batch > 0 ? o.micro_batch : o.batch) << "\n"
       << "parallel: {tp: " << kTp << ", pp: 1, dp: 1, zero: 0}\n"
       << "model: {layers: " << o.layers << ", heads: " << o.heads << ", d_model: " << o.d_model
       << ", vocab: " << o.vocab << ", max_seq_len: " << o.max_seq_len << "}\n"
       << "data: {synthetic: {seed: 1, bytes: 1MiB}}\n"
       << "optimizer: {lr: 1.0e-4}\n"
       << "steps: " << o.steps << "\nbatch: " << o.batch << "\nseq_len: " << o.seq_len << "\n"
       << "seed: 1\n"
       << "checkpoint: {dir: " << checkpoint_dir << ", interval: " << o.interval << "}\n"
       << "log_interval: 1\n";
  return yaml.str();
}

// One save of one rank as the file system saw it: from the writer's first call for it (the step
// folder's CreateDirectories, AsyncShardWriter::Write's first act) to its file's commit.
struct WriteWindow {
  double start = 0, committed = 0;
  int64_t bytes = 0;
};

// Times the writer's saves from outside it, passing every call on to DefaultFileSystem.
class TimingFileSystem final : public checkpoint::FileSystem {
 public:
  TimingFileSystem() : base_(checkpoint::DefaultFileSystem()) {}

  absl::StatusOr<std::unique_ptr<checkpoint::WritableFile>> NewAtomicFile(
      const std::string& path) override {
    ASSIGN_OR_RETURN(std::unique_ptr<checkpoint::WritableFile> file, base_.NewAtomicFile(path));
    double start;
    {
      std::lock_guard<std::mutex> lock(mu_);
      start = pending_start_ > 0 ? pending_start_ : Now();
      pending_start_ = 0;
    }
    return std::unique_ptr<checkpoint::WritableFile>(
        std::make_unique<TimedFile>(std::move(file), start, *this));
  }
  absl::Status CreateDirectories(const std::string& path) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      pending_start_ = Now();
    }
    return base_.CreateDirectories(path);
  }
  absl::Status Rename(const std::string& from, const std::string& to) override {
    return base_.Rename(from, to);
  }
  absl::Status RemoveAll(const std::string& path) override { return base_.RemoveAll(path); }

  std::vector<WriteWindow> windows() {
    std::lock_guard<std::mutex> lock(mu_);
    return windows_;
  }

 private:
  class TimedFile final : public checkpoint::WritableFile {
   public:
    TimedFile(std::unique_ptr<checkpoint::WritableFile> base, double start, TimingFileSystem& owner)
        : base_(std::move(base)), owner_(owner) {
      window_.start = start;
    }
    absl::Status Append(std::span<const std::byte> data) override {
      window_.bytes += static_cast<int64_t>(data.size());
      return base_->Append(data);
    }
    absl::Status Commit() override {
      RETURN_IF_ERROR(base_->Commit());
      window_.committed = Now();
      std::lock_guard<std::mutex> lock(owner_.mu_);
      owner_.windows_.push_back(window_);
      return absl::OkStatus();
    }

   private:
    std::unique_ptr<checkpoint::WritableFile> base_;
    TimingFileSystem& owner_;
    WriteWindow window_;
  };

  checkpoint::FileSystem& base_;
  std::mutex mu_;
  double pending_start_ = 0;
  std::vector<WriteWindow> windows_;
};

// What one rank measured, passed from the child to the parent as a text file.
struct StepRecord {
  int64_t step = 0;
  double seconds = 0;  // the training step itself
  double end = 0;      // on the shared clock, when the loop finished the step and its save
  float loss = 0;      // equal in both runs when the synchronous loop trains the same job
};
struct SaveRecord {
  int64_t step = 0;
  double stall = 0;  // how long the loop stopped
  double copy = 0;   // of which the copy into the staging buffer (synchronous run only)
  WriteWindow write;
};
// One round of the writer against dd (synchronous run, rank 0's record only): both ranks' files
// written by the writer alone, and by dd, one after the other into fresh files.
struct WriteRound {
  double dd_gbps = 0;
  double writer_gbps = 0;
};
struct RankRecord {
  std::vector<StepRecord> steps;
  std::vector<SaveRecord> saves;
  std::vector<WriteRound> rounds;
};

void WriteRecord(const std::string& path, const RankRecord& record) {
  std::ofstream out(path);
  out.precision(17);
  for (const StepRecord& s : record.steps) {
    out << "step " << s.step << " " << s.seconds << " " << s.end << " " << s.loss << "\n";
  }
  for (const SaveRecord& s : record.saves) {
    out << "save " << s.step << " " << s.stall << " " << s.copy << " " << s.write.start << " "
        << s.write.committed << " " << s.write.bytes << "\n";
  }
  for (const WriteRound& r : record.rounds) {
    out << "round " << r.dd_gbps << " " << r.writer_gbps << "\n";
  }
}

bool ReadRecord(const std::string& path, RankRecord& record) {
  std::ifstream in(path);
  if (!in) return false;
  for (std::string tag; in >> tag;) {
    if (tag == "step") {
      StepRecord s;
      in >> s.step >> s.seconds >> s.end >> s.loss;
      record.steps.push_back(s);
    } else if (tag == "save") {
      SaveRecord s;
      in >> s.step >> s.stall >> s.copy >> s.write.start >> s.write.committed >> s.write.bytes;
      record.saves.push_back(s);
    } else if (tag == "round") {
      WriteRound r;
      in >> r.dd_gbps >> r.writer_gbps;
      record.rounds.push_back(r);
    } else {
      return false;
    }
  }
  return !record.steps.empty();
}

void SetThreads(int threads) {
  omp_set_num_threads(threads);
  setenv("OPENBLAS_NUM_THREADS", std::to_string(threads).c_str(), 1);  // as sharded_step_bench
}

std::string RecordPath(const std::string& dir, const std::string& run, int rank) {
  return dir + "/" + run + "-rank-" + std::to_string(rank) + ".txt";
}

std::string CommandOutput(const std::string& command) {
  std::string out;
  if (FILE* pipe = popen(command.c_str(), "r")) {
    char buffer[256];
    while (fgets(buffer, sizeof(buffer), pipe)) out += buffer;
    pclose(pipe);
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return out;
}

struct DdRun {
  bool ok = false;
  int64_t bytes = 0;             // all dd's together
  double seconds = 0;            // wall time of all of them, started together
  std::vector<double> own_gbps;  // each dd's own figure: its bytes over its own time
  double gbps() const { return bytes / seconds / kGB; }
};

// One dd per entry of `bytes`, all at once, each writing ⌈bytes / MiB⌉ MiB into `dir` with an
// fsync at the end, as the writer's Commit does.
DdRun RunDd(const std::string& dir, const std::vector<int64_t>& bytes) {
  std::string command = "export LC_ALL=C; ";
  for (size_t i = 0; i < bytes.size(); ++i) {
    const int64_t mib = (bytes[i] + (1 << 20) - 1) >> 20;
    command += "dd if=/dev/zero of='" + dir + "/dd" + std::to_string(i) +
               ".bin' bs=1M count=" + std::to_string(mib) + " conv=fsync 2>'" + dir + "/dd" +
               std::to_string(i) + ".log' & ";
  }
  command += "wait";
  DdRun run;
  const double start = Now();
  const int rc = std::system(command.c_str());
  run.seconds = Now() - start;
  run.ok = rc == 0;
  for (size_t i = 0; i < bytes.size(); ++i) {
    const std::string base = dir + "/dd" + std::to_string(i);
    std::ifstream log(base + ".log");
    const std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
    // GNU dd's last line: "786432000 bytes (786 MB, 750 MiB) copied, 1.23 s, 639 MB/s".
    const size_t line = text.rfind(" bytes ");
    const size_t copied = text.find("copied, ", line == std::string::npos ? 0 : line);
    if (line == std::string::npos || copied == std::string::npos) {
      std::fprintf(stderr, "dd %zu: %s\n", i, text.c_str());
      run.ok = false;
    } else {
      const size_t line_start = text.rfind('\n', line);
      const int64_t written =
          std::atoll(text.c_str() + (line_start == std::string::npos ? 0 : line_start + 1));
      const double seconds = std::atof(text.c_str() + copied + 8);
      run.bytes += written;
      run.own_gbps.push_back(seconds > 0 ? written / seconds / kGB : 0);
    }
    std::error_code ignored;
    fs::remove(base + ".bin", ignored);
    fs::remove(base + ".log", ignored);
  }
  run.ok = run.ok && run.bytes > 0 && run.seconds > 0;
  return run;
}

// Run 1, in a rank: the production loop with its asynchronous saves.
int AsyncRank(const BenchOptions& o, const std::string& results, const std::string& checkpoints,
              int rank, const model::ShardedGroups& groups) {
  SetThreads(o.threads);
  auto job = placement::ParseJobSpec(JobYaml(o, checkpoints), "checkpoint_bench.yaml");
  if (!job.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, std::string(job.status().message()).c_str());
    return 2;
  }
  TimingFileSystem file_system;
  RankRecord record;
  std::mutex mu;  // on_saved runs on the writer's thread
  std::vector<int64_t> saved_steps;
  training::ShardedTrainOptions options;
  options.spec = *job;
  options.rank = rank;
  options.groups = groups;
  options.fs = &file_system;
  // With log_interval 1 every step reports, and the report comes right after the step's save.
  options.on_progress = [&](const training::ShardedProgress& p) {
    record.steps.push_back(
        StepRecord{p.step, p.compute_seconds + p.comm_seconds + p.bubble_seconds, Now(), p.loss});
  };
  options.on_saved = [&](const training::SavedStep& saved) {
    std::lock_guard<std::mutex> lock(mu);
    saved_steps.push_back(saved.step);
    return absl::OkStatus();
  };
  auto result = training::TrainSharded(options);
  if (!result.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, std::string(result.status().message()).c_str());
    return 3;
  }
  const std::vector<WriteWindow> windows = file_system.windows();
  const size_t saves = result->save_stall_seconds.size();
  if (windows.size() != saves || saved_steps.size() != saves) {
    std::fprintf(stderr, "rank %d: %zu stalls, %zu files committed, %zu saves reported\n", rank,
                 saves, windows.size(), saved_steps.size());
    return 4;
  }
  for (size_t k = 0; k < saves; ++k) {
    record.saves.push_back(
        SaveRecord{saved_steps[k], result->save_stall_seconds[k], /*copy=*/0, windows[k]});
  }
  WriteRecord(RecordPath(results, "async", rank), record);
  return 0;
}

// Run 3, in a rank: TrainSharded's loop with the same model, data and schedule, but each save
// waits for its file. The job spec is the same; only the loop differs.
absl::Status SyncRankLoop(const BenchOptions& o, const std::string& checkpoints, int rank,
                          const model::ShardedGroups& groups, RankRecord& record) {
  ASSIGN_OR_RETURN(const placement::JobSpec job,
                   placement::ParseJobSpec(JobYaml(o, checkpoints), "checkpoint_bench.yaml"));
  const placement::TrainSpec& spec = job.train;
  ASSIGN_OR_RETURN(const model::ShardedOptions sharded, training::ShardedOptionsOf(job, rank));
  ASSIGN_OR_RETURN(data::TextDataset dataset, training::LoadTrainingData(spec.data));
  ASSIGN_OR_RETURN(data::Sampler sampler,
                   data::Sampler::Create(dataset, spec.seq_len, spec.batch, spec.seed));
  kernels::CpuAllocator allocator;
  kernels::cpu::CpuBackend backend(allocator);
  ASSIGN_OR_RETURN(auto gpt, model::ShardedGpt::Create(sharded, groups, backend));
  RETURN_IF_ERROR(gpt->InitGpt2(spec.seed));
  TimingFileSystem file_system;
  worker::AsyncShardWriter writer(worker::MakeShardPlan(gpt->StatePieces()), rank, file_system,
                                  /*on_written=*/nullptr);
  for (int64_t step = 1; step <= spec.steps; ++step) {
    const float lr = static_cast<float>(training::LearningRateAt(spec.optimizer, step));
    ASSIGN_OR_RETURN(const model::StepStats stats,
                     gpt->TrainStep(training::StepSamples(sampler, step), step, lr));
    double end = Now();
    if (training::SavesAfter(spec, step, step == spec.steps)) {
      const double stall = end;
      RETURN_IF_ERROR(writer.WaitIdle());
      RETURN_IF_ERROR(gpt->CopyState(writer.staging()));
      const double copied = Now();
      RETURN_IF_ERROR(writer.Start(step, checkpoint::StepDir(spec.checkpoint.dir, step)));
      RETURN_IF_ERROR(writer.WaitIdle());
      end = Now();
      const std::vector<WriteWindow> windows = file_system.windows();
      if (windows.empty()) return absl::InternalError("the save committed no file");
      record.saves.push_back(SaveRecord{step, end - stall, copied - stall, windows.back()});
    }
    record.steps.push_back(StepRecord{step, stats.seconds, end, stats.loss});
  }
  // The writer alone against dd, alternated round by round in fresh files of the same sizes in
  // the same folder: this VM's disk and page cache drift by 2-5x within a minute, so only
  // measurements taken side by side compare. Rank 0 runs both ranks' dd's, then both ranks write
  // their (already staged) state; the last save's files are the sizes.
  comm::Communicator* world = groups.world;
  const std::vector<WriteWindow> saved = file_system.windows();
  if (world == nullptr || saved.empty()) return absl::InternalError("no world or no save");
  double sizes[kTp] = {};
  sizes[rank] = static_cast<double>(saved.back().bytes);
  RETURN_IF_ERROR(world->AllReduce(sizes, kTp, DType::kFloat64, comm::ReduceOp::kSum));
  for (int round = 0; round < o.write_rounds; ++round) {
    WriteRound measured;
    // Which goes first alternates, so that neither always inherits what the other left behind
    // (dirty pages still being written back, blocks just freed).
    const auto run_dd = [&]() -> absl::Status {
      RETURN_IF_ERROR(world->Barrier());
      if (rank == 0) {
        const DdRun dd = RunDd(fs::path(checkpoints).parent_path().string(),
                               {static_cast<int64_t>(sizes[0]), static_cast<int64_t>(sizes[1])});
        if (!dd.ok) return absl::InternalError("dd failed");
        measured.dd_gbps = dd.gbps();
      }
      return world->Barrier();
    };
    const auto run_writer = [&]() -> absl::Status {
      const int64_t step = 1000000 + round;  // a folder of its own, removed after the round
      RETURN_IF_ERROR(world->Barrier());
      RETURN_IF_ERROR(writer.Start(step, checkpoint::StepDir(spec.checkpoint.dir, step)));
      RETURN_IF_ERROR(writer.WaitIdle());
      const WriteWindow window = file_system.windows().back();
      double span[2] = {-window.start, window.committed};  // the earliest start, the last commit
      RETURN_IF_ERROR(world->AllReduce(span, 2, DType::kFloat64, comm::ReduceOp::kMax));
      RETURN_IF_ERROR(world->Barrier());
      if (rank == 0) {
        measured.writer_gbps = (sizes[0] + sizes[1]) / (span[1] + span[0]) / kGB;
        RETURN_IF_ERROR(checkpoint::DefaultFileSystem().RemoveAll(
            checkpoint::StepDir(spec.checkpoint.dir, step)));
      }
      return absl::OkStatus();
    };
    if (round % 2 == 0) {
      RETURN_IF_ERROR(run_dd());
      RETURN_IF_ERROR(run_writer());
    } else {
      RETURN_IF_ERROR(run_writer());
      RETURN_IF_ERROR(run_dd());
    }
    if (rank == 0) record.rounds.push_back(measured);
  }
  return absl::OkStatus();
}

int SyncRank(const BenchOptions& o, const std::string& results, const std::string& checkpoints,
             int rank, const model::ShardedGroups& groups) {
  SetThreads(o.threads);
  RankRecord record;
  const absl::Status status = SyncRankLoop(o, checkpoints, rank, groups, record);
  if (!status.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, std::string(status.message()).c_str());
    return 3;
  }
  WriteRecord(RecordPath(results, "sync", rank), record);
  return 0;
}

using Body = int (*)(const BenchOptions&, const std::string&, const std::string&, int,
                     const model::ShardedGroups&);

// Runs one forked world of kTp ranks; their records, or empty (after saying why) on failure.
std::vector<RankRecord> RunWorld(const BenchOptions& o, const std::string& run_dir,
                                 const std::string& run, Body body) {
  auto grid = placement::RankGrid::Create(kTp, 1, 1);
  if (!grid.ok()) return {};
  const std::string store = run_dir + "/store-" + run;
  const std::string checkpoints = run_dir + "/" + run;
  fs::create_directories(store);
  const auto result = testing::RunForkedWorld(
      *grid, store,
      [&](int rank, const placement::RankCoords&, const model::ShardedGroups& groups) {
        return body(o, run_dir, checkpoints, rank, groups);
      },
      std::chrono::hours(3));
  std::error_code ignored;
  fs::remove_all(checkpoints, ignored);  // the files are measured; only the disk space is left
  fs::remove_all(store, ignored);
  if (!result.ok()) {
    std::fprintf(stderr, "%s run: %s\n", run.c_str(), result.Describe().c_str());
    return {};
  }
  std::vector<RankRecord> records(kTp);
  for (int rank = 0; rank < kTp; ++rank) {
    if (!ReadRecord(RecordPath(run_dir, run, rank), records[rank])) {
      std::fprintf(stderr, "%s run: rank %d left no record\n", run.c_str(), rank);
      return {};
    }
  }
  for (const RankRecord& r : records) {
    if (r.saves.size() != records[0].saves.size() || r.steps.size() != records[0].steps.size()) {
      std::fprintf(stderr, "%s run: the ranks disagree on their steps or saves\n", run.c_str());
      return {};
    }
  }
  if (records[0].saves.empty()) {
    std::fprintf(stderr, "%s run: no save\n", run.c_str());
    return {};
  }
  return records;
}

// The interval of a step's training (before its save), on the shared clock.
struct Interval {
  double begin = 0, end = 0;
};
Interval StepInterval(const StepRecord& step, const RankRecord& rank) {
  double stall = 0;
  for (const SaveRecord& save : rank.saves) {
    if (save.step == step.step) stall = save.stall;
  }
  return {step.end - stall - step.seconds, step.end - stall};
}

// The share of `step` during which some rank's write was in flight.
double OverlapShare(const Interval& step, const std::vector<RankRecord>& ranks) {
  // Windows of all ranks, merged, so that two concurrent writes count once.
  std::vector<Interval> windows;
  for (const RankRecord& rank : ranks) {
    for (const SaveRecord& save : rank.saves) {
      windows.push_back({save.write.start, save.write.committed});
    }
  }
  std::sort(windows.begin(), windows.end(),
            [](const Interval& a, const Interval& b) { return a.begin < b.begin; });
  double covered = 0, reach = step.begin;
  for (const Interval& w : windows) {
    const double begin = std::max(w.begin, reach), end = std::min(w.end, step.end);
    if (end > begin) covered += end - begin;
    reach = std::max(reach, std::min(w.end, step.end));
  }
  const double length = step.end - step.begin;
  return length > 0 ? covered / length : 0;
}

// The job's figure for save k: the slowest rank holds the others at the next collective.
double MaxOver(const std::vector<RankRecord>& ranks, size_t k, double SaveRecord::*field) {
  double worst = 0;
  for (const RankRecord& r : ranks) worst = std::max(worst, r.saves[k].*field);
  return worst;
}

// All ranks' bytes of save k over the time from the first start to the last commit.
double WriteGbps(const std::vector<RankRecord>& ranks, size_t k) {
  double begin = 1e300, end = 0;
  int64_t bytes = 0;
  for (const RankRecord& r : ranks) {
    begin = std::min(begin, r.saves[k].write.start);
    end = std::max(end, r.saves[k].write.committed);
    bytes += r.saves[k].write.bytes;
  }
  return end > begin ? bytes / (end - begin) / kGB : 0;
}

// Over every save: all bytes over the sum of each save's window.
double MeanWriteGbps(const std::vector<RankRecord>& ranks) {
  double seconds = 0;
  int64_t bytes = 0;
  for (size_t k = 0; k < ranks[0].saves.size(); ++k) {
    double begin = 1e300, end = 0;
    for (const RankRecord& r : ranks) {
      begin = std::min(begin, r.saves[k].write.start);
      end = std::max(end, r.saves[k].write.committed);
      bytes += r.saves[k].write.bytes;
    }
    seconds += end - begin;
  }
  return seconds > 0 ? bytes / seconds / kGB : 0;
}

double Median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

double Mean(const std::vector<double>& values) {
  double sum = 0;
  for (double v : values) sum += v;
  return values.empty() ? 0 : sum / static_cast<double>(values.size());
}

bool ParseFlags(int argc, char** argv, BenchOptions& o) {
  const std::map<std::string, int*> ints = {{"--steps", &o.steps},
                                            {"--interval", &o.interval},
                                            {"--batch", &o.batch},
                                            {"--micro-batch", &o.micro_batch},
                                            {"--seq-len", &o.seq_len},
                                            {"--threads", &o.threads},
                                            {"--layers", &o.layers},
                                            {"--heads", &o.heads},
                                            {"--d-model", &o.d_model},
                                            {"--vocab", &o.vocab},
                                            {"--max-seq-len", &o.max_seq_len},
                                            {"--write-rounds", &o.write_rounds}};
  for (int i = 1; i < argc; i += 2) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "%s needs a value\n", flag.c_str());
      return false;
    }
    if (flag == "--dir") {
      o.dir = argv[i + 1];
    } else if (auto it = ints.find(flag); it != ints.end()) {
      *it->second = std::atoi(argv[i + 1]);
    } else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      return false;
    }
  }
  // Step 1 is a warm-up (first-touch page faults), so a clean step needs a second one.
  if (o.steps < 2 || o.interval < 1 || o.write_rounds < 1) {
    std::fprintf(stderr,
                 "--steps must be at least 2, --interval and --write-rounds at least 1\n");
    return false;
  }
  return true;
}

}  // namespace
}  // namespace shardline

int main(int argc, char** argv) {
  using namespace shardline;
  BenchOptions o;
  if (!ParseFlags(argc, argv, o)) return 2;
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  if (o.threads <= 0) o.threads = std::max(1, cores / kTp);
  // Under --dir, so that checkpoints and dd share one disk (mkdtemp: several runs may coexist).
  std::string run_template = o.dir + "/shardline_checkpoint_bench.XXXXXX";
  if (!mkdtemp(run_template.data())) {
    std::fprintf(stderr, "cannot create a directory under %s\n", o.dir.c_str());
    return 1;
  }
  const std::string run_dir = run_template;

  const std::string dd_version = CommandOutput("dd --version 2>&1 | head -1");
  std::printf(
      "GPT layers=%d heads=%d d_model=%d vocab=%d max_seq_len=%d (tied embeddings), "
      "tp=%d\n",
      o.layers, o.heads, o.d_model, o.vocab, o.max_seq_len, kTp);
  std::printf(
      "global batch %d (micro-batch %d), seq %d, %d steps, a save every %d and after the "
      "last; %d thread(s) per rank + its writer thread, %d cores\n",
      o.batch, o.micro_batch > 0 ? o.micro_batch : o.batch, o.seq_len, o.steps, o.interval,
      o.threads, cores);
  std::printf("checkpoints and dd in %s; peer: %s\n\n", run_dir.c_str(), dd_version.c_str());
  std::fflush(stdout);  // before fork: the children would print it again

  const std::vector<RankRecord> async_run = RunWorld(o, run_dir, "async", AsyncRank);
  std::vector<RankRecord> sync_run;
  if (!async_run.empty()) sync_run = RunWorld(o, run_dir, "sync", SyncRank);
  std::error_code ignored;
  fs::remove_all(run_dir, ignored);
  if (async_run.empty() || sync_run.empty() || sync_run[0].rounds.empty() ||
      sync_run[0].saves.size() != async_run[0].saves.size()) {
    std::fprintf(stderr, "a run failed; no table\n");
    return 1;
  }

  std::printf("bytes per save: ");
  for (int rank = 0; rank < kTp; ++rank) {
    std::printf("rank %d %.3f GB%s", rank, async_run[rank].saves[0].write.bytes / kGB,
                rank + 1 < kTp ? ", " : "\n\n");
  }

  // Steps. The first of each run is a warm-up and counts nowhere.
  std::printf(
      "Steps (s: the slowest rank; write: share of the step during which a save was "
      "being written)\n");
  std::printf("step | async s  write | sync s\n");
  std::vector<double> clean, during, outside;
  for (size_t i = 0; i < async_run[0].steps.size(); ++i) {
    double async_seconds = 0, sync_seconds = 0, share = 0;
    for (int rank = 0; rank < kTp; ++rank) {
      const StepRecord& a = async_run[rank].steps[i];
      async_seconds = std::max(async_seconds, a.seconds);
      share = std::max(share, OverlapShare(StepInterval(a, async_run[rank]), async_run));
      sync_seconds = std::max(sync_seconds, sync_run[rank].steps[i].seconds);
    }
    const int64_t step = async_run[0].steps[i].step;
    std::printf("%4lld | %7.3f %5.0f%% | %6.3f%s\n", static_cast<long long>(step), async_seconds,
                100 * share, sync_seconds, step == 1 ? "  (warm-up)" : "");
    if (step == 1) continue;
    clean.push_back(sync_seconds);
    if (share >= 0.5) during.push_back(async_seconds);
    if (share < 0.01) outside.push_back(async_seconds);
  }
  const double step_seconds = Mean(clean);
  const float async_loss = async_run[0].steps.back().loss,
              sync_loss = sync_run[0].steps.back().loss;
  std::printf("\nloss at the last step: async %.6f, sync %.6f (%s)\n", async_loss, sync_loss,
              async_loss == sync_loss ? "the same job" : "DIFFERENT: the loops do not train alike");
  std::printf("step time with no write in flight (synchronous run, %zu steps): %.3f s\n",
              clean.size(), step_seconds);
  if (!during.empty()) {
    std::printf(
        "async steps at least half overlapped by a write (%zu): %.3f s, %+.1f%% against "
        "that\n",
        during.size(), Mean(during), 100 * (Mean(during) / step_seconds - 1));
  } else {
    std::printf("async steps at least half overlapped by a write: none\n");
  }
  if (!outside.empty()) {
    std::printf("async steps with no write in flight (%zu): %.3f s, %+.1f%%\n", outside.size(),
                Mean(outside), 100 * (Mean(outside) / step_seconds - 1));
  }

  // The peer: dd in the rounds alternated with the writer alone (the median of each, and of the
  // rounds' ratios, the fairest figure on a disk that drifts).
  std::vector<double> dd_rates, writer_rates, ratios;
  std::printf("\nThe writer alone against dd (%s), %d at once, alternated in fresh files:\n",
              dd_version.c_str(), kTp);
  std::printf("round |   dd GB/s  writer GB/s  writer/dd\n");
  for (size_t r = 0; r < sync_run[0].rounds.size(); ++r) {
    const WriteRound& round = sync_run[0].rounds[r];
    dd_rates.push_back(round.dd_gbps);
    writer_rates.push_back(round.writer_gbps);
    ratios.push_back(round.writer_gbps / round.dd_gbps);
    std::printf("%5zu | %9.3f %12.3f %9.0f%%\n", r + 1, round.dd_gbps, round.writer_gbps,
                100 * ratios.back());
  }
  const double dd_gbps = Median(dd_rates);
  const double writer_ratio = Median(ratios);
  std::printf("median: dd %.3f GB/s, writer %.3f GB/s, writer/dd %.0f%%\n\n", dd_gbps,
              Median(writer_rates), 100 * writer_ratio);

  std::printf(
      "Saves (stall: the slowest rank's; copy: the synchronous save's copy into the "
      "staging buffer, the least an async stall can be; step: %.3f s; write: all ranks' "
      "bytes from the first start to the last commit)\n",
      step_seconds);
  std::printf(
      "step | stall s async  sync  copy | stall/step async   sync | write GB/s async  "
      "sync |   dd | async/dd sync/dd\n");
  double worst_async = 0, worst_sync = 0;
  std::vector<double> async_stalls, sync_stalls;
  for (size_t k = 0; k < async_run[0].saves.size(); ++k) {
    const double stall_async = MaxOver(async_run, k, &SaveRecord::stall);
    const double stall_sync = MaxOver(sync_run, k, &SaveRecord::stall);
    async_stalls.push_back(stall_async);
    sync_stalls.push_back(stall_sync);
    const double copy = MaxOver(sync_run, k, &SaveRecord::copy);
    const double write_async = WriteGbps(async_run, k), write_sync = WriteGbps(sync_run, k);
    worst_async = std::max(worst_async, stall_async / step_seconds);
    worst_sync = std::max(worst_sync, stall_sync / step_seconds);
    std::printf(
        "%4lld | %13.3f %5.3f %5.3f | %15.1f%% %5.1f%% | %15.3f %5.3f | %4.2f | %7.0f%% "
        "%6.0f%%\n",
        static_cast<long long>(async_run[0].saves[k].step), stall_async, stall_sync, copy,
        100 * stall_async / step_seconds, 100 * stall_sync / step_seconds, write_async, write_sync,
        dd_gbps, 100 * write_async / dd_gbps, 100 * write_sync / dd_gbps);
  }
  const double mean_async = MeanWriteGbps(async_run);
  std::printf("\nstall <= %.0f%% of a step: %s (async: worst save %.1f%%; sync: %.1f%%)\n",
              100 * kStallTarget, worst_async <= kStallTarget ? "PASS" : "FAIL", 100 * worst_async,
              100 * worst_sync);
  std::printf(
      "write >= %.0f%% of dd (%s): the writer alone, alternated with dd, %.0f%% (median of %zu "
      "rounds) %s; while training (async run, against the rounds' median dd) %.3f GB/s = %.0f%%\n",
      100 * kWriteTarget, dd_version.c_str(), 100 * writer_ratio, ratios.size(),
      writer_ratio >= kWriteTarget ? "PASS" : "FAIL", mean_async, 100 * mean_async / dd_gbps);
  // For bench/checkpoint_compare.py, which sets these against PyTorch's distributed checkpoint.
  std::printf(
      "result bytes=%.0f step_s=%.4f async_stall_s=%.4f sync_stall_s=%.4f writer_gbps=%.4f "
      "dd_gbps=%.4f\n",
      static_cast<double>(async_run[0].saves[0].write.bytes + async_run[1].saves[0].write.bytes),
      step_seconds, Median(async_stalls), Median(sync_stalls), Median(writer_rates), dd_gbps);
  return 0;
}
