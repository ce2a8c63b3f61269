"""Renders the Kubernetes manifests in deploy/k8s with `kubectl kustomize`, offline, and computes what
Kubernetes would give a pod of them: the environment of a container (values, downward-API fields,
resource fields, $(VAR) expansion) and its arguments. Shared by the deploy tests.

The auth Secret's files are not in git: rendering works on a temporary copy of deploy/k8s in which
deploy/k8s/make-secrets.sh has made them.
"""

import atexit
import json
import math
import os
import re
import shutil
import subprocess
import tempfile

import yaml

SOURCE_DIR = os.environ.get("ZT_SOURCE_DIR") or os.path.abspath(
    os.path.join(os.path.dirname(__file__), "..", ".."))
K8S_DIR = os.path.join(SOURCE_DIR, "deploy", "k8s")

# The annotation the Job controller puts on each pod of an Indexed Job (Kubernetes 1.21 and later).
INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"


class RenderError(Exception):
    pass


def kubectl():
    """Returns the kubectl to render with: $ZT_KUBECTL, else the one on PATH."""
    path = os.environ.get("ZT_KUBECTL", "")
    if not path or path.endswith("-NOTFOUND"):  # CMake found none when it configured
        path = shutil.which("kubectl")
    if not path or not os.path.exists(path):
        raise RenderError("kubectl not found; install it with scripts/install-deps.sh "
                          "(Debian package kubernetes-client) or set ZT_KUBECTL to its path")
    return path


def overlays():
    """Returns the overlay folders under deploy/k8s/overlays, relative to deploy/k8s, sorted."""
    root = os.path.join(K8S_DIR, "overlays")
    return sorted("overlays/" + d for d in os.listdir(root)
                  if os.path.isfile(os.path.join(root, d, "kustomization.yaml")))


_copy = None


def _k8s_copy():
    """A temporary copy of deploy/k8s with the Secret's files made; made once per process."""
    global _copy
    if _copy is None:
        tmp = tempfile.mkdtemp(prefix="ztrain-k8s-")
        atexit.register(shutil.rmtree, tmp, True)
        dst = os.path.join(tmp, "k8s")
        shutil.copytree(K8S_DIR, dst, ignore=shutil.ignore_patterns("secrets"))
        run = subprocess.run(["bash", os.path.join(dst, "make-secrets.sh"), "ztrain",
                              os.path.join(dst, "base", "secrets")],
                             capture_output=True, text=True)
        if run.returncode != 0:
            raise RenderError("make-secrets.sh failed:\n" + run.stdout + run.stderr)
        _copy = dst
    return _copy


def secrets_dir():
    """The folder where make-secrets.sh wrote the Secret's files for the rendered manifests."""
    return os.path.join(_k8s_copy(), "base", "secrets")


def render(target):
    """Runs `kubectl kustomize` on target ("base" or "overlays/NAME") and returns its objects, in order."""
    run = subprocess.run([kubectl(), "kustomize", os.path.join(_k8s_copy(), target)],
                         capture_output=True, text=True)
    if run.returncode != 0:
        raise RenderError("kubectl kustomize %s failed:\n%s" % (target, run.stderr))
    return [doc for doc in yaml.safe_load_all(run.stdout) if doc]


def load_file(path):
    """Returns the objects of a plain manifest file (relative to deploy/k8s)."""
    with open(os.path.join(K8S_DIR, path)) as f:
        return [doc for doc in yaml.safe_load_all(f) if doc]


def find(objects, kind, name=None):
    """Returns the objects of this kind (and name, when given)."""
    return [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]


def one(objects, kind, name=None):
    """Returns the single object of this kind (and name); raises if there is not exactly one."""
    found = find(objects, kind, name)
    if len(found) != 1:
        raise AssertionError("expected one %s%s, found %d" % (kind, " " + name if name else "", len(found)))
    return found[0]


def generated(objects, kind, base_name):
    """Returns the object a kustomize generator made from base_name (its name gets a hash suffix)."""
    found = [o for o in objects if o["kind"] == kind and
             re.fullmatch(re.escape(base_name) + r"(-[a-z0-9]{10})?", o["metadata"]["name"])]
    if len(found) != 1:
        raise AssertionError("expected one generated %s %s, found %d" % (kind, base_name, len(found)))
    return found[0]


def selects(selector, labels):
    """True when a matchLabels selector (a dict) selects these labels."""
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


_VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(text, env):
    """Expands $(NAME) from env as Kubernetes does in env values, command and args: an unknown
    $(NAME) stays as written, and $$ gives a literal $."""
    def sub(m):
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))
    return _VAR.sub(sub, text)


def _quantity_cpu(text):
    """Cores in a CPU quantity ("4", "500m")."""
    text = str(text)
    return int(text[:-1]) / 1000 if text.endswith("m") else float(text)


def _field(pod, path):
    """The value of a downward-API fieldRef path for this pod."""
    m = re.fullmatch(r"metadata\.(annotations|labels)\['([^']+)'\]", path)
    if m:
        value = pod["metadata"].get(m.group(1), {}).get(m.group(2))
        if value is None:
            raise AssertionError("fieldRef %s: the pod has no such %s" % (path, m.group(1)[:-1]))
        return value
    simple = {"metadata.name": pod["metadata"]["name"],
              "metadata.namespace": pod["metadata"].get("namespace", "default"),
              "spec.nodeName": "node-0", "spec.serviceAccountName": "default",
              "status.podIP": "10.0.0.1", "status.hostIP": "192.0.2.1"}
    if path not in simple:
        raise AssertionError("fieldRef %s is not one this test knows how to fill in" % path)
    return simple[path]


def _resource(container, ref):
    """The value of a resourceFieldRef, as the kubelet computes it (rounded up to the divisor)."""
    kind, name = ref["resource"].split(".", 1)
    value = container.get("resources", {}).get(kind, {}).get(name)
    if value is None:
        raise AssertionError("resourceFieldRef %s: container %s sets no %s" %
                             (ref["resource"], container["name"], ref["resource"]))
    if name != "cpu":
        raise AssertionError("resourceFieldRef %s: only cpu is filled in by this test" % ref["resource"])
    divisor = _quantity_cpu(ref.get("divisor", "1"))
    return str(math.ceil(_quantity_cpu(value) / divisor))


def job_pod(job, index, namespace="ztrain"):
    """The pod the Job controller makes for completion index `index` of an Indexed Job: its template
    with the name, hostname, index annotation and label Kubernetes adds."""
    pod = json.loads(json.dumps(job["spec"]["template"]))  # a deep copy
    name = job["metadata"]["name"]
    meta = pod.setdefault("metadata", {})
    meta["name"] = "%s-%d-abcde" % (name, index)
    meta["namespace"] = job["metadata"].get("namespace", namespace)
    meta.setdefault("annotations", {})[INDEX_ANNOTATION] = str(index)
    labels = meta.setdefault("labels", {})
    labels[INDEX_ANNOTATION] = str(index)
    labels["job-name"] = name
    pod["spec"]["hostname"] = "%s-%d" % (name, index)
    # The controller adds JOB_COMPLETION_INDEX (from the annotation) to every container.
    for c in pod["spec"]["containers"]:
        env = c.setdefault("env", [])
        if not any(e["name"] == "JOB_COMPLETION_INDEX" for e in env):
            env.append({"name": "JOB_COMPLETION_INDEX", "valueFrom": {
                "fieldRef": {"fieldPath": "metadata.annotations['%s']" % INDEX_ANNOTATION}}})
    return pod


# The label the StatefulSet controller puts on each pod with its ordinal (Kubernetes 1.28 and later).
POD_INDEX_LABEL = "apps.kubernetes.io/pod-index"


def statefulset_pod(sts, ordinal, namespace="ztrain"):
    """The pod the StatefulSet controller makes for ordinal `ordinal`: its template with the name,
    hostname, subdomain and the labels Kubernetes adds (pod name and pod index)."""
    pod = json.loads(json.dumps(sts["spec"]["template"]))  # a deep copy
    name = "%s-%d" % (sts["metadata"]["name"], ordinal)
    meta = pod.setdefault("metadata", {})
    meta["name"] = name
    meta["namespace"] = sts["metadata"].get("namespace", namespace)
    labels = meta.setdefault("labels", {})
    labels["statefulset.kubernetes.io/pod-name"] = name
    labels[POD_INDEX_LABEL] = str(ordinal)
    pod["spec"]["hostname"] = name
    pod["spec"]["subdomain"] = sts["spec"]["serviceName"]
    return pod


def container_env(pod, container, objects):
    """The environment Kubernetes gives container in pod: env entries in order, each value expanded
    against the entries before it; valueFrom filled from the pod, the container's resources and the
    rendered ConfigMaps and Secrets in objects."""
    env = {}
    for e in container.get("env", []):
        if "value" in e:
            env[e["name"]] = expand(str(e["value"]), env)
        elif "valueFrom" in e:
            src = e["valueFrom"]
            if "fieldRef" in src:
                env[e["name"]] = _field(pod, src["fieldRef"]["fieldPath"])
            elif "resourceFieldRef" in src:
                env[e["name"]] = _resource(container, src["resourceFieldRef"])
            elif "configMapKeyRef" in src:
                ref = src["configMapKeyRef"]
                env[e["name"]] = one(objects, "ConfigMap", ref["name"])["data"][ref["key"]]
            else:
                raise AssertionError("env %s: valueFrom %s is not filled in by this test" %
                                     (e["name"], list(src)))
        else:
            env[e["name"]] = ""
    return env


def container_args(container, env):
    """The command line Kubernetes passes: args with $(VAR) expanded from the container's env."""
    return [expand(str(a), env) for a in container.get("args", [])]
