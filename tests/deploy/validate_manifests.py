#!/usr/bin/python3
"""deploy/kubernetes/ validated offline against the Kubernetes API's schemas and rules.

  validate_manifests.py --source DIR --validate-prefix PREFIX schemas
      Every kustomization under deploy/kubernetes/ (base, overlays/*):
      - it lists every manifest beside it (each *.yaml is a resource or a generator's file), so
        nothing in the folder escapes validation;
      - every resource file it lists, and the whole rendered kustomization (k8s_manifests.render;
        where a kubectl is installed, also compared with `kubectl kustomize`), passes
        k8s_validation: kubernetes-validate's strict schemas and the API server's quantity and
        name rules, for every Kubernetes release from 1.25 to the newest that kubernetes-validate
        ships.
  validate_manifests.py --source DIR --validate-prefix PREFIX bad-input
      Copies of the manifests with one mistake each (a quantity "12 GiBs", a name
      "Shardline_Coordinator", ...) are refused, and the error names the field and the value.

PREFIX is where scripts/install-deps.sh put kubernetes-validate
(/opt/shardline/deps/kubernetes-validate).
"""

import argparse
import glob
import os
import sys
import tempfile


def import_validation(prefix):
    sites = glob.glob(os.path.join(prefix, "lib", "python3*", "*-packages"))
    if not sites or not glob.glob(os.path.join(sites[0], "kubernetes_validate")):
        sys.exit("FAIL: no kubernetes-validate in %s (run scripts/install-deps.sh, or set "
                 "SHARDLINE_KUBERNETES_VALIDATE_DIR)" % prefix)
    sys.path.insert(0, sites[0])
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def kustomization_dirs(deploy_dir):
    found = sorted(os.path.dirname(p) for p in
                   glob.glob(os.path.join(deploy_dir, "**", "kustomization.yaml"), recursive=True))
    if not found:
        sys.exit("FAIL: no kustomization.yaml under " + deploy_dir)
    return found


def check_schemas(source):
    import k8s_manifests as km
    import k8s_validation as kv

    deploy_dir = os.path.join(source, "deploy", "kubernetes")
    print("Kubernetes releases checked: %s" % ", ".join(kv.versions()))
    kubectl = km.find_kubectl()
    print("kubectl: %s" % (kubectl or "not installed: the rendering is checked by "
                           "tests/deploy/k8s_manifests.py alone"))
    failures, checks = [], 0
    for directory in kustomization_dirs(deploy_dir):
        name = os.path.relpath(directory, source)
        resources, generated = km.listed_files(directory)
        # Every manifest in the folder is one the kustomization lists.
        beside = sorted(os.path.basename(p) for pattern in ("*.yaml", "*.yml")
                        for p in glob.glob(os.path.join(directory, pattern)))
        beside.remove("kustomization.yaml")
        unlisted = [f for f in beside if f not in resources and f not in generated]
        if unlisted:
            failures.append("%s: kustomization.yaml lists neither as a resource nor as a "
                            "generator's file: %s" % (name, ", ".join(unlisted)))
        # Each listed resource file on its own.
        for file in resources:
            path = os.path.join(directory, file)
            docs = km.load_documents(path)
            errors, n = kv.validate_all(docs, os.path.relpath(path, source))
            failures += errors
            checks += n
            print("%s/%s: %d resources, %s" % (name, file, len(docs),
                                               "valid" if not errors else "%d errors" % len(errors)))
        # The kustomization as a whole, as it would be applied.
        try:
            rendered = km.render(directory)
        except km.KustomizeError as e:
            failures.append("%s: %s" % (name, e))
            continue
        errors, n = kv.validate_all(rendered, name + " (rendered)")
        failures += errors
        checks += n
        kinds = ", ".join(sorted("%s/%s" % (r["kind"], r["metadata"]["name"]) for r in rendered))
        print("%s rendered: %s: %s" % (name, kinds, "valid" if not errors else
                                       "%d errors" % len(errors)))
        if kubectl:
            try:
                theirs = {km.resource_key(r): r for r in km.kubectl_kustomize(directory, kubectl)}
            except km.KustomizeError as e:
                failures.append(str(e))
                continue
            ours = {km.resource_key(r): r for r in rendered}
            if ours != theirs:
                for key in sorted(set(ours) | set(theirs), key=str):
                    if ours.get(key) != theirs.get(key):
                        failures.append("%s: tests/deploy/k8s_manifests.py renders %s otherwise "
                                        "than kubectl kustomize:\n  ours:   %r\n  kubectl: %r"
                                        % (name, key, ours.get(key), theirs.get(key)))
            else:
                print("%s: the same %d resources as `kubectl kustomize`" % (name, len(theirs)))
    for failure in failures:
        print("FAIL: " + failure)
    print("%d resource checks (schemas + API rules), %d failures" % (checks, len(failures)))
    return 1 if failures else 0


# Each case: the file, the text to break (it must occur exactly once), what it becomes, and what
# the error must say (the field path and the value).
BAD_INPUT_CASES = [
    ("base/coordinator.yaml", "              memory: 2Gi\n", '              memory: "12 GiBs"\n',
     ["spec.template.spec.containers[0].resources.limits.memory", "'12 GiBs'", "quantities"]),
    ("base/coordinator.yaml", "kind: StatefulSet\nmetadata:\n  name: shardline-coordinator\n",
     "kind: StatefulSet\nmetadata:\n  name: Shardline_Coordinator\n",
     ["StatefulSet/Shardline_Coordinator", "metadata.name", "'Shardline_Coordinator'",
      "RFC 1123 subdomain"]),
    ("base/coordinator.yaml", "kind: Service\nmetadata:\n  name: shardline-coordinator\n",
     "kind: Service\nmetadata:\n  name: 5hardline-coordinator\n",
     ["Service/5hardline-coordinator", "metadata.name", "DNS-1035 label"]),
    ("base/agent.yaml", "              nvidia.com/gpu: 8\n", "              nvidia.com/gpu: eight\n",
     ["resources.limits[nvidia.com/gpu]", "'eight'", "quantities"]),
    ("base/shared-volume.yaml", "      storage: 100Gi\n", "      storage: 100GB\n",
     ["spec.resources.requests.storage", "'100GB'", "quantities"]),
    ("base/coordinator.yaml", "        - name: coordinator\n", "        - name: Coordinator\n",
     ["spec.template.spec.containers[0].name", "'Coordinator'", "RFC 1123 label"]),
    ("base/submit.yaml", "  backoffLimit: 0\n", "  backofLimit: 0\n",
     ["backofLimit", "was unexpected"]),
]


def check_bad_input(source):
    import k8s_manifests as km
    import k8s_validation as kv

    deploy_dir = os.path.join(source, "deploy", "kubernetes")
    failures = []
    newest = kv.versions()[-1]
    with tempfile.TemporaryDirectory(prefix="shardline-k8s-bad-") as tmp:
        for i, (file, good, bad, expected) in enumerate(BAD_INPUT_CASES):
            with open(os.path.join(deploy_dir, file)) as f:
                text = f.read()
            if text.count(good) != 1:
                failures.append("case %d: %s holds %r %d times, not once (update the case)"
                                % (i, file, good, text.count(good)))
                continue
            copy_path = os.path.join(tmp, "%d-%s" % (i, os.path.basename(file)))
            with open(copy_path, "w") as f:
                f.write(text.replace(good, bad))
            errors = []
            for doc in km.load_documents(copy_path):
                errors += kv.validate(doc, newest, copy_path)
            print("case %d: %s with %r -> %d error(s)" % (i, file, bad.strip().splitlines()[-1].strip(),
                                                          len(errors)))
            for error in errors:
                print("    " + error)
            if not any(all(piece in error for piece in expected) for error in errors):
                failures.append("case %d: no error names all of %r" % (i, expected))
            # The same file unbroken is valid: the error is the mistake's.
            clean = []
            for doc in km.load_documents(os.path.join(deploy_dir, file)):
                clean += kv.validate(doc, newest, file)
            if clean:
                failures.append("case %d: %s is not valid unbroken: %s" % (i, file, clean))
    for failure in failures:
        print("FAIL: " + failure)
    print("%d bad-input cases, %d failures" % (len(BAD_INPUT_CASES), len(failures)))
    return 1 if failures else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", required=True, help="the Shardline source tree")
    parser.add_argument("--validate-prefix", required=True,
                        help="where scripts/install-deps.sh installed kubernetes-validate")
    parser.add_argument("check", choices=["schemas", "bad-input"])
    args = parser.parse_args()
    source = os.environ.get("SHARDLINE_SOURCE_DIR") or args.source
    import_validation(args.validate_prefix)
    sys.exit(check_schemas(source) if args.check == "schemas" else check_bad_input(source))


if __name__ == "__main__":
    main()
