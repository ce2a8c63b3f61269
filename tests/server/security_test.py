"""ztrain-server's protections, each checked against the real process with Python grpcio (docs/security.md):
  1. protected mode: a --listen address other hosts can reach with neither --token-file nor --tls-ca
     makes the server exit 2 before it listens, naming the fixes; --insecure yes, a token, or client
     certificates let it start; loopback needs none of them;
  2. token rotation: SIGHUP re-reads --token-file; from then on the old token is refused and the new one
     accepted, without a restart; a file of two lines accepts both (a rotation's overlap) until the old
     line is removed and SIGHUP sent again; an empty token file keeps the tokens in use;
  3. mutual TLS: with --tls-ca a client without a certificate, or with one the CA did not sign, or in
     plaintext, is refused; one signed by the CA is served;
  4. --max-message: a message over the limit gets RESOURCE_EXHAUSTED and the server goes on;
  5. --max-runs: the run past the limit gets RESOURCE_EXHAUSTED naming --max-runs, the others go on;
  6. --max-memory: a run that does not fit gets RESOURCE_EXHAUSTED naming --max-memory, the server stays
     up and the run that fits trains on;
  7. a full disk during SaveSnapshot (a file size limit put on the running server): RESOURCE_EXHAUSTED
     naming the file, the server stays up, and a restart restores the snapshot before.
Each check fails when its protection is taken out of the server. Loopback only; every process is ended in
a finally block.

usage: security_test.py PATH/TO/ztrain-server
"""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import grpc
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "proto"))
import grpcio_client_test as g  # noqa: E402  (stubs, the Server wrapper, the numpy model)
sys.path.insert(0, os.path.join(HERE, "..", "pylib"))
import zt_testlib as t  # noqa: E402  (time limit, summary)

check = g.check
TIMEOUT = g.TIMEOUT


def write(path, text):
    """Replaces a file atomically, as an operator rotating a secret would."""
    with open(path + ".new", "w") as f:
        f.write(text)
    os.replace(path + ".new", path)


def wait_log(srv, text, after=0, timeout=TIMEOUT):
    """Waits until the server's log holds text past its first `after` characters (the log is a file: read
    again until it appears). Pass the log's length before a signal to wait for that signal's line, not an
    earlier one of the same text."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if text in srv.log_text()[after:]:
            return True
        if not srv.alive():
            return False
        time.sleep(0.02)
    return False


def run_refused(argv):
    """Runs a command that should exit at once; one that keeps running (a server that started) is killed
    after 5 s and reported with returncode None."""
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = p.communicate(timeout=5.0)
        return p.returncode, out, err
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        return None, out, err


def run_protected_mode(binary, workdir, certs):
    tok = os.path.join(workdir, "pm-token")
    write(tok, "pm-token\n")
    tls = ["--tls-cert", os.path.join(certs, "server.pem"), "--tls-key", os.path.join(certs, "server.key")]
    for addr in ("0.0.0.0:0", "[::]:0", ":0"):
        for extra, what in (([], "nothing"), (tls, "TLS without client certificates or a token")):
            rc, out, err = run_refused([binary, "--listen", addr] + extra)
            check(rc == 2 and "ready" not in out and "--insecure" in err and "--token-file" in err and "--tls-ca" in err,
                  "protected mode: --listen %s with %s -> exit %s before listening, naming the fixes (%r)"
                  % (addr, what, rc, err.strip()[-160:]))
    rc, _, err = run_refused([binary, "--listen", "0.0.0.0:0", "--insecure", "maybe"])
    check(rc == 2 and "--insecure yes" in err, "--insecure maybe -> exit 2 (%r)" % err.strip())
    allowed = [(["--insecure", "yes"], "--insecure yes"),
               (["--insecure"], "--insecure"),
               (["--token-file", tok], "a token"),
               (tls + ["--tls-ca", os.path.join(certs, "ca.pem")], "client certificates")]
    for extra, what in allowed:
        srv = g.Server(binary, workdir, "pm", ["--listen", "0.0.0.0:0"] + extra)
        try:
            check(srv.port > 0, "protected mode: 0.0.0.0 with %s starts (port %d)" % (what, srv.port))
            if what.startswith("--insecure"):
                check("--insecure" in srv.log_text() and "any client" in srv.log_text(),
                      "protected mode: --insecure is logged as a warning")
        finally:
            srv.stop()
    srv = g.Server(binary, workdir, "pm-lo", ["--listen", "127.0.0.1:0"])
    try:
        check(srv.port > 0, "protected mode: loopback needs neither a token nor certificates")
    finally:
        srv.stop()


def stats_code(target, pb, pbg, token, creds=None):
    ch = grpc.secure_channel(target, creds) if creds else grpc.insecure_channel(target)
    try:
        stub = pbg.StateServiceStub(ch)
        return g.code_of(lambda: stub.Stats(pb.StatsRequest(), timeout=5.0, metadata=g.md(token)))
    finally:
        ch.close()


def run_rotation(binary, workdir, mods):
    pb, pbg, _, _ = mods
    tok = os.path.join(workdir, "token")
    write(tok, "first-token\n")
    srv = g.Server(binary, workdir, "rotate", ["--token-file", tok])
    try:
        target = "127.0.0.1:%d" % srv.port
        check(stats_code(target, pb, pbg, "first-token")[0] == grpc.StatusCode.OK, "rotation: the first token works")
        write(tok, "second-token\n")
        # Before SIGHUP the file is not read again: the first token still works.
        check(stats_code(target, pb, pbg, "first-token")[0] == grpc.StatusCode.OK,
              "rotation: nothing changes until SIGHUP")
        mark = len(srv.log_text())
        srv.proc.send_signal(signal.SIGHUP)
        check(wait_log(srv, "token reloaded", mark), "rotation: SIGHUP -> 'token reloaded' logged")
        c, d = stats_code(target, pb, pbg, "first-token")
        check(c == grpc.StatusCode.UNAUTHENTICATED, "rotation: the old token is refused after SIGHUP (%s %r)" % (c.name, d))
        check(stats_code(target, pb, pbg, "second-token")[0] == grpc.StatusCode.OK,
              "rotation: the new token works without a restart")
        # A rotation with overlap: the new token first, the old one still accepted, then the old one dropped.
        write(tok, "third-token\nsecond-token\n")
        mark = len(srv.log_text())
        srv.proc.send_signal(signal.SIGHUP)
        check(wait_log(srv, "(2 accepted)", mark), "rotation: SIGHUP with two lines -> two tokens accepted")
        check(stats_code(target, pb, pbg, "third-token")[0] == grpc.StatusCode.OK
              and stats_code(target, pb, pbg, "second-token")[0] == grpc.StatusCode.OK,
              "rotation: during the overlap the new and the old token both work")
        write(tok, "third-token\n")
        mark = len(srv.log_text())
        srv.proc.send_signal(signal.SIGHUP)
        check(wait_log(srv, "(1 accepted)", mark), "rotation: SIGHUP with one line -> one token accepted")
        check(stats_code(target, pb, pbg, "second-token")[0] == grpc.StatusCode.UNAUTHENTICATED,
              "rotation: after the overlap the old token is refused")
        write(tok, "\n")
        mark = len(srv.log_text())
        srv.proc.send_signal(signal.SIGHUP)
        check(wait_log(srv, "the tokens in use stay", mark), "rotation: an empty token file is refused with a message")
        check(stats_code(target, pb, pbg, "third-token")[0] == grpc.StatusCode.OK and srv.alive(),
              "rotation: after a bad file the token in use still works")
    finally:
        rc = srv.stop()
    check(rc == 0, "rotation: the server exits 0 on SIGTERM")


def make_client_certs(d):
    """A client certificate signed by the test CA, and a self-signed one with the same name."""
    def ossl(*args):
        subprocess.run(["openssl"] + list(args), check=True, cwd=d, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=30)
    ossl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "client.key", "-out", "client.csr", "-subj",
         "/CN=ztrain-worker")
    ossl("x509", "-req", "-in", "client.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-out",
         "client.pem", "-days", "1")
    ossl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "rogue.key", "-out", "rogue.pem", "-days", "1",
         "-subj", "/CN=ztrain-worker")


def run_mutual_tls(binary, workdir, certs, mods):
    pb, pbg, _, _ = mods

    def read(name):
        with open(os.path.join(certs, name), "rb") as f:
            return f.read()
    srv = g.Server(binary, workdir, "mtls", ["--tls-cert", os.path.join(certs, "server.pem"), "--tls-key",
                                             os.path.join(certs, "server.key"), "--tls-ca",
                                             os.path.join(certs, "ca.pem")])
    try:
        target = "127.0.0.1:%d" % srv.port
        ca = read("ca.pem")
        cases = [(grpc.ssl_channel_credentials(root_certificates=ca), "no client certificate", False),
                 (grpc.ssl_channel_credentials(ca, read("rogue.key"), read("rogue.pem")),
                  "a self-signed client certificate", False),
                 (grpc.ssl_channel_credentials(ca, read("client.key"), read("client.pem")),
                  "a client certificate of the CA", True)]
        for creds, what, ok in cases:
            c, d = stats_code(target, pb, pbg, None, creds)
            want = grpc.StatusCode.OK if ok else grpc.StatusCode.UNAVAILABLE
            check(c == want, "mutual TLS: %s -> %s (%r)" % (what, c.name, d[:100]))
        c, d = stats_code(target, pb, pbg, None)
        check(c == grpc.StatusCode.UNAVAILABLE, "mutual TLS: a plaintext client -> %s (%r)" % (c.name, d[:100]))
        check(srv.alive(), "mutual TLS: the server survived the refused clients")
    finally:
        srv.stop()


def run_limits(binary, workdir, mods):
    pb, pbg, _, _ = mods
    r = subprocess.run([binary, "--max-message", "1MiB"], capture_output=True, text=True, timeout=TIMEOUT)
    check(r.returncode == 2 and "2MiB" in r.stderr, "--max-message 1MiB -> exit 2 (%r)" % r.stderr.strip())
    model = g.Model(np.random.default_rng(3))

    # --max-message: a 3 MiB chunk over a 2 MiB limit
    srv = g.Server(binary, workdir, "maxmsg", ["--max-message", "2MiB"])
    try:
        ch = grpc.insecure_channel("127.0.0.1:%d" % srv.port,
                                   options=[("grpc.max_send_message_length", 16 << 20)])
        stub = pbg.StateServiceStub(ch)
        stub.RegisterRun(model.register_request(pb), timeout=TIMEOUT)
        big = model.register_request(pb)
        big.run = "x" * (3 << 20)
        c, d = g.code_of(lambda: stub.RegisterRun(big, timeout=TIMEOUT))
        check(c == grpc.StatusCode.RESOURCE_EXHAUSTED, "--max-message 2MiB: a 3 MiB message -> %s (%r)" % (c.name, d))
        chunk = pb.PushMessage(chunk=pb.PushChunk(offset=0, data=bytes(3 << 20)))
        head = pb.PushMessage(header=pb.PushHeader(run=model.RUN, step=0, block=0, shard=0, dtype=pb.DTYPE_F32,
                                                   total_bytes=4 * model.shard[0]))
        c, d = g.code_of(lambda: stub.PushParams(iter([head, chunk]), timeout=TIMEOUT))
        check(c == grpc.StatusCode.RESOURCE_EXHAUSTED, "--max-message 2MiB: a 3 MiB chunk in a push -> %s (%r)"
              % (c.name, d))
        data = model.p[0][model.shard_slice(0, 0)].tobytes()
        resp = stub.PushParams(g.push_stream(pb, model.RUN, 0, 0, 0, pb.DTYPE_F32, data, 1 << 20), timeout=TIMEOUT)
        check(resp.bytes_received == len(data), "--max-message: a push in 1 MiB chunks still passes")
        ch.close()
    finally:
        srv.stop()

    # --max-runs 2
    srv = g.Server(binary, workdir, "maxruns", ["--max-runs", "2"])
    try:
        ch = grpc.insecure_channel("127.0.0.1:%d" % srv.port)
        stub = pbg.StateServiceStub(ch)
        codes = []
        for name in ("run-a", "run-b", "run-c"):
            req = model.register_request(pb)
            req.run = name
            codes.append(g.code_of(lambda: stub.RegisterRun(req, timeout=TIMEOUT)))
        check([c for c, _ in codes] == [grpc.StatusCode.OK, grpc.StatusCode.OK, grpc.StatusCode.RESOURCE_EXHAUSTED]
              and "--max-runs" in codes[2][1], "--max-runs 2: the third run -> %s (%r)" % (codes[2][0].name, codes[2][1]))
        st = stub.Stats(pb.StatsRequest(), timeout=TIMEOUT)
        check(sorted(r.run for r in st.runs) == ["run-a", "run-b"], "--max-runs: the two runs are there, nothing else")
        req = model.register_request(pb)
        req.run = "run-a"
        check(g.code_of(lambda: stub.RegisterRun(req, timeout=TIMEOUT))[0] == grpc.StatusCode.OK,
              "--max-runs: a held run registers again (a restarted worker)")
        ch.close()
    finally:
        srv.stop()

    # --max-memory: the model's run needs about 38 KiB (36 bytes per parameter); a 64 KiB limit takes one
    srv = g.Server(binary, workdir, "maxmem", ["--max-memory", "64KiB"])
    try:
        ch = grpc.insecure_channel("127.0.0.1:%d" % srv.port)
        stub = pbg.StateServiceStub(ch)
        stub.RegisterRun(model.register_request(pb), timeout=TIMEOUT)
        for b in range(len(model.NUMEL)):
            for s in range(model.W):
                stub.PushParams(g.push_stream(pb, model.RUN, 0, b, s, pb.DTYPE_F32,
                                              model.p[b][model.shard_slice(b, s)].tobytes(), 1024), timeout=TIMEOUT)
        other = model.register_request(pb)
        other.run = "second"
        c, d = g.code_of(lambda: stub.RegisterRun(other, timeout=TIMEOUT))
        check(c == grpc.StatusCode.RESOURCE_EXHAUSTED and "--max-memory" in d,
              "--max-memory 64KiB: a second run -> %s (%r)" % (c.name, d))
        huge = pb.RegisterRunRequest(run="huge", world_size=1, blocks=[pb.BlockLayout(numel=1 << 40)], beta1=0.9,
                                     beta2=0.95, eps=1e-8, param_dtype=pb.DTYPE_F32)
        c, d = g.code_of(lambda: stub.RegisterRun(huge, timeout=TIMEOUT))
        check(c == grpc.StatusCode.RESOURCE_EXHAUSTED and srv.alive(),
              "--max-memory: a run of 2^40 parameters -> %s, the server stays up" % c.name)
        g_step = [np.pad(np.ones(n, np.float32), (0, model.shard[b] * model.W - n)) for b, n in enumerate(model.NUMEL)]
        for b in range(len(model.NUMEL)):
            for s in range(model.W):
                stub.PushGradients(g.push_stream(pb, model.RUN, 1, b, s, pb.DTYPE_F32,
                                                 g_step[b][model.shard_slice(b, s)].tobytes(), 1024), timeout=TIMEOUT)
        r = stub.CommitStep(pb.CommitStepRequest(run=model.RUN, step=1, grad_norm=1.0, clip_coef=1.0, lr=1e-3),
                            timeout=TIMEOUT)
        check(r.step == 1, "--max-memory: the run that fits commits its step")
        ch.close()
    finally:
        rc = srv.stop()
    check(rc == 0, "--max-memory: the server exits 0 on SIGTERM")


def run_disk_full(binary, workdir, mods):
    """A snapshot that meets a full disk (a file size limit set on the running server, as `prlimit --fsize`
    would): RESOURCE_EXHAUSTED naming the file, the server stays up (it ignores SIGXFSZ), the run keeps its
    step, and a restart restores the previous snapshot."""
    import resource
    pb, pbg, _, _ = mods
    snaps = os.path.join(workdir, "full-snaps")
    model = g.Model(np.random.default_rng(5))
    grads = [np.pad(np.full(n, 0.5, np.float32), (0, model.shard[b] * model.W - n)) for b, n in enumerate(model.NUMEL)]

    def step(stub, s):
        for b in range(len(model.NUMEL)):
            for sh in range(model.W):
                stub.PushGradients(g.push_stream(pb, model.RUN, s, b, sh, pb.DTYPE_F32,
                                                 grads[b][model.shard_slice(b, sh)].tobytes(), 4096), timeout=TIMEOUT)
        stub.CommitStep(pb.CommitStepRequest(run=model.RUN, step=s, grad_norm=1.0, clip_coef=1.0, lr=1e-3),
                        timeout=TIMEOUT)

    srv = g.Server(binary, workdir, "full", ["--snapshot-dir", snaps])
    try:
        ch = grpc.insecure_channel("127.0.0.1:%d" % srv.port)
        stub = pbg.StateServiceStub(ch)
        stub.RegisterRun(model.register_request(pb), timeout=TIMEOUT)
        for b in range(len(model.NUMEL)):
            for sh in range(model.W):
                stub.PushParams(g.push_stream(pb, model.RUN, 0, b, sh, pb.DTYPE_F32,
                                              model.p[b][model.shard_slice(b, sh)].tobytes(), 4096), timeout=TIMEOUT)
        step(stub, 1)
        check(stub.SaveSnapshot(pb.SaveSnapshotRequest(run=model.RUN), timeout=TIMEOUT).step == 1,
              "disk full: the snapshot of step 1 is saved")
        step(stub, 2)
        hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
        resource.prlimit(srv.proc.pid, resource.RLIMIT_FSIZE, (4096, hard))
        c, d = g.code_of(lambda: stub.SaveSnapshot(pb.SaveSnapshotRequest(run=model.RUN), timeout=TIMEOUT))
        check(c == grpc.StatusCode.RESOURCE_EXHAUSTED and "step_00000002.tmp" in d,
              "disk full: SaveSnapshot -> %s (%r)" % (c.name, d))
        check(srv.alive(), "disk full: the server is still running")
        st = stub.Stats(pb.StatsRequest(run=model.RUN), timeout=TIMEOUT)
        check(st.runs[0].step == 2, "disk full: the run is still at step 2")
        ch.close()
    finally:
        rc = srv.stop()
    check(rc == 0, "disk full: the server exits 0 on SIGTERM")
    srv = g.Server(binary, workdir, "full2", ["--snapshot-dir", snaps])
    try:
        ch = grpc.insecure_channel("127.0.0.1:%d" % srv.port)
        st = pbg.StateServiceStub(ch).Stats(pb.StatsRequest(run=model.RUN), timeout=TIMEOUT)
        check(st.runs[0].step == 1, "disk full: a restart restores the snapshot of step 1")
        ch.close()
    finally:
        srv.stop()


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    binary = os.path.abspath(sys.argv[1])
    t.set_deadline(120)
    workdir = tempfile.mkdtemp(prefix="zt-security-")
    try:
        g.generate_stubs(os.path.join(workdir, "stubs"))
        from ztrain.v1 import state_pb2, state_pb2_grpc
        from zt_health import health_pb2, health_pb2_grpc
        mods = (state_pb2, state_pb2_grpc, health_pb2, health_pb2_grpc)
        certs = os.path.join(workdir, "certs")
        os.mkdir(certs)
        g.make_certs(certs)
        make_client_certs(certs)
        run_protected_mode(binary, workdir, certs)
        run_rotation(binary, workdir, mods)
        run_mutual_tls(binary, workdir, certs, mods)
        run_limits(binary, workdir, mods)
        run_disk_full(binary, workdir, mods)
    finally:
        t.cancel_deadline()
        shutil.rmtree(workdir, ignore_errors=True)
    return t.summary()


if __name__ == "__main__":
    sys.exit(main())
