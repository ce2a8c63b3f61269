"""The worker's state-service client (worker/state/client.h) with real processes on loopback:
  1. embedded (one process playing both ranks, the core in process), one ztrain-server with two rank
     processes (one stream per push and pull), and two ztrain-servers sharing the run with two rank
     processes (3 streams: block 0's shards go in 2 pieces on concurrent streams) give bit-identical
     parameters after 5 steps; a bad ZT_STATE_STREAMS is refused with a message;
  2. fault test: kill -9 the server between steps and again in the middle of a push, restart it with
     --snapshot-dir; the ranks retry (logging "unavailable, retry"), learn that the server is back at
     its last snapshot, resume from there, and end with the parameters of the uninterrupted run. No
     partial step is applied: the restarted server is exactly at the snapshot's step. The ranks use 2
     streams here, so the interrupted push and the retries run on concurrent streams.
The ranks are tests/server/state_rank (a line protocol on stdin/stdout), so every wait is a wait for a
reply line, never a sleep. Every process is ended in a finally block.

usage: state_client_test.py PATH/TO/ztrain-server PATH/TO/state_rank
"""
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "proto"))
import grpcio_client_test as g  # noqa: E402  (the Server wrapper and check())
sys.path.insert(0, os.path.join(HERE, "..", "pylib"))
import zt_testlib as t  # noqa: E402  (free port, time limit, summary)

check = g.check
STEPS = 5


class Rank:
    """A state_rank process; its stderr is collected by a thread, so a test can wait for a log line."""

    def __init__(self, binary, ranks, servers=None, snap_root=None, streams=1):
        argv = [binary, "--ranks", ranks, "--streams", str(streams)]
        if servers:
            argv += ["--servers", servers]
        if snap_root:
            argv += ["--snap-root", snap_root]
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, bufsize=1)
        self.err = t.LineLog(self.proc, self.proc.stderr)

    def wait_log(self, text, timeout=30.0):
        return self.err.wait_count(text, 1, timeout)

    def send(self, cmd):
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()

    def reply(self):
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("state_rank exited (%s); its log:\n%s" % (self.proc.poll(), self.err.text()))
        return line.strip()

    def cmd(self, cmd):
        self.send(cmd)
        return self.reply()

    def stop(self):
        if self.proc.poll() is None:
            try:
                self.send("quit")
                self.proc.wait(10)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()


def all_ok(ranks, cmd):
    """Sends cmd to every rank process first, then reads every reply: the ranks work at the same time."""
    for r in ranks:
        r.send(cmd)
    replies = [r.reply() for r in ranks]
    if any(not x.startswith("ok") for x in replies):
        raise RuntimeError("%s: %s" % (cmd, replies))
    return replies


def train(ranks, first, last, save_at=None):
    """Steps first..last: every rank pushes, rank 0 commits, every rank pulls."""
    for s in range(first, last + 1):
        all_ok(ranks, "push %d" % s)
        all_ok(ranks[:1], "commit %d" % s)
        all_ok(ranks, "pull %d" % s)
        if save_at is not None and s == save_at:
            all_ok(ranks[:1], "save")


def read_dump(prefix):
    out = []
    for r in range(2):
        with open("%s.r%d" % (prefix, r), "rb") as f:
            out.append(f.read())
    return out


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    server_bin, rank_bin = (os.path.abspath(a) for a in sys.argv[1:])
    t.set_deadline(120)
    work = tempfile.mkdtemp(prefix="zt-state-client-")
    procs = []  # everything to end in finally

    def rank(*a, **k):
        r = Rank(rank_bin, *a, **k)
        procs.append(r)
        return r

    def server(name, extra):
        s = g.Server(server_bin, work, name, extra)
        procs.append(s)
        return s

    try:
        # 1. embedded
        emb = rank("0,1", snap_root=os.path.join(work, "emb-snap"))
        check(emb.cmd("init") == "ok 0", "embedded: init")
        all_ok([emb], "pull 0")
        train([emb], 1, STEPS)
        all_ok([emb], "dump " + os.path.join(work, "embedded"))
        emb.stop()
        ref = read_dump(os.path.join(work, "embedded"))

        # 2. one server, two rank processes
        srv = server("one", [])
        target = "127.0.0.1:%d" % srv.port
        rs = [rank("0", servers=target), rank("1", servers=target)]
        all_ok(rs, "init")
        all_ok(rs, "pull 0")
        train(rs, 1, STEPS)
        all_ok(rs, "dump " + os.path.join(work, "one"))
        for r in rs:
            r.stop()
        srv.stop()
        check(read_dump(os.path.join(work, "one")) == ref, "1 server, 2 rank processes: bit-identical to embedded")

        # 3. two servers sharing the run
        s0 = server("two0", ["--server-index", "0", "--server-count", "2"])
        s1 = server("two1", ["--server-index", "1", "--server-count", "2"])
        targets = "127.0.0.1:%d,127.0.0.1:%d" % (s0.port, s1.port)
        rs = [rank("0", servers=targets, streams=3), rank("1", servers=targets, streams=3)]
        all_ok(rs, "init")
        all_ok(rs, "pull 0")
        train(rs, 1, STEPS)
        all_ok(rs, "dump " + os.path.join(work, "two"))
        for r in rs:
            r.stop()
        s0.stop()
        s1.stop()
        check(read_dump(os.path.join(work, "two")) == ref,
              "2 servers, 2 rank processes, 3 streams: bit-identical to embedded")
        bad = subprocess.run([rank_bin, "--ranks", "0", "--servers", targets, "--streams", "0"], input="quit\n",
                             capture_output=True, text=True, env=dict(os.environ, ZT_STATE_STREAMS="99"), timeout=30)
        check(bad.returncode != 0 and "ZT_STATE_STREAMS=99" in bad.stderr,
              "ZT_STATE_STREAMS=99 is refused, naming the variable (%r)" % bad.stderr.strip())

        # 4. faults: one server with snapshots on a fixed port, so a restarted server has the same address
        port = t.free_port()
        flags = ["--listen", "127.0.0.1:%d" % port, "--snapshot-dir", os.path.join(work, "snap")]
        srv = server("fault1", flags)
        target = "127.0.0.1:%d" % port
        rs = [rank("0", servers=target, streams=2), rank("1", servers=target, streams=2)]
        all_ok(rs, "init")
        all_ok(rs, "pull 0")
        train(rs, 1, 3, save_at=2)  # snapshot at 2, step 3 only in memory

        # kill -9 between steps 3 and 4; rank 0 starts step 4 and retries until the server is back
        srv.proc.kill()
        srv.stop()
        rs[0].send("push 4")
        check(rs[0].wait_log("unavailable, retry 1/8"), "rank 0 logs 'state server ... unavailable, retry 1/8 in 0.1s'")
        srv = server("fault2", flags)
        check("restored 1 run(s)" in srv.log_text(), "the restarted server restored the run from its snapshot")
        r0 = rs[0].reply()
        rs[1].send("push 4")
        r1 = rs[1].reply()
        check(r0 == "resume 2" and r1 == "resume 2",
              "after a kill between steps both ranks are told to resume at the snapshot's step 2 (%s, %s)" % (r0, r1))
        all_ok(rs, "pull 2")
        train(rs, 3, 4, save_at=3)  # a new snapshot at 3, step 4 only in memory

        # kill -9 in the middle of rank 0's push of step 5
        rs[1].send("push 5")
        check(rs[1].reply() == "ok", "rank 1 pushed step 5")
        rs[0].send("pushpause 5")
        check(rs[0].reply() == "paused", "rank 0 stopped after the first chunk of its push of step 5")
        srv.proc.kill()
        srv.stop()
        srv = server("fault3", flags)
        rs[0].send("go")
        r0 = rs[0].reply()
        check(r0 == "resume 3", "after a kill mid-push rank 0 is told to resume at step 3 (%s)" % r0)
        rs[1].send("commit 5")
        r1 = rs[1].reply()
        check(r1 == "resume 3", "a commit of step 5 is refused: the server is at 3, no partial step (%s)" % r1)
        all_ok(rs, "pull 3")
        train(rs, 4, STEPS)
        all_ok(rs, "dump " + os.path.join(work, "fault"))
        check(read_dump(os.path.join(work, "fault")) == ref,
              "after two kill -9 and restarts the run ends bit-identical to the uninterrupted run")
        for r in rs:
            r.stop()
        check(srv.stop() == 0, "the last server exits 0 on SIGTERM")
    finally:
        t.cancel_deadline()
        t.stop_all(procs)
        shutil.rmtree(work, ignore_errors=True)
    return t.summary()


if __name__ == "__main__":
    sys.exit(main())
