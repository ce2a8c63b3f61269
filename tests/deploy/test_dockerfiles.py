"""Lints the container images' Dockerfiles (deploy/docker/*.Dockerfile) and the scripts they run, offline:
no Docker engine is needed (or available on CI).

- Each Dockerfile parses with Docker's own parser (the `dockerfile` package wraps BuildKit's Go parser).
- Base images carry a pinned release tag (never `latest`, never none), after ARG defaults are filled in.
- Builds are multi-stage; the final stage runs as a numeric, non-root USER; ENTRYPOINT and CMD use the
  exec (JSON) form; every `apt-get install` runs after `apt-get update` in the same RUN, with
  --no-install-recommends, and removes /var/lib/apt/lists in that RUN; no ADD.
- The server's final stage is a slim Debian; the worker's is NVIDIA's CUDA runtime image (NCCL inside).
- Files the builds copy or run exist and are not excluded by .dockerignore, which does exclude .git,
  build folders, virtual environments and the Kubernetes secrets folder.
- The ports the images expose are the ones the Kubernetes manifests use.
- The worker entrypoint adds --resume only when the run directory has a checkpoint, and
  runtime-packages.sh names the packages of a program's shared libraries.
"""

import os
import re
import shlex
import subprocess
import sys
import tempfile
import unittest

import dockerfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import k8s_render as k8s  # noqa: E402

SRC = k8s.SOURCE_DIR
DOCKER_DIR = os.path.join(SRC, "deploy", "docker")
IMAGES = {"server": "server.Dockerfile", "worker": "worker.Dockerfile"}


def parse(name):
    return dockerfile.parse_file(os.path.join(DOCKER_DIR, name))


def stages(commands):
    """Splits the instructions into (global ARG defaults, [(from command, [instructions])...])."""
    args, out = {}, []
    for c in commands:
        if c.cmd == "FROM":
            out.append((c, []))
        elif not out:
            if c.cmd == "ARG":
                name, _, default = c.value[0].partition("=")
                args[name] = default.strip('"')
        else:
            out[-1][1].append(c)
    return args, out


# Docker's instructions and the flags each accepts; BuildKit's parser reads any word as an instruction.
INSTRUCTIONS = {
    "FROM": {"--platform"}, "RUN": {"--mount", "--network", "--security"},
    "COPY": {"--from", "--chown", "--chmod", "--link", "--parents", "--exclude"},
    "ARG": set(), "ENV": set(), "LABEL": set(), "USER": set(), "WORKDIR": set(), "EXPOSE": set(),
    "ENTRYPOINT": set(), "CMD": set(), "VOLUME": set(), "STOPSIGNAL": set(), "SHELL": set(),
    "HEALTHCHECK": {"--interval", "--timeout", "--start-period", "--start-interval", "--retries"},
    "ONBUILD": set(), "ADD": {"--chown", "--chmod", "--link", "--checksum", "--keep-git-dir"},
}


def structure_problems(commands):
    """What Docker would refuse that the parser lets through: unknown instructions and flags, a first
    instruction other than ARG or FROM, FROM and COPY with the wrong number of arguments."""
    problems = []
    seen_from = False
    for c in commands:
        where = "line %d: %s" % (c.start_line, c.original)
        if c.cmd not in INSTRUCTIONS:
            problems.append(where + ": unknown instruction")
            continue
        for flag in c.flags:
            if flag.split("=")[0] not in INSTRUCTIONS[c.cmd]:
                problems.append(where + ": unknown flag " + flag)
        if c.cmd == "FROM":
            seen_from = True
            if len(c.value) not in (1, 3) or (len(c.value) == 3 and c.value[1].upper() != "AS"):
                problems.append(where + ": FROM IMAGE [AS NAME]")
        elif not seen_from and c.cmd != "ARG":
            problems.append(where + ": only ARG may come before the first FROM")
        if c.cmd == "COPY" and len(c.value) < 2:
            problems.append(where + ": COPY needs a source and a destination")
        if c.cmd in ("RUN", "USER", "WORKDIR", "ENTRYPOINT", "EXPOSE") and not any(v.strip() for v in c.value):
            problems.append(where + ": no argument")
    return problems


def substitute(text, args):
    """Fills ${NAME} and $NAME from ARG defaults; raises when one has no default."""
    def sub(m):
        name = m.group(1) or m.group(2)
        if name not in args or args[name] == "":
            raise AssertionError("%s: ARG %s has no default" % (text, name))
        return args[name]
    return re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)", sub, text)


def dockerignore_patterns():
    with open(os.path.join(SRC, ".dockerignore")) as f:
        lines = [ln.strip() for ln in f]
    return [ln for ln in lines if ln and not ln.startswith("#")]


def _pattern_regex(pattern):
    out = ""
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out += "(?:.*/)?"
            i += 3
        elif pattern.startswith("**", i):
            out += ".*"
            i += 2
        elif pattern[i] == "*":
            out += "[^/]*"
            i += 1
        elif pattern[i] == "?":
            out += "[^/]"
            i += 1
        else:
            out += re.escape(pattern[i])
            i += 1
    return re.compile(out + r"\Z")


def ignored(path, patterns):
    """True when .dockerignore patterns leave path (relative to the context) out: a pattern that matches
    the path or one of its parent folders excludes it; a later '!' pattern brings it back."""
    parts = path.strip("/").split("/")
    candidates = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    result = False
    for p in patterns:
        negate = p.startswith("!")
        rx = _pattern_regex(os.path.normpath(p.lstrip("!").strip("/")))
        if any(rx.match(c) for c in candidates):
            result = not negate
    return result


def lint(commands):
    """The image rules, as a list of problems (empty when the Dockerfile keeps them all)."""
    problems = structure_problems(commands)
    args, st = stages(commands)
    if len(st) < 2:
        problems.append("one stage: build from source in a stage of its own")
    aliases = set()
    for frm, _ in st:
        try:
            ref = substitute(frm.value[0], args)
        except AssertionError as e:
            problems.append(str(e))
            continue
        if ref not in aliases:
            repo, _, tag = ref.partition("@")[0].rpartition(":")
            if "@sha256:" not in ref and not (repo and tag and "/" not in tag):
                problems.append("base image %s has no tag" % ref)
            if "latest" in ref:
                problems.append("base image %s is not pinned" % ref)
        if len(frm.value) == 3:
            aliases.add(frm.value[2])
    if st and st[-1][0].value and st[-1][0].value[0] in aliases:
        problems.append("the final stage must start from a fresh base, not from a build stage")
    users = [c.value[0] for c in (st[-1][1] if st else []) if c.cmd == "USER" and c.value]
    uid = users[-1].split(":")[0] if users else ""
    if not re.fullmatch(r"[0-9]+", uid) or int(uid) == 0:
        problems.append("the final stage must end with a numeric, non-root USER (got %r)" % (uid or None))
    for c in commands:
        where = "line %d" % c.start_line
        if c.cmd == "ADD":
            problems.append(where + ": ADD; use COPY")
        if c.cmd in ("ENTRYPOINT", "CMD") and not c.json:
            problems.append(where + ": %s in shell form; use the exec (JSON) form" % c.cmd)
        if c.cmd != "RUN" or not c.value:
            continue
        run = c.value[0]
        if re.search(r"(^|[\s;&|])sudo\s", run):
            problems.append(where + ": sudo")
        if "apt-get" not in run:
            continue
        steps = [x.strip() for x in run.split("&&")]
        update = [i for i, x in enumerate(steps) if x.startswith("apt-get update")]
        install = [i for i, x in enumerate(steps) if "apt-get install" in x]
        clean = [i for i, x in enumerate(steps) if "rm -rf /var/lib/apt/lists/*" in x]
        if not install:
            problems.append(where + ": apt-get update without an install in the same RUN")
            continue
        if not update or update[0] > install[0]:
            problems.append(where + ": apt-get install without apt-get update before it in the same RUN")
        if not clean or clean[-1] < install[-1]:
            problems.append(where + ": apt lists not removed (rm -rf /var/lib/apt/lists/*) in the same RUN")
        for i in install:
            if "--no-install-recommends" not in steps[i]:
                problems.append(where + ": apt-get install without --no-install-recommends")
            if not re.search(r"(^|\s)-y(\s|$)", steps[i]):
                problems.append(where + ": apt-get install without -y")
    return problems


class Dockerfiles(unittest.TestCase):

    def test_images_keep_the_rules(self):
        for image, name in IMAGES.items():
            with self.subTest(image=image):
                self.assertEqual(lint(parse(name)), [])

    def test_final_bases(self):
        finals = {}
        for image, name in IMAGES.items():
            args, st = stages(parse(name))
            finals[image] = substitute(st[-1][0].value[0], args)
        self.assertRegex(finals["server"], r"^debian:[0-9.]+-slim$")
        self.assertRegex(finals["worker"], r"^nvidia/cuda:[0-9.]+-runtime-ubuntu[0-9.]+$")

    def test_the_rules_catch_mistakes(self):
        ok = ("FROM debian:12.11 AS build\nRUN true\n"
              "FROM debian:12.11-slim\nCOPY --from=build /a /a\nUSER 10001:10001\nENTRYPOINT [\"/a\"]\n")
        self.assertEqual(lint(dockerfile.parse_string(ok)), [])
        bad = {
            "unpinned": ok.replace("debian:12.11-slim", "debian"),
            "latest": ok.replace("debian:12.11-slim", "debian:latest"),
            "ARG without default": "ARG V\n" + ok.replace("debian:12.11-slim", "debian:${V}"),
            "single stage": "FROM debian:12.11-slim\nUSER 10001\n",
            "final stage from build": ok.replace("debian:12.11-slim", "build"),
            "root": ok.replace("USER 10001:10001", "USER root"),
            "no user": ok.replace("USER 10001:10001\n", ""),
            "user by name": ok.replace("USER 10001:10001", "USER ztrain"),
            "apt lists kept": ok.replace("RUN true", "RUN apt-get update && apt-get install -y --no-install-recommends x"),
            "update alone": ok.replace("RUN true", "RUN apt-get update"),
            "recommends": ok.replace("RUN true", "RUN apt-get update && apt-get install -y x && rm -rf /var/lib/apt/lists/*"),
            "shell entrypoint": ok.replace('ENTRYPOINT ["/a"]', "ENTRYPOINT /a"),
            "add": ok.replace("RUN true", "ADD https://example.com/x /x"),
            "unknown instruction": ok.replace("RUN true", "COPPY . ."),
            "unknown flag": ok.replace("--from=build", "--form=build"),
            "before FROM": "RUN true\n" + ok,
        }
        for what, text in bad.items():
            with self.subTest(mistake=what):
                self.assertNotEqual(lint(dockerfile.parse_string(text)), [])
        with self.assertRaises(dockerfile.GoParseError):
            dockerfile.parse_string("FROM debian:12.11\nRUN <<EOF\napt-get update\n")
        with self.assertRaises(dockerfile.GoParseError):
            dockerfile.parse_string("FROM debian:12.11\nENV ONLY_A_NAME\n")

    def test_build_inputs_are_in_the_context(self):
        patterns = dockerignore_patterns()
        for image, name in IMAGES.items():
            for c in parse(name):
                with self.subTest(image=image, line=c.start_line):
                    if c.cmd == "COPY" and not any(f.startswith("--from=") for f in c.flags):
                        for src in c.value[:-1]:
                            self.assertTrue(os.path.exists(os.path.join(SRC, src)), src)
                            if src != ".":
                                self.assertFalse(ignored(src, patterns), "%s is in .dockerignore" % src)
                    if c.cmd == "RUN":
                        for word in shlex.split(c.value[0]):
                            if word.startswith("deploy/"):
                                self.assertTrue(os.path.isfile(os.path.join(SRC, word)), word)
                                self.assertFalse(ignored(word, patterns), "%s is in .dockerignore" % word)
        for needed in ("CMakeLists.txt", "common/status.h", "worker/cli/main.c", "deploy/docker/worker-entrypoint.sh"):
            self.assertFalse(ignored(needed, patterns), needed)

    def test_dockerignore_keeps_secrets_and_clutter_out(self):
        patterns = dockerignore_patterns()
        for path in (".git/config", "build/CMakeCache.txt", "build-deploy/x", ".venv/bin/python3",
                     "deploy/k8s/base/secrets/token", "deploy/k8s/base/secrets/tls.key",
                     "tests/deploy/__pycache__/k8s_render.cpython-311.pyc", "runs/demo/metrics.jsonl"):
            with self.subTest(path=path):
                self.assertTrue(ignored(path, patterns), "%s would be sent to the build" % path)

    def test_exposed_ports_match_the_manifests(self):
        objects = k8s.render("base")
        manifest_ports = {
            "server": {p["containerPort"] for p in
                       k8s.one(objects, "StatefulSet")["spec"]["template"]["spec"]["containers"][0]["ports"]},
            "worker": {p["containerPort"] for p in
                       k8s.one(objects, "Job")["spec"]["template"]["spec"]["containers"][0]["ports"]},
        }
        for image, name in IMAGES.items():
            with self.subTest(image=image):
                _, st = stages(parse(name))
                exposed = {int(p.split("/")[0]) for c in st[-1][1] if c.cmd == "EXPOSE" for p in c.value}
                self.assertEqual(exposed, manifest_ports[image])


class Scripts(unittest.TestCase):

    def test_shell_syntax(self):
        for d in (DOCKER_DIR, os.path.join(SRC, "deploy", "k8s")):
            for f in sorted(os.listdir(d)):
                if f.endswith(".sh"):
                    path = os.path.join(d, f)
                    with open(path) as fh:
                        shell = "bash" if "bash" in fh.readline() else "sh"
                    with self.subTest(script=f):
                        run = subprocess.run([shell, "-n", path], capture_output=True, text=True)
                        self.assertEqual(run.returncode, 0, run.stderr)

    def entrypoint(self, args, run_dir):
        """Runs worker-entrypoint.sh with a stand-in `ztrain` that prints its arguments."""
        with tempfile.TemporaryDirectory() as bindir:
            fake = os.path.join(bindir, "ztrain")
            with open(fake, "w") as f:
                f.write('#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done\n')
            os.chmod(fake, 0o755)
            env = {"PATH": bindir + ":/usr/bin:/bin", "ZT_RUN_DIR": run_dir}
            run = subprocess.run(["sh", os.path.join(DOCKER_DIR, "worker-entrypoint.sh")] + args,
                                 env=env, capture_output=True, text=True)
            self.assertEqual(run.returncode, 0, run.stderr)
            return run.stdout.splitlines()

    def test_entrypoint_resumes_only_from_a_checkpoint(self):
        with tempfile.TemporaryDirectory() as run_dir:
            args = ["train", "--config", "/etc/ztrain/config/train.json", "--out", run_dir]
            self.assertEqual(self.entrypoint(args, run_dir), args)
            with open(os.path.join(run_dir, "latest"), "w") as f:
                f.write("ckpt_000500\n")
            self.assertEqual(self.entrypoint(args, run_dir), args + ["--resume", run_dir])
            explicit = args + ["--resume", "/elsewhere"]
            self.assertEqual(self.entrypoint(explicit, run_dir), explicit)
            self.assertEqual(self.entrypoint(["--version"], ""), ["--version"])

    def test_runtime_packages(self):
        script = os.path.join(DOCKER_DIR, "runtime-packages.sh")
        run = subprocess.run(["sh", script, sys.executable], capture_output=True, text=True)
        self.assertEqual(run.returncode, 0, run.stderr)
        packages = run.stdout.split()
        self.assertIn("libc6", packages)
        self.assertEqual(packages, sorted(set(packages)))
        run = subprocess.run(["sh", script], capture_output=True, text=True)
        self.assertEqual(run.returncode, 2)


if __name__ == "__main__":
    unittest.main(verbosity=1)
