"""Random kills of a state server or of a worker during training, and the check that they change nothing.

For each configuration (W ranks on the CPU: 1, 2 or 3; the server's store: ram or nvme) this script
  1. runs `ztrain [launch --nproc W] train --optimizer server --servers ...` once without a fault, against a
     fresh ztrain-server with --snapshot-dir (the reference: the final checkpoint's model.safetensors);
  2. runs TRIALS trials: the same command against a fresh server, which is killed with SIGKILL at a random
     moment (drawn from --seed, uniform over the part of the reference run in which the worker talks to the
     server: from its log line "optimizer: AdamW on" less 50 ms to its last line) and started again at
     once on the same address with the same --snapshot-dir (and NVMe folder); the run must exit 0 and
     its final model.safetensors must equal the reference's, byte for byte;
  3. with --snapshot-kills K, K more trials kill the server while it writes a snapshot: each picks a step
     N at random, the script watches the snapshot folder and kills as soon as a step_M.tmp folder with
     M >= N appears; a kill counts as one during a snapshot only if the .tmp folder is still there after it
     (the write was cut), and such a trial is drawn again (up to 10 times) until one is;
  4. with --checkpoint-kills K, K more trials kill the server while the worker writes a checkpoint: the
     script watches the run folder and kills as soon as a ckpt_N.tmp folder appears (N >= a random step);
  5. with --worker-kills K, K more trials kill a worker instead (one rank process, chosen at random, with
     SIGKILL; `ztrain launch` then stops the others) at a random moment of the run, and K more while rank 0
     writes a checkpoint; the server (if any) stays up, and the run is continued as a user would: `ztrain
     ... train --resume RUN_DIR` with the same flags (the same command again when no checkpoint was
     written yet). Its final model.safetensors must equal the reference's.
A configuration is wN-ram, wN-nvme (--optimizer server, the server's store) or wN-cpu (--optimizer cpu, no
server: only worker kills apply).
Everything goes only through the ztrain and ztrain-server command lines. A trial whose kill came after the
run had ended is reported as "late" and drawn again. Prints one line per trial (with what the run logged
about the fault: "retry" of an unavailable server, "rewind" to a checkpoint, or "none seen" for a kill
that came while the worker was not talking to the server) and a table: configuration, trials,
bit-identical, failures, kills the run saw; exits 1 if any trial failed. --json FILE writes the same as
JSON. Every process is ended in a finally block.

usage: fault_injection.py ZTRAIN_SERVER ZTRAIN [--configs w1-ram,w2-nvme,w2-cpu,...] [--trials N]
                          [--snapshot-kills K] [--checkpoint-kills K] [--worker-kills K] [--seed S] [--steps N]
                          [--server-flags "..."] [--json FILE] [--keep]
"""
import argparse
import datetime
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "proto"))
import grpcio_client_test as g  # noqa: E402  (the Server wrapper: ready line, log, stop)
sys.path.insert(0, os.path.join(HERE, "..", "pylib"))
import zt_testlib as t  # noqa: E402  (free port, shards)

RUN_TIMEOUT = 240.0  # seconds one training run may take, faults included


class TrainJob:
    """A `ztrain ... train` process with its output in a file."""

    def __init__(self, argv, log_path):
        self.log_path = log_path
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT)

    def wait(self, timeout):
        try:
            return self.proc.wait(timeout)
        finally:
            self.log.flush()

    def text(self):
        self.log.flush()
        with open(self.log_path) as f:
            return f.read()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def server_window(text, start, duration, marker="optimizer: AdamW on"):
    """The seconds after `start` (time.time()) from the first log line holding `marker` (by default the line
    that says the optimizer runs on the servers; for worker kills the first step's line), less 50 ms, to the
    last log line: where a kill meets the worker talking to the server, or training. Falls back to
    (0, duration) when the lines cannot be read."""
    stamps = []
    first = None
    for line in text.splitlines():
        word = line.split(" ", 1)[0].split("]")[-1]  # "[r0]" prefixes of ztrain launch
        try:
            ts = datetime.datetime.fromisoformat(word.replace("Z", "+00:00")).timestamp() - start
        except ValueError:
            continue
        stamps.append(ts)
        if first is None and marker in line:
            first = ts
    if first is None or not stamps or stamps[-1] <= first:
        return 0.0, duration
    return max(0.0, first - 0.05), stamps[-1]


def final_model(run_dir):
    """The bytes of model.safetensors of the checkpoint `latest` names, or None."""
    try:
        with open(os.path.join(run_dir, "latest")) as f:
            name = f.read().strip()
        with open(os.path.join(run_dir, name, "model.safetensors"), "rb") as f:
            return name, f.read()
    except OSError:
        return None, None


class Harness:
    def __init__(self, server_bin, ztrain, work, steps, server_extra):
        self.server_extra = server_extra
        self.server_bin = server_bin
        self.ztrain = ztrain
        self.work = work
        self.steps = steps
        self.procs = []
        model = os.path.join(work, "model.json")
        with open(model, "w") as f:
            json.dump({"model_type": "gpt2", "n_layer": 2, "n_head": 2, "n_embd": 16, "n_positions": 16,
                       "vocab_size": 37}, f)
        t.write_shard(os.path.join(work, "train_000.bin"), [(i * 7 + (i // 5) * 3) % 37 for i in range(8192)])
        t.write_shard(os.path.join(work, "val_000.bin"), [(i * 5 + i // 3) % 37 for i in range(1024)])
        self.common = ["--model", model, "--train-data", os.path.join(work, "train_*.bin"),
                       "--val-data", os.path.join(work, "val_*.bin"), "--batch-size", "6", "--seq-len", "8",
                       "--grad-accum", "1", "--threads", "1", "--log-every", "1", "--eval-every", "4",
                       "--eval-batches", "1", "--warmup", "1", "--save-every", "2", "--steps", str(steps),
                       "--lr", "1e-2"]

    def server(self, name, port, snap, store):
        argv = ["--listen", "127.0.0.1:%d" % port, "--snapshot-dir", snap, "--log-level", "warn"] + self.server_extra
        if store:
            argv += ["--store", "nvme:" + store]
        s = g.Server(self.server_bin, self.work, name, argv)
        self.procs.append(s)
        return s

    def train(self, name, nproc, target, resume=False, log_suffix=""):
        """`ztrain [launch] train` against the server at target (None: --optimizer cpu, no server)."""
        argv = [self.ztrain]
        if nproc > 1:
            argv += ["launch", "--nproc", str(nproc), "--master-port", str(t.free_port())]
        out = os.path.join(self.work, name)
        argv += ["train"] + self.common + ["--out", out]
        argv += ["--optimizer", "server", "--servers", target] if target else ["--optimizer", "cpu"]
        if resume:
            argv += ["--resume", out]
        j = TrainJob(argv, os.path.join(self.work, name + log_suffix + ".train.log"))
        self.procs.append(j)
        return j, out

    def fresh_dirs(self, name, nvme):
        snap = os.path.join(self.work, name + "-snap")
        store = os.path.join(self.work, name + "-nvme") if nvme else None
        for d in (snap, store):
            if d:
                shutil.rmtree(d, ignore_errors=True)
        if store:
            os.makedirs(store)
        return snap, store

    def stop_all(self):
        t.stop_all(self.procs)
        self.procs = []

    def cleanup(self, name):
        for suffix in ("", "-snap", "-nvme"):
            shutil.rmtree(os.path.join(self.work, name + suffix), ignore_errors=True)
        for ext in (".train.log", "-resume.train.log"):
            try:
                os.remove(os.path.join(self.work, name + ext))
            except OSError:
                pass

    def reference(self, cfg, nproc, nvme, with_server=True):
        name = "ref-" + cfg
        port = t.free_port()
        snap, store = self.fresh_dirs(name, nvme)
        srv = self.server(name + "-server", port, snap, store) if with_server else None
        start = time.monotonic()
        wall = time.time()
        job, out = self.train(name, nproc, "127.0.0.1:%d" % port if with_server else None)
        rc = job.wait(RUN_TIMEOUT)
        duration = time.monotonic() - start
        if srv:
            srv.stop()
        text = job.text()
        self.stop_all()
        ckpt, model = final_model(out)
        if rc != 0 or model is None:
            raise RuntimeError("%s: the reference run failed (exit %s):\n%s" % (cfg, rc, text[-3000:]))
        return (ckpt, model, duration, server_window(text, wall, duration),
                server_window(text, wall, duration, "step 1/"))

    def trial(self, cfg, k, nproc, nvme, ref, delay, snapshot_kill, snapshot_step=0, checkpoint_kill=False):
        """One run with one kill. Returns a dict: outcome ('identical', 'different', 'failed', 'late',
        'no-snapshot-cut'), the kill time, and what the run logged about the fault."""
        name = "%s-%s%d" % (cfg, "snap" if snapshot_kill else "t", k)
        port = t.free_port()
        target = "127.0.0.1:%d" % port
        snap, store = self.fresh_dirs(name, nvme)
        srv = self.server(name + "-a", port, snap, store)
        start = time.monotonic()
        job, out = self.train(name, nproc, target)
        cut = None
        try:
            if snapshot_kill or checkpoint_kill:
                cut = self.kill_during_snapshot(srv, job, out if checkpoint_kill else snap, snapshot_step,
                                                start + 60.0, "ckpt_" if checkpoint_kill else "step_")
                if cut is None:
                    return {"outcome": "late", "kill_s": None}
            else:
                while time.monotonic() - start < delay and job.proc.poll() is None:
                    time.sleep(min(0.002, max(0.0, delay - (time.monotonic() - start))))
                if job.proc.poll() is not None:
                    return {"outcome": "late", "kill_s": delay}
                srv.proc.send_signal(signal.SIGKILL)
            kill_s = time.monotonic() - start
            srv.stop()
            if snapshot_kill and not cut_still_there(cut):
                return {"outcome": "no-snapshot-cut", "kill_s": kill_s}
            if checkpoint_kill:
                cut = cut if cut_still_there(cut) else cut + " (done meanwhile)"
            srv = self.server(name + "-b", port, snap, store)
            rc = job.wait(RUN_TIMEOUT)
            text = job.text()
            what = "rewind" if "rewinding to checkpoint" in text else ("retry" if "unavailable, retry" in text
                                                                       else "none seen")
            return judge(rc, text, out, ref, kill_s, what, cut)
        finally:
            self.stop_all()
            if not os.environ.get("ZT_KEEP_TEST_DIR"):
                self.cleanup(name)

    def worker_trial(self, cfg, k, nproc, nvme, with_server, ref, delay, checkpoint_step=None):
        """One run whose worker is killed (one rank, SIGKILL), at `delay` seconds or, with checkpoint_step,
        while rank 0 writes a checkpoint of a step >= it; then continued with --resume. Returns a dict as
        trial does."""
        name = "%s-w%d" % (cfg, k)
        port = t.free_port()
        target = "127.0.0.1:%d" % port if with_server else None
        snap, store = self.fresh_dirs(name, nvme)
        if with_server:
            self.server(name + "-a", port, snap, store)
        start = time.monotonic()
        job, out = self.train(name, nproc, target)
        cut = None
        try:
            if checkpoint_step is not None:
                until = start + 60.0
                while time.monotonic() < until and job.proc.poll() is None and cut is None:
                    cut = find_tmp(out, checkpoint_step, "ckpt_") if os.path.isdir(out) else None
                if cut is None:
                    return {"outcome": "late", "kill_s": None}
            else:
                while time.monotonic() - start < delay and job.proc.poll() is None:
                    time.sleep(min(0.002, max(0.0, delay - (time.monotonic() - start))))
            victim = pick_rank(job.proc.pid, nproc, self.rng)
            if job.proc.poll() is not None or victim is None:
                return {"outcome": "late", "kill_s": delay}
            try:
                os.kill(victim, signal.SIGKILL)
            except ProcessLookupError:  # the rank ended between the listing and the kill
                return {"outcome": "late", "kill_s": delay}
            kill_s = time.monotonic() - start
            rc0 = job.wait(RUN_TIMEOUT)
            if rc0 == 0:
                return {"outcome": "late", "kill_s": kill_s}  # the killed rank had already finished its work
            if cut is not None:
                cut = cut if cut_still_there(cut) else cut + " (done meanwhile)"
            ckpt, model = final_model(out)
            if ckpt == ref[0]:
                # the final checkpoint was written before the kill: the run is done, nothing to continue
                return {"outcome": "late", "kill_s": kill_s}
            resumed = ckpt is not None
            again, _ = self.train(name, nproc, target, resume=resumed, log_suffix="-resume")
            rc = again.wait(RUN_TIMEOUT)
            text = again.text()
            what = "resume" if resumed else "restart"
            if "taking them back to their snapshot" in text:
                what += ", servers back to the checkpoint"
            return judge(rc, text, out, ref, kill_s, what, cut)
        finally:
            self.stop_all()
            if not os.environ.get("ZT_KEEP_TEST_DIR"):
                self.cleanup(name)

    def kill_during_snapshot(self, srv, job, folder, min_step, until, prefix):
        """Kills the server as soon as a folder PREFIXN.tmp with N >= min_step appears under folder (a snapshot
        being written: step_N.tmp, somewhere under the snapshot folder; a worker checkpoint: ckpt_N.tmp in the
        run folder); returns its path, or None if the run ended (or the time ran out) without one."""
        while time.monotonic() < until and job.proc.poll() is None:
            tmp = find_tmp(folder, min_step, prefix)
            if tmp:
                srv.proc.send_signal(signal.SIGKILL)
                return tmp
        return None


def judge(rc, text, out, ref, kill_s, recovery, cut):
    """A trial's result: 'failed' (the run did not end well), 'different' (its final checkpoint is not the
    reference's, byte for byte) or 'identical'."""
    ckpt, model = final_model(out)
    if rc != 0 or model is None:
        outcome, detail = "failed", "exit %s: %s" % (rc, tail_of(text))
    elif ckpt != ref[0] or model != ref[1]:
        outcome, detail = "different", "final %s differs from the reference's %s" % (ckpt, ref[0])
    else:
        outcome, detail = "identical", ""
    return {"outcome": outcome, "kill_s": round(kill_s, 3), "recovery": recovery, "detail": detail,
            "snapshot_cut": os.path.basename(cut) if cut else None}


def pick_rank(pid, nproc, rng):
    """A rank process of the job: the job itself with one rank, else a random child of `ztrain launch`
    (found in /proc), or None when it has none left."""
    if nproc == 1:
        return pid
    kids = []
    for e in os.listdir("/proc"):
        if not e.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % e) as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[1]) == pid:
                kids.append(int(e))
        except (OSError, IndexError, ValueError):
            continue
    return rng.choice(sorted(kids)) if kids else None


def find_tmp(folder, min_step, prefix):
    """The path of a folder being written, PREFIXN.tmp with N >= min_step, in folder or up to two levels
    below it (snapshots: SNAPDIR/run/serverIofS/step_N.tmp), or None."""
    def scan(d, depth):
        for e in os.scandir(d):
            if e.name.startswith(prefix) and e.name.endswith(".tmp"):
                digits = e.name[len(prefix):-4]
                if digits.isdigit() and int(digits) >= min_step:
                    return e.path
            elif depth > 0 and e.is_dir(follow_symlinks=False) and not e.name.startswith("ckpt_"):
                found = scan(e.path, depth - 1)
                if found:
                    return found
        return None
    try:
        return scan(folder, 2)
    except OSError:
        return None


def cut_still_there(path):
    return path is not None and os.path.isdir(path)


def tail_of(text, n=4):
    """The last n lines that are warnings or errors (what went wrong), joined."""
    lines = [l for l in text.strip().splitlines() if " WARN " in l or " ERROR " in l or "error" in l]
    return " | ".join(lines[-n:])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("server_bin")
    ap.add_argument("ztrain")
    ap.add_argument("--configs", default="w1-ram,w1-nvme,w2-ram,w2-nvme,w3-ram,w3-nvme")
    ap.add_argument("--trials", type=int, default=30)
    ap.add_argument("--snapshot-kills", type=int, default=0)
    ap.add_argument("--checkpoint-kills", type=int, default=0)
    ap.add_argument("--worker-kills", type=int, default=0,
                    help="K trials that kill a worker at a random moment, and K while it writes a checkpoint")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--server-flags", default="--snapshot-commits 1",
                    help="flags every ztrain-server gets (default: durable commits)")
    ap.add_argument("--json")
    ap.add_argument("--keep", action="store_true", help="keep the work folder")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    work = tempfile.mkdtemp(prefix="zt-fault-", dir=os.environ.get("ZT_TEST_TMPDIR"))
    h = Harness(os.path.abspath(a.server_bin), os.path.abspath(a.ztrain), work, a.steps, a.server_flags.split())
    h.rng = rng
    results = []
    failed = 0
    try:
        for cfg in a.configs.split(","):
            w, store = cfg.split("-")
            nproc, nvme, with_server = int(w[1:]), store == "nvme", store != "cpu"
            ref_ckpt, ref_model, duration, (lo, hi), (wlo, whi) = h.reference(cfg, nproc, nvme, with_server)
            print("%s: reference %s in %.2f s; random server kills between %.3f and %.3f s, worker kills between "
                  "%.3f and %.3f s" % (cfg, ref_ckpt, duration, lo, hi, wlo, whi), flush=True)
            row = {"config": cfg, "trials": 0, "identical": 0, "failed": 0, "late": 0, "snapshot_trials": 0,
                   "snapshot_identical": 0, "checkpoint_trials": 0, "checkpoint_identical": 0,
                   "worker_trials": 0, "worker_identical": 0, "worker_checkpoint_trials": 0,
                   "worker_checkpoint_identical": 0, "seen": 0,
                   "unplaced": 0,
                   "duration_s": round(duration, 2), "window_s": [round(lo, 3), round(hi, 3)],
                   "worker_window_s": [round(wlo, 3), round(whi, 3)], "trial_log": []}
            plan = []
            if with_server:
                plan += ["random"] * a.trials + ["snapshot"] * a.snapshot_kills + ["checkpoint"] * a.checkpoint_kills
            plan += ["worker"] * a.worker_kills + ["worker-ckpt"] * a.worker_kills
            for k, kind in enumerate(plan):
                snapshot_kill = kind == "snapshot"
                attempts = 0
                while True:
                    attempts += 1
                    delay = rng.uniform(lo, hi)
                    snap_step = rng.randint(0, a.steps)
                    if kind.startswith("worker"):
                        # worker kills: while the reference trained (from its first step's line to its end)
                        r = h.worker_trial(cfg, k, nproc, nvme, with_server, (ref_ckpt, ref_model),
                                           rng.uniform(wlo, whi), snap_step if kind == "worker-ckpt" else None)
                    else:
                        r = h.trial(cfg, k, nproc, nvme, (ref_ckpt, ref_model), delay, snapshot_kill, snap_step,
                                    kind == "checkpoint")
                    if r["outcome"] in ("late", "no-snapshot-cut") and attempts < (20 if kind == "random" else 10):
                        row["late"] += 1
                        continue
                    break
                r["trial"] = k
                r["kind"] = kind
                row["trial_log"].append(r)
                if r["outcome"] in ("late", "no-snapshot-cut"):
                    # No kill could be placed (the runs ended sooner than the reference): not a result.
                    row["unplaced"] += 1
                    print("%s %-10s %2d: no kill placed in %d draws" % (cfg, kind, k, attempts), flush=True)
                    continue
                ok = r["outcome"] == "identical"
                row["seen"] += r.get("recovery") in ("retry", "rewind")
                if kind == "worker":
                    row["worker_trials"] += 1
                    row["worker_identical"] += ok
                elif kind == "worker-ckpt":
                    row["worker_checkpoint_trials"] += 1
                    row["worker_checkpoint_identical"] += ok
                elif kind == "snapshot":
                    row["snapshot_trials"] += 1
                    row["snapshot_identical"] += ok
                elif kind == "checkpoint":
                    row["checkpoint_trials"] += 1
                    row["checkpoint_identical"] += ok
                else:
                    row["trials"] += 1
                    row["identical"] += ok
                if not ok:
                    row["failed"] += 1
                    failed += 1
                where = " in %s" % r["snapshot_cut"] if r.get("snapshot_cut") else ""
                print("%s %-10s %2d: kill at %s s%s -> %s (%s)%s" % (cfg, kind, k,
                                                                   r.get("kill_s"), where, r["outcome"],
                                                                   r.get("recovery", "-"),
                                                                   "; " + r["detail"] if r.get("detail") else ""),
                      flush=True)
            results.append(row)
    finally:
        h.stop_all()
        if a.keep or os.environ.get("ZT_KEEP_TEST_DIR"):
            print("kept " + work)
        else:
            shutil.rmtree(work, ignore_errors=True)
    print("| configuration | random kills | bit-identical | kills during a snapshot | bit-identical | "
          "kills during a checkpoint | bit-identical | worker kills | bit-identical | worker kills during a "
          "checkpoint | bit-identical | failed | kills the run saw | kills redrawn | not placed |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        print("| %s | %d | %d | %d | %d | %d | %d | %d | %d | %d | %d | %d | %d | %d | %d |" % (
            r["config"], r["trials"], r["identical"], r["snapshot_trials"], r["snapshot_identical"],
            r["checkpoint_trials"], r["checkpoint_identical"], r["worker_trials"], r["worker_identical"],
            r["worker_checkpoint_trials"], r["worker_checkpoint_identical"], r["failed"], r["seen"], r["late"],
            r["unplaced"]))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"seed": a.seed, "steps": a.steps, "results": results}, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
