"""ztrain-server as a process: the NVMe tier (--store nvme:DIR), snapshots that a restart restores
(--snapshot-dir), Prometheus text on GET /metrics (--metrics-listen), a clean SIGTERM shutdown, bad
flags (exit 2 with a message) and a port in use (a clear error). Loopback only; every process it starts
is ended in a finally block.

usage: server_process_test.py PATH/TO/ztrain-server
"""
import os
import shutil
import socket
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "proto"))
import grpcio_client_test as g  # noqa: E402  (stubs, the Server wrapper, the numpy model)
sys.path.insert(0, os.path.join(HERE, "..", "pylib"))
import zt_testlib as t  # noqa: E402  (time limit, summary)

check = g.check
md = g.md
TIMEOUT = g.TIMEOUT


def run_bad_flags(binary):
    cases = [
        (["--threads", "many"], "--threads"),
        (["--no-such-flag", "1"], "unknown option --no-such-flag"),
        (["--store", "disk"], "use ram or nvme:PATH"),
        (["--listen"], "--listen needs a value"),
        (["--server-index", "2", "--server-count", "2"], "--server-index 2 must be below --server-count 2"),
        (["--log-level", "loud"], "--log-level loud"),
        (["--shm", "on"], "write --shm auto"),
    ]
    for argv, want in cases:
        r = subprocess.run([binary] + argv, capture_output=True, text=True, timeout=TIMEOUT)
        check(r.returncode == 2 and want in r.stderr, "ztrain-server %s -> exit %d, %r" % (" ".join(argv), r.returncode,
                                                                                           r.stderr.strip()))


def run_port_in_use(binary, workdir):
    """The gRPC port, then the metrics port, already taken by another socket."""
    busy = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        for argv, what in ((["--listen", "127.0.0.1:%d" % port], "gRPC"),
                           (["--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:%d" % port], "metrics")):
            r = subprocess.run([binary] + argv, capture_output=True, text=True, timeout=TIMEOUT)
            text = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ""
            check(r.returncode == 1 and str(port) in text and "ready" not in r.stdout,
                  "%s port in use -> exit %d, %r" % (what, r.returncode, text))
    finally:
        busy.close()


def http_get(port, path):
    """A minimal HTTP/1.0 GET; returns (status line, headers text, body)."""
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as s:
        s.sendall(("GET %s HTTP/1.0\r\nHost: localhost\r\n\r\n" % path).encode())
        data = b""
        while True:
            part = s.recv(65536)
            if not part:
                break
            data += part
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    return lines[0], "\n".join(lines[1:]), body.decode()


def run_nvme_snapshot_restart(binary, workdir, mods):
    pb, pbg, _, _ = mods
    import grpc
    store = os.path.join(workdir, "nvme")
    snaps = os.path.join(workdir, "snapshots")
    os.mkdir(store)
    flags = ["--store", "nvme:" + store, "--snapshot-dir", snaps, "--metrics-listen", "127.0.0.1:0"]
    rng = np.random.default_rng(11)
    model = g.Model(rng)
    grads = {}
    for step in (1, 2, 3):
        grads[step] = [np.pad(rng.standard_normal(n).astype(np.float32), (0, model.shard[b] * model.W - n))
                       for b, n in enumerate(model.NUMEL)]

    def do_step(stub, step):
        for b in range(len(model.NUMEL)):
            for s in range(model.W):
                data = grads[step][b][model.shard_slice(b, s)].tobytes()
                stub.PushGradients(g.push_stream(pb, model.RUN, step, b, s, pb.DTYPE_F32, data, 1024),
                                   timeout=TIMEOUT, metadata=md(None))
        return stub.CommitStep(pb.CommitStepRequest(run=model.RUN, step=step, grad_norm=1.0, clip_coef=1.0,
                                                    lr=1e-3), timeout=TIMEOUT, metadata=md(None))

    # First life: steps 1 and 2, a snapshot at 2, then step 3 (not saved), then SIGTERM.
    srv = g.Server(binary, workdir, "nvme1", flags)
    try:
        ch = grpc.insecure_channel("127.0.0.1:%d" % srv.port)
        stub = pbg.StateServiceStub(ch)
        stub.RegisterRun(model.register_request(pb), timeout=TIMEOUT)
        for b in range(len(model.NUMEL)):
            for s in range(model.W):
                stub.PushParams(g.push_stream(pb, model.RUN, 0, b, s, pb.DTYPE_F32,
                                              model.p[b][model.shard_slice(b, s)].tobytes(), 1024), timeout=TIMEOUT)
        do_step(stub, 1)
        do_step(stub, 2)
        check(len(os.listdir(store)) > 0, "--store nvme: the state files are under the store directory")
        at2, _ = g.pull_all(stub, pb, model, 2, None)
        sr = stub.SaveSnapshot(pb.SaveSnapshotRequest(run=model.RUN), timeout=TIMEOUT)
        check(sr.step == 2, "SaveSnapshot at step 2")
        do_step(stub, 3)
        at3, _ = g.pull_all(stub, pb, model, 3, None)

        status, headers, body = http_get(srv.metrics_port, "/metrics")
        lines = [l for l in body.splitlines() if l and not l.startswith("#")]
        step_line = [l for l in lines if l.startswith("ztrain_server_step{") and 'run="%s"' % model.RUN in l]
        check(status.endswith("200 OK") and "text/plain; version=0.0.4" in headers and "# TYPE ztrain_server_" in body
              and step_line and step_line[0].split()[-1] == "3",
              "GET /metrics: Prometheus text with the run's step (%s)" % (step_line[:1],))
        check(all(len(l.rsplit(" ", 1)) == 2 and l.startswith("ztrain_server_") for l in lines),
              "GET /metrics: every sample line is 'ztrain_server_<name>{labels} value'")
        status, _, _ = http_get(srv.metrics_port, "/other")
        check(status.endswith("404 Not Found"), "GET /other -> 404")
        ch.close()
    finally:
        rc = srv.stop()
        log = srv.log_text()
    check(rc == 0 and "SIGTERM received" in log and "server: stopped" in log,
          "SIGTERM: exit %d and the shutdown logged" % rc)

    # Second life: the snapshot of step 2 comes back; step 3 again gives the first life's step 3 exactly.
    srv = g.Server(binary, workdir, "nvme2", flags)
    try:
        check("restored 1 run(s)" in srv.log_text(), "restart with --snapshot-dir: 'restored 1 run(s)' logged")
        ch = grpc.insecure_channel("127.0.0.1:%d" % srv.port)
        stub = pbg.StateServiceStub(ch)
        st = stub.Stats(pb.StatsRequest(run=model.RUN), timeout=TIMEOUT)
        check(st.runs[0].step == 2, "after the restart the run is at step 2 (the last snapshot)")
        got, _ = g.pull_all(stub, pb, model, 2, None)
        check(g.same_blocks(got, at2), "the restored parameters equal step 2's, bit for bit")
        resp = stub.RegisterRun(model.register_request(pb), timeout=TIMEOUT)
        check(resp.info.step == 2, "RegisterRun after the restart finds the run at step 2")
        do_step(stub, 3)
        got, _ = g.pull_all(stub, pb, model, 3, None)
        check(g.same_blocks(got, at3), "step 3 after the restart equals step 3 of the uninterrupted server")
        ch.close()
    finally:
        rc = srv.stop()
    check(rc == 0, "the restarted server exits 0 on SIGTERM")


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    binary = os.path.abspath(sys.argv[1])
    t.set_deadline(120)
    workdir = tempfile.mkdtemp(prefix="zt-server-proc-", dir=os.environ.get("ZT_TEST_TMPDIR"))
    try:
        g.generate_stubs(os.path.join(workdir, "stubs"))
        from ztrain.v1 import state_pb2, state_pb2_grpc
        from zt_health import health_pb2, health_pb2_grpc
        mods = (state_pb2, state_pb2_grpc, health_pb2, health_pb2_grpc)
        run_bad_flags(binary)
        run_port_in_use(binary, workdir)
        run_nvme_snapshot_restart(binary, workdir, mods)
    finally:
        t.cancel_deadline()
        shutil.rmtree(workdir, ignore_errors=True)
    return t.summary()


if __name__ == "__main__":
    sys.exit(main())
