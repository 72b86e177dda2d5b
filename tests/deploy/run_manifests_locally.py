#!/usr/bin/python3
"""What the pods of deploy/kubernetes/overlays/cpu would run, run here as local processes.

No cluster runs here, so this test plays the kubelet's part for the manifests as
`kubectl apply -k deploy/kubernetes/overlays/cpu` would apply them (rendered by
tests/deploy/k8s_manifests.py; validate_manifests.py checks that rendering against `kubectl
kustomize` where a kubectl is installed):

- the Secret shardline-keys is made as deploy/kubernetes/README.md says, from `shardline keygen`
  output (and compared with `kubectl create secret generic --dry-run=client` where kubectl is
  installed), and validated;
- each workload's container (the coordinator StatefulSet's, the agent DaemonSet's, the submit
  Job's) gets the command, args, working directory and environment its manifest gives it: env
  values with $(VAR) expanded, valueFrom resolved (fieldRef status.podIP -> 127.0.0.1,
  spec.nodeName -> local-node; resourceFieldRef from the container's resources; ConfigMap and
  Secret keys); `shardline` is the binary under test;
- every volume mount is remapped, explicitly, to a folder of this test's temporary directory: a
  Secret or ConfigMap volume to a folder holding the items the manifest projects (with its
  defaultMode), a claim to one folder per claim (so the ReadWriteMany claim is the same folder in
  the agent and the submit Job, as on a cluster), an emptyDir to a folder per pod, and /dev/shm is
  left as the host's;
- every address is remapped, explicitly: a pod's 0.0.0.0:PORT to 127.0.0.1 and a free port of its
  own for that container port, and the Service's DNS name (no cluster DNS here) to 127.0.0.1 and
  the port of the pod the Service selects;

then it starts the coordinator, waits for its readiness probe, starts the agent, waits for its
probe, runs the submit Job's command on the ConfigMap's job spec, and asserts that the job
succeeded, that its checkpoint is on the shared claim, that the coordinator kept its history in its
state volume, and that the coordinator's and the agent's Prometheus endpoints answer at the
annotated ports. It also checks that every SHARDLINE_ variable the manifests set is one the
command reads (a misspelt one would be ignored silently), and that the base's GPU job spec parses.

Real processes and sockets on loopback, free ports, a deadline on every wait; every process is
stopped and the temporary directory removed, also on failure (SHARDLINE_KEEP_TEST_DIRS=1 keeps it).
"""

import argparse
import base64
import ctypes
import fractions
import glob
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

OVERLAY = os.path.join("deploy", "kubernetes", "overlays", "cpu")
BASE_JOB_SPEC = os.path.join("deploy", "kubernetes", "base", "job.yaml")
TEST_DEADLINE_S = 55  # the whole test; ctest's TIMEOUT is the outer bound
POD_IP = "127.0.0.1"
NODE_NAME = "local-node"
NAMESPACE = "default"


class Failure(Exception):
    pass


def log(message):
    print(message, flush=True)


# ---- quantities (for resourceFieldRef) -----------------------------------------------------------

_SUFFIXES = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
             "n": fractions.Fraction(1, 10**9), "u": fractions.Fraction(1, 10**6),
             "m": fractions.Fraction(1, 1000), "": 1, "k": 10**3, "M": 10**6, "G": 10**9,
             "T": 10**12, "P": 10**15, "E": 10**18}


def parse_quantity(value):
    if isinstance(value, (int, float)):
        return fractions.Fraction(value)
    match = re.fullmatch(r"([+-]?[0-9.]+)([eE][+-]?[0-9]+|[A-Za-z]*)", str(value))
    if not match:
        raise Failure("not a quantity: %r" % value)
    number, suffix = match.groups()
    if suffix[:1] in ("e", "E") and len(suffix) > 1:
        return fractions.Fraction(number) * fractions.Fraction(10) ** int(suffix[1:])
    return fractions.Fraction(number) * _SUFFIXES[suffix]


# ---- the pods -------------------------------------------------------------------------------------

def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Pod:
    """One pod of a workload, as this test stands in for it."""

    def __init__(self, workload, tmp):
        self.workload = workload
        self.kind = workload["kind"]
        self.name = workload["metadata"]["name"] + ("-0" if self.kind == "StatefulSet" else "-local")
        self.template = workload["spec"]["template"]
        self.spec = self.template["spec"]
        containers = self.spec["containers"]
        if len(containers) != 1 or self.spec.get("initContainers"):
            raise Failure("%s: this test runs pods of one container" % self.name)
        self.container = containers[0]
        self.dir = os.path.join(tmp, "pods", self.name)
        os.makedirs(os.path.join(self.dir, "home"))
        self.ports = {}        # container port -> local port
        self.port_names = {}   # port name -> container port
        for port in self.container.get("ports", []):
            self.ports[port["containerPort"]] = free_port()
            if "name" in port:
                self.port_names[port["name"]] = port["containerPort"]
        self.mounts = {}       # mountPath -> local folder (None: the host's own)
        self.env = {}
        self.argv = []
        self.cwd = self.dir
        self.process = None
        self.log_path = os.path.join(tmp, self.name + ".log")
        self.cluster = None

    def remap(self, value):
        return remap(value, self, self.cluster)

    def labels(self):
        return self.template.get("metadata", {}).get("labels", {})

    def local_port(self, port):
        port = self.port_names.get(port, port)
        if port not in self.ports:
            raise Failure("%s: port %s is not one of its container's ports %s"
                          % (self.name, port, sorted(self.ports)))
        return self.ports[port]


def write_projected(folder, data, items, mode, what):
    """A Secret or ConfigMap volume: its keys (or the items listed) as files of mode `mode`."""
    os.makedirs(folder)
    chosen = [(i["key"], i["path"], i.get("mode", mode)) for i in items] if items else \
        [(key, key, mode) for key in data]
    for key, path, file_mode in chosen:
        if key not in data:
            raise Failure("%s has no key %s" % (what, key))
        target = os.path.join(folder, path)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "wb") as f:
            f.write(data[key])
        os.chmod(target, file_mode)


def mount_volumes(pod, config_maps, secrets, claims_dir):
    volumes = {v["name"]: v for v in pod.spec.get("volumes", [])}
    for template in pod.workload["spec"].get("volumeClaimTemplates", []):
        volumes[template["metadata"]["name"]] = {
            "persistentVolumeClaim": {"claimName": "%s-%s" % (template["metadata"]["name"],
                                                              pod.name)}}
    for mount in pod.container.get("volumeMounts", []):
        path, volume = mount["mountPath"], volumes[mount["name"]]
        if path == "/dev/shm":
            pod.mounts[path] = None  # the host's /dev/shm (a memory emptyDir in the pod)
            continue
        if "secret" in volume:
            source = volume["secret"]
            local = os.path.join(pod.dir, "volumes", mount["name"])
            write_projected(local, secrets[source["secretName"]], source.get("items"),
                            source.get("defaultMode", 0o644), "Secret " + source["secretName"])
        elif "configMap" in volume:
            source = volume["configMap"]
            data = {k: v.encode() for k, v in config_maps[source["name"]].items()}
            local = os.path.join(pod.dir, "volumes", mount["name"])
            write_projected(local, data, source.get("items"), source.get("defaultMode", 0o644),
                            "ConfigMap " + source["name"])
        elif "persistentVolumeClaim" in volume:
            local = os.path.join(claims_dir, volume["persistentVolumeClaim"]["claimName"])
            os.makedirs(local, exist_ok=True)
        elif "emptyDir" in volume:
            local = os.path.join(pod.dir, "volumes", mount["name"])
            os.makedirs(local)
        else:
            raise Failure("%s: volume %s: a kind this test does not stand in for"
                          % (pod.name, mount["name"]))
        pod.mounts[path] = local
        log("  %s: %s -> %s" % (pod.name, path, local))


class Cluster:
    """The Services and the pods: how names and addresses resolve here."""

    def __init__(self, services, pods):
        self.services = {s["metadata"]["name"]: s for s in services}
        self.pods = pods

    def service_target(self, name, port):
        service = self.services[name]
        selector = service["spec"]["selector"]
        chosen = [p for p in self.pods
                  if all(p.labels().get(k) == v for k, v in selector.items())]
        if len(chosen) != 1:
            raise Failure("Service %s selects %d pods here" % (name, len(chosen)))
        for service_port in service["spec"]["ports"]:
            if service_port["port"] == port:
                return chosen[0], service_port.get("targetPort", port)
        raise Failure("Service %s has no port %s" % (name, port))

    def service_pattern(self):
        names = "|".join(re.escape(n) for n in self.services)
        # name, name.namespace, name.namespace.svc, name.namespace.svc.cluster.local
        return r"(?:%s)(?:\.[a-z0-9-]+(?:\.svc(?:\.cluster\.local)?)?)?" % names


def remap(value, pod, cluster):
    """A string of the manifest as this machine needs it: mount paths and addresses remapped."""
    original = value
    for path in sorted((p for p in pod.mounts if pod.mounts[p]), key=len, reverse=True):
        if value == path or value.startswith(path + "/"):
            value = pod.mounts[path] + value[len(path):]
            break

    def address(match):
        scheme, host, port = match.group(1) or "", match.group(2), int(match.group(3))
        if host == "0.0.0.0":
            return "%s127.0.0.1:%d" % (scheme, pod.local_port(port))
        target, target_port = cluster.service_target(host.split(".")[0], port)
        return "%s127.0.0.1:%d" % (scheme, target.local_port(target_port))

    value = re.sub(r"(tcp://)?(0\.0\.0\.0|%s):([0-9]+)\b" % cluster.service_pattern(), address,
                   value)
    if value != original:
        log("  %s: %s -> %s" % (pod.name, original, value))
    return value


def expand(value, env):
    """Kubernetes' $(VAR) expansion ($$ escapes), from the variables defined before."""
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                  lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), value)


def resolve_env(pod, cluster, config_maps, secrets):
    for var in pod.container.get("env", []):
        name = var["name"]
        if "value" in var:
            value = remap(expand(str(var["value"]), pod.env), pod, cluster)
        else:
            source = var["valueFrom"]
            if "fieldRef" in source:
                field = source["fieldRef"]["fieldPath"]
                fields = {"status.podIP": POD_IP, "status.hostIP": POD_IP,
                          "spec.nodeName": NODE_NAME, "metadata.name": pod.name,
                          "metadata.namespace": NAMESPACE}
                if field not in fields:
                    raise Failure("%s: %s: fieldRef %s not stood in for" % (pod.name, name, field))
                value = fields[field]
            elif "resourceFieldRef" in source:
                ref = source["resourceFieldRef"]
                which, _, resource = ref["resource"].partition(".")
                amount = pod.container.get("resources", {}).get(which, {}).get(resource)
                if amount is None:
                    raise Failure("%s: %s: the container sets no %s (on a cluster: the node's "
                                  "allocatable)" % (pod.name, name, ref["resource"]))
                divisor = parse_quantity(ref.get("divisor", "1"))
                value = str(math.ceil(parse_quantity(amount) / divisor))
            elif "configMapKeyRef" in source:
                ref = source["configMapKeyRef"]
                value = config_maps[ref["name"]][ref["key"]]
            elif "secretKeyRef" in source:
                ref = source["secretKeyRef"]
                value = secrets[ref["name"]][ref["key"]].decode()
            else:
                raise Failure("%s: %s: valueFrom %s not stood in for" % (pod.name, name, source))
        pod.env[name] = value


def known_variables(binary, subcommand):
    """The SHARDLINE_ variables `shardline SUBCOMMAND` reads, from its --help: (Env:NAME) of
    every option that takes one, and $NAME where the help says an option defaults to one."""
    done = subprocess.run([binary, subcommand, "--help"], capture_output=True, text=True,
                          timeout=20)
    found = re.findall(r"\(Env:(SHARDLINE_[A-Z0-9_]+)\)|\$(SHARDLINE_[A-Z0-9_]+)", done.stdout)
    return {env or dollar for env, dollar in found}


def prepare_command(pod, binary):
    """command + args ($(VAR) expanded, paths and addresses remapped), `shardline` the binary."""
    command = [expand(str(c), pod.env) for c in pod.container.get("command", [])]
    args = [expand(str(a), pod.env) for a in pod.container.get("args", [])]
    if not command or command[0] != "shardline":
        raise Failure("%s: the container's command must start with `shardline` (the image's "
                      "binary on PATH), not %r" % (pod.name, command))
    pod.argv = [binary] + [pod.remap(a) for a in command[1:] + args]
    if "workingDir" in pod.container:
        pod.cwd = pod.remap(pod.container["workingDir"])


def set_pdeathsig():
    # Die with this test, whatever kills it (ctest's timeout included): nothing is orphaned.
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def start(pod):
    env = {"PATH": "/usr/bin:/bin", "HOME": os.path.join(pod.dir, "home")}
    env.update(pod.env)
    log("start %s: cd %s && %s %s" % (pod.name, pod.cwd,
                                      " ".join("%s=%s" % kv for kv in sorted(pod.env.items())),
                                      " ".join(pod.argv)))
    out = open(pod.log_path, "w")
    pod.process = subprocess.Popen(pod.argv, cwd=pod.cwd, env=env, stdout=out,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   preexec_fn=set_pdeathsig)
    out.close()


def tail(pod, lines=30):
    try:
        with open(pod.log_path) as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return ""


def http_get(url, timeout=2.0):
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.status, response.read().decode(errors="replace")


def wait_ready(pod, deadline):
    """The container's readiness probe (httpGet), tried until it answers 200."""
    probe = pod.container.get("readinessProbe", {}).get("httpGet")
    if probe is None:
        raise Failure("%s: no httpGet readiness probe to wait on" % pod.name)
    url = "http://127.0.0.1:%d%s" % (pod.local_port(probe["port"]), probe.get("path", "/"))
    while True:
        if pod.process.poll() is not None:
            raise Failure("%s exited (%d) before it was ready:\n%s"
                          % (pod.name, pod.process.returncode, tail(pod)))
        try:
            if http_get(url)[0] == 200:
                log("%s ready: %s answers" % (pod.name, url))
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise Failure("%s: readiness probe %s never answered:\n%s" % (pod.name, url, tail(pod)))
        time.sleep(0.1)


def stop(pod):
    if pod.process is None or pod.process.poll() is not None:
        return
    pod.process.terminate()  # what the kubelet sends first
    try:
        pod.process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pod.process.kill()
        pod.process.wait(timeout=10)


# ---- the test ------------------------------------------------------------------------------------

def run(source, binary, tmp):
    import yaml
    import k8s_manifests as km
    import k8s_validation as kval

    deadline = time.monotonic() + TEST_DEADLINE_S
    resources = km.render(os.path.join(source, OVERLAY))
    by_kind = {}
    for resource in resources:
        by_kind.setdefault(resource["kind"], []).append(resource)
    config_maps = {c["metadata"]["name"]: c.get("data", {}) for c in by_kind.get("ConfigMap", [])}

    # The Secret, as deploy/kubernetes/README.md makes it.
    keygen = os.path.join(tmp, "keygen")
    subprocess.run([binary, "keygen", "--out", keygen], check=True, capture_output=True,
                   timeout=20)
    key_files = sorted(os.listdir(keygen))
    secret = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
              "metadata": {"name": "shardline-keys"},
              "data": {f: base64.b64encode(open(os.path.join(keygen, f), "rb").read()).decode()
                       for f in key_files}}
    errors = kval.validate(secret, kval.versions()[-1], "the Secret shardline-keys")
    if errors:
        raise Failure("\n".join(errors))
    kubectl = km.find_kubectl()
    if kubectl:
        made = subprocess.run([kubectl, "create", "secret", "generic", "shardline-keys",
                               "--from-file=" + keygen, "--dry-run=client", "-o", "yaml"],
                              capture_output=True, text=True, timeout=30)
        if made.returncode != 0:
            raise Failure("kubectl create secret --dry-run=client failed: " + made.stderr)
        if yaml.safe_load(made.stdout)["data"] != secret["data"]:
            raise Failure("kubectl's Secret from %s holds other keys: %s" % (keygen, made.stdout))
        log("the Secret shardline-keys (%s) is what `kubectl create secret generic "
            "shardline-keys --from-file=DIR` makes" % ", ".join(key_files))
    secrets = {"shardline-keys": {k: base64.b64decode(v) for k, v in secret["data"].items()}}

    # The pods, in the order they become useful: the coordinator, the agents, the submit Job.
    order = ["StatefulSet", "DaemonSet", "Job"]
    workloads = [w for kind in order for w in by_kind.get(kind, [])]
    if [w["kind"] for w in workloads] != order:
        raise Failure("expected one StatefulSet, one DaemonSet and one Job, found %s"
                      % [w["kind"] for w in workloads])
    pods = [Pod(w, tmp) for w in workloads]
    cluster = Cluster(by_kind.get("Service", []), pods)
    claims_dir = os.path.join(tmp, "claims")
    log("volumes (mount path -> folder here):")
    for pod in pods:
        mount_volumes(pod, config_maps, secrets, claims_dir)
    log("environment and addresses (as the manifest says -> as run here):")
    for pod in pods:
        pod.cluster = cluster
        resolve_env(pod, cluster, config_maps, secrets)
        prepare_command(pod, binary)

    # Every SHARDLINE_ variable is one the command reads.
    for pod in pods:
        subcommand = pod.argv[1]
        known = known_variables(binary, subcommand)
        unknown = sorted(n for n in pod.env if n.startswith("SHARDLINE_") and n not in known)
        if unknown:
            raise Failure("%s: `shardline %s` reads none of %s (it reads %s)"
                          % (pod.name, subcommand, unknown, sorted(known)))
    log("every SHARDLINE_ variable set is read by its command")

    # A claim that several pods mount is ReadWriteMany.
    claims = {c["metadata"]["name"]: c for c in by_kind.get("PersistentVolumeClaim", [])}
    users = {}
    for pod in pods:
        for volume in pod.spec.get("volumes", []):
            if "persistentVolumeClaim" in volume:
                users.setdefault(volume["persistentVolumeClaim"]["claimName"], []).append(pod.name)
    for claim, names in users.items():
        if claim not in claims:
            raise Failure("%s mount the claim %s, which the manifests do not make" % (names, claim))
        if len(names) > 1 and "ReadWriteMany" not in claims[claim]["spec"]["accessModes"]:
            raise Failure("the claim %s is mounted by %s but not ReadWriteMany" % (claim, names))

    coordinator, agent, submit = pods
    # The job spec's checkpoint folder, relative to the submit Job's working directory, is on a
    # claim the agents mount at the same path (the actors write where submit resolved it).
    spec_in_pod = [a for a in submit.container["command"][2:] if not a.startswith("-")][0]
    spec_mount = [m for m in submit.container["volumeMounts"]
                  if spec_in_pod.startswith(m["mountPath"] + "/")]
    spec_volume = [v for v in submit.spec["volumes"] if spec_mount and
                   v["name"] == spec_mount[0]["name"] and "configMap" in v]
    if not spec_volume:
        raise Failure("the submit Job's spec %s is not on a ConfigMap volume" % spec_in_pod)
    with open(submit.remap(spec_in_pod)) as f:
        spec = yaml.safe_load(f)
    work_dir = submit.container["workingDir"]
    checkpoint_in_pod = os.path.join(work_dir, spec["checkpoint"]["dir"])
    shared = [p for p in agent.mounts if agent.mounts[p] and
              (checkpoint_in_pod + "/").startswith(p + "/")]
    if not shared or agent.mounts[shared[0]] != submit.mounts.get(shared[0]):
        raise Failure("the checkpoint folder %s is not on a claim the agent mounts at the same "
                      "path" % checkpoint_in_pod)
    log("job spec %s (%s, from the ConfigMap %s): checkpoints in %s, on the claim mounted at %s "
        "in the agent and the submit Job" % (spec["name"], spec_in_pod,
                                             spec_volume[0]["configMap"]["name"],
                                             checkpoint_in_pod, shared[0]))

    try:
        start(coordinator)
        wait_ready(coordinator, min(deadline, time.monotonic() + 20))
        start(agent)
        wait_ready(agent, min(deadline, time.monotonic() + 20))
        start(submit)
        try:
            submit.process.wait(timeout=max(1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise Failure("the submit Job's command did not end in time:\n%s\ncoordinator:\n%s"
                          "\nagent:\n%s" % (tail(submit), tail(coordinator), tail(agent)))
        output = open(submit.log_path).read()
        log("submit Job's output:\n" + output)
        if submit.process.returncode != 0 or not re.search(r"\bsucceeded\b", output):
            raise Failure("the submit Job failed (%d)\ncoordinator:\n%s\nagent:\n%s"
                          % (submit.process.returncode, tail(coordinator), tail(agent)))
        checkpoint = submit.remap(checkpoint_in_pod)
        if not os.path.exists(os.path.join(checkpoint, "latest")):
            raise Failure("no committed checkpoint in %s" % checkpoint)
        log("the checkpoint is in %s (the shared claim)" % checkpoint)
        state = coordinator.remap(coordinator.env["SHARDLINE_STATE_DIR"])
        if not os.listdir(state):
            raise Failure("the coordinator's state volume %s is empty" % state)
        log("the coordinator's state volume holds %s" % ", ".join(sorted(os.listdir(state))))

        # Prometheus scrapes what the annotations say.
        for pod in (coordinator, agent):
            annotations = pod.template["metadata"].get("annotations", {})
            if annotations.get("prometheus.io/scrape") != "true":
                raise Failure("%s: no prometheus.io/scrape: \"true\" annotation" % pod.name)
            port = int(annotations["prometheus.io/port"])
            url = "http://127.0.0.1:%d%s" % (pod.local_port(port),
                                             annotations.get("prometheus.io/path", "/metrics"))
            status, text = http_get(url)
            families = sorted(set(re.findall(r"^# TYPE (shardline_\w+)", text, re.M)))
            if status != 200 or not families:
                raise Failure("%s: %s answers %d without shardline_ metrics" % (pod.name, url,
                                                                               status))
            log("%s: Prometheus at the annotated port %d (here %s): %d shardline_ families, "
                "e.g. %s" % (pod.name, port, url, len(families), ", ".join(families[:3])))
    finally:
        for pod in reversed(pods):
            stop(pod)

    # The base's job spec (GPU devices) cannot run here, but it parses: submit validates a spec
    # before it reaches a coordinator, so a valid one fails only for want of one.
    done = subprocess.run([binary, "submit", os.path.join(source, BASE_JOB_SPEC), "--insecure",
                           "--coordinator", "tcp://127.0.0.1:%d" % free_port(), "--timeout-s",
                           "0.3"], capture_output=True, text=True, timeout=20)
    if "no reply to submit_job" not in done.stderr:
        raise Failure("the base's job spec does not parse: " + done.stderr)
    log("the base's job spec (%s) parses" % BASE_JOB_SPEC)


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", required=True)
    parser.add_argument("--validate-prefix", required=True)
    parser.add_argument("--binary", required=True)
    args = parser.parse_args()
    source = os.environ.get("SHARDLINE_SOURCE_DIR") or args.source
    binary = os.path.abspath(os.environ.get("SHARDLINE_BINARY") or args.binary)
    if not os.access(binary, os.X_OK):
        sys.exit("FAIL: no shardline binary at " + binary)
    sites = glob.glob(os.path.join(args.validate_prefix, "lib", "python3*", "*-packages"))
    if not sites:
        sys.exit("FAIL: no kubernetes-validate in %s (run scripts/install-deps.sh)"
                 % args.validate_prefix)
    sys.path[:0] = [os.path.dirname(os.path.abspath(__file__)), sites[0]]

    tmp = tempfile.mkdtemp(prefix="shardline-k8s-local-")
    log("binary %s, temporary directory %s" % (binary, tmp))
    started = time.monotonic()
    try:
        run(source, binary, tmp)
    except Failure as e:
        log("FAIL: %s" % e)
        sys.exit(1)
    finally:
        if os.environ.get("SHARDLINE_KEEP_TEST_DIRS"):
            log("kept " + tmp)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    log("PASS in %.1f s" % (time.monotonic() - started))


if __name__ == "__main__":
    main()
