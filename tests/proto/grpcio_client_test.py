"""ztrain-server against an independent gRPC implementation: Python grpcio with stubs generated at test
time by grpc_tools.protoc from the repository's own .proto files.

It starts real ztrain-server processes on free loopback ports (one with a bearer token and a plaintext
health port, one with TLS from throwaway openssl certificates) and proves that the service speaks
standard gRPC: grpc.health.v1 Check, RegisterRun, PushParams, PushGradients (client streams of chunks),
CommitStep, PullParams (a server stream), Stats, SaveSnapshot and LoadSnapshot. The updated parameters
after each step are compared with a numpy AdamW (PyTorch's semantics). Every bad input of issue 5
(malformed protobuf, wrong sizes, unknown run, stale step, oversize message, missing or wrong token,
plaintext against TLS) must get its gRPC status with a message, and afterwards the server must still
serve with its state unchanged.

usage: grpcio_client_test.py PATH/TO/ztrain-server
"""
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import grpc
import numpy as np
from grpc_tools import protoc

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE_DIR = os.environ.get("ZT_SOURCE_DIR", os.path.normpath(os.path.join(HERE, "..", "..")))
PROTO_DIR = os.path.join(SOURCE_DIR, "proto")
TIMEOUT = 10.0  # deadline of every call, seconds
SVC = "/ztrain.v1.StateService/"
TOKEN = "s3cret-token"

sys.path.insert(0, os.path.join(HERE, "..", "pylib"))
from zt_testlib import check, failures  # noqa: E402,F401  (re-exported: other scripts use g.check, g.failures)
import zt_testlib as t  # noqa: E402


# ---- stubs generated from the repository's .proto files ----

def generate_stubs(outdir):
    """Runs grpc_tools.protoc on proto/ztrain/v1/state.proto and proto/grpc/health/v1/health.proto.
    The health file is mapped to the import path zt_health/ so that its generated module does not
    shadow the installed grpc package; its protobuf package stays grpc.health.v1, which is what the
    wire names use."""
    os.makedirs(outdir)
    include = os.path.join(os.path.dirname(protoc.__file__), "_proto")
    for args in (["-I" + PROTO_DIR, "ztrain/v1/state.proto"],
                 ["-Izt_health=" + os.path.join(PROTO_DIR, "grpc", "health", "v1"), "zt_health/health.proto"]):
        rc = protoc.main(["grpc_tools.protoc", "-I" + include] + args[:1] +
                         ["--python_out=" + outdir, "--grpc_python_out=" + outdir] + args[1:])
        if rc != 0:
            raise RuntimeError("grpc_tools.protoc failed on %s (exit %d)" % (args[1], rc))
    sys.path.insert(0, outdir)


# ---- the server process ----

class Server:
    """A ztrain-server process on free loopback ports; stop() always ends it."""

    def __init__(self, binary, workdir, name, extra):
        self.log_path = os.path.join(workdir, name + ".log")
        self.log = open(self.log_path, "w")
        argv = [binary, "--listen", "127.0.0.1:0", "--threads", "2"] + extra
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=self.log)
        try:
            self.port, self.health_port, self.metrics_port = self._wait_ready(TIMEOUT)
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, timeout):
        end = time.monotonic() + timeout
        line = b""
        while not line.endswith(b"\n"):
            left = end - time.monotonic()
            if left <= 0 or not select.select([self.proc.stdout], [], [], left)[0]:
                raise RuntimeError("ztrain-server did not print its ready line; log: " + self.log_text())
            ch = os.read(self.proc.stdout.fileno(), 1)  # unbuffered, so select sees what is left
            if not ch:
                raise RuntimeError("ztrain-server exited with %s; log: %s" % (self.proc.wait(), self.log_text()))
            line += ch
        fields = dict(f.split("=") for f in line.decode().split()[2:])
        return int(fields["port"]), int(fields["health_port"]), int(fields.get("metrics_port", 0))

    def log_text(self):
        if not self.log.closed:
            self.log.flush()
        with open(self.log_path) as f:
            return f.read()

    def alive(self):
        return self.proc.poll() is None

    def stop(self):
        """SIGTERM, then SIGKILL if it does not exit within 15 s. Returns the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()
        self.log.close()
        return self.proc.returncode


# ---- helpers over the generated stubs ----

def md(token=TOKEN):
    return [("authorization", "Bearer " + token)] if token is not None else []


def code_of(fn):
    """Runs fn and returns (grpc.StatusCode, details); OK with "" when it succeeds."""
    try:
        fn()
        return grpc.StatusCode.OK, ""
    except grpc.RpcError as e:
        return e.code(), e.details() or ""


def push_stream(pb, run, step, block, shard, dtype, data, chunk_bytes, offset=0, total=None):
    """The PushMessage stream of one push: a header, then chunks of at most chunk_bytes."""
    yield pb.PushMessage(header=pb.PushHeader(run=run, step=step, block=block, shard=shard, dtype=dtype,
                                              total_bytes=len(data) if total is None else total, offset=offset))
    for at in range(0, len(data), chunk_bytes):
        yield pb.PushMessage(chunk=pb.PushChunk(offset=at, data=data[at:at + chunk_bytes]))


def adamw(p, m, v, g, lr, b1, b2, eps, wd, scale, step, decay_mask):
    """numpy twin of kernels/adamw.h (PyTorch's AdamW), in fp32 like the C code."""
    f = np.float32
    bc1 = f(1.0 - b1 ** step)
    bc2 = f(1.0 - b2 ** step)
    b1, b2, lr, eps = f(b1), f(b2), f(lr), f(eps)
    wdv = np.where(decay_mask, f(wd), f(0)).astype(np.float32)
    g = g.astype(np.float32) * f(scale)
    m[:] = b1 * m + (f(1) - b1) * g
    v[:] = b2 * v + (f(1) - b2) * g * g
    p[:] = p - lr * ((m / bc1) / (np.sqrt(v / bc2) + eps) + wdv * p)


class Model:
    """The run used throughout: two blocks over W = 2 ranks, one with padding and a decay range."""
    RUN = "grpcio-run"
    W = 2
    NUMEL = [1000, 77]
    DECAY = [[(0, 600)], []]
    B1, B2, EPS, WD = 0.9, 0.95, 1e-8, 0.1

    def __init__(self, rng):
        self.shard = [(n + self.W - 1) // self.W for n in self.NUMEL]
        self.p, self.m, self.v, self.mask = [], [], [], []
        for b, n in enumerate(self.NUMEL):
            padded = self.shard[b] * self.W
            p = np.zeros(padded, np.float32)
            p[:n] = rng.standard_normal(n).astype(np.float32)
            mask = np.zeros(padded, bool)
            for lo, hi in self.DECAY[b]:
                mask[lo:hi] = True
            self.p.append(p)
            self.m.append(np.zeros(padded, np.float32))
            self.v.append(np.zeros(padded, np.float32))
            self.mask.append(mask)
        self.adam_step = 0

    def shard_slice(self, b, s):
        return slice(s * self.shard[b], (s + 1) * self.shard[b])

    def register_request(self, pb):
        blocks = [pb.BlockLayout(numel=n, decay=[pb.Range(begin=lo, end=hi) for lo, hi in d])
                  for n, d in zip(self.NUMEL, self.DECAY)]
        return pb.RegisterRunRequest(run=self.RUN, world_size=self.W, blocks=blocks, beta1=self.B1, beta2=self.B2,
                                     eps=self.EPS, weight_decay=self.WD, param_dtype=pb.DTYPE_F32)

    def all_ranges(self, pb):
        return [pb.PullRange(block=b, shard=s, offset=0, count=self.shard[b])
                for b in range(len(self.NUMEL)) for s in range(self.W)]


def pull_all(stub, pb, model, step, metadata):
    """Pulls every shard of every block after `step` commits; returns a list of padded fp32 blocks and
    the order in which blocks arrived."""
    out = [np.full(model.shard[b] * model.W, np.nan, np.float32) for b in range(len(model.NUMEL))]
    order = []
    req = pb.PullParamsRequest(run=model.RUN, step=step, ranges=model.all_ranges(pb))
    for c in stub.PullParams(req, timeout=TIMEOUT, metadata=metadata):
        if c.dtype != pb.DTYPE_F32:
            raise RuntimeError("pulled dtype %d, expected DTYPE_F32" % c.dtype)
        vals = np.frombuffer(c.data, np.float32)
        at = c.shard * model.shard[c.block] + c.offset
        out[c.block][at:at + len(vals)] = vals
        order.append(c.block)
    return out, order


def same_blocks(a, b):
    return all(np.array_equal(x, y) for x, y in zip(a, b))


# ---- the plaintext server with a token ----

def run_plain(binary, workdir, mods):
    pb, pbg, hpb, hpbg = mods
    snapdir = os.path.join(workdir, "snapshots")
    tokfile = os.path.join(workdir, "token")
    with open(tokfile, "w") as f:
        f.write(TOKEN + "\n")
    srv = Server(binary, workdir, "plain", ["--token-file", tokfile, "--health-listen", "127.0.0.1:0",
                                            "--snapshot-dir", snapdir])
    try:
        target = "127.0.0.1:%d" % srv.port
        opts = [("grpc.max_send_message_length", 64 << 20), ("grpc.max_receive_message_length", 64 << 20)]
        ch = grpc.insecure_channel(target, options=opts)
        hch = grpc.insecure_channel("127.0.0.1:%d" % srv.health_port)
        stub = pbg.StateServiceStub(ch)
        health = hpbg.HealthStub(ch)
        hhealth = hpbg.HealthStub(hch)

        # Health: the main port with the token, the health port without one.
        r = health.Check(hpb.HealthCheckRequest(service=""), timeout=TIMEOUT, metadata=md())
        check(r.status == hpb.HealthCheckResponse.SERVING, "health Check on the main port with the token: SERVING")
        r = health.Check(hpb.HealthCheckRequest(service="ztrain.v1.StateService"), timeout=TIMEOUT, metadata=md())
        check(r.status == hpb.HealthCheckResponse.SERVING, "health Check of ztrain.v1.StateService: SERVING")
        r = hhealth.Check(hpb.HealthCheckRequest(service=""), timeout=TIMEOUT)
        check(r.status == hpb.HealthCheckResponse.SERVING, "health Check on the --health-listen port without a token")
        c, d = code_of(lambda: pbg.StateServiceStub(hch).Stats(pb.StatsRequest(), timeout=TIMEOUT))
        check(c == grpc.StatusCode.UNIMPLEMENTED, "the health port serves nothing else: %s %r" % (c, d))

        # RegisterRun (twice: idempotent) and the initial parameters, in small chunks.
        rng = np.random.default_rng(5)
        model = Model(rng)
        resp = stub.RegisterRun(model.register_request(pb), timeout=TIMEOUT, metadata=md())
        check(resp.info.step == 0 and resp.info.owned_shards == 4, "RegisterRun: step 0, 4 shards owned")
        resp = stub.RegisterRun(model.register_request(pb), timeout=TIMEOUT, metadata=md())
        check(resp.info.step == 0, "RegisterRun again with the same layout is accepted")
        for b in range(len(model.NUMEL)):
            for s in range(model.W):
                data = model.p[b][model.shard_slice(b, s)].tobytes()
                r = stub.PushParams(push_stream(pb, model.RUN, 0, b, s, pb.DTYPE_F32, data, 400),
                                    timeout=TIMEOUT, metadata=md())
                check(r.bytes_received == len(data), "PushParams block %d shard %d: %d bytes" % (b, s, len(data)))
        got, _ = pull_all(stub, pb, model, 0, md())
        check(same_blocks(got, model.p), "PullParams at step 0 returns the pushed parameters")

        # Steps: gradients (fp32 chunks; one shard as fp16), commit, pull, compare with numpy AdamW.
        def push_step(step, clip, lr, grads=None):
            if grads is None:
                grads = [np.zeros(model.shard[b] * model.W, np.float32) for b in range(len(model.NUMEL))]
                for b, n in enumerate(model.NUMEL):
                    grads[b][:n] = rng.standard_normal(n).astype(np.float32)
            used = []
            for b in range(len(model.NUMEL)):
                g_used = grads[b].copy()
                for s in range(model.W):
                    sl = model.shard_slice(b, s)
                    if b == 1 and s == 1:  # an fp16 push: the server widens it exactly
                        h = grads[b][sl].astype(np.float16)
                        g_used[sl] = h.astype(np.float32)
                        data, dt = h.tobytes(), pb.DTYPE_F16
                    else:
                        data, dt = grads[b][sl].tobytes(), pb.DTYPE_F32
                    r = stub.PushGradients(push_stream(pb, model.RUN, step, b, s, dt, data, 256),
                                           timeout=TIMEOUT, metadata=md())
                    if r.bytes_received != len(data):
                        raise RuntimeError("PushGradients received %d of %d bytes" % (r.bytes_received, len(data)))
                used.append(g_used)
            cr = stub.CommitStep(pb.CommitStepRequest(run=model.RUN, step=step, grad_norm=1.5, clip_coef=clip, lr=lr,
                                                      overflow=False), timeout=TIMEOUT, metadata=md())
            model.adam_step += 1
            for b in range(len(model.NUMEL)):
                adamw(model.p[b], model.m[b], model.v[b], used[b], lr, model.B1, model.B2, model.EPS, model.WD,
                      clip, model.adam_step, model.mask[b])
            return cr, grads

        worst = 0.0
        for step in (1, 2):
            cr, _ = push_step(step, 0.5 if step == 1 else 1.0, 1e-3 * step)
            check(cr.step == step and cr.adam_step == step and not cr.skipped, "CommitStep %d applied" % step)
            got, order = pull_all(stub, pb, model, step, md())
            check(order == sorted(order) and order[0] == 0, "PullParams streams block 0 first")
            for g, want in zip(got, model.p):
                rel = np.abs(g - want) / np.maximum(np.abs(want), 1e-30)
                rel[want == 0] = np.abs(g[want == 0])
                worst = max(worst, float(rel.max()))
        check(worst <= 1e-6, "parameters after 2 steps match numpy AdamW (worst relative error %.3g)" % worst)

        # A retried commit of the last step is answered as such.
        cr = stub.CommitStep(pb.CommitStepRequest(run=model.RUN, step=2, clip_coef=1.0, lr=1e-3), timeout=TIMEOUT,
                             metadata=md())
        check(cr.already_committed and cr.step == 2, "CommitStep of the last step again: already_committed")

        st = stub.Stats(pb.StatsRequest(run=model.RUN), timeout=TIMEOUT, metadata=md())
        check(len(st.runs) == 1 and st.runs[0].step == 2 and st.runs[0].commits == 2 and st.runs[0].bytes_pushed > 0
              and st.runs[0].bytes_pulled > 0, "Stats: step 2, 2 commits, bytes pushed and pulled counted")

        # Snapshots: save at step 2, go on to step 3, load step 2 back.
        sr = stub.SaveSnapshot(pb.SaveSnapshotRequest(run=model.RUN), timeout=TIMEOUT, metadata=md())
        check(sr.step == 2 and os.path.isdir(sr.path) and sr.path.startswith(snapdir),
              "SaveSnapshot wrote step 2 under --snapshot-dir (%s)" % sr.path)
        at2, _ = pull_all(stub, pb, model, 2, md())
        saved = ([m.copy() for m in model.m], [v.copy() for v in model.v], model.adam_step)
        push_step(3, 1.0, 2e-3)
        got3, _ = pull_all(stub, pb, model, 3, md())
        check(not same_blocks(got3, at2), "step 3 changed the parameters")
        lr_ = stub.LoadSnapshot(pb.LoadSnapshotRequest(run=model.RUN, step=0), timeout=TIMEOUT, metadata=md())
        check(lr_.info.step == 2, "LoadSnapshot of the latest snapshot puts the run back at step 2")
        got, _ = pull_all(stub, pb, model, 2, md())
        check(same_blocks(got, at2), "after LoadSnapshot the pulled parameters are those of step 2, bit for bit")
        # The numpy model goes back to step 2 as well (the server's parameters, its own moments).
        model.p = [p.copy() for p in at2]
        model.m, model.v, model.adam_step = saved

        # ---- bad inputs: each gets its status and a message, the state stays as it is ----
        before, _ = pull_all(stub, pb, model, 2, md())

        def unchanged(what):
            got, _ = pull_all(stub, pb, model, 2, md())
            st = stub.Stats(pb.StatsRequest(run=model.RUN), timeout=TIMEOUT, metadata=md())
            check(same_blocks(got, before) and st.runs[0].step == 2, "  ... and the state is unchanged after " + what)

        def expect(what, want, fn):
            c, d = code_of(fn)
            check(c == want and len(d) > 10, "%s -> %s %r" % (what, c.name, d))
            unchanged(what)

        raw_commit = ch.unary_unary(SVC + "CommitStep")  # bytes in, bytes out: no serializer
        raw_push = ch.stream_unary(SVC + "PushGradients")
        expect("malformed CommitStepRequest bytes", grpc.StatusCode.INVALID_ARGUMENT,
               lambda: raw_commit(b"\x0a\xff\xff\xff\xff\x0f", timeout=TIMEOUT, metadata=md()))
        expect("malformed PushMessage bytes", grpc.StatusCode.INVALID_ARGUMENT,
               lambda: raw_push(iter([b"\x12\x05\x0a"]), timeout=TIMEOUT, metadata=md()))
        g_ok = np.ones(model.shard[0], np.float32).tobytes()
        expect("PushGradients announcing more bytes than the shard holds", grpc.StatusCode.INVALID_ARGUMENT,
               lambda: stub.PushGradients(push_stream(pb, model.RUN, 3, 0, 0, pb.DTYPE_F32, g_ok + b"\0" * 8, 256),
                                          timeout=TIMEOUT, metadata=md()))
        expect("PushGradients with a chunk past the announced total", grpc.StatusCode.INVALID_ARGUMENT,
               lambda: stub.PushGradients(push_stream(pb, model.RUN, 3, 0, 0, pb.DTYPE_F32, g_ok, 4096, total=64),
                                          timeout=TIMEOUT, metadata=md()))
        expect("PushGradients of 6 bytes of fp32", grpc.StatusCode.INVALID_ARGUMENT,
               lambda: stub.PushGradients(push_stream(pb, model.RUN, 3, 0, 0, pb.DTYPE_F32, b"\0" * 6, 256),
                                          timeout=TIMEOUT, metadata=md()))
        expect("PushGradients to block 7 of a 2-block run", grpc.StatusCode.INVALID_ARGUMENT,
               lambda: stub.PushGradients(push_stream(pb, model.RUN, 3, 7, 0, pb.DTYPE_F32, g_ok, 256),
                                          timeout=TIMEOUT, metadata=md()))
        expect("CommitStep of an unknown run", grpc.StatusCode.NOT_FOUND,
               lambda: stub.CommitStep(pb.CommitStepRequest(run="no-such-run", step=1, clip_coef=1, lr=1e-3),
                                       timeout=TIMEOUT, metadata=md()))
        expect("PushGradients to an unknown run", grpc.StatusCode.NOT_FOUND,
               lambda: stub.PushGradients(push_stream(pb, "no-such-run", 1, 0, 0, pb.DTYPE_F32, g_ok, 256),
                                          timeout=TIMEOUT, metadata=md()))
        expect("PushGradients for the stale step 2", grpc.StatusCode.FAILED_PRECONDITION,
               lambda: stub.PushGradients(push_stream(pb, model.RUN, 2, 0, 0, pb.DTYPE_F32, g_ok, 256),
                                          timeout=TIMEOUT, metadata=md()))
        expect("CommitStep of the stale step 1", grpc.StatusCode.FAILED_PRECONDITION,
               lambda: stub.CommitStep(pb.CommitStepRequest(run=model.RUN, step=1, clip_coef=1, lr=1e-3),
                                       timeout=TIMEOUT, metadata=md()))
        expect("CommitStep 3 before its gradients arrived", grpc.StatusCode.FAILED_PRECONDITION,
               lambda: stub.CommitStep(pb.CommitStepRequest(run=model.RUN, step=3, clip_coef=1, lr=1e-3),
                                       timeout=TIMEOUT, metadata=md()))
        big = np.zeros(5 << 20, np.uint8).tobytes()  # one 5 MiB message, over the server's 4 MiB limit
        expect("an oversize PushChunk (5 MiB)", grpc.StatusCode.RESOURCE_EXHAUSTED,
               lambda: stub.PushGradients(push_stream(pb, model.RUN, 3, 0, 0, pb.DTYPE_F32, big, len(big), total=len(g_ok)),
                                          timeout=TIMEOUT, metadata=md()))
        expect("RegisterRun with a different layout", grpc.StatusCode.FAILED_PRECONDITION,
               lambda: stub.RegisterRun(pb.RegisterRunRequest(run=model.RUN, world_size=2,
                                                              blocks=[pb.BlockLayout(numel=999)], beta1=0.9,
                                                              beta2=0.95, eps=1e-8, param_dtype=pb.DTYPE_F32),
                                        timeout=TIMEOUT, metadata=md()))
        expect("Stats without a token", grpc.StatusCode.UNAUTHENTICATED,
               lambda: stub.Stats(pb.StatsRequest(), timeout=TIMEOUT))
        expect("CommitStep with a wrong token", grpc.StatusCode.UNAUTHENTICATED,
               lambda: stub.CommitStep(pb.CommitStepRequest(run=model.RUN, step=3, clip_coef=1, lr=1e-3),
                                       timeout=TIMEOUT, metadata=md("wrong-token")))
        expect("PushGradients with a wrong token", grpc.StatusCode.UNAUTHENTICATED,
               lambda: stub.PushGradients(push_stream(pb, model.RUN, 3, 0, 0, pb.DTYPE_F32, g_ok, 256),
                                          timeout=TIMEOUT, metadata=md("wrong-token")))
        expect("health Check on the main port without a token", grpc.StatusCode.UNAUTHENTICATED,
               lambda: health.Check(hpb.HealthCheckRequest(service=""), timeout=TIMEOUT))
        expect("an unknown method", grpc.StatusCode.UNIMPLEMENTED,
               lambda: ch.unary_unary(SVC + "NoSuchMethod")(b"", timeout=TIMEOUT, metadata=md()))

        # After all that, the run goes on: step 3 from the snapshot matches numpy again.
        cr, _ = push_step(3, 1.0, 2e-3)
        got, _ = pull_all(stub, pb, model, 3, md())
        err = max(float(np.max(np.abs(g - w) / np.maximum(np.abs(w), 1e-30) * (w != 0))) for g, w in zip(got, model.p))
        check(cr.step == 3 and err <= 1e-6, "the server still serves: step 3 applied and matches numpy (%.3g)" % err)
        ch.close()
        hch.close()
    finally:
        rc = srv.stop()
        log = srv.log_text()
    check(rc == 0, "the token server exits 0 on SIGTERM")
    check("SIGTERM received" in log and "server: stopped" in log, "the server logs its shutdown")


# ---- the TLS server ----

def make_certs(d):
    """A throwaway CA and a server certificate for 127.0.0.1 / localhost, with openssl."""
    def ossl(*args):
        subprocess.run(["openssl"] + list(args), check=True, cwd=d, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=30)
    with open(os.path.join(d, "san.cnf"), "w") as f:
        f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    ossl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "1",
         "-subj", "/CN=ztrain test CA")
    ossl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=localhost")
    ossl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-out",
         "server.pem", "-days", "1", "-extfile", "san.cnf")


def run_tls(binary, workdir, mods):
    pb, pbg, hpb, hpbg = mods
    certs = os.path.join(workdir, "certs")
    os.mkdir(certs)
    make_certs(certs)
    tokfile = os.path.join(workdir, "token")
    srv = Server(binary, workdir, "tls", ["--tls-cert", os.path.join(certs, "server.pem"), "--tls-key",
                                          os.path.join(certs, "server.key"), "--token-file", tokfile])
    try:
        target = "127.0.0.1:%d" % srv.port
        with open(os.path.join(certs, "ca.pem"), "rb") as f:
            creds = grpc.ssl_channel_credentials(root_certificates=f.read())
        ch = grpc.secure_channel(target, creds)
        health = hpbg.HealthStub(ch)
        stub = pbg.StateServiceStub(ch)
        r = health.Check(hpb.HealthCheckRequest(service=""), timeout=TIMEOUT, metadata=md())
        check(r.status == hpb.HealthCheckResponse.SERVING, "TLS: health Check with the token: SERVING")
        model = Model(np.random.default_rng(7))
        resp = stub.RegisterRun(model.register_request(pb), timeout=TIMEOUT, metadata=md())
        check(resp.info.step == 0, "TLS: RegisterRun")
        c, d = code_of(lambda: stub.Stats(pb.StatsRequest(), timeout=TIMEOUT, metadata=md("wrong")))
        check(c == grpc.StatusCode.UNAUTHENTICATED, "TLS: a wrong token -> %s %r" % (c.name, d))

        plain = grpc.insecure_channel(target)
        c, d = code_of(lambda: pbg.StateServiceStub(plain).Stats(pb.StatsRequest(), timeout=3.0, metadata=md()))
        check(c == grpc.StatusCode.UNAVAILABLE and len(d) > 0, "TLS: a plaintext client -> %s %r" % (c.name, d))
        plain.close()
        check(srv.alive(), "TLS: the server survived the plaintext client")
        st = stub.Stats(pb.StatsRequest(), timeout=TIMEOUT, metadata=md())
        check(len(st.runs) == 1 and st.runs[0].run == model.RUN and st.runs[0].step == 0,
              "TLS: still serving afterwards, its run unchanged")
        ch.close()
    finally:
        rc = srv.stop()
    check(rc == 0, "the TLS server exits 0 on SIGTERM")


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    binary = os.path.abspath(sys.argv[1])
    # A hard bound on the whole test: the servers are ended in finally blocks when it fires.
    t.set_deadline(120)
    workdir = tempfile.mkdtemp(prefix="zt-grpcio-")
    try:
        generate_stubs(os.path.join(workdir, "stubs"))
        from ztrain.v1 import state_pb2, state_pb2_grpc
        from zt_health import health_pb2, health_pb2_grpc
        mods = (state_pb2, state_pb2_grpc, health_pb2, health_pb2_grpc)
        run_plain(binary, workdir, mods)
        run_tls(binary, workdir, mods)
    finally:
        t.cancel_deadline()
        shutil.rmtree(workdir, ignore_errors=True)
    return t.summary()


if __name__ == "__main__":
    sys.exit(main())
