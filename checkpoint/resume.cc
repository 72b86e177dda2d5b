#include "checkpoint/resume.h"

#include <filesystem>
#include <optional>

#include "absl/strings/str_cat.h"
#include "checkpoint/layout.h"
#include "checkpoint/model_config.h"
#include "common/status_macros.h"

namespace shardline::checkpoint {
namespace {

namespace stdfs = std::filesystem;

std::string Canonical(const std::string& path) {
  std::error_code ec;
  const stdfs::path canonical = stdfs::weakly_canonical(path, ec);
  return ec ? stdfs::path(path).lexically_normal().string() : canonical.string();
}

// DecideResume, and the manifest of the step it chose, read (and verified) once.
struct Decided {
  ResumeDecision decision;
  std::optional<Manifest> manifest;
};

absl::StatusOr<Decided> Decide(const ResumeRequest& request) {
  std::vector<int64_t> committed;
  if (!request.dir.empty()) {
    ASSIGN_OR_RETURN(committed, CommittedSteps(request.dir));
  }
  Decided decided;
  ResumeDecision& decision = decided.decision;
  switch (request.mode) {
    case ResumeMode::kNone:
      if (!committed.empty()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "checkpoint.dir ", request.dir, " already holds committed steps (the newest is ",
            committed.back(), "): resume: none would write a new run over them; resume it "
            "(resume: latest), or give the new run another checkpoint.dir"));
      }
      return decided;
    case ResumeMode::kLatest:
      for (auto step = committed.rbegin(); step != committed.rend(); ++step) {
        const std::string manifest = ManifestPath(request.dir, *step);
        absl::StatusOr<Manifest> verified = ReadVerifiedStep(manifest, request.depth);
        if (verified.ok()) {
          decision.manifest = manifest;
          decision.step = *step;
          decided.manifest = std::move(*verified);
          return decided;
        }
        decision.skipped.push_back(SkippedStep{*step, std::string(verified.status().message())});
      }
      if (!decision.skipped.empty()) {
        return absl::DataLossError(absl::StrCat("no committed step of ", request.dir,
                                                " verifies: ", DescribeSkipped(decision.skipped)));
      }
      return decided;
    case ResumeMode::kPath: {
      ASSIGN_OR_RETURN(const std::string manifest, ResolveCheckpoint(request.path));
      if (!IsManifestPath(manifest)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "resume: ", request.path, " is a model file (", manifest,
            "), not a checkpoint step with optimizer state; start from its parameters with "
            "init_from instead"));
      }
      ASSIGN_OR_RETURN(decided.manifest, ReadVerifiedStep(manifest, request.depth));
      decision.manifest = manifest;
      decision.step = decided.manifest->step;
      if (committed.empty()) return decided;
      const bool own_dir = Canonical(stdfs::path(manifest).parent_path().parent_path().string()) ==
                           Canonical(request.dir);
      if (!own_dir) {
        return absl::FailedPreconditionError(absl::StrCat(
            "resume: ", request.path, " is a step of another run, but checkpoint.dir ",
            request.dir, " already holds committed steps (the newest is ", committed.back(),
            "), which this run would write over; give it a new checkpoint.dir"));
      }
      if (committed.back() > decision.step) {
        return absl::FailedPreconditionError(absl::StrCat(
            "resume: step ", decision.step, " is older than the newest committed step ",
            committed.back(), " of ", request.dir, ", which resuming would write over; resume from ",
            "the newest (resume: latest), or resume into another checkpoint.dir"));
      }
      return decided;
    }
  }
  return absl::InternalError("unknown resume mode");
}

}  // namespace

absl::StatusOr<ResumeDecision> DecideResume(const ResumeRequest& request) {
  ASSIGN_OR_RETURN(Decided decided, Decide(request));
  return std::move(decided.decision);
}

absl::Status CheckCanResume(const Manifest& manifest, const model::ModelConfig& config,
                            const TrainState& train, const std::string& where) {
  if (!HasOptimizerState(manifest)) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": it holds parameters only (no AdamW moments), so a run cannot "
                            "resume from it; start a new run from its parameters with init_from"));
  }
  ASSIGN_OR_RETURN(const model::ModelConfig stored,
                   ModelConfigFromMetadata(manifest.metadata, where));
  return CheckResumable(stored, manifest.train, config, train, where);
}

absl::StatusOr<std::vector<std::string>> PrepareForResume(FileSystem& fs, const std::string& dir,
                                                          const ResumeDecision& decision) {
  std::vector<std::string> done;
  if (dir.empty()) return done;
  for (const SkippedStep& skipped : decision.skipped) {
    const std::string from = StepDir(dir, skipped.step);
    std::string to = from + ".corrupt";
    std::error_code ec;
    for (int n = 2; stdfs::exists(to, ec); ++n) to = absl::StrCat(from, ".corrupt.", n);
    RETURN_IF_ERROR(fs.Rename(from, to));
    done.push_back(absl::StrCat("set aside step ", skipped.step, " as ", to, ": ",
                                skipped.reason));
  }
  ASSIGN_OR_RETURN(const std::vector<StepFolder> folders, ListStepFolders(dir));
  for (const StepFolder& folder : folders) {
    if (folder.committed || folder.step <= decision.step) continue;
    // Not fatal: a writer of the run that crashed (an actor outliving a killed coordinator) may
    // still be adding files, and the folder holds nothing committed. The run writes the step
    // again, and retention removes what is left once a newer step commits.
    if (const absl::Status removed = fs.RemoveAll(folder.path); !removed.ok()) {
      done.push_back(absl::StrCat("left ", folder.path, " (an interrupted save, no manifest): ",
                                  removed.message()));
      continue;
    }
    done.push_back(absl::StrCat("removed ", folder.path, ": an interrupted save (no manifest)"));
  }
  return done;
}

absl::StatusOr<ResumePlan> PlanResume(FileSystem& fs, const ResumeRequest& request,
                                      const model::ModelConfig& config, const TrainState& train) {
  ASSIGN_OR_RETURN(Decided decided, Decide(request));
  ResumePlan plan;
  plan.decision = std::move(decided.decision);
  if (decided.manifest) {
    TrainState wanted = train;
    wanted.data.tokens = 0;  // not loaded here
    RETURN_IF_ERROR(CheckCanResume(*decided.manifest, config, wanted,
                                   "resuming from " + plan.decision.manifest));
  }
  ASSIGN_OR_RETURN(plan.prepared, PrepareForResume(fs, request.dir, plan.decision));
  return plan;
}

std::string DescribeSkipped(const std::vector<SkippedStep>& skipped) {
  std::string text;
  for (const SkippedStep& step : skipped) {
    absl::StrAppend(&text, text.empty() ? "" : "; ", "step ", step.step, " (", step.reason, ")");
  }
  return text;
}

}  // namespace shardline::checkpoint
