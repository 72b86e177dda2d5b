#!/usr/bin/env bash
# SLURM for real: munged, slurmctld and two slurmd "nodes", each slurmd in a network namespace of
# its own (own address on a bridge, own host name through a UTS namespace), Debian's slurm-wlm.
# Runs examples/slurm/train.sbatch and checks that
#   1. the job trains to the loss `shardline up` reaches on the same spec on this machine;
#   2. an elastic job goes on when one node's agent is killed mid-training (an elastic fault like
#      any other), and the step still succeeds;
#   3. serve.sbatch serves run 1's checkpoint behind the OpenAI-compatible API on a node's address;
#   4. scancel mid-job leaves no process and no file (the rendezvous directory, its keys) behind.
# Everything it starts is stopped and everything it makes is removed on every way out.
# Usage: slurm_cluster_test.sh SHARDLINE_BINARY SOURCE_DIR. Exit 77 (skipped) with the reason
# when SLURM, root or network namespaces are not available.
set -euo pipefail

binary=$1
source_dir=$2
skip() { echo "SKIPPED: $*"; exit 77; }
fail() { echo "FAILED: $*"; exit 1; }

[[ $(id -u) -eq 0 ]] || skip "needs root (network namespaces, slurmd)"
for tool in munged slurmctld slurmd sbatch scontrol scancel sinfo squeue ip nsenter unshare curl; do
  command -v "$tool" >/dev/null || skip "$tool not installed (scripts/install-deps.sh brings slurm-wlm and munge)"
done

# Names and addresses of this run: the pid keeps parallel runs apart.
tag=sl$(( $$ % 100000 ))
subnet=10.232.$(( $$ % 250 ))
bridge=${tag}br
work=$(mktemp -d /tmp/shardline-slurm-test.XXXXXX)
export SLURM_CONF=$work/slurm.conf
# The rendezvous directory lives under $HOME: this run's own, so that what is left is ours to see.
export HOME=$work/home
mkdir -p "$HOME"
daemon_pids=()

cleanup() {
  local status=$?
  set +e
  if [[ -e $SLURM_CONF ]]; then
    for job in $(squeue -h -o %i 2>/dev/null); do scancel "$job"; done
  fi
  for pid in "${daemon_pids[@]}"; do kill "$pid" 2>/dev/null; done
  for pidfile in "$work"/run/*.pid; do [[ -e $pidfile ]] && kill "$(cat "$pidfile")" 2>/dev/null; done
  sleep 0.5
  # Whatever of ours is left (a step's processes carry our binary's path), then the daemons.
  pkill -9 -f "$binary (slurm|agent|coordinator|actor)" 2>/dev/null
  for pid in "${daemon_pids[@]}"; do kill -9 "$pid" 2>/dev/null; done
  for pidfile in "$work"/run/*.pid; do [[ -e $pidfile ]] && kill -9 "$(cat "$pidfile")" 2>/dev/null; done
  # Everything in the nodes' namespaces (slurmd, the steps' slurmstepd and tasks), then them.
  for node in 1 2; do
    for pid in $(ip netns pids "${tag}n$node" 2>/dev/null); do kill -9 "$pid" 2>/dev/null; done
    ip netns del "${tag}n$node" 2>/dev/null
  done
  ip link del "$bridge" 2>/dev/null
  if [[ $status -ne 0 && $status -ne 77 ]]; then
    for log in "$work"/log/* "$work"/run*/*.out; do
      [[ -e $log ]] && { echo "---- $log"; tail -n 40 "$log"; }
    done
  fi
  rm -rf "$work"
  exit $status
}
trap cleanup EXIT

# ---- two hosts on a bridge ---------------------------------------------------------------------
ip link add "$bridge" type bridge || skip "cannot make a bridge (no CAP_NET_ADMIN?)"
ip addr add "$subnet.1/24" dev "$bridge"
ip link set "$bridge" up
for node in 1 2; do
  ns=${tag}n$node
  ip netns add "$ns" || skip "cannot make network namespaces"
  ip link add "${tag}v$node" type veth peer name eth0 netns "$ns"
  ip link set "${tag}v$node" master "$bridge" up
  ip -n "$ns" addr add "$subnet.$((node + 1))/24" dev eth0
  ip -n "$ns" link set eth0 up
  ip -n "$ns" link set lo up
done

# ---- munge and SLURM ---------------------------------------------------------------------------
mkdir -p "$work"/{munge,state,log,run,spool/node1,spool/node2}
chmod 700 "$work/munge"
head -c 1024 /dev/urandom > "$work/munge/munge.key"
chmod 400 "$work/munge/munge.key"
munged --socket="$work/munge/socket" --key-file="$work/munge/munge.key" \
  --pid-file="$work/run/munged.pid" --log-file="$work/log/munged.log" \
  --seed-file="$work/munge/seed" --force

free_port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("'"$1"'", 0)); print(s.getsockname()[1])'; }
ctld_port=$(free_port "$subnet.1")
cat > "$SLURM_CONF" <<CONF
ClusterName=shardlinetest
SlurmctldHost=$(hostname)($subnet.1)
SlurmctldPort=$ctld_port
SlurmdPort=6818
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$work/munge/socket
CredType=cred/munge
StateSaveLocation=$work/state
SlurmdSpoolDir=$work/spool/%n
SlurmctldPidFile=$work/run/slurmctld.pid
SlurmdPidFile=$work/run/slurmd-%n.pid
SlurmctldLogFile=$work/log/slurmctld.log
SlurmdLogFile=$work/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
KillWait=10
NodeName=node1 NodeAddr=$subnet.2 CPUs=2 State=UNKNOWN
NodeName=node2 NodeAddr=$subnet.3 CPUs=2 State=UNKNOWN
PartitionName=main Nodes=node1,node2 Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
slurmctld -f "$SLURM_CONF"
# nsenter, not `ip netns exec`: that remounts /sys, and slurmd wants the host's cgroup mounts.
for node in 1 2; do
  nsenter --net="/run/netns/${tag}n$node" unshare --uts \
    sh -c "hostname node$node && exec slurmd -f '$SLURM_CONF' -N node$node"
done
deadline=$((SECONDS + 60))
until [[ $(sinfo -h -o '%t' 2>/dev/null | sort -u) == idle ]]; do
  ((SECONDS < deadline)) || fail "the SLURM nodes did not become idle in 60 s: $(sinfo 2>&1)"
  sleep 0.5
done
echo "SLURM up: $(sinfo -h -o '%D nodes %t %N')"

# ---- the job spec: a small Llama, tp 2 within a node x dp 2 across the two ---------------------
write_spec() {  # write_spec FILE NAME STEPS [elastic]
  cat > "$1" <<SPEC
name: $2
kind: train
model: {arch: llama, layers: 2, heads: 4, kv_heads: 2, d_model: 64, max_seq_len: 64}
data: {synthetic: {seed: 1, bytes: 256KiB}}
optimizer: {lr: 3.0e-3, warmup_steps: 5}
steps: $3
batch: 8
seq_len: 64
seed: 1
checkpoint: {dir: checkpoints, interval: 10, resume: none}
log_interval: 10
parallel: {tp: 2, pp: 1, dp: 2}
SPEC
  if [[ ${4:-} == elastic ]]; then echo "elastic: {min_actors: 2, max_actors: 4}" >> "$1"; fi
}
final_loss() { grep -oE 'step [0-9]+/[0-9]+ +loss [0-9.]+' "$1" | tail -n 1 | awk '{print $NF}'; }
sbatch_run() {  # sbatch_run DIR [SCRIPT]: submits examples/slurm/SCRIPT (train.sbatch) from DIR
  local dir=$1
  (cd "$dir" && sbatch --parsable --output="$dir/job.out" \
     --export="ALL,SHARDLINE=$binary,SHARDLINE_SPEC=$dir/spec.yaml" \
     "$source_dir/examples/slurm/${2:-train.sbatch}")
}
wait_job_end() {  # wait_job_end JOB SECONDS
  local deadline=$((SECONDS + $2))
  while squeue -h -j "$1" 2>/dev/null | grep -q .; do
    ((SECONDS < deadline)) || fail "job $1 still in the queue after $2 s"
    sleep 0.5
  done
}
job_exit_code() { scontrol show job "$1" 2>/dev/null | grep -oE ' ExitCode=[0-9]+:[0-9]+' | cut -d= -f2; }

# ---- 1. train.sbatch trains to the loss of `shardline up` --------------------------------------
mkdir -p "$work/run1" "$work/up"
write_spec "$work/run1/spec.yaml" slurm-train 30
job=$(sbatch_run "$work/run1")
wait_job_end "$job" 180
code=$(job_exit_code "$job")
[[ $code == 0:0 ]] || fail "train.sbatch job $job ended with ExitCode=$code"
grep -q 'node node2 advertises '"$subnet"'.3' "$work/run1/job.out" ||
  fail "node2 did not advertise its own address $subnet.3"
grep -q "coordinator at tcp://$subnet.2:" "$work/run1/job.out" ||
  fail "the coordinator was not published at node1's address $subnet.2"
cp "$work/run1/spec.yaml" "$work/up/spec.yaml"
(cd "$work/up" && timeout 300 "$binary" up --job spec.yaml --devices 4 > up.out 2>&1) ||
  fail "shardline up on the same spec failed: $(tail -n 20 "$work/up/up.out")"
slurm_loss=$(final_loss "$work/run1/job.out")
up_loss=$(final_loss "$work/up/up.out")
echo "final loss: SLURM $slurm_loss, shardline up $up_loss"
[[ -n $slurm_loss && $slurm_loss == "$up_loss" ]] ||
  fail "the SLURM job's final loss '$slurm_loss' is not shardline up's '$up_loss'"
[[ -z $(ls -A "$HOME/.shardline/slurm" 2>/dev/null) ]] ||
  fail "the rendezvous directory was left behind: $(ls "$HOME/.shardline/slurm")"

# ---- 2. an elastic job survives a node's agent killed mid-training -----------------------------
mkdir -p "$work/run2"
write_spec "$work/run2/spec.yaml" slurm-elastic 60 elastic
job=$(sbatch_run "$work/run2")
node2_agent() {  # the pid of the agent in node2's network namespace, if any
  local pid
  for pid in $(ip netns pids "${tag}n2"); do
    if tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | grep -q "^$binary agent "; then
      echo "$pid"
      return
    fi
  done
}
# Once node2's actors train (a job may start on node1's devices alone and grow at a commit) and
# a step is committed past the start, node2's agent is killed.
deadline=$((SECONDS + 120))
until agent=$(node2_agent) && [[ -n $agent ]] && [[ -n $(pgrep -P "$agent") ]] &&
      grep -q 'committed checkpoint step [2-5]0 of 4 ranks' "$work/run2/job.out"; do
  ((SECONDS < deadline)) || fail "the elastic job did not train on both nodes within 120 s"
  sleep 0.2
done
generations_before=$(grep -oE 'generation [0-9]+' "$work/run2/job.out" | sort -u | wc -l)
kill -9 "$agent"
wait_job_end "$job" 240
code=$(job_exit_code "$job")
[[ $code == 0:0 ]] || fail "the elastic job $job ended with ExitCode=$code after node2's agent was killed"
generations_after=$(grep -oE 'generation [0-9]+' "$work/run2/job.out" | sort -u | wc -l)
((generations_after > generations_before)) || fail "the job did not restart after the fault"
grep -q 'committed checkpoint step 60' "$work/run2/job.out" || fail "the elastic job did not finish its 60 steps"
echo "elastic: node2's agent killed at step 20+, job $job succeeded in a later generation"

# ---- 3. serve.sbatch serves the trained checkpoint ---------------------------------------------
mkdir -p "$work/serve"
cat > "$work/serve/spec.yaml" <<SPEC
name: slurm-serve
kind: serve
checkpoint: $work/run1/checkpoints
tokenizer: bytes
model_name: slurm-llama
parallel: {tp: 2, pp: 1}
listen: 0.0.0.0:0
SPEC
job=$(sbatch_run "$work/serve" serve.sbatch)
deadline=$((SECONDS + 120))
# `shardline slurm` follows the job: "serving: URL (not ready)", then "serving: URL" once ready.
until url=$(grep -oE '^  serving: http://[0-9.]+:[0-9]+$' "$work/serve/job.out" 2>/dev/null |
            tail -n 1) && [[ -n $url ]]; do
  ((SECONDS < deadline)) || fail "serve.sbatch printed no ready URL in 120 s"
  sleep 0.3
done
port=${url##*:}
# The one node of serve.sbatch is node1: its address, from the root namespace over the bridge.
reply=$(curl -sS --max-time 30 "http://$subnet.2:$port/v1/completions" \
  -H 'Content-Type: application/json' \
  -d '{"model": "slurm-llama", "prompt": "The ", "max_tokens": 8, "temperature": 0}') ||
  fail "no completion from the served model at $subnet.2:$port"
grep -q '"text"' <<<"$reply" || fail "the completion has no text: $reply"
scancel "$job"
wait_job_end "$job" 60
echo "serve: a completion from $subnet.2:$port, then scancel"

# ---- 4. scancel mid-job leaves nothing behind --------------------------------------------------
mkdir -p "$work/run3"
write_spec "$work/run3/spec.yaml" slurm-cancel 100000
job=$(sbatch_run "$work/run3")
deadline=$((SECONDS + 120))
until grep -q 'step 20/' "$work/run3/job.out" 2>/dev/null; do
  ((SECONDS < deadline)) || fail "the long job reached no step 20 in 120 s"
  sleep 0.2
done
[[ -n $(ls -A "$HOME/.shardline/slurm") ]] || fail "no rendezvous directory while the job runs"
[[ $(stat -c %a "$HOME/.shardline/slurm/$(ls "$HOME/.shardline/slurm")") == 700 ]] ||
  fail "the rendezvous directory is readable by others"
scancel "$job"
wait_job_end "$job" 60
deadline=$((SECONDS + 30))
while pgrep -f "^$binary " >/dev/null; do
  ((SECONDS < deadline)) || fail "processes left 30 s after scancel: $(pgrep -af "^$binary ")"
  sleep 0.2
done
[[ -z $(ls -A "$HOME/.shardline/slurm") ]] ||
  fail "scancel left the rendezvous directory behind: $(ls -R "$HOME/.shardline/slurm")"
leftover=$(find /tmp -maxdepth 1 -name 'shardline-slurm-??????' 2>/dev/null)
[[ -z $leftover ]] || fail "scancel left temporary files: $leftover"
echo "scancel: no process and no rendezvous file left"
echo "PASSED"
