// `shardline checkpoint inspect` and `shardline checkpoint export`: local commands (no coordinator)
// over a run's checkpoint folder, through the checkpoint library's names (checkpoint/layout.h),
// manifests and verification, and the model loader's reader of boxes.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/gpt2_hf_export.h"
#include "checkpoint/hf_llama_export.h"
#include "checkpoint/layout.h"
#include "checkpoint/manifest.h"
#include "checkpoint/model_config.h"
#include "checkpoint/train_state.h"
#include "checkpoint/verify.h"
#include "cli/commands.h"
#include "common/status_macros.h"
#include "model/tensor_table.h"
#include "nlohmann/json.hpp"
#include "placement/byte_size.h"
#include "worker/training/model_checkpoint.h"

namespace shardline::cli {
namespace {

namespace stdfs = std::filesystem;
using nlohmann::json;

// Abseil's StrCat takes its own string_view, not the std::string_view of layout.h's names.
const std::string kManifest(checkpoint::kManifestFileName);

constexpr int kOk = 0;
constexpr int kFailed = 1;
constexpr int kBadInput = 2;

int Fail(int code, absl::string_view message) {
  std::cerr << "error: " << message << "\n";
  return code;
}

// "a/b/" and "a/b" name the same folder; filename() of the first is empty.
stdfs::path WithoutTrailingSlash(const std::string& path) {
  std::string text = path;
  while (text.size() > 1 && text.back() == '/') text.pop_back();
  return stdfs::path(text);
}

// What `inspect` was pointed at: a run's checkpoint dir, and the one step to show if any.
struct Target {
  std::string dir;
  std::optional<int64_t> step;
};

// A step folder or a step's manifest stands for its run's dir and that step.
absl::StatusOr<Target> ResolveTarget(const std::string& path, int64_t step_option) {
  const stdfs::path p = WithoutTrailingSlash(path);
  std::error_code ec;
  Target target;
  if (stdfs::is_regular_file(p, ec)) {
    const std::optional<int64_t> step =
        checkpoint::ParseStepDirName(p.parent_path().filename().string());
    if (p.filename().string() != checkpoint::kManifestFileName || !step) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, " is a file but not a step's ", kManifest,
                       " (inspect reads a run's checkpoint dir, a step folder or its manifest)"));
    }
    target.dir = p.parent_path().parent_path().string();
    target.step = step;
  } else if (stdfs::is_directory(p, ec)) {
    if (const std::optional<int64_t> step = checkpoint::ParseStepDirName(p.filename().string())) {
      target.dir = p.parent_path().string();
      target.step = step;
    } else {
      target.dir = p.string();
    }
  } else {
    return absl::NotFoundError(absl::StrCat("no checkpoint dir at ", path));
  }
  if (target.dir.empty()) target.dir = std::string(".");
  if (step_option >= 0) {
    if (target.step && *target.step != step_option) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, " is step ", *target.step, ", but --step says ", step_option));
    }
    target.step = step_option;
  }
  return target;
}

// One step folder as inspect reports it.
struct StepReport {
  int64_t step = 0;
  std::string path;
  bool committed = false;
  bool latest = false;
  absl::StatusOr<checkpoint::Manifest> manifest = absl::UnknownError("not read");
  uint64_t bytes = 0;  // committed: the manifest's files; uncommitted: what is on disk
  int64_t files = 0;
  std::optional<absl::Status> verify;
};

// Entries named like a step that ListStepFolders passes over: "step-00000300.corrupt" (a step
// that failed verification, set aside), or anything else that starts with the step prefix.
std::vector<stdfs::path> SetAsideEntries(const std::string& dir) {
  std::vector<stdfs::path> entries;
  std::error_code ec;
  for (stdfs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.starts_with("step-") && !checkpoint::ParseStepDirName(name)) {
      entries.push_back(it->path());
    }
  }
  std::sort(entries.begin(), entries.end());
  return entries;
}

StepReport ReadStep(const checkpoint::StepFolder& folder) {
  StepReport report;
  report.step = folder.step;
  report.path = folder.path;
  report.committed = folder.committed;
  if (folder.committed) {
    report.manifest = checkpoint::ReadManifest(
        (stdfs::path(folder.path) / checkpoint::kManifestFileName).string());
    if (report.manifest.ok()) {
      for (const auto& [name, file] : report.manifest->files) report.bytes += file.bytes;
      report.files = static_cast<int64_t>(report.manifest->files.size());
    }
  } else {
    std::error_code ec;
    for (stdfs::directory_iterator it(folder.path, ec), end; !ec && it != end; it.increment(ec)) {
      if (!it->is_regular_file(ec)) continue;
      report.bytes += it->file_size(ec);
      ++report.files;
    }
  }
  return report;
}

// The tensors of a manifest in the model's order: parameters as model::ModelRows lists them, then
// the first moments, then the second, then anything else by name.
std::vector<std::string> TensorOrder(const checkpoint::Manifest& manifest) {
  std::map<std::string, int64_t> rank_of;
  if (absl::StatusOr<model::ModelConfig> config =
          checkpoint::ModelConfigFromMetadata(manifest.metadata, "manifest");
      config.ok()) {
    int64_t index = 0;
    for (const model::TensorRow& spec : model::ModelRows(*config)) {
      rank_of[spec.name] = index++;
    }
  }
  const auto key = [&](const std::string& name) {
    const checkpoint::StateTensor state = checkpoint::ParseStateTensorName(name);
    const auto it = rank_of.find(state.param);
    return std::make_pair(static_cast<int>(state.kind) + (it == rank_of.end() ? 3 : 0),
                          it == rank_of.end() ? int64_t{0} : it->second);
  };
  std::vector<std::string> names;
  for (const auto& [name, tensor] : manifest.tensors) names.push_back(name);
  std::stable_sort(names.begin(), names.end(),
                   [&](const std::string& a, const std::string& b) { return key(a) < key(b); });
  return names;
}

uint64_t TensorBytes(const checkpoint::ManifestTensor& tensor) {
  return checkpoint::NumElements(tensor.global_shape).value_or(0) *
         checkpoint::DTypeSize(tensor.dtype);
}

std::string Plural(int64_t count, const char* one, const char* many) {
  return absl::StrCat(count, " ", count == 1 ? one : many);
}

// The manifest's own JSON of its train/plan/metadata sections: the same keys as the file.
json ManifestSections(const checkpoint::Manifest& manifest) {
  json all = json::parse(checkpoint::ManifestToJson(manifest));
  return {{"metadata", all["metadata"]}, {"train", all["train"]}, {"plan", all["plan"]}};
}

json StepJson(const StepReport& report, bool details) {
  json out = {{"step", report.step},     {"path", report.path},   {"committed", report.committed},
              {"latest", report.latest}, {"files", report.files}, {"bytes", report.bytes}};
  if (report.committed && !report.manifest.ok()) {
    out["error"] = ToString(report.manifest.status().message());
  } else if (report.committed) {
    const checkpoint::Manifest& manifest = *report.manifest;
    const json sections = ManifestSections(manifest);
    out["plan"] = sections["plan"];
    out["plan_summary"] = checkpoint::PlanSummary(manifest.plan);
    out["world_size"] = manifest.world_size;
    out["optimizer_state"] = checkpoint::HasOptimizerState(manifest);
    if (details) {
      out["metadata"] = sections["metadata"];
      out["train"] = sections["train"];
      json files = json::array();
      for (const auto& [name, file] : manifest.files) {
        files.push_back({{"name", name}, {"rank", file.rank}, {"bytes", file.bytes}});
      }
      out["file_list"] = files;
      json tensors = json::array();
      for (const std::string& name : TensorOrder(manifest)) {
        const checkpoint::ManifestTensor& tensor = manifest.tensors.at(name);
        tensors.push_back({{"name", name},
                           {"dtype", checkpoint::DTypeName(tensor.dtype)},
                           {"global_shape", tensor.global_shape},
                           {"shards", tensor.shards.size()},
                           {"bytes", TensorBytes(tensor)}});
      }
      out["tensors"] = tensors;
    }
  }
  if (report.verify) {
    out["verify"] = report.verify->ok()
                        ? json{{"ok", true}}
                        : json{{"ok", false}, {"error", ToString(report.verify->message())}};
  }
  return out;
}

void PrintVerify(const StepReport& report) {
  if (!report.verify) return;
  if (report.verify->ok()) {
    std::cout << "    verify: OK\n";
  } else {
    std::cout << "    verify: FAILED: " << report.verify->message() << "\n";
  }
}

void PrintStepLine(const StepReport& report) {
  std::cout << "  step " << report.step << ": ";
  if (!report.committed) {
    std::cout << "uncommitted (no " << checkpoint::kManifestFileName
              << ": an interrupted or unfinished save), " << Plural(report.files, "file", "files")
              << ", " << placement::FormatApproxByteSize(static_cast<double>(report.bytes)) << " on disk\n";
    return;
  }
  if (!report.manifest.ok()) {
    std::cout << "manifest unreadable: " << report.manifest.status().message()
              << (report.latest ? "  [latest]" : "") << "\n";
    PrintVerify(report);
    return;
  }
  const checkpoint::Manifest& manifest = *report.manifest;
  std::cout << checkpoint::PlanSummary(manifest.plan) << ", world size " << manifest.world_size
            << ", " << Plural(report.files, "file", "files") << ", " << placement::FormatApproxByteSize(static_cast<double>(report.bytes))
            << " (" << report.bytes << " bytes), "
            << (checkpoint::HasOptimizerState(manifest) ? "with optimizer state"
                                                        : "parameters only")
            << (report.latest ? "  [latest]" : "") << "\n";
  PrintVerify(report);
}

void PrintStepDetails(const std::string& dir, const StepReport& report) {
  std::cout << "Step " << report.step << " of " << dir << (report.latest ? " (latest)" : "") << ": "
            << report.path << "\n";
  PrintStepLine(report);
  if (!report.manifest.ok()) return;
  const checkpoint::Manifest& manifest = *report.manifest;
  std::cout << "  model:";
  for (const auto& [key, value] : manifest.metadata) std::cout << " " << key << "=" << value;
  std::cout << "\n";
  const checkpoint::TrainState& train = manifest.train;
  std::cout << "  train: seed " << train.seed << ", batch " << train.batch << ", seq_len "
            << train.seq_len << ", data " << train.data.source;
  if (train.data.source == "synthetic") {
    std::cout << " (seed " << train.data.synthetic_seed << ", " << train.data.synthetic_bytes
              << " bytes)";
  } else {
    std::cout << " (" << train.data.path << ")";
  }
  std::cout << ", " << train.data.tokens << " tokens, steps " << train.steps << "\n";
  std::cout << "  files:\n";
  for (const auto& [name, file] : manifest.files) {
    std::cout << "    " << name << "  rank " << file.rank << "  " << file.bytes << " bytes\n";
  }
  const std::vector<std::string> names = TensorOrder(manifest);
  size_t width = 4;
  for (const std::string& name : names) width = std::max(width, name.size());
  std::cout << "  tensors (" << names.size() << "):\n";
  char line[512];
  std::snprintf(line, sizeof(line), "    %-*s  %-5s  %-18s  %6s  %10s\n", static_cast<int>(width),
                "NAME", "DTYPE", "GLOBAL SHAPE", "SHARDS", "BYTES");
  std::cout << line;
  for (const std::string& name : names) {
    const checkpoint::ManifestTensor& tensor = manifest.tensors.at(name);
    std::snprintf(line, sizeof(line), "    %-*s  %-5s  %-18s  %6zu  %10llu\n",
                  static_cast<int>(width), name.c_str(), checkpoint::DTypeName(tensor.dtype),
                  checkpoint::ShapeString(tensor.global_shape).c_str(), tensor.shards.size(),
                  static_cast<unsigned long long>(TensorBytes(tensor)));
    std::cout << line;
  }
}

}  // namespace

int CheckpointInspect(const CheckpointInspectOptions& options) {
  absl::StatusOr<Target> target = ResolveTarget(options.dir, options.step);
  if (!target.ok()) return Fail(kBadInput, target.status().message());
  absl::StatusOr<std::vector<checkpoint::StepFolder>> folders =
      checkpoint::ListStepFolders(target->dir);
  if (!folders.ok()) return Fail(kBadInput, folders.status().message());
  const std::vector<stdfs::path> set_aside = SetAsideEntries(target->dir);
  // A bad `latest` does not stop the listing: it is one of the things inspect is for.
  const absl::StatusOr<std::optional<int64_t>> latest = checkpoint::ReadLatest(target->dir);

  std::vector<StepReport> reports;
  for (const checkpoint::StepFolder& folder : *folders) {
    if (target->step && folder.step != *target->step) continue;
    reports.push_back(ReadStep(folder));
    reports.back().latest = latest.ok() && *latest == folder.step;
  }
  if (target->step) {
    if (reports.empty()) {
      std::string steps;
      for (const checkpoint::StepFolder& folder : *folders) {
        if (folder.committed) absl::StrAppend(&steps, steps.empty() ? "" : ", ", folder.step);
      }
      return Fail(kBadInput,
                  absl::StrCat(target->dir, " has no step ", *target->step,
                               " (committed steps: ", steps.empty() ? "none" : steps, ")"));
    }
    if (!reports.front().committed) {
      return Fail(kBadInput,
                  absl::StrCat("step ", *target->step, " of ", target->dir, " is not committed (",
                               reports.front().path, " holds no ", kManifest, ")"));
    }
  } else if (folders->empty() && set_aside.empty()) {
    return Fail(kBadInput, absl::StrCat(target->dir, " holds no checkpoint step folders (",
                                        checkpoint::StepDirName(0), ", ...)"));
  }

  bool failed = false;
  if (options.verify) {
    for (StepReport& report : reports) {
      if (!report.committed) continue;
      report.verify = checkpoint::VerifyStep(
          (stdfs::path(report.path) / checkpoint::kManifestFileName).string(),
          checkpoint::VerifyDepth::kChecksums);
      failed |= !report.verify->ok();
    }
  }
  // `latest` must name a committed step for a run to resume from it.
  std::optional<std::string> latest_problem;
  if (!latest.ok()) {
    latest_problem = ToString(latest.status().message());
  } else if (latest->has_value() &&
             !std::any_of(folders->begin(), folders->end(), [&](const auto& folder) {
               return folder.committed && folder.step == **latest;
             })) {
    latest_problem =
        absl::StrCat(target->dir, "/", std::string(checkpoint::kLatestFileName), " names ",
                     checkpoint::StepDirName(**latest), ", which is not a committed step");
  }
  if (options.verify && latest_problem && !target->step) failed = true;

  int64_t committed = 0;
  for (const checkpoint::StepFolder& folder : *folders) committed += folder.committed ? 1 : 0;

  if (options.json) {
    json out = {{"dir", target->dir}};
    out["latest"] = latest.ok() && latest->has_value() ? json(**latest) : json(nullptr);
    if (latest_problem) out["latest_error"] = *latest_problem;
    if (target->step) {
      out["step"] = StepJson(reports.front(), /*details=*/true);
    } else {
      json steps = json::array();
      json uncommitted = json::array();
      for (const StepReport& report : reports) {
        (report.committed ? steps : uncommitted).push_back(StepJson(report, false));
      }
      out["steps"] = steps;
      out["uncommitted"] = uncommitted;
      json aside = json::array();
      for (const stdfs::path& path : set_aside) {
        aside.push_back({{"name", path.filename().string()}, {"path", path.string()}});
      }
      out["set_aside"] = aside;
    }
    if (options.verify) out["ok"] = !failed;
    std::cout << out.dump(2) << "\n";
    return failed ? kFailed : kOk;
  }

  if (target->step) {
    PrintStepDetails(target->dir, reports.front());
  } else {
    std::cout << target->dir << ": " << Plural(committed, "committed step", "committed steps");
    if (latest.ok() && latest->has_value()) std::cout << ", latest step " << **latest;
    std::cout << "\n";
    for (const StepReport& report : reports) {
      if (report.committed) PrintStepLine(report);
    }
    for (const StepReport& report : reports) {
      if (!report.committed) PrintStepLine(report);
    }
    for (const stdfs::path& path : set_aside) {
      std::cout << "  " << path.filename().string()
                << ": set aside (a step that failed verification; not loaded)\n";
    }
  }
  if (latest_problem) std::cout << "  latest: " << *latest_problem << "\n";
  if (options.verify) {
    std::cout << (failed ? "Verification FAILED" : "Verification OK") << "\n";
  }
  return failed ? kFailed : kOk;
}

int CheckpointExport(const CheckpointExportOptions& options) {
  if (options.format != "hf") {
    return Fail(kBadInput, absl::StrCat("--format '", options.format,
                                        "' is not supported: the one export format is hf (a "
                                        "Hugging Face GPT-2 or Llama folder: model.safetensors + "
                                        "config.json)"));
  }
  std::error_code ec;
  if (stdfs::exists(options.out, ec) &&
      (!stdfs::is_directory(options.out, ec) || !stdfs::is_empty(options.out, ec))) {
    return Fail(kBadInput, absl::StrCat("--out ", options.out,
                                        " exists and is not an empty folder; export writes "
                                        "into a new or empty one"));
  }
  std::string path;
  if (options.step >= 0) {
    path = checkpoint::ManifestPath(options.dir, options.step);
    if (!stdfs::is_regular_file(path, ec)) {
      return Fail(kBadInput, absl::StrCat(options.dir, " has no committed step ", options.step,
                                          " (no ", path, ")"));
    }
  } else {
    absl::StatusOr<std::string> resolved = checkpoint::ResolveCheckpoint(options.dir);
    if (!resolved.ok()) return Fail(kBadInput, resolved.status().message());
    path = *resolved;
  }
  // Box reads trust the files; a changed byte is caught here rather than exported.
  if (checkpoint::IsManifestPath(path)) {
    if (const absl::Status verified =
            checkpoint::VerifyStep(path, checkpoint::VerifyDepth::kChecksums);
        !verified.ok()) {
      return Fail(kFailed, verified.message());
    }
  }
  absl::StatusOr<training::CheckpointSource> source = training::CheckpointSource::Open(path);
  if (!source.ok()) return Fail(kFailed, source.status().message());

  checkpoint::Gpt2Weights weights;
  weights.config = source->config();
  for (const model::TensorRow& spec : model::ModelRows(weights.config)) {
    // The whole tensor as one box of its box view: for qkv (3, C, C), the same bytes as (3C, C).
    absl::StatusOr<std::vector<int64_t>> shape = source->BoxShape(spec.name);
    if (!shape.ok()) return Fail(kFailed, shape.status().message());
    const std::vector<int64_t> zeros(shape->size(), 0);
    absl::StatusOr<std::vector<float>> values =
        training::ReadCheckpointBox(*source, spec.name, zeros, *shape);
    if (!values.ok()) return Fail(kFailed, values.status().message());
    weights.tensors[spec.name] = checkpoint::HostTensor{spec.shape, std::move(*values)};
  }
  // The family decides the Hugging Face class: GPT-2's choices are a GPT2LMHeadModel, Llama's a
  // LlamaForCausalLM; a mix of them is neither.
  const std::string_view family = weights.config.FamilyName();
  if (family != "gpt" && family != "llama") {
    return Fail(kFailed, absl::StrCat(source->path(), ": its model (", weights.config.DebugString(),
                                      ") has neither GPT-2's nor Llama's choices, so no Hugging "
                                      "Face class computes it"));
  }
  const bool llama = family == "llama";
  if (const absl::Status written = llama ? checkpoint::ExportHfLlama(weights, options.out)
                                         : checkpoint::ExportHfGpt2(weights, options.out);
      !written.ok()) {
    return Fail(kFailed, written.message());
  }
  std::cout << "Exported " << (source->step() ? absl::StrCat("step ", *source->step(), " (") : "")
            << source->path() << (source->step() ? ")" : "") << " to " << options.out << ": "
            << checkpoint::kModelFileName << " and config.json, " << weights.config.layers
            << " layers, " << (llama ? "hidden_size " : "n_embd ") << weights.config.d_model << ", "
            << weights.config.heads << " heads"
            << (llama ? absl::StrCat(" (", weights.config.kv(), " key/value)") : "") << ", "
            << (weights.config.tied_embeddings ? "tied" : "untied") << " head\n"
            << "Load it with transformers." << (llama ? "LlamaForCausalLM" : "GPT2LMHeadModel")
            << ".from_pretrained(\"" << options.out << "\")\n";
  return kOk;
}

}  // namespace shardline::cli
