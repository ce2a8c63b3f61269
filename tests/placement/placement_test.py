"""Optimizer placement "server" under ZeRO (WORLD_SIZE > 1) with real processes on loopback:
  1. the reference: one process, `ztrain train --optimizer server` with the embedded state server;
     2 ranks without --servers are refused (an embedded server lives in one process);
  2. 1 ztrain-server + `ztrain launch --nproc 2 train --optimizer server --servers ...` gives the
     reference's train and val losses within 1e-5 relative (as the ZeRO equivalence tests accept);
  3. 2 ztrain-servers sharing the run (--server-index/--server-count) with 2 ranks do too;
  4. 3 ranks (block sizes that do not split evenly into 3 shards) with 1 server do too;
  5. fault, kill -9 between steps: rank 0 pauses after step 3 (the servers' last snapshot is step 2),
     the server is killed and restarted with --snapshot-dir; the ranks find it at step 2, log
     "state server ... restarted at step 2; rewinding to checkpoint RUN/ckpt_000002 (rewind 1 of 3)",
     train on from that checkpoint by themselves, exit 0 and end on the reference's losses; the same with
     one process (W = 1, --servers);
  6. fault, kill -9 in the middle of a push: rank 0 pauses in its push of step 5 after the server took
     block 0 and the first chunk of block 1 (snapshot at step 4); the server is killed and restarted; the
     ranks retry (log "unavailable, retry"), the restarted server refuses to commit the half-pushed step
     ("incomplete": block 0 went down with the killed server), every rank pushes its gradients again,
     the step commits and the run ends on the reference's losses without a restart; the same with one
     process (W = 1, --servers);
  7. fault, a server that keeps going back: rank 0 pauses after step 3 four times (ZT_TEST_PAUSE_TIMES),
     and each time the server is killed and restarted at its snapshot of step 2; the run rewinds 3 times,
     then stops with a message saying it gave up after 3 automatic rewinds and exits 1.
  8. placement cpu with 1, 2 and 3 ranks (each rank's AdamW on its shard in its own process) gives the bits
     of placement server (overlapped: pushes during the backward, pulls behind the servers' update and into
     the next forward) with the same ranks against 1 and against 2 servers: the same losses and the same
     final weights; both with the bytes through shared memory (the default on one host, the step breakdown
     says "via shared memory"; the servers read the pushes from the ranks' host gradients and write the pulls
     into their weights, so the breakdown counts no pulled byte copied by a rank, and the pulls stand there:
     every server's commits after the first write the new weights there during their update, GET /metrics
     ztrain_server_delivered_bytes_total) and over TCP (--server-shm off, or a ztrain-server --shm off that
     refuses it, which one INFO line names);
  9. a run that will checkpoint against a server without --snapshot-dir is refused before the model is
     built, naming the server and --snapshot-dir.
The pauses are rank 0 waiting for a line on a FIFO (ZT_TEST_PAUSE in tests/runtime/train_rank.c, a
stand-in for `ztrain train` that carries the pause through the trainer's hooks), so every wait is for a
log line or an exit, never a sleep. Every process is ended in a finally block.

usage: placement_test.py PATH/TO/ztrain-server PATH/TO/ztrain PATH/TO/zt_train_rank
"""
import json
import re
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "proto"))
import grpcio_client_test as g  # noqa: E402  (the Server wrapper and check())
sys.path.insert(0, os.path.join(HERE, "..", "pylib"))
import zt_testlib as t  # noqa: E402  (free port, time limit, summary)

STEPS = 8


def metric(srv, name):
    """The sum of one counter over the runs of a ztrain-server's GET /metrics (started with --metrics-listen)."""
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % srv.metrics_port, timeout=10) as r:
        body = r.read().decode()
    return sum(int(float(l.rsplit(" ", 1)[1])) for l in body.splitlines() if l.startswith(name + "{"))


def check(cond, what, log=""):
    """g.check, with the tail of a process's output added when the expectation failed."""
    g.check(cond, what if cond or not log else what + "\n" + log[-3000:])


write_shard = t.write_shard


class Job:
    """A `ztrain ...` process whose output is collected by a thread, so a test can wait for a line."""

    def __init__(self, argv, env=None):
        self.argv = argv
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                                     env=env)
        self.out = t.LineLog(self.proc, self.proc.stdout)

    def text(self):
        return self.out.text()

    def wait_count(self, text, count, timeout=60.0):
        """Waits until `count` lines hold text (or the process ended); returns whether they do."""
        return self.out.wait_count(text, count, timeout)

    def wait_log(self, text, timeout=60.0):
        return self.out.wait_count(text, 1, timeout)

    def wait(self, timeout=90.0):
        """The exit status; on a timeout the process is killed, its log printed, and None returned."""
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            self.out.join(10)
            print("TIMEOUT after %.0f s: %s\n%s" % (timeout, " ".join(self.argv[:6]), self.text()[-6000:]))
            return None
        self.out.join(10)
        return rc

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def losses(run):
    """{step: loss} and {step: val_loss} of a run's metrics.jsonl."""
    train, val = {}, {}
    with open(os.path.join(run, "metrics.jsonl")) as f:
        for line in f:
            d = json.loads(line)
            if "val_loss" in d:
                val[d["step"]] = d["val_loss"]
            elif "loss" in d:
                train[d["step"]] = d["loss"]
    return train, val


def same_curves(ref, run, what):
    rt, rv = losses(ref)
    t, v = losses(run)
    ok = sorted(rt) == sorted(t) == list(range(1, STEPS + 1)) and sorted(rv) == sorted(v) and len(rv) >= 2
    bad = [(s, rt[s], t.get(s)) for s in rt if t.get(s) is None or abs(t[s] - rt[s]) > 1e-5 * abs(rt[s])]
    bad += [(s, rv[s], v.get(s)) for s in rv if v.get(s) is None or abs(v[s] - rv[s]) > 1e-5 * abs(rv[s])]
    check(ok and not bad, "%s: the reference's losses within 1e-5 relative (steps %s vs %s; differences %s)" %
          (what, sorted(t), sorted(rt), bad[:3]))


def final_weights(run):
    """The bytes of the final checkpoint's weights."""
    with open(os.path.join(run, "latest")) as f:
        name = f.read().strip()
    with open(os.path.join(run, name, "model.safetensors"), "rb") as f:
        return f.read()


def same_bits(a, b, what):
    la, lb = losses(a), losses(b)
    check(la == lb, "%s: the same train and val losses, bit for bit" % what)
    check(final_weights(a) == final_weights(b), "%s: the same final weights, bit for bit" % what)


def main():
    if len(sys.argv) != 4:
        print(__doc__)
        return 2
    server_bin, ztrain, train_rank = (os.path.abspath(a) for a in sys.argv[1:])
    t.set_deadline(240)
    work = tempfile.mkdtemp(prefix="zt-placement-")
    procs = []  # everything to end in finally

    def server(name, extra):
        s = g.Server(server_bin, work, name, extra)
        procs.append(s)
        return s

    def job(argv, env=None):
        j = Job(argv, env)
        procs.append(j)
        return j

    model = os.path.join(work, "model.json")
    with open(model, "w") as f:
        json.dump({"model_type": "gpt2", "n_layer": 2, "n_head": 2, "n_embd": 10, "n_positions": 16,
                   "vocab_size": 37}, f)
    write_shard(os.path.join(work, "train_000.bin"), [(i * 7 + (i // 5) * 3) % 37 for i in range(4096)])
    write_shard(os.path.join(work, "val_000.bin"), [(i * 5 + i // 3) % 37 for i in range(1024)])
    common = ["--model", model, "--train-data", os.path.join(work, "train_*.bin"),
              "--val-data", os.path.join(work, "val_*.bin"), "--batch-size", "6", "--seq-len", "8",
              "--grad-accum", "2", "--threads", "1", "--log-every", "1", "--eval-every", "3", "--eval-batches", "2",
              "--warmup", "1", "--save-every", "2", "--steps", str(STEPS), "--lr", "1e-2", "--optimizer", "server"]

    def train(out, servers=None, nproc=1, extra=(), env=None, paused=False):
        """`ztrain train` (or, for the runs that pause, the stand-in that carries the pauses), with nproc ranks."""
        argv = [ztrain]
        if nproc > 1:
            argv += ["launch", "--nproc", str(nproc), "--master-port", str(t.free_port())]
        if paused:
            argv = (argv + ["--"] if nproc > 1 else []) + [train_rank]
        else:
            argv += ["train"]
        argv += common + ["--out", os.path.join(work, out)] + list(extra)
        if servers:
            argv += ["--servers", servers]
        return job(argv, env)

    try:
        # 1. reference: one process, embedded state server
        ref = train("ref")
        check(ref.wait() == 0, "reference run (embedded state server) exits 0", ref.text())
        ref_dir = os.path.join(work, "ref")

        # 1b. several ranks cannot share an embedded state server: refused with what to start instead
        j = train("embedded2", nproc=2)
        rc = j.wait()
        check(rc != 0 and "needs state servers the ranks can reach" in j.text() and "ztrain-server" in j.text(),
              "2 ranks without --servers are refused, naming ztrain-server and --servers (%s)" % rc, j.text())

        # 2. one server, two ranks
        srv = server("one", ["--snapshot-dir", os.path.join(work, "snap-one")])
        j = train("one", "127.0.0.1:%d" % srv.port, nproc=2)
        rc = j.wait()
        check(rc == 0, "1 server + 2 ranks exits 0 (%s)" % rc, j.text())
        check("AdamW on the state servers" in j.text(), "1 server + 2 ranks: the optimizer runs on the server")
        same_curves(ref_dir, os.path.join(work, "one"), "1 server, 2 ranks")
        check(srv.stop() == 0, "server 'one' exits 0 on SIGTERM")

        # 3. two servers sharing the run
        s0 = server("two0", ["--server-index", "0", "--server-count", "2", "--snapshot-dir", os.path.join(work, "snap-two")])
        s1 = server("two1", ["--server-index", "1", "--server-count", "2", "--snapshot-dir", os.path.join(work, "snap-two")])
        j = train("two", "127.0.0.1:%d,127.0.0.1:%d" % (s0.port, s1.port), nproc=2)
        rc = j.wait()
        check(rc == 0, "2 servers + 2 ranks exits 0 (%s)" % rc, j.text())
        same_curves(ref_dir, os.path.join(work, "two"), "2 servers, 2 ranks")
        s0.stop()
        s1.stop()

        # 4. three ranks: shards of uneven blocks (padding in the last shard)
        srv = server("three", ["--snapshot-dir", os.path.join(work, "snap-three")])
        j = train("three", "127.0.0.1:%d" % srv.port, nproc=3)
        rc = j.wait()
        check(rc == 0, "1 server + 3 ranks exits 0 (%s)" % rc, j.text())
        same_curves(ref_dir, os.path.join(work, "three"), "1 server, 3 ranks")
        srv.stop()

        # the other pairs of ranks and servers: W = 1 against 1 and 2 servers, W = 3 against 2 servers; then
        # every pair over TCP (the runs above and these moved their bytes through shared memory): the client
        # turned it off, or (W = 1, 1 server) the server refuses it
        tcp_runs = [(1, 1, "server"), (2, 1, "client"), (3, 1, "client"), (1, 2, "client"), (2, 2, "client"),
                    (3, 2, "client")]
        for nproc, nsrv, tcp_by in [(1, 1, None), (1, 2, None), (3, 2, None)] + tcp_runs:
            name = "w%ds%d" % (nproc, nsrv) + ("-tcp" if tcp_by else "")
            srvs = [server("%s-%d" % (name, i), ["--server-index", str(i), "--server-count", str(nsrv),
                                                  "--snapshot-dir", os.path.join(work, "snap-" + name),
                                                  "--metrics-listen", "127.0.0.1:0"] +
                           (["--shm", "off"] if tcp_by == "server" else []))
                    for i in range(nsrv)]
            j = train(name, ",".join("127.0.0.1:%d" % x.port for x in srvs), nproc=nproc,
                      extra=["--server-shm", "off"] if tcp_by == "client" else [])
            rc = j.wait()
            text = j.text()
            check(rc == 0, "%s: %d server(s) + %d rank(s) exits 0 (%s)" % (name, nsrv, nproc, rc), text)
            check("server push" in text and "server update" in text and "waited for pulled blocks" in text,
                  "%d server(s) + %d rank(s): the step breakdown names push, update and pull" % (nsrv, nproc), text)
            check(re.search(r"server update [0-9.]+ s \(AdamW on the servers [0-9.]+ s, during the forward", text)
                  is not None, "%s: rank 0's breakdown gives the servers' own update time from their answers"
                  % name, text)
            if tcp_by is None:
                check("pushes and pulls through shared memory" in text and "(via shared memory)" in text and
                      "(via TCP)" not in text, "%s: the bytes move through shared memory, and the breakdown says so"
                      % name, text)
                check(text.count("gradient pushes read by the server from this process's host gradient") == nproc * nsrv
                      and "the segment of the host" not in text,
                      "%s: every rank's gradient pushes are read by every server where they lie (no slot copy)" % name,
                      text)
                check(text.count("pulls written by the server into this process's host weights") == nproc * nsrv,
                      "%s: every server writes every rank's pulls into its weights (no slot copy)" % name, text)
                copied = re.findall(r"worker copies ([0-9.]+ [KMGT]?i?B) in", text)
                check(len(copied) > 0 and all(c == "0 B" for c in copied),
                      "%s: the step breakdown says the ranks copied none of the pulled bytes" % name, text)
                delivered = [metric(x, "ztrain_server_delivered_bytes_total") for x in srvs]
                pulled = [metric(x, "ztrain_server_pulled_bytes_total") for x in srvs]
                check(all(0 < d < p for d, p in zip(delivered, pulled)),
                      "%s: the pulls stand in the ranks' weights: every server's commits after the first wrote them "
                      "there (delivered %s of pulled %s bytes)" % (name, delivered, pulled), text)
            elif tcp_by == "client":
                check(sum(metric(x, "ztrain_server_delivered_bytes_total") for x in srvs) == 0,
                      "%s: over TCP no commit writes into a rank's memory" % name, text)
            else:
                check("(via TCP)" in text and "(via shared memory)" not in text,
                      "%s: the bytes move over TCP, and the breakdown says so" % name, text)
                check(any(c != "0 B" for c in re.findall(r"worker copies ([0-9.]+ [KMGT]?i?B) in", text)),
                      "%s: the step breakdown counts the pulled bytes copied out of the TCP messages" % name, text)
            if tcp_by == "server":
                check("pushes and pulls over TCP: this server was started with --shm off" in text,
                      "%s: one line says the server refused shared memory" % name, text)
            for x in srvs:
                x.stop()

        # 8. placement cpu with 1, 2 and 3 ranks: the bits of placement server with the same ranks, 1 and 2 servers
        for nproc, server_runs in ((1, ("w1s1", "w1s2", "w1s1-tcp", "w1s2-tcp")), (2, ("one", "two", "w2s1-tcp", "w2s2-tcp")),
                                   (3, ("three", "w3s2", "w3s1-tcp", "w3s2-tcp"))):
            name = "cpu%d" % nproc
            j = train(name, nproc=nproc, extra=["--optimizer", "cpu"])
            rc = j.wait()
            check(rc == 0, "placement cpu, %d ranks, exits 0 (%s)" % (nproc, rc), j.text())
            for server_run in server_runs:
                same_bits(os.path.join(work, server_run), os.path.join(work, name),
                          "%d ranks: cpu vs server (%s)" % (nproc, server_run))

        # 9. a server without a snapshot directory, and a run that checkpoints: refused before the model is built
        srv = server("nosnap", [])
        j = train("nosnap", "127.0.0.1:%d" % srv.port, nproc=2)
        rc = j.wait()
        text = j.text()
        check(rc != 0 and ("state server 127.0.0.1:%d has no snapshot directory" % srv.port) in text and
              "--snapshot-dir DIR" in text and "--save-every -1" in text,
              "a server without --snapshot-dir is refused for a run that checkpoints (%s)" % rc, text)
        check("model:" not in text and "engine:" not in text, "... before the model is built", text)
        srv.stop()

        # 5. kill -9 between steps: a server on a fixed port with snapshots, so a restarted one has the
        # same address; with 2 ranks, then with one process
        port = t.free_port()
        target = "127.0.0.1:%d" % port
        fifo = os.path.join(work, "pause")
        os.mkfifo(fifo)

        def server_flags(snap):
            return ["--listen", target, "--snapshot-dir", os.path.join(work, snap)]

        for nproc, name in ((2, "fault"), (1, "fault1p")):
            env = dict(os.environ, ZT_TEST_PAUSE="step:3", ZT_TEST_PAUSE_FIFO=fifo)
            flags = server_flags("snap-" + name)
            srv = server(name + "-a", flags)
            j = train(name, target, nproc=nproc, env=env, paused=True)
            check(j.wait_log("test pause: step:3"), "W=%d: the run pauses after step 3" % nproc, j.text())
            srv.proc.kill()
            srv.stop()
            srv = server(name + "-b", flags)
            check("restored 1 run(s)" in srv.log_text(), "the restarted server restored the run from its snapshot")
            with open(fifo, "w") as f:
                f.write("go\n")
            rc = j.wait()
            text = j.text()
            run = os.path.join(work, name)
            check(rc == 0, "W=%d: after a kill between steps the run rewinds by itself and exits 0 (%s)" % (nproc, rc),
                  text)
            check(("state server %s restarted at step 2; rewinding to checkpoint %s/ckpt_000002 (rewind 1 of 3)"
                   % (target, run)) in text, "W=%d: one clear line names the server, its step and the checkpoint"
                  % nproc, text)
            check(text.count("rewinding to checkpoint") == 1, "W=%d: exactly one rewind" % nproc, text)
            same_curves(ref_dir, run, "W=%d: kill -9 between steps, automatic rewind" % nproc)
            check(srv.stop() == 0, "server '%s-b' exits 0 on SIGTERM" % name)

        # 6. kill -9 in the middle of rank 0's push of step 5 (the last snapshot is step 4); 2 ranks, then
        # one process
        for nproc, name in ((2, "midpush"), (1, "midpush1p")):
            flags = server_flags("snap-" + name)
            env = dict(os.environ, ZT_TEST_PAUSE="push:5", ZT_TEST_PAUSE_FIFO=fifo)
            srv = server(name + "-a", flags)
            j = train(name, target, nproc=nproc, env=env, paused=True)
            check(j.wait_log("test pause: push:5"), "W=%d: pauses in its push of step 5" % nproc, j.text())
            srv.proc.kill()
            srv.stop()
            srv = server(name + "-b", flags)
            with open(fifo, "w") as f:
                f.write("go\n")
            rc = j.wait()
            text = j.text()
            check(rc == 0, "W=%d: after a kill mid-push the run goes on and exits 0 (%s)" % (nproc, rc), text)
            check("unavailable, retry" in text, "W=%d: logs 'state server ... unavailable, retry'" % nproc)
            check("incomplete" in text and "committing once more" in text and "rewinding" not in text,
                  "W=%d: the half-pushed step is refused as incomplete, then pushed again and committed" % nproc, text)
            same_curves(ref_dir, os.path.join(work, name), "W=%d: kill -9 mid-push" % nproc)
            check(srv.stop() == 0, "server '%s-b' exits 0 on SIGTERM" % name)

        # 7. a server that keeps going back to its snapshot of step 2: 3 rewinds, then the run gives up
        flags = server_flags("snap-dying")
        env = dict(os.environ, ZT_TEST_PAUSE="step:3", ZT_TEST_PAUSE_FIFO=fifo, ZT_TEST_PAUSE_TIMES="4")
        srv = server("dying0", flags)
        j = train("dying", target, nproc=2, env=env, paused=True)
        for k in range(1, 5):
            check(j.wait_count("test pause: step:3 (", k), "pause %d after step 3" % k, j.text())
            srv.proc.kill()
            srv.stop()
            srv = server("dying%d" % k, flags)
            with open(fifo, "w") as f:
                f.write("go\n")
        rc = j.wait()
        text = j.text()
        check(rc == 1, "a server that keeps going back: the run exits 1 (%s)" % rc, text)
        check("(rewind 3 of 3)" in text and "(rewind 4 of" not in text, "it rewinds 3 times, not more", text)
        check("after 3 automatic rewinds" in text and "--resume %s/ckpt_000002" % os.path.join(work, "dying") in text,
              "it says it gave up after 3 rewinds and how to resume by hand", text)
        check(srv.stop() == 0, "server 'dying4' exits 0 on SIGTERM")
    finally:
        t.cancel_deadline()
        t.stop_all(procs)
        if not os.environ.get("ZT_KEEP_TEST_DIR"):
            shutil.rmtree(work, ignore_errors=True)
        else:
            print("kept " + work)
    return t.summary()


if __name__ == "__main__":
    sys.exit(main())
