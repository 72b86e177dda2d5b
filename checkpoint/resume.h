// Where a run starts, decided the same way by `shardline train` and by the coordinator before it
// spawns a job's ranks: from the newest committed step of its checkpoint dir that verifies
// (`resume: latest`, the default), from nothing (`resume: none`), or from a step it names. Steps
// that fail verification are skipped, with the reason, and set aside so that the run's own saves
// never mix with them; a run is never started over committed steps it would overwrite.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "checkpoint/file_system.h"
#include "checkpoint/gpt2_checkpoint.h"
#include "checkpoint/train_state.h"
#include "checkpoint/verify.h"

namespace shardline::checkpoint {

enum class ResumeMode { kLatest, kNone, kPath };

// (The `= {}`s let callers write ResumeRequest{dir, mode} without -Wmissing-field-initializers.)
struct ResumeRequest {
  std::string dir = {};  // the run's checkpoint dir; empty: the run saves nothing
  ResumeMode mode = ResumeMode::kLatest;
  std::string path = {};  // kPath: a step folder, its manifest, or a run's dir (its `latest`)
  VerifyDepth depth = VerifyDepth::kChecksums;
};

struct SkippedStep {
  int64_t step = 0;
  std::string reason;  // why it did not verify
};

struct ResumeDecision {
  std::string manifest;  // the step to resume from; empty: start fresh
  int64_t step = 0;      // its step (0 when fresh)
  std::vector<SkippedStep> skipped;  // newer committed steps of `dir` that failed verification
};

// Decides, reading (and for kChecksums hashing) the candidate steps. Errors, all before any work:
//   kLatest: DataLoss when `dir` has committed steps and none verifies (each one's reason);
//   kNone:   FailedPrecondition when `dir` already holds committed steps;
//   kPath:   the step's own verification error; FailedPrecondition when `dir` holds committed
//            steps newer than it (the run would overwrite them) or, for a step of another dir,
//            any committed steps.
absl::StatusOr<ResumeDecision> DecideResume(const ResumeRequest& request);

// Makes `dir` ready for a run that resumes as `decision` says: renames each skipped step's folder
// to DIR/step-NNNNNNNN.corrupt (.corrupt.2, ... when taken), and removes the uncommitted step
// folders newer than the resumed step (saves a crash interrupted, which the run will write again;
// one that cannot be removed, because a writer of the crashed run is still adding to it, is left
// and said so). Returns what it did, one line each, for the log.
absl::StatusOr<std::vector<std::string>> PrepareForResume(FileSystem& fs, const std::string& dir,
                                                          const ResumeDecision& decision);

// OK when a run of `config` and `train` can resume from the step `manifest` describes: it holds
// optimizer state, and its model and train settings are the run's (CheckResumable; the tokens
// only when both sides know them). InvalidArgument prefixed by `where`.
absl::Status CheckCanResume(const Manifest& manifest, const model::ModelConfig& config,
                            const TrainState& train, const std::string& where);

// All a run does before its first step, for whoever decides where it starts (`shardline train`, or
// the coordinator for every rank of a job): DecideResume; then, when it resumes, that the step can
// be resumed by a run of `config` and `train` (CheckResumable, without the tokens: those are
// checked by whoever loads the data) and holds optimizer state; then PrepareForResume. Errors as
// theirs, each naming the checkpoint; nothing in `dir` is changed unless every check passed.
struct ResumePlan {
  ResumeDecision decision;
  std::vector<std::string> prepared;  // PrepareForResume's lines
};
absl::StatusOr<ResumePlan> PlanResume(FileSystem& fs, const ResumeRequest& request,
                                      const model::ModelConfig& config, const TrainState& train);

// "step 300 (rank-00001.safetensors fails its checksum ...); step 200 (...)".
std::string DescribeSkipped(const std::vector<SkippedStep>& skipped);

}  // namespace shardline::checkpoint
