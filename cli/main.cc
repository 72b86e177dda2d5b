// The one `shardline` binary: every daemon and tool is a subcommand.
#include <fstream>
#include <iostream>

#include "CLI/CLI.hpp"
#include "cli/commands.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "coordinator/coordinator.h"
#include "protocol/address_rule.h"
#include "spdlog/spdlog.h"
#include "worker/actor/actor.h"
#include "worker/actor/actor_flags.h"
#include "worker/agent/agent.h"

namespace shardline::cli {
namespace {

constexpr const char* kDefaultCoordinator = "tcp://127.0.0.1:5555";

std::string DefaultCoordinator() {
  const char* env = std::getenv("SHARDLINE_COORDINATOR");
  return env ? env : kDefaultCoordinator;
}

// Every option of a daemon may come from the environment as well, SHARDLINE_ and its long name
// in upper case with '_' for '-' (--state-dir: $SHARDLINE_STATE_DIR), as a container or a
// launcher sets it (deploy/kubernetes/). A flag on the command line wins.
void TakeOptionsFromEnvironment(CLI::App* command) {
  for (CLI::Option* option : command->get_options()) {
    std::string name = option->get_single_name();
    if (name.empty() || name == "help") continue;
    std::string env = "SHARDLINE_";
    for (char c : name) env += c == '-' ? '_' : static_cast<char>(std::toupper(c));
    option->envname(env);
  }
}

// The endpoint the coordinator publishes (--endpoint-file, `shardline slurm`): its bound one, with
// a wildcard host replaced by the advertised address (protocol/address_rule.h).
absl::StatusOr<std::string> PublishedEndpoint(const std::string& bound,
                                              const std::string& advertise_address,
                                              const std::string& interface) {
  if (!protocol::HasWildcardHost(bound) && advertise_address.empty() && interface.empty()) {
    return bound;
  }
  // Listening everywhere, it is reached at the address of the interface that routes outwards,
  // unless told: a coordinator has no coordinator of its own to route to.
  ASSIGN_OR_RETURN(
      const protocol::AdvertisedAddress advertised,
      protocol::ChooseAdvertisedAddress(advertise_address, interface, "tcp://192.0.2.1:9"));
  spdlog::info("the coordinator advertises {} ({})", advertised.address,
               advertise_address.empty() && interface.empty()
                   ? "the address of " + advertised.interface + ", the default route's interface"
                   : advertised.how);
  return protocol::WithHost(bound, advertised.address);
}

// --keys, --key and --insecure: where a daemon or client finds its CURVE keys.
void AddCurveFlags(CLI::App* command, protocol::CurveSetup& curve, bool identity) {
  command->add_option("--keys", curve.key_dir,
                      "CURVE key directory, made by `shardline keygen` ($SHARDLINE_KEYS; "
                      "default ~/.shardline/keys)");
  if (identity) {
    command->add_option("--key", curve.identity,
                        "This process's key pair, a NAME.key_secret file ($SHARDLINE_KEY; "
                        "default: the key directory's node.key_secret for agents, "
                        "client.key_secret for clients)");
  }
  command->add_flag("--insecure", curve.insecure,
                    "No CURVE authentication or encryption: anyone who reaches the "
                    "coordinator's port can run programs on every agent's host");
}

struct CoordinatorCommand {
  std::string endpoint_file;
  std::string advertise_address, interface;
};

int RunCoordinator(coordinator::CoordinatorOptions options, const CoordinatorCommand& command) {
  auto coordinator = coordinator::Coordinator::Create(std::move(options), SteadyClock::Get());
  if (!coordinator.ok()) {
    spdlog::error("{}", ToString(coordinator.status().message()));
    std::cerr << "error: " << coordinator.status().message() << "\n";
    return 1;
  }
  if (!command.endpoint_file.empty()) {
    auto published =
        PublishedEndpoint((*coordinator)->endpoint(), command.advertise_address, command.interface);
    if (!published.ok()) {
      std::cerr << "error: " << published.status().message() << "\n";
      return 1;
    }
    // Written whole then renamed: whoever waits for the file never reads half an endpoint.
    const std::string tmp = command.endpoint_file + ".tmp";
    std::ofstream(tmp) << *published;
    std::rename(tmp.c_str(), command.endpoint_file.c_str());
  }
  InstallStopHandlers();
  InstallReloadHandler();
  auto status = (*coordinator)->Run(StopRequested(), &ReloadRequested());
  if (!status.ok()) {
    std::cerr << "error: " << status.message() << "\n";
    return 1;
  }
  return 0;
}

int RunAgent(agent::AgentOptions options) {
  auto agent = agent::Agent::Create(std::move(options));
  if (!agent.ok()) {
    std::cerr << "error: " << agent.status().message() << "\n";
    return 1;
  }
  InstallStopHandlers();
  auto status = (*agent)->Run(StopRequested());
  if (!status.ok()) {
    spdlog::error("{}", ToString(status.message()));
    std::cerr << "error: " << status.message() << "\n";
    return 1;
  }
  return 0;
}

}  // namespace

int Main(int argc, char** argv) {
  CLI::App app{"Shardline: shard transformer models across devices and hosts"};
  app.require_subcommand(1);
  std::string log_level = "info";
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error or off")
      ->capture_default_str();

  // ---- daemons ----
  coordinator::CoordinatorOptions coordinator_options;
  CoordinatorCommand coordinator_command;
  int64_t heartbeat_interval_ms = 300, heartbeat_timeout_ms = 1500;
  auto* coordinator_cmd = app.add_subcommand("coordinator", "Run the coordinator daemon");
  coordinator_cmd->add_option("--listen", coordinator_options.listen, "ZeroMQ endpoint to bind (port 0: any)")
      ->capture_default_str();
  coordinator_cmd->add_option("--metrics", coordinator_options.metrics_address,
                              "HOST:PORT of the Prometheus endpoint (empty: none)")
      ->capture_default_str();
  coordinator_cmd->add_option("--state-dir", coordinator_options.state_dir,
                              "Directory for the job history");
  coordinator_cmd->add_option("--cluster-id", coordinator_options.cluster_id)->capture_default_str();
  coordinator_cmd->add_option("--heartbeat-interval-ms", heartbeat_interval_ms)
      ->check(CLI::Range(10, 600000))->capture_default_str();
  coordinator_cmd->add_option("--heartbeat-timeout-ms", heartbeat_timeout_ms)
      ->check(CLI::Range(20, 3600000))->capture_default_str();
  coordinator_cmd->add_option("--endpoint-file", coordinator_command.endpoint_file,
                              "Write the endpoint to reach it here once listening (a wildcard "
                              "--listen host replaced by the advertised address)");
  coordinator_cmd->add_option(
      "--advertise-address", coordinator_command.advertise_address,
      "The IPv4 address others reach it at (default, when listening on "
      "every interface: the address of the interface that routes outwards)");
  coordinator_cmd->add_option("--interface", coordinator_command.interface,
                              "Advertise this interface's address");
  coordinator_cmd->add_option("--log-level", log_level);
  AddCurveFlags(coordinator_cmd, coordinator_options.curve, false);
  TakeOptionsFromEnvironment(coordinator_cmd);

  agent::AgentOptions agent_options;
  double connect_timeout_s = 30;
  auto* agent_cmd = app.add_subcommand("agent", "Run a node agent");
  agent_cmd->add_option("--coordinator", agent_options.coordinator)->default_val(DefaultCoordinator());
  agent_cmd->add_option("--devices", agent_options.devices, "cpu:N, cuda or auto")->capture_default_str();
  agent_cmd->add_option("--node-id", agent_options.node_id, "Default: the host name");
  agent_cmd->add_option("--advertise-address", agent_options.advertise_address,
                        "The IPv4 address this node's peers reach it and its actors at "
                        "(default: the address of the interface that routes to the coordinator)");
  agent_cmd->add_option("--interface", agent_options.interface,
                        "Advertise this interface's address (for ZeroMQ, Gloo and NCCL alike)");
  agent_cmd->add_option("--metrics", agent_options.metrics_address,
                        "HOST:PORT of the agent's Prometheus endpoint (loopback by default)")
      ->capture_default_str();
  agent_cmd->add_option("--actor-metrics-host", agent_options.actor_metrics_host,
                        "Where the actors' Prometheus endpoints listen, any port (loopback by "
                        "default; this node's address for a Prometheus elsewhere)")
      ->capture_default_str();
  agent_cmd->add_option("--cluster-id", agent_options.cluster_id)->capture_default_str();
  agent_cmd->add_option("--log-dir", agent_options.log_dir, "One log file per actor here");
  agent_cmd->add_option("--memory-store", agent_options.memory_store,
                        "Where this node's actors keep in-memory checkpoint steps "
                        "(checkpoint.memory_interval): host memory that outlives them "
                        "(default /dev/shm/shardline/CLUSTER/NODE)");
  agent_cmd->add_option("--actor-binary", agent_options.actor_binary,
                        "The program run for each actor (default: this executable); tests use "
                        "it to inject faults");
  agent_cmd->add_option("--connect-timeout-s", connect_timeout_s,
                        "Give up when the first registration fails this long")
      ->check(CLI::Range(0.1, 86400.0))->capture_default_str();
  agent_cmd->add_option("--log-level", log_level);
  AddCurveFlags(agent_cmd, agent_options.curve, true);
  TakeOptionsFromEnvironment(agent_cmd);

  actor::ActorOptions actor_options;
  auto* actor_cmd = app.add_subcommand("actor", "Run one actor (spawned by an agent)");
  actor_cmd->group("");  // internal: not listed in --help
  actor::AddActorFlags(*actor_cmd, actor_options, log_level);

  // ---- clients ----
  ClientOptions client;
  client.coordinator = DefaultCoordinator();
  double timeout_s = 5;
  auto add_client_options = [&](CLI::App* cmd) {
    cmd->add_option("--coordinator", client.coordinator, "Coordinator endpoint ($SHARDLINE_COORDINATOR)")
        ->capture_default_str();
    cmd->add_option("--cluster-id", client.cluster_id)->capture_default_str();
    cmd->add_option("--timeout-s", timeout_s, "How long to wait for the coordinator")
        ->check(CLI::Range(0.01, 3600.0))->capture_default_str();
    cmd->add_option("--log-level", log_level);
    AddCurveFlags(cmd, client.curve, true);
  };

  SubmitOptions submit_options;
  int64_t wait_timeout_s = 3600;
  auto* submit_cmd = app.add_subcommand("submit", "Submit a job spec (YAML)");
  submit_cmd->add_option("spec", submit_options.spec_path, "Job spec file")->required();
  submit_cmd->add_flag("--wait", submit_options.wait, "Follow the job to its end");
  submit_cmd->add_option("--wait-timeout-s", wait_timeout_s)->capture_default_str();
  add_client_options(submit_cmd);

  StatusOptions status_options;
  auto* status_cmd = app.add_subcommand("status", "Show nodes, devices, jobs and actors");
  status_cmd->add_option("job", status_options.job_id, "Show one job in detail");
  status_cmd->add_flag("--json", status_options.json, "Machine-readable output");
  add_client_options(status_cmd);

  std::string cancel_job;
  auto* cancel_cmd = app.add_subcommand("cancel", "Cancel a job");
  cancel_cmd->add_option("job", cancel_job)->required();
  add_client_options(cancel_cmd);

  PlanOptions plan_options;
  auto* plan_cmd = app.add_subcommand(
      "plan", "Choose the parallel layout of a model on a cluster (the placement planner)");
  plan_cmd->add_option("--model", plan_options.model_path, "Model spec (YAML)");
  plan_cmd->add_option("--cluster", plan_options.cluster_path,
                       "Cluster spec (YAML); default: the live coordinator's cluster");
  plan_cmd->add_option("--train", plan_options.train_path,
                       "Train set-up (YAML): global_batch, seq_len, micro_batch, dtype, zero");
  plan_cmd->add_flag("--json", plan_options.json, "Machine-readable output");
  plan_cmd->add_flag("--explain", plan_options.explain,
                     "Also the alternatives, the rejected candidates and the rank map");
  plan_cmd->add_option("--devices", plan_options.devices,
                       "Which devices of the live cluster: cpu, cuda or auto")
      ->capture_default_str();
  add_client_options(plan_cmd);

  UpOptions up_options;
  auto* up_cmd = app.add_subcommand("up", "Start a local cluster on this machine and run the default job");
  up_cmd->add_option("--devices", up_options.devices,
                     "CPU devices of the local node (default: 4 on 4 or more cores, else 2)");
  up_cmd->add_option("--job", up_options.job_path, "Run this job spec instead of the default");
  up_cmd->add_option("--work-dir", up_options.work_dir, "Logs and state here (default: a temp dir)");
  up_cmd->add_flag("--keep", up_options.keep, "Keep the logs and state after success");
  up_cmd->add_option("--log-level", log_level);
  up_cmd->add_flag("--insecure", up_options.insecure,
                   "No CURVE keys (by default `up` makes throwaway ones in WORK_DIR/keys)");

  SlurmOptions slurm_options;
  int64_t slurm_start_timeout_s = slurm_options.start_timeout.count();
  int64_t slurm_wait_timeout_s = slurm_options.wait_timeout.count();
  auto* slurm_cmd = app.add_subcommand(
      "slurm", "Run a job on a cluster of this SLURM allocation's nodes (in an sbatch script)");
  slurm_cmd->add_option("spec", slurm_options.spec_path, "Job spec file")->required();
  slurm_cmd->add_option("--rendezvous-dir", slurm_options.rendezvous_dir,
                        "Where the first node publishes the coordinator's endpoint and the "
                        "allocation's keys, on a file system every node shares (default "
                        "~/.shardline/slurm/JOB.STEP; mode 0700, removed at the end)");
  slurm_cmd->add_option("--devices", slurm_options.devices,
                        "Each node's devices (default: its allocated GPUs, else cpu:N for its "
                        "N allocated CPUs)");
  slurm_cmd->add_option("--interface", slurm_options.interface,
                        "Advertise this interface's address on every node (default: the "
                        "interface that routes to the coordinator; the coordinator's, the one "
                        "that routes to the other nodes)");
  slurm_cmd
      ->add_option("--start-timeout-s", slurm_start_timeout_s,
                   "How long the other nodes wait for the first one's coordinator")
      ->check(CLI::Range(1, 86400))
      ->capture_default_str();
  slurm_cmd->add_option("--wait-timeout-s", slurm_wait_timeout_s, "How long to follow the job")
      ->check(CLI::Range(1, 100 * 86400))
      ->capture_default_str();
  slurm_cmd->add_option("--log-level", log_level);

  KeygenOptions keygen_options;
  auto* keygen_cmd = app.add_subcommand(
      "keygen", "Make the cluster's CURVE keys (coordinator, node, client) and allowlist");
  keygen_cmd->add_option("--out", keygen_options.out, "The key directory (made, mode 0700)")
      ->required();
  keygen_cmd->add_option("--name", keygen_options.name,
                         "Add one identity NAME.key/NAME.key_secret to an existing directory "
                         "and its allowlist (one key per node or user)");
  keygen_cmd->add_option("--role", keygen_options.role, "With --name: node or client")
      ->capture_default_str();
  keygen_cmd->add_option("--log-level", log_level);

  TrainOptions train_options;
  auto* train_cmd = app.add_subcommand("train", "Train a GPT on this machine (one device)");
  train_cmd->add_option("spec", train_options.spec_path, "Training spec (YAML)")->required();
  train_cmd->add_option("--steps", train_options.steps, "Override the spec's steps")
      ->check(CLI::PositiveNumber);
  train_cmd->add_option("--checkpoint-dir", train_options.checkpoint_dir,
                        "Override the spec's checkpoint dir");
  train_cmd->add_option("--resume", train_options.resume,
                        "Override the spec's checkpoint.resume: latest (the newest committed step "
                        "that verifies), none, or a checkpoint step to resume from");
  train_cmd->add_option("--init-from", train_options.init_from,
                        "Start a fresh run from the parameters of this checkpoint (ours, a "
                        "sharded step, or a Hugging Face GPT-2 model.safetensors)");
  train_cmd->add_option("--device", train_options.device,
                        "Override the spec's device: cpu, cuda or cuda:N (its default precision "
                        "too: bf16 on cuda)");
  train_cmd->add_option("--precision", train_options.precision,
                        "Override the spec's precision: fp32 or bf16 (cuda only)");
  train_cmd->add_option("--log-level", log_level);

  GenerateCommandOptions generate_options;
  auto* generate_cmd = app.add_subcommand("generate", "Generate text from a checkpoint");
  generate_cmd
      ->add_option("--checkpoint", generate_options.checkpoint,
                   "A checkpoint file, a training run's checkpoint folder or a Hugging "
                   "Face model folder")
      ->required();
  generate_cmd->add_option("--prompt", generate_options.prompt)->required();
  generate_cmd->add_option("--max-new-tokens", generate_options.max_new_tokens)
      ->check(CLI::Range(1, 1 << 20))->capture_default_str();
  generate_cmd->add_option("--temperature", generate_options.temperature, "0: greedy")
      ->check(CLI::Range(0.0, 100.0))->capture_default_str();
  generate_cmd->add_option("--top-k", generate_options.top_k, "0: all tokens")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
  generate_cmd->add_option("--seed", generate_options.seed)->capture_default_str();
  generate_cmd->add_option("--hf-heads", generate_options.hf_heads,
                           "Heads of a Hugging Face GPT-2 checkpoint")
      ->check(CLI::PositiveNumber)->capture_default_str();
  generate_cmd->add_option("--tokenizer", generate_options.tokenizer,
                           "bytes, or a folder with tokenizer.json (or vocab.json + merges.txt), "
                           "or one of those files; default: the checkpoint folder's, else bytes");
  generate_cmd->add_flag("--no-kv-cache", generate_options.no_kv_cache,
                         "Recompute the whole sequence for every token (reference path)");
  generate_cmd->add_flag("--ignore-eos", generate_options.ignore_eos,
                         "Go on generating past an end-of-sequence token (printing it)");
  generate_cmd
      ->add_option("--device", generate_options.device, "cpu, cuda or cuda:N (fp32 on either)")
      ->capture_default_str();
  generate_cmd->add_option("--log-level", log_level);

  ServeOptions serve_options;
  auto* serve_cmd = app.add_subcommand(
      "serve",
      "Serve a checkpoint over an OpenAI-compatible HTTP API (continuous batching; --tp N: N "
      "processes)");
  serve_cmd
      ->add_option("--checkpoint", serve_options.checkpoint,
                   "A checkpoint file, a training run's checkpoint folder or a Hugging Face "
                   "model folder")
      ->required();
  serve_cmd->add_option("--tokenizer", serve_options.tokenizer,
                        "bytes, or a tokenizer folder or file (as `generate`); default: the "
                        "checkpoint folder's, else bytes");
  serve_cmd->add_option("--listen", serve_options.listen, "HOST:PORT (port 0: any free port)")
      ->capture_default_str();
  auto* api_key_opt = serve_cmd->add_option("--api-key", serve_options.api_key,
                                            "Require 'Authorization: Bearer KEY' on /v1/*");
  serve_cmd->add_option("--api-key-file", serve_options.api_key_file,
                        "As --api-key, the key being this file's first line")
      ->check(CLI::ExistingFile)
      ->excludes(api_key_opt);
  serve_cmd->add_option("--model-name", serve_options.model_name,
                        "The model name clients give (default: the checkpoint's name)");
  serve_cmd->add_option("--max-queue", serve_options.max_queue,
                        "Requests that may wait to join the running batch; more get 429")
      ->check(CLI::Range(1, 1 << 20))->capture_default_str();
  serve_cmd->add_option("--max-running", serve_options.max_running,
                        "Sequences generated together in one batch")
      ->check(CLI::Range(1, 4096))->capture_default_str();
  serve_cmd->add_option("--max-tokens-per-step", serve_options.max_tokens_per_step,
                        "Prompt and decode tokens one step computes (longer prompts are "
                        "prefilled in chunks)")
      ->check(CLI::Range(1, 1 << 20))->capture_default_str();
  serve_cmd->add_option("--block-size", serve_options.block_size, "KV-cache positions per block")
      ->check(CLI::Range(1, 4096))->capture_default_str();
  serve_cmd
      ->add_option("--kv-cache-mib", serve_options.kv_cache_mib,
                   "KV-cache size, of each rank with --tp (0: room for --max-running whole "
                   "contexts)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 30))
      ->capture_default_str();
  serve_cmd->add_option("--hf-heads", serve_options.hf_heads,
                        "Heads of a Hugging Face GPT-2 checkpoint")
      ->check(CLI::PositiveNumber)->capture_default_str();
  serve_cmd
      ->add_option("--tp", serve_options.tp,
                   "Tensor-parallel ranks: processes of this host, each holding 1/N of the "
                   "heads, MLP columns and vocabulary (N must divide the heads and d_ff)")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  // No range check here: serve names the model's layers when --pp is out of range (exit 2).
  serve_cmd
      ->add_option("--pp", serve_options.pp,
                   "Pipeline stages: tp x pp processes of this host, each stage holding its share "
                   "of the layers (1 to the model's layers)")
      ->capture_default_str();
  serve_cmd
      ->add_option("--device", serve_options.device,
                   "cpu, cuda or cuda:N: where every rank computes (fp32; with --tp/--pp the "
                   "ranks share the GPU and exchange through host memory)")
      ->capture_default_str();
  serve_cmd->add_option("--log-level", log_level);

  // The options `serve --tp/--pp` starts each other rank with (cli/serve.cc's ServeRankCommand).
  ServeRankOptions serve_rank_options;
  auto* serve_rank_cmd =
      app.add_subcommand("serve-rank", "One rank of `serve --tp/--pp` (internal)");
  serve_rank_cmd->group("");  // internal: not listed in --help
  serve_rank_cmd->add_option("--checkpoint", serve_rank_options.checkpoint)->required();
  serve_rank_cmd->add_option("--hf-heads", serve_rank_options.hf_heads)->required();
  serve_rank_cmd->add_option("--rank", serve_rank_options.rank)->required();
  serve_rank_cmd->add_option("--tp", serve_rank_options.tp)->required();
  serve_rank_cmd->add_option("--pp", serve_rank_options.pp)->required();
  serve_rank_cmd->add_option("--store", serve_rank_options.store_dir)->required();
  serve_rank_cmd->add_option("--max-running", serve_rank_options.max_running)->required();
  serve_rank_cmd->add_option("--max-tokens-per-step", serve_rank_options.max_tokens_per_step)
      ->required();
  serve_rank_cmd->add_option("--block-size", serve_rank_options.block_size)->required();
  serve_rank_cmd->add_option("--kv-cache-mib", serve_rank_options.kv_cache_mib)->required();
  serve_rank_cmd->add_option("--device", serve_rank_options.device)->required();
  serve_rank_cmd->add_option("--log-level", log_level);

  CheckpointInspectOptions inspect_options;
  CheckpointExportOptions export_options;
  auto* checkpoint_cmd =
      app.add_subcommand("checkpoint", "Inspect, verify and export checkpoints (no cluster)");
  checkpoint_cmd->require_subcommand(1);
  auto* inspect_cmd = checkpoint_cmd->add_subcommand(
      "inspect", "List the steps of a run's checkpoint dir, or one step's tensors");
  inspect_cmd
      ->add_option("dir", inspect_options.dir,
                   "A run's checkpoint dir, a step folder or a step's manifest.json")
      ->required();
  inspect_cmd->add_option("--step", inspect_options.step, "Show this step's tensors")
      ->check(CLI::NonNegativeNumber);
  inspect_cmd->add_flag("--verify", inspect_options.verify,
                        "Check every listed step's files against their checksums");
  inspect_cmd->add_flag("--json", inspect_options.json, "Machine-readable output");
  inspect_cmd->add_option("--log-level", log_level);
  auto* export_cmd = checkpoint_cmd->add_subcommand(
      "export", "Write a checkpoint step's parameters in another format");
  export_cmd->add_option("dir", export_options.dir, "A checkpoint (a run's dir, a step, a file)")
      ->required();
  export_cmd
      ->add_option("--step", export_options.step,
                   "This committed step of the run (default: the one `latest` names)")
      ->check(CLI::NonNegativeNumber);
  export_cmd
      ->add_option("--format", export_options.format,
                   "hf: a Hugging Face GPT-2 or Llama folder (model.safetensors + config.json)")
      ->required();
  export_cmd->add_option("--out", export_options.out, "A new or empty folder")->required();
  export_cmd->add_option("--log-level", log_level);

  CLI11_PARSE(app, argc, argv);

  const std::string component = app.get_subcommands().front()->get_name();
  if (auto status = InitLogging(component, log_level); !status.ok()) {
    std::cerr << "error: " << status.message() << "\n";
    return 2;
  }
  client.timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));

  if (*coordinator_cmd) {
    coordinator_options.heartbeat_interval = std::chrono::milliseconds(heartbeat_interval_ms);
    coordinator_options.heartbeat_timeout = std::chrono::milliseconds(heartbeat_timeout_ms);
    return RunCoordinator(std::move(coordinator_options), coordinator_command);
  }
  if (*agent_cmd) {
    agent_options.connect_timeout =
        std::chrono::milliseconds(static_cast<int64_t>(connect_timeout_s * 1000));
    agent_options.log_level = log_level;
    return RunAgent(std::move(agent_options));
  }
  if (*actor_cmd) return actor::RunActor(actor_options);
  if (*submit_cmd) {
    submit_options.wait_timeout = std::chrono::seconds(wait_timeout_s);
    InstallStopHandlers();
    return Submit(client, submit_options);
  }
  if (*status_cmd) return Status(client, status_options);
  if (*cancel_cmd) return Cancel(client, cancel_job);
  if (*plan_cmd) {
    // The live cluster only when one was named: a plan for a default endpoint nobody chose would
    // be a surprise.
    const char* env = std::getenv("SHARDLINE_COORDINATOR");
    plan_options.coordinator_given =
        plan_cmd->get_option("--coordinator")->count() > 0 || (env != nullptr && *env != '\0');
    return Plan(client, plan_options);
  }
  if (*train_cmd) return Train(train_options);
  if (*generate_cmd) return Generate(generate_options);
  if (*serve_cmd) {
    serve_options.log_level = log_level;
    return Serve(serve_options);
  }
  if (*serve_rank_cmd) {
    serve_rank_options.log_level = log_level;
    return ServeRank(serve_rank_options);
  }
  if (*checkpoint_cmd) {
    return *inspect_cmd ? CheckpointInspect(inspect_options) : CheckpointExport(export_options);
  }
  if (*keygen_cmd) return Keygen(keygen_options);
  if (*slurm_cmd) {
    slurm_options.log_level = log_level;
    slurm_options.start_timeout = std::chrono::seconds(slurm_start_timeout_s);
    slurm_options.wait_timeout = std::chrono::seconds(slurm_wait_timeout_s);
    return Slurm(slurm_options, argc, argv);
  }
  if (*up_cmd) {
    up_options.log_level = log_level;
    return Up(up_options);
  }
  return 2;
}

}  // namespace shardline::cli

int main(int argc, char** argv) { return shardline::cli::Main(argc, argv); }
