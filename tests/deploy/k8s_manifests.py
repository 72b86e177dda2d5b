"""Reading deploy/kubernetes/: its YAML files, and a kustomization rendered as `kubectl kustomize`
would render it.

Debian 12 packages no kustomize (and kubectl comes from Kubernetes' own repository, not Debian's),
so the tests cannot count on one. render() builds a kustomization itself, for exactly the
features deploy/kubernetes/ uses: `resources` (files and other kustomizations),
`configMapGenerator` (files; behavior create or replace) with `generatorOptions:
disableNameSuffixHash: true`, and `patches` that are JSON 6902 patches aimed at a kind and name
(ops add, remove, replace, test). Anything else in a kustomization is an error here, never
silently skipped. Where a kubectl is installed, tests compare this rendering with `kubectl
kustomize` (kubectl_kustomize()).
"""

import copy
import os
import shutil
import subprocess

import yaml

SUPPORTED_KEYS = {"apiVersion", "kind", "resources", "configMapGenerator", "generatorOptions",
                  "patches"}


class KustomizeError(Exception):
    pass


def load_documents(path):
    """The YAML documents of a file (empty ones dropped)."""
    with open(path) as f:
        return [doc for doc in yaml.safe_load_all(f) if doc is not None]


def resource_key(resource):
    metadata = resource.get("metadata") or {}
    return (resource.get("apiVersion"), resource.get("kind"), metadata.get("namespace"),
            metadata.get("name"))


def read_kustomization(directory):
    path = os.path.join(directory, "kustomization.yaml")
    docs = load_documents(path)
    if len(docs) != 1 or not isinstance(docs[0], dict):
        raise KustomizeError(path + ": not one YAML mapping")
    kustomization = docs[0]
    unknown = set(kustomization) - SUPPORTED_KEYS
    if unknown:
        raise KustomizeError("%s: %s not rendered by tests/deploy/k8s_manifests.py (it renders %s)"
                             % (path, ", ".join(sorted(unknown)), ", ".join(sorted(SUPPORTED_KEYS))))
    return kustomization


def listed_files(directory):
    """The files a kustomization names: (resources, files read by generators)."""
    kustomization = read_kustomization(directory)
    resources = [r for r in kustomization.get("resources", [])
                 if os.path.isfile(os.path.join(directory, r))]
    generated = []
    for generator in kustomization.get("configMapGenerator", []):
        for entry in generator.get("files", []):
            generated.append(entry.split("=", 1)[-1])
    return resources, generated


def _config_map(directory, generator, options):
    unknown = set(generator) - {"name", "files", "behavior"}
    if unknown:
        raise KustomizeError("configMapGenerator %s: %s not rendered here"
                             % (generator.get("name"), ", ".join(sorted(unknown))))
    if not options.get("disableNameSuffixHash"):
        raise KustomizeError("configMapGenerator %s: name suffix hashes are not rendered here "
                             "(set generatorOptions: disableNameSuffixHash: true)"
                             % generator.get("name"))
    data = {}
    for entry in generator.get("files", []):
        key, _, path = entry.rpartition("=")
        key = key or os.path.basename(path)
        with open(os.path.join(directory, path)) as f:
            data[key] = f.read()
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": generator["name"]},
            "data": data}


def _pointer(path):
    if not path.startswith("/"):
        raise KustomizeError("JSON pointer %r does not start with /" % path)
    return [part.replace("~1", "/").replace("~0", "~") for part in path[1:].split("/")]


def _parent(document, parts, path):
    node = document
    for part in parts[:-1]:
        try:
            node = node[int(part)] if isinstance(node, list) else node[part]
        except (KeyError, IndexError, ValueError):
            raise KustomizeError("JSON patch path %s: %r not found" % (path, part))
    return node, parts[-1]


def apply_json_patch(document, operations):
    """RFC 6902 add, remove, replace and test on `document` (changed in place)."""
    for op in operations:
        path = op["path"]
        parent, last = _parent(document, _pointer(path), path)
        kind = op["op"]
        if isinstance(parent, list):
            index = len(parent) if last == "-" else int(last)
            if kind == "add":
                parent.insert(index, copy.deepcopy(op["value"]))
            elif kind == "remove":
                del parent[index]
            elif kind == "replace":
                parent[index] = copy.deepcopy(op["value"])
            elif kind == "test":
                if parent[index] != op["value"]:
                    raise KustomizeError("JSON patch test failed at %s: %r is not %r"
                                         % (path, parent[index], op["value"]))
            else:
                raise KustomizeError("JSON patch op %s not rendered here" % kind)
        else:
            if kind in ("remove", "replace", "test") and last not in parent:
                raise KustomizeError("JSON patch path %s not found" % path)
            if kind in ("add", "replace"):
                parent[last] = copy.deepcopy(op["value"])
            elif kind == "remove":
                del parent[last]
            elif kind == "test":
                if parent[last] != op["value"]:
                    raise KustomizeError("JSON patch test failed at %s: %r is not %r"
                                         % (path, parent[last], op["value"]))
            else:
                raise KustomizeError("JSON patch op %s not rendered here" % kind)


def render(directory):
    """The resources of the kustomization in `directory`, as a list of dicts."""
    kustomization = read_kustomization(directory)
    resources = []
    for entry in kustomization.get("resources", []):
        path = os.path.join(directory, entry)
        if os.path.isdir(path):
            resources += render(path)
        else:
            resources += load_documents(path)
    options = kustomization.get("generatorOptions", {})
    for generator in kustomization.get("configMapGenerator", []):
        made = _config_map(directory, generator, options)
        behavior = generator.get("behavior", "create")
        same = [i for i, r in enumerate(resources) if resource_key(r) == resource_key(made)]
        if behavior == "create":
            if same:
                raise KustomizeError("ConfigMap %s made twice" % generator["name"])
            resources.append(made)
        elif behavior == "replace":
            if not same:
                raise KustomizeError("ConfigMap %s: nothing to replace" % generator["name"])
            resources[same[0]] = made
        else:
            raise KustomizeError("configMapGenerator behavior %s not rendered here" % behavior)
    for patch in kustomization.get("patches", []):
        if set(patch) != {"target", "patch"} or set(patch["target"]) - {"kind", "name"}:
            raise KustomizeError("only inline JSON 6902 patches aimed at a kind and name are "
                                 "rendered here: %r" % patch)
        operations = yaml.safe_load(patch["patch"])
        if not isinstance(operations, list):
            raise KustomizeError("strategic-merge patches are not rendered here")
        target = patch["target"]
        hits = [r for r in resources
                if r.get("kind") == target.get("kind")
                and (r.get("metadata") or {}).get("name") == target.get("name")]
        if len(hits) != 1:
            raise KustomizeError("patch target %r matches %d resources" % (target, len(hits)))
        apply_json_patch(hits[0], operations)
    return resources


def find_kubectl():
    return shutil.which("kubectl")


def kubectl_kustomize(directory, kubectl):
    """`kubectl kustomize DIRECTORY` (offline: kustomize is built into kubectl)."""
    done = subprocess.run([kubectl, "kustomize", directory], capture_output=True, text=True,
                          timeout=60)
    if done.returncode != 0:
        raise KustomizeError("kubectl kustomize %s failed: %s" % (directory, done.stderr.strip()))
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc is not None]
