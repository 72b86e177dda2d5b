# Every control message of Shardline. One ZeroMQ frame carries one Envelope.
# Compatibility: fields are only ever added (new ordinals), never renumbered; a breaking change
# bumps `protocolVersion` below, and peers of another version are refused with an error reply.
@0xf03e18e6711f6ee9;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("shardline::wire");

const protocolVersion :UInt32 = 1;

struct Envelope {
  protocolVersion @0 :UInt32;
  clusterId @1 :Text;
  sender @2 :Text;        # "coordinator", "agent/NODE", "actor/JOB/GEN/RANK", "cli"
  requestId @3 :UInt64;   # a reply echoes its request's id; 0 for messages that expect no reply

  payload :union {
    error @4 :Error;
    ack @5 :Void;
    registerNode @6 :RegisterNode;
    registerNodeReply @7 :RegisterNodeReply;
    heartbeat @8 :Heartbeat;
    submitJob @9 :SubmitJob;
    submitJobReply @10 :SubmitJobReply;
    statusRequest @11 :StatusRequest;
    clusterStatus @12 :ClusterStatus;
    cancelJob @13 :CancelJob;
    spawnActors @14 :SpawnActors;
    abortGeneration @15 :AbortGeneration;
    actorExited @16 :ActorExited;
    registerActor @17 :RegisterActor;
    assignment @18 :Assignment;
    kvRequest @19 :KvRequest;
    kvReply @20 :KvReply;
    commReady @21 :CommReady;
    commFailed @22 :CommFailed;
    stepReport @23 :StepReport;
    actorDone @24 :ActorDone;
    shutdown @25 :Shutdown;
    commJoin @26 :CommJoin;
    shardSaved @27 :ShardSaved;
    calibration @28 :Calibration;
  }

  # An actor's secret for its rank of its job's generation (ActorSpawn.token, handed to it by its
  # agent); on every message an actor sends. The coordinator checks it against the job, generation
  # and rank the message claims. Empty for every other sender.
  actorToken @29 :Data;
}

# A failed request. `code` is an absl::StatusCode.
struct Error {
  code @0 :UInt32;
  message @1 :Text;
}

enum DeviceKind {
  cpu @0;
  cuda @1;
}

struct Device {
  kind @0 :DeviceKind;
  index @1 :UInt32;
  memoryBytes @2 :UInt64;
  name @3 :Text;
  # Status only: why placements leave the device out while others are free (a generation's
  # cause was the death or hang of its actor), until its node registers again; empty: trusted.
  avoided @4 :Text;
}

# ---- membership (agent -> coordinator) ----

struct RegisterNode {
  nodeId @0 :Text;
  instanceId @1 :Text;      # new at every agent start: tells a restarted agent from a second one
  hostname @2 :Text;
  address @3 :Text;         # the node's address that reaches the coordinator
  devices @4 :List(Device);
  metricsAddress @5 :Text;
  pid @6 :UInt32;
  addressChosenBy @7 :Text;  # why this address (protocol/address_rule.h): "--interface eth1", ...
}

struct RegisterNodeReply {
  heartbeatIntervalMs @0 :UInt32;
  heartbeatTimeoutMs @1 :UInt32;
  # Changes when the coordinator restarts: an agent that registers with a new instance kills the
  # actors it still runs, whose generations the new coordinator no longer supervises (fencing).
  coordinatorInstance @2 :Text;
}

# Answered by `ack`, or by an error NOT_FOUND when the coordinator no longer knows the node (it
# restarted, or declared the node dead): the agent then registers again.
struct Heartbeat {
  nodeId @0 :Text;
  instanceId @1 :Text;
  runningActors @2 :UInt32;
  stoppedActors @3 :List(ActorRef);  # actors of this node that are stopped (SIGSTOP, a debugger)
}

struct ActorRef {
  jobId @0 :Text;
  generation @1 :UInt32;
  rank @2 :UInt32;
}

# ---- jobs (cli -> coordinator) ----

struct SubmitJob {
  specYaml @0 :Text;
  sourceName @1 :Text;      # the file name, for error messages
  # Where relative paths of the spec resolve (a train job's data.path against specDir, its
  # checkpoint.dir against workDir): the spec file's absolute folder and the submitter's current
  # directory. Empty: the coordinator's current directory.
  specDir @2 :Text;
  workDir @3 :Text;
}

struct SubmitJobReply {
  jobId @0 :Text;
}

struct StatusRequest {
  jobId @0 :Text;           # empty: every job
}

struct CancelJob {
  jobId @0 :Text;
}

struct ClusterStatus {
  clusterId @0 :Text;
  nodes @1 :List(NodeStatus);
  jobs @2 :List(JobStatus);
  coordinatorUptimeMs @3 :UInt64;
  metricsAddress @4 :Text;  # the coordinator's Prometheus endpoint
}

struct NodeStatus {
  nodeId @0 :Text;
  hostname @1 :Text;
  address @2 :Text;
  state @3 :Text;           # alive | dead
  devices @4 :List(Device);
  lastHeartbeatAgoMs @5 :UInt64;
  metricsAddress @6 :Text;
  actors @7 :UInt32;
  calibration @8 :NodeCalibration;  # what the node's actors last measured
  addressChosenBy @9 :Text;
}

# What the planner knows of one node from its actors' start-up measurements (Calibration); a
# value of 0 was never measured, and the planner then assumes its defaults. Intra-node numbers
# come from groups whose ranks all ran on this node, inter-node ones from groups that spanned
# it and others. Each is from the latest job generation that measured it, the most conservative
# of that generation's reports (the lowest bandwidth, the highest latency).
struct NodeCalibration {
  computeFlops @0 :Float64;            # fp32 layer FLOP/s of one device (the slowest measured)
  intraBusBytesPerSecond @1 :Float64;  # all-reduce bus bandwidth
  intraLatencySeconds @2 :Float64;     # per link step (LinkCalibration in coordinator/calibration.h)
  interBusBytesPerSecond @3 :Float64;
  interLatencySeconds @4 :Float64;
  jobId @5 :Text;                      # the job whose actors measured last
  measuredUnixMs @6 :Int64;            # 0: never
  devices @7 :List(DeviceCompute);     # per device
  computeHalfDim @8 :Float64;          # of the device computeFlops is
  optimizerBytesPerSecond @9 :Float64; # the slowest measured device's optimizer step
}

# A device's transformer-layer rate (worker/actor/calibration.h): FLOP/s approached by wide
# layers, and the size min(tokens per micro-batch, d_model) at which a layer reaches half of it.
struct DeviceCompute {
  device @0 :Device;
  computeFlops @1 :Float64;
  computeHalfDim @2 :Float64;
  optimizerBytesPerSecond @3 :Float64;  # AdamW + gradient norm, 32 bytes per parameter
}

struct JobStatus {
  jobId @0 :Text;
  name @1 :Text;
  kind @2 :Text;
  state @3 :Text;           # pending | running | succeeded | failed | cancelled
  generation @4 :UInt32;
  worldSize @5 :UInt32;
  error @6 :Text;
  submittedUnixMs @7 :Int64;
  finishedUnixMs @8 :Int64;
  phase @9 :Text;           # within running: spawning | registering | bootstrapping | running
  actors @10 :List(ActorStatus);
  results @11 :List(CollectiveResult);
  backend @12 :Text;
  train @13 :TrainProgress; # kind train only
  serving @14 :ServingStatus;  # kind serve only: the leader's last report
}

# A serve job's service as its leader (rank 0) reports it: once it listens, then every second.
struct ServingStatus {
  url @0 :Text;             # "http://HOST:PORT"; empty until the leader listens
  model @1 :Text;           # the name /v1/models lists
  ready @2 :Bool;           # every rank has loaded its shard and the engine runs
  tp @3 :UInt32;
  pp @4 :UInt32;
  running @5 :UInt64;       # sequences in the running batch
  waiting @6 :UInt64;       # requests queued behind them
  tokensGenerated @7 :UInt64;  # by this generation's engine, since it started
  kvBlocks @8 :UInt64;      # blocks of the KV cache on each rank
  kvBlocksUsed @9 :UInt64;
  preemptions @10 :UInt64;
  # Status only (the coordinator's, not the leader's report):
  maxRunning @11 :UInt32;   # the spec's limits
  maxTokensPerStep @12 :UInt32;
  blockSize @13 :UInt32;
  generations @14 :List(GenerationStatus);  # every generation of the service, oldest first
  elastic @15 :Bool;                        # it restarts after a fault (its spec has `elastic`)
  planSummary @16 :Text;    # `parallel: auto`: the layout planned and what a rank holds
}

# A train job's progress as the coordinator aggregates it from every rank's StepReports: the loss
# of the last pipeline stage, the timings of the slowest rank. `step` is 0 until the first report.
struct TrainProgress {
  step @0 :UInt64;
  steps @1 :UInt64;
  loss @2 :Float64;
  tokensPerSecond @3 :Float64;
  computeSeconds @4 :Float64;       # of one step, on the slowest rank
  commSeconds @5 :Float64;
  bubbleSeconds @6 :Float64;
  etaSeconds @7 :Float64;           # to the last step at the recent rate; 0 when unknown
  lastCommittedStep @8 :Int64 = -1; # -1: nothing committed yet
  checkpointDir @9 :Text;           # absolute; empty: the job saves no checkpoints
  tp @10 :UInt32;                   # the plan
  pp @11 :UInt32;
  dp @12 :UInt32;
  zero @13 :UInt32;
  microBatch @14 :UInt64;           # sequences per micro-batch on one data-parallel rank
  microBatches @15 :UInt64;         # micro-batches per step
  batch @16 :UInt64;                # sequences per step
  seqLen @17 :UInt64;
  autoPlan @18 :Bool;               # `parallel: auto`: the planner chose the plan above
  predictedStepSeconds @19 :Float64;  # the planner's price of the layout; 0 when none
  predictedMemoryBytes @20 :UInt64;   # the planner's peak per device; 0 when none
  planSummary @21 :Text;            # the planner's one-line summary of the chosen plan
  predictionCalibrated @22 :Bool;   # predictedStepSeconds priced with this generation's own
                                    # start-up calibration (every rank's), not earlier numbers
  resumedFromStep @23 :Int64;       # the committed step the job resumed after; 0: it started fresh
  skippedCheckpoints @24 :List(SkippedCheckpoint);  # newer steps that failed verification
  initializedFrom @25 :Text;        # init_from, when the job started from those parameters
  generations @26 :List(GenerationStatus);  # every generation of the job, oldest first
  elastic @27 :Bool;                # the job restarts on faults (its spec has `elastic`)
  minActors @28 :UInt32;
  maxActors @29 :UInt32;
  loggedStep @30 :UInt64;           # the newest step of log_interval reported (progress lines)
  layout @31 :ParallelLayout;       # the plan's whole layout, typed (its schedule and
                                    # recomputation too); unset while an auto job is not planned
  networkBytesPerStep @32 :GroupBytes;  # of the rank that moved the most in the latest step's
                                        # reports; unset until a rank has measured it
  lastMemoryStep @33 :Int64 = -1;  # the newest committed memory step (checkpoint.memory_interval);
                                   # -1: none (or none known since the coordinator started)
  memoryStoreBytes @34 :UInt64;    # host memory the job's memory steps take on its fullest node:
                                   # the steps a node keeps (3) x that node's files of the newest
}

# One generation of a train job as its supervisor saw it.
struct GenerationStatus {
  generation @0 :UInt32;
  startedUnixMs @1 :Int64;
  endedUnixMs @2 :Int64;           # 0 while it runs
  plan @3 :Text;                   # "tp=2 pp=2 dp=1 zero=0 on 4 actors"
  resumedStep @4 :Int64;           # the committed step it loaded; 0: fresh
  lastStep @5 :Int64;              # the newest step a rank reported
  ending @6 :Text;                 # running | fault | grow | succeeded | failed | cancelled
  cause @7 :Text;                  # the first cause in time (ending fault), e.g. "rank 1 on node-b
                                   # killed by SIGKILL at step 140"
  causeKind @8 :Text;              # actor_exit | actor_error | comm_error | node_lost | hung | ...
  consequences @9 :List(Text);     # what the cause set off: peers' broken sockets, aborted ranks
  stepsLost @10 :Int64;            # steps trained past the step the next generation resumed from
  recoverySeconds @11 :Float64;    # from the abort (the first fault seen) to the next
                                   # generation's first step; -1: none
  detectionSeconds @12 :Float64;   # from the fault to the supervisor's abort; -1: not measured
  abortSeconds @13 :Float64;       # from the abort until every actor of it had exited or was lost
  resumedFrom @14 :Text;           # "disk", "survivors" (the nodes' own memory copies),
                                   # "memory replica", or "" (fresh)
  resumeNote @15 :Text;            # why a newer memory step was not used, when one was not
}

# A committed checkpoint step that `resume: latest` passed over, and why (checkpoint/verify.h).
struct SkippedCheckpoint {
  step @0 :Int64;
  reason @1 :Text;
}

struct ActorStatus {
  rank @0 :UInt32;
  nodeId @1 :Text;
  device @2 :Device;
  pid @3 :UInt32;
  state @4 :Text;           # spawning | registered | bootstrapping | ready | running | succeeded | failed | lost
  detail @5 :Text;
  metricsAddress @6 :Text;
  address @7 :Text;         # where its communicators listen (its node's advertised address)
}

# One (operation, size) of a comm-check, as rank 0 measured it; `ok` is every rank's verdict.
struct CollectiveResult {
  op @0 :Text;
  bytes @1 :UInt64;
  ranks @2 :UInt32;
  seconds @3 :Float64;      # mean time of one operation
  algorithmGBps @4 :Float64;
  busGBps @5 :Float64;
  ok @6 :Bool;
  detail @7 :Text;          # what mismatched, when not ok
}

# ---- generations (coordinator <-> agent) ----

struct SpawnActors {
  jobId @0 :Text;
  generation @1 :UInt32;
  actors @2 :List(ActorSpawn);
}

struct ActorSpawn {
  rank @0 :UInt32;
  device @1 :Device;
  token @2 :Data;  # the actor's Envelope.actorToken: random, per rank and generation
  # On an AbortGeneration: 0, SIGKILL at once; else SIGTERM, and SIGKILL this many milliseconds
  # later if it is still alive (a serve job's leader, to answer its open requests first).
  stopGraceMs @3 :UInt32;
}

# Kill every actor of the job's generation (all of the job's generations when 0).
struct AbortGeneration {
  jobId @0 :Text;
  generation @1 :UInt32;
  reason @2 :Text;
  jobEnded @3 :Bool;        # no generation follows: the node drops what it held for the job
}

struct ActorExited {
  jobId @0 :Text;
  generation @1 :UInt32;
  rank @2 :UInt32;
  pid @3 :UInt32;
  signaled @4 :Bool;
  code @5 :Int32;           # exit code, or the signal when `signaled`
  description @6 :Text;
  killedByAgent @7 :Bool;   # the agent killed it (an abort): a consequence, not a cause
}

# ---- actors (actor <-> coordinator) ----

struct RegisterActor {
  jobId @0 :Text;
  generation @1 :UInt32;
  rank @2 :UInt32;
  nodeId @3 :Text;
  pid @4 :UInt32;
  address @5 :Text;         # where this actor's communicators listen
  metricsAddress @6 :Text;
}

# Everything an actor needs to run its part. Later issues add the shard it holds (layers, slices)
# as new fields; the groups already carry every parallel dimension.
struct Assignment {
  jobId @0 :Text;
  generation @1 :UInt32;
  rank @2 :UInt32;
  worldSize @3 :UInt32;
  kind @4 :Text;            # comm-check
  specYaml @5 :Text;        # the job spec as submitted
  backend @6 :Text;         # gloo | nccl
  device @7 :Device;
  groups @8 :List(Group);
  storePrefix @9 :Text;     # key prefix of this job generation in the coordinator's store
  bootstrapTimeoutMs @10 :UInt32;
  specDir @11 :Text;        # as in SubmitJob: where the spec's relative paths resolve
  workDir @12 :Text;
  parallel @13 :ParallelLayout;  # kind train and serve: the layout to run (auto: the plan)
  resumeManifest @14 :Text; # kind train: the manifest of the step every rank resumes from (the
                            # coordinator verified it); empty: start fresh
  # kind train: measure the device and the groups before the first step (calibration.h). A
  # restarted generation skips it: the coordinator has its nodes' numbers, and a restart should
  # be back to training as soon as it can.
  calibrate @15 :Bool = true;
  # kind serve, rank 0: the HTTP address to listen on. The spec's `listen`, but for port 0 after
  # an earlier generation listened: that generation's port, so that a restarted service keeps
  # its address.
  serveListen @16 :Text;
  # Kind train, resuming from a memory step instead of resumeManifest: JSON, see
  # worker/training/memory_tier.h (MemoryResume): the step's manifest, its folder in the nodes'
  # memory stores, and for every shard file the rank of this generation that sends it.
  memoryResume @17 :Text;
  # Kind train with checkpoint.memory_replicas: for every rank, the rank (on another node) that
  # holds the copy of its memory shards; empty without replicas.
  memoryBuddies @18 :List(UInt32);
}

# A train job's layout as the coordinator resolved it (placement::ParallelSpec).
struct ParallelLayout {
  tp @0 :UInt32;
  pp @1 :UInt32;
  dp @2 :UInt32;
  zero @3 :UInt32;
  microBatch @4 :UInt64;    # 0: batch / dp
  stageLayers @5 :List(UInt32);  # empty: an even split
  # The pipeline schedule and activation recomputation (placement::PipelineScheduleKind,
  # RecomputeMode). A sender from before them sends neither: 1F1B, one chunk, no recomputation.
  schedule @6 :PipelineSchedule;
  virtualStages @7 :UInt32 = 1;  # chunks of layers per stage: 1 for 1F1B, >= 2 interleaved
  recompute @8 :RecomputeMode;
}

enum PipelineSchedule {
  oneFOneB @0;              # 1F1B (PipeDream-Flush)
  interleaved @1;           # Megatron-LM's interleaved 1F1B
}

enum RecomputeMode {
  none @0;
  selective @1;
  full @2;
}

struct Group {
  kind @0 :Text;            # world | tp | pp | dp
  id @1 :Text;              # unique in the generation, e.g. "world", "tp.0"
  ranks @2 :List(UInt32);   # global ranks, in group order
}

enum KvOp {
  set @0;
  get @1;                   # waits up to waitMs for the key to be set
  add @2;
}

struct KvRequest {
  op @0 :KvOp;
  key @1 :Text;
  value @2 :Data;
  delta @3 :Int64;
  waitMs @4 :UInt32;
}

struct KvReply {
  value @0 :Data;
  number @1 :Int64;
}

# Sent as an actor starts joining a group: a group that times out can then tell the members
# that never came from those that came and waited.
struct CommJoin {
  jobId @0 :Text;
  generation @1 :UInt32;
  rank @2 :UInt32;
  groupId @3 :Text;
}

struct CommReady {
  jobId @0 :Text;
  generation @1 :UInt32;
  rank @2 :UInt32;
  groupId @3 :Text;
  seconds @4 :Float64;
  transport @5 :Text;  # what the group runs over: "shm", "shm+gloo", "gloo", "nccl"
}

struct CommFailed {
  jobId @0 :Text;
  generation @1 :UInt32;
  rank @2 :UInt32;
  groupId @3 :Text;
  message @4 :Text;
}

# Asynchronous progress; never waited on by the sender beyond its ack.
struct StepReport {
  jobId @0 :Text;
  generation @1 :UInt32;
  rank @2 :UInt32;
  step @3 :UInt64;
  loss @4 :Float64;
  tokensPerSecond @5 :Float64;
  computeSeconds @6 :Float64;
  commSeconds @7 :Float64;
  bubbleSeconds @8 :Float64;
  results @9 :List(CollectiveResult);
  # A step of log_interval (or the last), which progress lines show. Train ranks also report at
  # least once a second in between, for the coordinator's hang watchdog.
  logged @10 :Bool;
  # A serve job's leader: its service (set: `step` counts the reports).
  serving @11 :ServingStatus;
  # Train ranks: the bytes this rank sent plus received over the network (TCP; not shared memory)
  # since its previous report, divided by the steps that covers, by the kind of group that moved
  # them. Unset in a rank's first report, whose window holds the start-up too.
  networkBytesPerStep @12 :GroupBytes;
}

# Bytes by the kind of communicator group that moved them.
struct GroupBytes {
  world @0 :Float64;
  tp @1 :Float64;
  pp @2 :Float64;
  dp @3 :Float64;
}

struct ActorDone {
  jobId @0 :Text;
  generation @1 :UInt32;
  rank @2 :UInt32;
  ok @3 :Bool;
  message @4 :Text;
  # When not ok: the failure's absl status code. UNAVAILABLE, DEADLINE_EXCEEDED and ABORTED come
  # from a communicator (a peer gone, a timeout, an abort) and are usually a consequence of
  # another rank's fault; the supervisor ranks them after every other cause.
  errorCode @5 :UInt32;
}

# One rank's checkpoint shard of step `step` is on disk: `file` (relative to `dir`, the step's
# folder, DIR/step-NNNNNNNN; empty when the rank holds nothing another rank does not write) holds
# `tensors`. The coordinator commits the step (writes its manifest.json, then DIR/latest) once
# every rank of the generation has saved it. Sent from the rank's checkpoint writer thread.
struct ShardSaved {
  jobId @0 :Text;
  generation @1 :UInt32;
  rank @2 :UInt32;
  step @3 :UInt64;
  dir @4 :Text;
  file @5 :Text;
  tensors @6 :List(SavedTensor);
  fileBytes @7 :UInt64;     # the file's size and XXH3-64, as written
  fileXxh3 @8 :UInt64;
  dataTokens @9 :UInt64;    # the token stream the rank trained on: its length and XXH3-64
  dataXxh3 @10 :UInt64;
  # A memory step (checkpoint.memory_interval): the shard is in the rank's node's memory store,
  # in the folder JOB/gG/step-NNNNNNNN of that store (`dir` says so); `replicaOf` lists the ranks
  # whose memory shards of the step this rank received and holds there too (memory_replicas).
  memory @11 :Bool;
  replicaOf @12 :List(UInt32);
}

# The box [offsets, offsets + shape) of global tensor `name` (shape globalShape), stored in the
# shard file as tensor `tensor` (empty: `name`), whose bytes have the XXH3-64 `xxh3`.
struct SavedTensor {
  name @0 :Text;
  dtype @1 :Text;           # a safetensors dtype: "F32", ...
  globalShape @2 :List(UInt64);
  offsets @3 :List(UInt64);
  shape @4 :List(UInt64);
  tensor @5 :Text;
  xxh3 @6 :UInt64;
}

# Sent once by every rank of a train job after bootstrap, before its first step: the fp32 GEMM
# FLOP/s of its device and, for each of its groups of more than one rank, the all-reduce bus
# bandwidth (2(n-1)/n x bytes / time of an 8 MiB all-reduce, its latency taken off) and latency
# (time of an 8-byte all-reduce). The coordinator folds them into its per-node calibration (see
# NodeCalibration), which the planner of later `parallel: auto` jobs plans with; whether a group
# crossed nodes the coordinator knows from its own placement.
struct Calibration {
  jobId @0 :Text;
  generation @1 :UInt32;
  rank @2 :UInt32;
  nodeId @3 :Text;
  device @4 :Device;
  computeFlops @5 :Float64;         # layer rate (DeviceCompute); 0: not measured (a GPU)
  groups @6 :List(GroupBandwidth);
  computeHalfDim @7 :Float64;
  optimizerBytesPerSecond @8 :Float64;  # 0: not measured
}

struct GroupBandwidth {
  groupId @0 :Text;
  kind @1 :Text;                    # world | tp | pp | dp
  ranks @2 :UInt32;
  busBytesPerSecond @3 :Float64;
  latencySeconds @4 :Float64;
}

struct Shutdown {
  reason @0 :Text;
}
