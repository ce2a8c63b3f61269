"""Gives the worker exactly the environment the Kubernetes manifests give each pod of the worker Job and
checks what it derives from it: for every overlay and every completion index i, renders the overlay,
builds pod i as the Job controller would (index annotation, JOB_COMPLETION_INDEX, hostname), computes its
container's environment as the kubelet would, runs a program that calls zt_launch_env_parse in exactly
that environment, and checks rank = i, world size = completions, and the rendezvous address = pod 0's
DNS name through the Job's headless Service.

    test_k8s_launch_env.py PATH/TO/zt_launch_env_print
"""

import os
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import k8s_render as k8s  # noqa: E402

PRINTER = None  # the zt_launch_env_print program, from the command line


def run_printer(env):
    """Runs zt_launch_env_print with env as its whole environment; returns (exit status, fields, stderr)."""
    run = subprocess.run([PRINTER], env=env, capture_output=True, text=True)
    fields = dict(line.split("=", 1) for line in run.stdout.splitlines() if "=" in line)
    return run.returncode, fields, run.stderr


class LaunchEnvFromManifests(unittest.TestCase):

    def check_overlay(self, target):
        objects = k8s.render(target)
        job = k8s.one(objects, "Job")
        spec = job["spec"]
        self.assertEqual(spec.get("completionMode"), "Indexed", "%s: the worker Job must be Indexed" % target)
        completions = spec["completions"]
        self.assertEqual(spec.get("parallelism"), completions,
                         "%s: every rank must run at once: parallelism must equal completions" % target)

        # The rendezvous host: pod 0 of the Job, in the headless Service named by the pod's subdomain.
        subdomain = spec["template"]["spec"].get("subdomain")
        self.assertTrue(subdomain, "%s: the Job's pods need a subdomain for stable DNS names" % target)
        svc = k8s.one(objects, "Service", subdomain)
        self.assertEqual(svc["spec"].get("clusterIP"), "None", "%s: Service %s must be headless" % (target, subdomain))
        self.assertTrue(k8s.selects(svc["spec"].get("selector"), spec["template"]["metadata"]["labels"]),
                        "%s: Service %s does not select the worker pods" % (target, subdomain))
        expected_addr = "%s-0.%s" % (job["metadata"]["name"], subdomain)
        (container,) = [c for c in spec["template"]["spec"]["containers"] if c["name"] == "worker"]
        rendezvous_ports = [p["containerPort"] for p in container.get("ports", []) if p.get("name") == "rendezvous"]
        self.assertEqual(len(rendezvous_ports), 1, "%s: the worker declares one rendezvous port" % target)
        self.assertIn(rendezvous_ports[0], [p["port"] for p in svc["spec"]["ports"]])

        # The state servers the workers are told about: one per replica, through their headless Service.
        sts = k8s.one(objects, "StatefulSet")
        server_svc = sts["spec"]["serviceName"]
        grpc_port = [p["containerPort"] for p in sts["spec"]["template"]["spec"]["containers"][0]["ports"]
                     if p["name"] == "grpc"][0]
        expected_servers = ["%s-%d.%s:%d" % (sts["metadata"]["name"], s, server_svc, grpc_port)
                            for s in range(sts["spec"]["replicas"])]

        for index in range(completions):
            with self.subTest(overlay=target, index=index):
                pod = k8s.job_pod(job, index)
                (pod_container,) = [c for c in pod["spec"]["containers"] if c["name"] == "worker"]
                env = k8s.container_env(pod, pod_container, objects)
                self.assertEqual(env.get("JOB_COMPLETION_INDEX"), str(index))
                env["PATH"] = os.environ.get("PATH", "/usr/bin:/bin")
                rc, got, err = run_printer(env)
                self.assertEqual(rc, 0, "pod %d: zt_launch_env_parse failed: %s" % (index, err))
                self.assertEqual(int(got["rank"]), index)
                self.assertEqual(int(got["world_size"]), completions)
                self.assertEqual(int(got["local_rank"]), 0)
                self.assertEqual(int(got["local_world_size"]), 1)
                self.assertEqual(got["master_addr"], expected_addr)
                self.assertEqual(int(got["master_port"]), rendezvous_ports[0])

                # Without RANK the worker falls back on the Job controller's JOB_COMPLETION_INDEX.
                no_rank = {k: v for k, v in env.items() if k != "RANK"}
                rc, got, err = run_printer(no_rank)
                self.assertEqual(rc, 0, err)
                self.assertEqual(int(got["rank"]), index)

                # The command line names every state server, as the StatefulSet's DNS names.
                args = k8s.container_args(container, env)
                self.assertIn("--servers", args)
                servers = args[args.index("--servers") + 1].split(",")
                self.assertEqual(servers, expected_servers)
                unexpanded = [a for a in args if "$(" in a]
                self.assertEqual(unexpanded, [], "arguments refer to variables the container does not set")

        # A world size that disagrees with the Job is refused by the last rank, with the reason.
        if completions > 1:
            pod = k8s.job_pod(job, completions - 1)
            env = k8s.container_env(pod, pod["spec"]["containers"][0], objects)
            env["WORLD_SIZE"] = str(completions - 1)
            rc, _, err = run_printer(env)
            self.assertEqual(rc, 1)
            self.assertIn("is not below WORLD_SIZE=%d" % (completions - 1), err)

    def test_multi_node(self):
        self.check_overlay("overlays/multi-node")

    def test_every_overlay(self):
        for target in k8s.overlays():
            self.check_overlay(target)


if __name__ == "__main__":
    if len(sys.argv) < 2 or not os.access(sys.argv[1], os.X_OK):
        sys.exit("usage: test_k8s_launch_env.py PATH/TO/zt_launch_env_print")
    PRINTER = os.path.abspath(sys.argv.pop(1))
    unittest.main(verbosity=2)
