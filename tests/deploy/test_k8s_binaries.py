"""Runs the real ztrain-server and ztrain binaries with exactly the command lines the Kubernetes
manifests in deploy/k8s give their containers, so that a flag or config key that a binary does not
accept fails CI instead of a pod.

How, for every overlay:

1. Render it with `kubectl kustomize` (k8s_render.py, with throwaway secrets from make-secrets.sh,
   which makes the token and the certificates with openssl).
2. For every pod the overlay makes (server ordinal s of the StatefulSet, completion index i of the
   Indexed Job), build the pod as the controller would (name, index labels and annotations), compute
   its container's environment as the kubelet would (values, downward-API fields such as the pod-index
   label and the completion-index annotation, resource fields, $(VAR) expansion), and its command line:
   the image's ENTRYPOINT (from the final stage of deploy/docker/<image>.Dockerfile, mapped to the
   program built here) followed by the container's args with $(VAR) expanded from that environment.
   Init containers run first, in order, each to success, as the kubelet runs them.
3. Give every volumeMount a temporary folder with what Kubernetes would put there: ConfigMap and Secret
   volumes get their files (the rendered objects' data), claims and emptyDirs start empty (one folder
   per claim, so workers share the checkpoint claim and each server has its own). Every mount path in
   the arguments and environment is rewritten to its folder.
4. Servers: start `ztrain-server` with those arguments, the listen addresses (--listen, --health-listen,
   --metrics-listen) rewritten to 127.0.0.1:0; wait (bounded) for its "ztrain-server ready" line.
5. Workers: start every rank of the Job at once with those arguments, with three rewrites:
   --servers lists the loopback ports of the servers started in 4 (same order, same count),
   MASTER_ADDR/MASTER_PORT become 127.0.0.1 and a free port when WORLD_SIZE > 1 (rank 0's DNS name
   exists only in a cluster), and --train-data is appended with a glob that matches nothing. Each rank
   must fail on the data ("no files match" that glob): every flag and config key before it was accepted.
   The model config in the ConfigMap folder is replaced by a tiny model with the same keys (the real
   models, 1.5B and 6.7B parameters, do not fit this machine); the real model.json is checked by a
   second run that stops right after reading it: `--steps 0` appended, which only the range check after
   the model is loaded rejects.
6. SIGTERM every server and expect exit status 0 (bounded).

Arguments: the ztrain-server and ztrain programs to run.
"""

import base64
import json
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import k8s_render as k8s  # noqa: E402

import dockerfile  # noqa: E402

SERVER_BIN = None
WORKER_BIN = None

DOCKER_DIR = os.path.join(k8s.SOURCE_DIR, "deploy", "docker")
# Which Dockerfile builds which image of the manifests.
IMAGE_DOCKERFILES = {"ztrain-server": "server.Dockerfile", "ztrain-worker": "worker.Dockerfile"}

# Bounds, in seconds: a server is ready well within this; a worker fails on its data within this.
READY_TIMEOUT = 30
WORKER_TIMEOUT = 90
STOP_TIMEOUT = 30

LISTEN_FLAGS = ("--listen", "--health-listen", "--metrics-listen")


def image_programs():
    """Where the programs an image's ENTRYPOINT runs come from here: the built binaries and the worker
    entrypoint script (worker.Dockerfile installs deploy/docker/worker-entrypoint.sh as
    /usr/local/bin/ztrain-entrypoint)."""
    return {"/usr/local/bin/ztrain-server": SERVER_BIN,
            "/usr/local/bin/ztrain": WORKER_BIN,
            "/usr/local/bin/ztrain-entrypoint": os.path.join(DOCKER_DIR, "worker-entrypoint.sh")}


def image_entrypoint(image):
    """The exec-form ENTRYPOINT of the final stage of the image's Dockerfile."""
    name = image.rpartition(":")[0] or image
    name = name.rsplit("/", 1)[-1]  # a registry prefix set by newName
    if name not in IMAGE_DOCKERFILES:
        raise AssertionError("image %s: no Dockerfile in deploy/docker builds it" % image)
    entry = None
    for c in dockerfile.parse_file(os.path.join(DOCKER_DIR, IMAGE_DOCKERFILES[name])):
        if c.cmd == "FROM":
            entry = None  # ENTRYPOINT does not carry over from one stage to the next
        elif c.cmd == "ENTRYPOINT":
            if not c.json:
                raise AssertionError("%s: ENTRYPOINT must be in exec form" % IMAGE_DOCKERFILES[name])
            entry = list(c.value)
    if not entry:
        raise AssertionError("%s: the final stage has no ENTRYPOINT" % IMAGE_DOCKERFILES[name])
    return entry


def container_command(container, env, mounts):
    """The command line of the container here: command (or the image's ENTRYPOINT) + expanded args,
    with the image's program replaced by the one built here and mount paths by their folders."""
    if "command" in container:
        command = [k8s.expand(str(a), env) for a in container["command"]]
    else:
        command = image_entrypoint(container["image"])
    programs = image_programs()
    if command[0] in programs:
        program = programs[command[0]]
    elif "/" not in command[0] and shutil.which(command[0]):  # a base-image tool such as mkdir
        program = shutil.which(command[0])
    else:
        raise AssertionError("container %s runs %s, which this test cannot map to a built program" %
                             (container["name"], command[0]))
    return [program] + [rewrite_paths(a, mounts) for a in command[1:] + k8s.container_args(container, env)]


def free_port():
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Volumes:
    """Temporary folders standing in for a pod's mounts, and the rewriting of mount paths to them."""

    def __init__(self, root, objects, tiny_model):
        self.root = root
        self.objects = objects
        self.tiny_model = tiny_model  # replace the ConfigMap's model config by a tiny one with its keys
        self.claims = {}              # claim name -> folder, shared by the pods that mount it

    def _folder(self, what):
        path = os.path.join(self.root, re.sub(r"[^A-Za-z0-9_.-]", "_", what))
        os.makedirs(path, exist_ok=True)
        return path

    def _claim(self, name):
        if name not in self.claims:
            self.claims[name] = self._folder("claim-" + name)
        return self.claims[name]

    def _write(self, folder, files, items, mode):
        """Writes files (name -> bytes), the keys items names (all when items is None), as Kubernetes does."""
        wanted = [(i["key"], i["path"]) for i in items] if items else [(k, k) for k in files]
        for key, path in wanted:
            if key not in files:
                raise AssertionError("volume item %s: not in the object" % key)
            dst = os.path.join(folder, path)
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            with open(dst, "wb") as f:
                f.write(files[key])
            os.chmod(dst, mode)

    def _config_files(self, data):
        files = {k: v.encode() for k, v in data.items()}
        if self.tiny_model and "train.json" in data:
            train = json.loads(data["train.json"])
            model = json.loads(data[train["model"]])
            # Same keys, sizes that fit a CI machine; n_positions stays, so seq_len is still checked.
            model.update({"n_embd": 32, "n_layer": 1, "n_head": 2, "vocab_size": 512})
            files[train["model"]] = json.dumps(model).encode()
        return files

    def mounts(self, pod, container):
        """mount path -> local folder for the container's volumeMounts."""
        volumes = {v["name"]: v for v in pod["spec"].get("volumes", [])}
        pod_name = pod["metadata"]["name"]
        out = {}
        for m in container.get("volumeMounts", []):
            v = volumes.get(m["name"])
            if v is None:  # a volumeClaimTemplate of a StatefulSet: claim <template>-<pod name>
                out[m["mountPath"]] = self._claim("%s-%s" % (m["name"], pod_name))
            elif "persistentVolumeClaim" in v:
                out[m["mountPath"]] = self._claim(v["persistentVolumeClaim"]["claimName"])
            elif "emptyDir" in v:
                out[m["mountPath"]] = self._folder("%s-%s" % (pod_name, m["name"]))
            elif "configMap" in v:
                cm = k8s.one(self.objects, "ConfigMap", v["configMap"]["name"])
                folder = self._folder("%s-%s" % (pod_name, m["name"]))
                self._write(folder, self._config_files(cm["data"]), v["configMap"].get("items"),
                            v["configMap"].get("defaultMode", 0o644))
                out[m["mountPath"]] = folder
            elif "secret" in v:
                secret = k8s.one(self.objects, "Secret", v["secret"]["secretName"])
                files = {k: base64.b64decode(d) for k, d in secret["data"].items()}
                folder = self._folder("%s-%s" % (pod_name, m["name"]))
                self._write(folder, files, v["secret"].get("items"), v["secret"].get("defaultMode", 0o644))
                out[m["mountPath"]] = folder
            else:
                raise AssertionError("volume %s: a kind this test does not stand in for" % m["name"])
        return out


def rewrite_paths(text, mounts):
    """text with every mount path (as a whole path prefix) replaced by its local folder, in one pass (the
    folders themselves are under /tmp, itself a mount path)."""
    if not mounts:
        return text
    alternatives = "|".join(re.escape(m) for m in sorted(mounts, key=len, reverse=True))
    pattern = r"(?<![\w.-])(" + alternatives + r")(?=/|$|,|:)"
    return re.sub(pattern, lambda m: mounts[m.group(1)], text)


def flag_value(args, flag):
    """The value after flag in args (the last one), or None."""
    idx = [i for i, a in enumerate(args) if a == flag]
    return args[idx[-1] + 1] if idx and idx[-1] + 1 < len(args) else None


def set_flag(args, flag, value):
    """args with every value of flag replaced by value."""
    out = list(args)
    for i, a in enumerate(out[:-1]):
        if a == flag:
            out[i + 1] = value
    return out


def read_until_ready(proc, deadline):
    """Reads the server's stdout until its ready line; returns (ready line or None, text read)."""
    seen = ""
    buf = b""
    fd = proc.stdout.fileno()
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            break
        chunk = os.read(fd, 4096)
        if not chunk:  # the server exited
            break
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            text = line.decode(errors="replace")
            seen += text + "\n"
            if text.startswith("ztrain-server ready"):
                return text, seen
    return None, seen + buf.decode(errors="replace")


class ManifestsRunTheRealBinaries(unittest.TestCase):

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="ztrain-deploy-run-")
        self.servers = []  # (name, Popen, log file)

    def tearDown(self):
        for _, proc, _ in self.servers:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        if os.environ.get("ZT_KEEP_TEST_DIR"):
            print("kept %s" % self.tmp, file=sys.stderr)
        else:
            shutil.rmtree(self.tmp, True)

    def base_env(self):
        """What a container gets besides its env entries: a PATH that finds the image's programs."""
        bin_dir = os.path.join(self.tmp, "bin")
        os.makedirs(bin_dir, exist_ok=True)
        for name, target in (("ztrain", WORKER_BIN), ("ztrain-server", SERVER_BIN)):
            link = os.path.join(bin_dir, name)
            if not os.path.exists(link):
                os.symlink(target, link)
        return {"PATH": bin_dir + ":/usr/bin:/bin", "HOME": self.tmp, "LANG": "C.UTF-8"}

    def start_servers(self, target, objects, volumes):
        """Starts every server pod of the StatefulSet; returns their loopback gRPC addresses, by ordinal."""
        sts = k8s.one(objects, "StatefulSet")
        (c,) = sts["spec"]["template"]["spec"]["containers"]
        grpc_port = {p["name"]: p["containerPort"] for p in c["ports"]}["grpc"]
        addresses = []
        for s in range(sts["spec"]["replicas"]):
            pod = k8s.statefulset_pod(sts, s)
            env = k8s.container_env(pod, c, objects)
            self.assertEqual(env.get("ZT_SERVER_INDEX"), str(s), "server %d must learn its ordinal" % s)
            for init in pod["spec"].get("initContainers", []):  # in order, each to success, as the kubelet does
                init_mounts = volumes.mounts(pod, init)
                init_k8s_env = k8s.container_env(pod, init, objects)
                init_env = self.base_env()
                init_env.update({k: rewrite_paths(v, init_mounts) for k, v in init_k8s_env.items()})
                init_argv = container_command(init, init_k8s_env, init_mounts)
                run = subprocess.run(init_argv, capture_output=True, text=True, env=init_env, cwd=self.tmp,
                                     timeout=READY_TIMEOUT)
                self.assertEqual(run.returncode, 0, "%s: init container %s of %s failed:\n%s%s" %
                                 (target, init["name"], pod["metadata"]["name"], run.stdout, run.stderr))
            mounts = volumes.mounts(pod, c)
            argv = container_command(c, env, mounts)
            self.assertEqual(flag_value(argv, "--server-index"), str(s))
            self.assertEqual(flag_value(argv, "--server-count"), str(sts["spec"]["replicas"]),
                             "--server-count must equal the StatefulSet's replicas")
            self.assertEqual(flag_value(argv, "--listen"), "0.0.0.0:%d" % grpc_port)
            for flag in LISTEN_FLAGS:
                self.assertIsNotNone(flag_value(argv, flag), "%s: the server is started without %s" % (target, flag))
                argv = set_flag(argv, flag, "127.0.0.1:0")
            log = open(os.path.join(self.tmp, "%s-%s.log" % (target.replace("/", "_"), pod["metadata"]["name"])),
                       "w+")
            proc_env = self.base_env()
            proc_env.update({k: rewrite_paths(v, mounts) for k, v in env.items()})
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log, env=proc_env, cwd=self.tmp)
            self.servers.append((pod["metadata"]["name"], proc, log))
            line, seen = read_until_ready(proc, time.monotonic() + READY_TIMEOUT)
            if line is None:
                log.seek(0)
                self.fail("%s: %s did not say it was ready (it exited, or %ds passed)\ncommand: %s\nstdout:\n%s\nstderr:\n%s" %
                          (target, pod["metadata"]["name"], READY_TIMEOUT, " ".join(argv), seen, log.read()))
            port = int(re.search(r"\bport=(\d+)", line).group(1))
            addresses.append(("%s.%s:%d" % (pod["metadata"]["name"], sts["spec"]["serviceName"], grpc_port),
                              "127.0.0.1:%d" % port))
        return addresses

    def stop_servers(self, target):
        for name, proc, log in self.servers:
            proc.send_signal(signal.SIGTERM)
        for name, proc, log in self.servers:
            try:
                rc = proc.wait(timeout=STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                rc = "no exit within %ds of SIGTERM" % STOP_TIMEOUT
            log.seek(0)
            self.assertEqual(rc, 0, "%s: %s after SIGTERM:\n%s" % (target, name, log.read()))

    def worker_runs(self, target, objects, volumes, servers, extra_args, master_port):
        """(rank, argv, env) of every rank of the Job, rewritten as the module docstring says."""
        job = k8s.one(objects, "Job")
        (c,) = job["spec"]["template"]["spec"]["containers"]
        runs = []
        for i in range(job["spec"]["completions"]):
            pod = k8s.job_pod(job, i)
            env = k8s.container_env(pod, c, objects)
            mounts = volumes.mounts(pod, c)
            argv = container_command(c, env, mounts)
            listed = flag_value(argv, "--servers")
            self.assertIsNotNone(listed, "%s: the worker is started without --servers" % target)
            self.assertEqual(listed.split(","), [name for name, _ in servers],
                             "%s: --servers must list every server, in ordinal order" % target)
            argv = set_flag(argv, "--servers", ",".join(addr for _, addr in servers)) + extra_args
            run_env = self.base_env()
            run_env.update({k: rewrite_paths(v, mounts) for k, v in env.items()})
            if int(env.get("WORLD_SIZE", "1")) > 1:
                self.assertEqual(env["MASTER_ADDR"], "%s-0.%s" % (job["metadata"]["name"],
                                                                  pod["spec"]["subdomain"]))
                run_env["MASTER_ADDR"] = "127.0.0.1"
                run_env["MASTER_PORT"] = str(master_port)
            runs.append((i, argv, run_env))
        return runs

    def run_workers(self, runs):
        """Runs every rank at once; returns (rank, argv, exit status, output) for each."""
        procs = []
        for rank, argv, env in runs:
            out = open(os.path.join(self.tmp, "rank%d-%d.log" % (rank, len(os.listdir(self.tmp)))), "w+")
            procs.append((rank, argv, out, subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                                            env=env, cwd=self.tmp)))
        results = []
        deadline = time.monotonic() + WORKER_TIMEOUT
        for rank, argv, out, proc in procs:
            try:
                rc = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                rc = "no exit within %ds" % WORKER_TIMEOUT
            out.seek(0)
            results.append((rank, argv, rc, out.read()))
            out.close()
        return results

    def check_overlay(self, target):
        objects = k8s.render(target)
        volumes = Volumes(os.path.join(self.tmp, target.replace("/", "_")), objects, tiny_model=True)
        servers = self.start_servers(target, objects, volumes)

        # Every rank with the tiny model: fails on the training data and on nothing before it.
        nothing = os.path.join(self.tmp, "no-such-folder", "corpus_train_*.bin")
        runs = self.worker_runs(target, objects, volumes, servers, ["--train-data", nothing], free_port())
        for rank, argv, rc, output in self.run_workers(runs):
            with self.subTest(target=target, rank=rank):
                self.assertIn("no files match '%s'" % nothing, output,
                              "rank %d did not fail on the data (a flag or key was refused?)\ncommand: %s\n"
                              "exit: %s\noutput:\n%s" % (rank, " ".join(argv), rc, output))
                self.assertNotEqual(rc, 0)

        # Rank 0 with the real model config: read and checked, then stopped by --steps 0.
        real = Volumes(os.path.join(self.tmp, target.replace("/", "_") + "-real"), objects, tiny_model=False)
        (run,) = self.worker_runs(target, objects, real, servers, ["--train-data", nothing, "--steps", "0"],
                                  free_port())[:1]
        ((rank, argv, rc, output),) = self.run_workers([run])
        self.assertIn('"steps" (--steps) = 0 is out of range', output,
                      "%s: the real model config was not accepted\ncommand: %s\nexit: %s\noutput:\n%s" %
                      (target, " ".join(argv), rc, output))
        self.assertEqual(rc, 2)

        self.stop_servers(target)

    def test_every_overlay(self):
        overlays = k8s.overlays()
        self.assertTrue(overlays)
        for target in overlays:
            with self.subTest(target=target):
                try:
                    self.check_overlay(target)
                finally:
                    for _, proc, log in self.servers:  # left running by a failed check
                        if proc.poll() is None:
                            proc.kill()
                            proc.wait()
                        log.close()
                    self.servers = []


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit("usage: test_k8s_binaries.py ZTRAIN_SERVER ZTRAIN [unittest args]")
    SERVER_BIN = os.path.abspath(sys.argv[1])
    WORKER_BIN = os.path.abspath(sys.argv[2])
    unittest.main(argv=[sys.argv[0]] + sys.argv[3:], verbosity=2)
