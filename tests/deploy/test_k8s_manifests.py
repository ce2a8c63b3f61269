"""Offline checks of the Kubernetes manifests in deploy/k8s.

1. Renders the base and every overlay with `kubectl kustomize`, and validates every object they hold
   (and deploy/k8s/tools/*.yaml) against the Kubernetes OpenAPI schemas of every version in
   KUBERNETES_VERSIONS, strictly (an unknown field is an error), with kubernetes-validate. Any error,
   or an object kind without a schema, fails.
2. Checks what the schemas cannot: the objects the deployment needs are there and refer to each other
   correctly (Services select the pods, volumes name existing claims, ConfigMaps and Secrets, probes hit
   declared ports), every container has requests and limits and runs as non-root, images carry a
   release tag, the NetworkPolicy admits workers only to the servers' gRPC port, and the server
   certificate that make-secrets.sh makes covers every server's DNS name.
"""

import functools
import json
import os
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import k8s_render as k8s  # noqa: E402

import kubernetes_validate.utils as kv  # noqa: E402

# The Kubernetes minor versions the manifests are validated against (docs/deploy.md says the same).
# 1.28 is the first that labels StatefulSet pods with their ordinal (apps.kubernetes.io/pod-index), which
# the servers' --server-index comes from; kubernetes-validate 1.37.0 knows up to 1.37.
KUBERNETES_VERSIONS = ["1.%d.0" % minor for minor in range(28, 38)]

# Loading a version's schema definitions takes long; the same files serve every object.
kv.schema_contents = functools.lru_cache(maxsize=None)(kv.schema_contents)

# The keys `ztrain train --config` accepts (unknown keys are errors there).
TRAIN_CONFIG_KEYS = {
    "model", "init_from", "train_data", "val_data", "out_dir", "steps", "batch_size", "seq_len",
    "grad_accum", "lr", "min_lr", "schedule", "warmup_steps", "lr_gamma", "weight_decay", "beta1",
    "beta2", "eps", "grad_clip", "eval_every", "eval_batches", "save_every", "log_every", "seed",
    "threads", "shuffle", "device", "precision", "loss_scale", "loss_scale_window", "min_loss_scale",
    "optimizer", "servers", "token_file", "tls_ca", "tls_cert", "tls_key", "state_store", "zero_level",
    "checkpointing", "prefetch"}

SERVER_LABELS = {"app.kubernetes.io/name": "ztrain", "app.kubernetes.io/component": "server"}
WORKER_LABELS = {"app.kubernetes.io/name": "ztrain", "app.kubernetes.io/component": "worker"}


def targets():
    """Every renderable folder: the base and the overlays."""
    return ["base"] + k8s.overlays()


def pod_specs(objects):
    """(owner name, pod spec, names of the volumes its pods get) for every object that makes pods."""
    out = []
    for o in objects:
        if o["kind"] in ("StatefulSet", "Deployment", "Job", "DaemonSet"):
            spec = o["spec"]["template"]["spec"]
            volumes = [v["name"] for v in spec.get("volumes", [])]
            volumes += [t["metadata"]["name"] for t in o["spec"].get("volumeClaimTemplates", [])]
            out.append((o["metadata"]["name"], spec, volumes))
        elif o["kind"] == "Pod":
            out.append((o["metadata"]["name"], o["spec"], [v["name"] for v in o["spec"].get("volumes", [])]))
    return out


class Schemas(unittest.TestCase):
    """Every object, every version, strict."""

    def validate_all(self, name, objects):
        self.assertTrue(objects, "%s rendered no objects" % name)
        for version in KUBERNETES_VERSIONS:
            for obj in objects:
                what = "%s: %s/%s against Kubernetes %s" % (name, obj["kind"], obj["metadata"]["name"], version)
                with self.subTest(what=what):
                    try:
                        kv.validate(obj, version, strict=True)
                    except kv.ValidationError as e:
                        self.fail("%s: %s: %s" % (what, ".".join(str(p) for p in e.path), e.message))
                    except kv.SchemaNotFoundError as e:
                        self.fail("%s: %s" % (what, e.message))

    def test_rendered_targets_validate(self):
        for target in targets():
            self.validate_all(target, k8s.render(target))

    def test_tools_validate(self):
        tools = os.path.join(k8s.K8S_DIR, "tools")
        for f in sorted(os.listdir(tools)):
            if f.endswith(".yaml"):
                self.validate_all("tools/" + f, k8s.load_file("tools/" + f))

    def test_a_broken_object_is_caught(self):
        # The validator really rejects: a misspelt field and a wrong type both fail.
        job = k8s.one(k8s.render("base"), "Job")
        bad = json.loads(json.dumps(job))
        bad["spec"]["completion"] = 2
        with self.assertRaises(kv.ValidationError):
            kv.validate(bad, KUBERNETES_VERSIONS[0], strict=True)
        bad = json.loads(json.dumps(job))
        bad["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "29500"
        with self.assertRaises(kv.ValidationError):
            kv.validate(bad, KUBERNETES_VERSIONS[-1], strict=True)


class Structure(unittest.TestCase):
    """What the schemas do not check, for the base and every overlay."""

    def setUp(self):
        self.rendered = {t: k8s.render(t) for t in targets()}

    def test_every_part_is_there(self):
        for target, objects in self.rendered.items():
            with self.subTest(target=target):
                k8s.one(objects, "StatefulSet", "ztrain-server")
                k8s.one(objects, "Job", "ztrain-train")
                k8s.one(objects, "Service", "ztrain-server")
                k8s.one(objects, "Service", "ztrain-workers")
                k8s.one(objects, "NetworkPolicy", "ztrain-server")
                k8s.one(objects, "PersistentVolumeClaim", "ztrain-checkpoints")
                k8s.one(objects, "PersistentVolumeClaim", "ztrain-data")
                k8s.generated(objects, "ConfigMap", "ztrain-config")
                k8s.generated(objects, "Secret", "ztrain-auth")
                if target != "base":
                    for o in objects:
                        self.assertEqual(o["metadata"].get("namespace"), "ztrain",
                                         "%s/%s is not in namespace ztrain" % (o["kind"], o["metadata"]["name"]))

    def test_statefulset_service_and_storage(self):
        for target, objects in self.rendered.items():
            with self.subTest(target=target):
                sts = k8s.one(objects, "StatefulSet")
                labels = sts["spec"]["template"]["metadata"]["labels"]
                self.assertTrue(k8s.selects(sts["spec"]["selector"]["matchLabels"], labels))
                svc = k8s.one(objects, "Service", sts["spec"]["serviceName"])
                self.assertEqual(svc["spec"]["clusterIP"], "None")
                self.assertTrue(k8s.selects(svc["spec"]["selector"], labels))
                claims = [t["metadata"]["name"] for t in sts["spec"]["volumeClaimTemplates"]]
                self.assertTrue(claims, "each server needs its PersistentVolumeClaim")
                (c,) = sts["spec"]["template"]["spec"]["containers"]
                mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
                for claim in claims:
                    self.assertIn(claim, mounts, "the claim %s is not mounted" % claim)
                # The NVMe tier and the snapshots are on the claim, not in the container's layer.
                env = {e["name"]: e.get("value") for e in c["env"]}
                args = c["args"]
                snapshot_dir = args[args.index("--snapshot-dir") + 1]
                self.assertTrue(any(snapshot_dir.startswith(mounts[cl] + "/") for cl in claims))
                store = env["ZT_STORE"]
                self.assertTrue(store == "ram" or store.startswith("nvme:"), store)
                if store.startswith("nvme:"):
                    self.assertTrue(any(store[5:].startswith(mounts[cl] + "/") for cl in claims))

    def test_server_probes_use_grpc_health(self):
        for target, objects in self.rendered.items():
            with self.subTest(target=target):
                sts = k8s.one(objects, "StatefulSet")
                (c,) = sts["spec"]["template"]["spec"]["containers"]
                ports = {p["name"]: p["containerPort"] for p in c["ports"]}
                self.assertEqual(ports.get("grpc"), 7070)
                self.assertEqual(ports.get("metrics"), 9090)
                args = c["args"]
                health = args[args.index("--health-listen") + 1]
                for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                    self.assertIn(probe, c)
                    self.assertIn("grpc", c[probe], "%s must be a gRPC probe (grpc.health.v1)" % probe)
                    self.assertEqual(c[probe]["grpc"]["port"], ports["health"])
                    self.assertTrue(health.endswith(":%d" % ports["health"]))
                metrics = args[args.index("--metrics-listen") + 1]
                self.assertTrue(metrics.endswith(":%d" % ports["metrics"]))

    def test_servers_know_their_place(self):
        for target, objects in self.rendered.items():
            with self.subTest(target=target):
                sts = k8s.one(objects, "StatefulSet")
                (c,) = sts["spec"]["template"]["spec"]["containers"]
                env = {e["name"]: e for e in c["env"]}
                self.assertEqual(env["ZT_SERVER_INDEX"]["valueFrom"]["fieldRef"]["fieldPath"],
                                 "metadata.labels['%s']" % k8s.POD_INDEX_LABEL)
                self.assertEqual(int(env["ZT_SERVER_COUNT"]["value"]), sts["spec"]["replicas"],
                                 "ZT_SERVER_COUNT must equal the StatefulSet's replicas")
                self.assertIn("$(ZT_SERVER_INDEX)", c["args"])
                self.assertIn("$(ZT_SERVER_COUNT)", c["args"])

    def test_job_is_indexed_and_consistent(self):
        for target, objects in self.rendered.items():
            with self.subTest(target=target):
                job = k8s.one(objects, "Job")
                spec = job["spec"]
                self.assertEqual(spec["completionMode"], "Indexed")
                self.assertEqual(spec["completions"], spec["parallelism"])
                pod = spec["template"]["spec"]
                self.assertEqual(pod["restartPolicy"], "Never")
                svc = k8s.one(objects, "Service", pod["subdomain"])
                self.assertEqual(svc["spec"]["clusterIP"], "None")
                self.assertTrue(svc["spec"].get("publishNotReadyAddresses"),
                                "ranks look up rank 0 before it is ready")
                (c,) = pod["containers"]
                env = {e["name"]: e.get("value") for e in c["env"]}
                self.assertEqual(int(env["WORLD_SIZE"]), spec["completions"])
                for kind in ("requests", "limits"):
                    self.assertGreaterEqual(int(c["resources"][kind]["nvidia.com/gpu"]), 1)

    def test_every_container_has_requests_limits_and_runs_as_non_root(self):
        for target, objects in list(self.rendered.items()) + [("tools", k8s.load_file("tools/data-loader.yaml"))]:
            for owner, spec, _ in pod_specs(objects):
                with self.subTest(target=target, owner=owner):
                    self.assertTrue(spec["securityContext"]["runAsNonRoot"])
                    self.assertNotEqual(spec["securityContext"].get("runAsUser"), 0)
                    for c in spec["containers"]:
                        for kind in ("requests", "limits"):
                            for res in ("cpu", "memory"):
                                self.assertIn(res, c["resources"].get(kind, {}),
                                              "%s: container %s has no %s.%s" % (owner, c["name"], kind, res))
                        self.assertFalse(c["securityContext"]["allowPrivilegeEscalation"])
                        self.assertEqual(c["securityContext"]["capabilities"]["drop"], ["ALL"])
                        image = c["image"]
                        name, _, tag = image.rpartition(":")
                        self.assertTrue(name and "/" not in tag and tag not in ("", "latest"),
                                        "%s: image %s has no release tag" % (owner, image))

    def test_references_resolve(self):
        for target, objects in self.rendered.items():
            claims = {o["metadata"]["name"] for o in k8s.find(objects, "PersistentVolumeClaim")}
            config_maps = {o["metadata"]["name"]: o for o in k8s.find(objects, "ConfigMap")}
            secrets = {o["metadata"]["name"]: o for o in k8s.find(objects, "Secret")}
            for owner, spec, volume_names in pod_specs(objects):
                with self.subTest(target=target, owner=owner):
                    volumes = {v["name"]: v for v in spec.get("volumes", [])}
                    for c in spec["containers"]:
                        for m in c.get("volumeMounts", []):
                            self.assertIn(m["name"], volume_names, "mount %s has no volume" % m["name"])
                        for var in (a[2:-1] for a in c.get("args", []) if a.startswith("$(")):
                            self.assertIn(var, {e["name"] for e in c.get("env", [])})
                    for v in volumes.values():
                        if "persistentVolumeClaim" in v:
                            self.assertIn(v["persistentVolumeClaim"]["claimName"], claims)
                        if "configMap" in v:
                            self.assertIn(v["configMap"]["name"], config_maps)
                        if "secret" in v:
                            secret = secrets.get(v["secret"]["secretName"])
                            self.assertIsNotNone(secret, "no Secret %s" % v["secret"]["secretName"])
                            for item in v["secret"].get("items", []):
                                self.assertIn(item["key"], secret["data"])

    def test_training_config(self):
        for target, objects in self.rendered.items():
            with self.subTest(target=target):
                data = k8s.generated(objects, "ConfigMap", "ztrain-config")["data"]
                train = json.loads(data["train.json"])
                self.assertEqual(set(train) - TRAIN_CONFIG_KEYS, set(), "keys ztrain train does not know")
                # The model config is a file next to train.json in the same ConfigMap.
                self.assertIn(train["model"], data)
                model = json.loads(data[train["model"]])
                self.assertEqual(model["n_embd"] % model["n_head"], 0)
                # The run directory comes from the Job (--out), so the config must not name another.
                self.assertNotIn("out_dir", train)

    def test_network_policy_admits_only_workers(self):
        for target, objects in self.rendered.items():
            with self.subTest(target=target):
                policy = k8s.one(objects, "NetworkPolicy", "ztrain-server")["spec"]
                sts = k8s.one(objects, "StatefulSet")
                self.assertTrue(k8s.selects(policy["podSelector"]["matchLabels"],
                                            sts["spec"]["template"]["metadata"]["labels"]))
                self.assertIn("Ingress", policy["policyTypes"])
                worker_labels = k8s.one(objects, "Job")["spec"]["template"]["metadata"]["labels"]
                grpc_rules = [r for r in policy["ingress"] if any(p["port"] == 7070 for p in r.get("ports", []))]
                self.assertEqual(len(grpc_rules), 1)
                for peer in grpc_rules[0]["from"]:
                    self.assertEqual(set(peer), {"podSelector"}, "only pods of this namespace, by label")
                    self.assertTrue(k8s.selects(peer["podSelector"]["matchLabels"], worker_labels))
                    self.assertFalse(k8s.selects(peer["podSelector"]["matchLabels"], SERVER_LABELS))
                for rule in policy["ingress"]:
                    self.assertTrue(rule.get("from"), "an ingress rule without 'from' admits everyone")
                    self.assertTrue(rule.get("ports"), "an ingress rule without 'ports' opens every port")

    def test_server_certificate_covers_every_server(self):
        cert = os.path.join(k8s.secrets_dir(), "tls.crt")
        for target, objects in self.rendered.items():
            sts = k8s.one(objects, "StatefulSet")
            replicas = sts["spec"]["replicas"]
            for s in range(replicas):
                host = "%s-%d.%s" % (sts["metadata"]["name"], s, sts["spec"]["serviceName"])
                for name in (host, host + ".ztrain.svc.cluster.local"):
                    with self.subTest(target=target, host=name):
                        run = subprocess.run(["openssl", "x509", "-in", cert, "-noout", "-checkhost", name],
                                             capture_output=True, text=True)
                        self.assertIn("does match certificate", run.stdout)
        run = subprocess.run(["openssl", "x509", "-in", cert, "-noout", "-checkhost", "evil.example"],
                             capture_output=True, text=True)
        self.assertIn("does NOT match certificate", run.stdout)


if __name__ == "__main__":
    unittest.main(verbosity=1)
