#!/usr/bin/env python3
"""The workload shapes of issue 26 on a real GPU with PyTorch, for hack/gpu-check.sh.

Workers (one process each, run under libvgpu by torch-measures.sh):

    torch_shapes.py run [--fake] [--barrier DIR] [--warmup S] SHAPE SECONDS

run SHAPE for SECONDS after S seconds of warm-up and print one line
"result shape=.. work=.. seconds=.." (work: kernels completed; for "requests" also the request
latency p99 in ms). With --barrier, the worker gets ready (tensors, graph, one step), creates
DIR/ready.<pid> and starts only once DIR/go exists, so that the processes of a run start together.

Figures (from the workers' output files, in the simulation's units, test_core_shared_sim):

    torch_shapes.py release DIR PID...        create DIR/go once every PID is ready
    torch_shapes.py util NAME TARGET --full F... --got F...
    torch_shapes.py pair LOW HIGH --low-out F --high-out F [--full F]
    torch_shapes.py latency --alone F --beside F --neighbour F --full F
    torch_shapes.py burst REQUEST ALLOWANCE --full F --got F

--fake replaces the GPU by a stand-in that needs no torch: a kernel takes a fixed time stretched by
100 / the core limit that the container's files under VGPU_TEST_ROOT give (cores.allowance, else
vgpu.config), the way the library would hold it. It exercises everything here but PyTorch:
`torch_shapes.py --selftest` and hack/gpu-check/selftest.sh. Standard library and torch only.
"""
import argparse
import os
import random
import sys
import time

# The shapes' sizes, fixed so that runs compare. fp32 without TF32, so the large matmul is long
# (3.7 TFLOP, expected about 70 ms on an H200, not yet measured; the simulation's synchronous GEMMs are 50-500 ms).
BIG_N = 12288  # "sync": one large matmul per step, then a synchronize
GRAPH_N, GRAPH_KERNELS = 1536, 100  # "graph": a CUDA graph of 100 small matmuls, replayed
SMALL_N, SMALL_BATCH = 1024, 32  # "async": small kernels, a synchronize every 32
FIXED_N, FIXED_BATCH = 2048, 16  # "fixed" (pairs, burst, the saturating neighbour)
REQUEST_KERNELS, REQUEST_RATE = 8, 20.0  # "requests": 8 fixed kernels each, Poisson 20/s
REQUEST_SEED = 26

# The fake GPU's kernel times, seconds at 100 %.
FAKE_NS = {"big": 0.020, "graph": 0.0001, "small": 0.0002, "fixed": 0.0005}

SHAPES = ("sync", "graph", "async", "fixed", "requests")


class TorchGPU:
    """The shapes' kernels on CUDA device 0 (the one CUDA_VISIBLE_DEVICES leaves)."""

    def __init__(self):
        import torch  # only here: the figures and the fake need no torch

        self.torch = torch
        torch.backends.cuda.matmul.allow_tf32 = False
        self.dev = torch.device("cuda", 0)
        self.mats = {}

    def _mats(self, name, n):
        if name not in self.mats:
            t = self.torch
            a = t.randn(n, n, device=self.dev)
            b = t.randn(n, n, device=self.dev)
            self.mats[name] = (a, b, t.empty(n, n, device=self.dev))
        return self.mats[name]

    def kernel(self, name):
        n = {"big": BIG_N, "small": SMALL_N, "fixed": FIXED_N}[name]
        a, b, c = self._mats(name, n)
        self.torch.mm(a, b, out=c)

    def graph(self):
        """A replay function of one CUDA graph of GRAPH_KERNELS matmuls."""
        t = self.torch
        a, b, c = self._mats("graph", GRAPH_N)

        def body():
            for _ in range(GRAPH_KERNELS):
                t.mm(a, b, out=c)

        side = t.cuda.Stream()  # warm up off the default stream, as torch's docs capture
        side.wait_stream(t.cuda.current_stream())
        with t.cuda.stream(side):
            body()
        t.cuda.current_stream().wait_stream(side)
        g = t.cuda.CUDAGraph()
        with t.cuda.graph(g):
            body()
        return g.replay

    def synchronize(self):
        self.torch.cuda.synchronize()


def fake_limit(root):
    """The core percent the library would follow in the container at root (contract §16, §4a):
    cores.allowance's when it parses, else vgpu.config's; 0 (no limit) is 100."""
    cfg = os.path.join(root, "etc/vgpu-dra/config")
    try:
        with open(os.path.join(cfg, "cores.allowance")) as f:
            lines = f.read().split("\n")
        if lines[0] == "version 1":
            for line in lines[1:]:
                w = line.split()
                if len(w) == 3 and w[0] == "gpu":
                    return int(w[2])
    except (OSError, ValueError):
        pass
    try:
        with open(os.path.join(cfg, "vgpu.config")) as f:
            for line in f:
                w = line.split()
                if len(w) == 5 and w[0] == "gpu":
                    return int(w[4]) or 100
    except (OSError, ValueError):
        pass
    return 100


class FakeGPU:
    """A stand-in GPU: kernels queue on one stream and each takes FAKE_NS[name] * 100 / limit;
    synchronize sleeps until the queue is done."""

    def __init__(self, limit=None):
        self.limit = limit if limit is not None else fake_limit(os.environ.get("VGPU_TEST_ROOT", "/"))
        self.done_at = 0.0

    def kernel(self, name, count=1):
        now = time.monotonic()
        self.done_at = max(now, self.done_at) + count * FAKE_NS[name] * 100.0 / self.limit

    def graph(self):
        return lambda: self.kernel("graph", GRAPH_KERNELS)

    def synchronize(self):
        wait = self.done_at - time.monotonic()
        if wait > 0:
            time.sleep(wait)


def make_step(gpu, shape):
    """One step of a shape, returning the kernels it completed (it ends synchronized)."""
    if shape == "sync":

        def step():
            gpu.kernel("big")
            gpu.synchronize()
            return 1

    elif shape == "graph":
        replay = gpu.graph()

        def step():
            replay()
            gpu.synchronize()
            return GRAPH_KERNELS

    elif shape in ("async", "fixed"):
        name, batch = ("small", SMALL_BATCH) if shape == "async" else ("fixed", FIXED_BATCH)

        def step():
            for _ in range(batch):
                gpu.kernel(name)
            gpu.synchronize()
            return batch

    else:
        raise ValueError("no step for shape " + shape)
    return step


def timed(step, seconds, clock=time.monotonic):
    """Runs step until seconds have passed; returns (work, elapsed), elapsed up to the end of the
    last step, so that a long step counts whole rather than being cut at the deadline."""
    start = clock()
    work = 0
    end = start
    while end - start < seconds:
        work += step()
        end = clock()
    return work, end - start


def poisson_arrivals(rate, seconds, seed):
    """Arrival times (s from the start) of a Poisson process of rate per second."""
    rng = random.Random(seed)
    out = []
    t = rng.expovariate(rate)
    while t < seconds:
        out.append(t)
        t += rng.expovariate(rate)
    return out


def serve_requests(request, arrivals, clock=time.monotonic, sleep=time.sleep):
    """Serves the requests in arrival order (open loop: one that arrives while another is served
    waits); returns each one's latency, completion less arrival, seconds."""
    start = clock()
    latencies = []
    for at in arrivals:
        now = clock() - start
        if now < at:
            sleep(at - now)
        request()
        latencies.append(clock() - start - at)
    return latencies


def p99(xs):
    """The 99th percentile the simulation takes (pkg/arbiter's latency test)."""
    s = sorted(xs)
    return s[int(0.99 * (len(s) - 1))]


def wait_barrier(barrier, timeout=300.0):
    open(os.path.join(barrier, "ready.%d" % os.getpid()), "w").close()
    deadline = time.monotonic() + timeout
    while not os.path.exists(os.path.join(barrier, "go")):
        if time.monotonic() > deadline:
            raise SystemExit("no go in %s after %.0f s" % (barrier, timeout))
        time.sleep(0.001)


def alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def release(barrier, pids, timeout=300.0, poll=0.01):
    """Creates barrier/go once each pid has its ready file; when one dies first or the timeout
    passes, creates it anyway (the others then finish) and returns the pids that never got ready."""
    deadline = time.monotonic() + timeout
    while True:
        missing = [p for p in pids if not os.path.exists(os.path.join(barrier, "ready.%d" % p))]
        if not missing or time.monotonic() > deadline or not all(alive(p) for p in missing):
            break
        time.sleep(poll)
    open(os.path.join(barrier, "go"), "w").close()
    return missing


def worker(gpu, shape, seconds, warmup, barrier=None, out=sys.stdout):
    if shape == "requests":
        step = make_step(gpu, "fixed")

        def request():
            for _ in range(REQUEST_KERNELS):
                gpu.kernel("fixed")
            gpu.synchronize()

        request()  # tensors made, kernels loaded
        if barrier:
            wait_barrier(barrier)
        timed(step, warmup)
        arrivals = poisson_arrivals(REQUEST_RATE, seconds, REQUEST_SEED)
        start = time.monotonic()
        lat = serve_requests(request, arrivals)
        elapsed = time.monotonic() - start
        print("result shape=requests work=%d seconds=%.3f requests=%d p99_ms=%.3f"
              % (len(lat) * REQUEST_KERNELS, elapsed, len(lat), 1000 * p99(lat)), file=out)
        return
    step = make_step(gpu, shape)
    step()
    if barrier:
        wait_barrier(barrier)
    timed(step, warmup)
    work, elapsed = timed(step, seconds)
    print("result shape=%s work=%d seconds=%.3f" % (shape, work, elapsed), file=out)


def parse_result(path):
    """The key=value fields of the worker's "result" line in its output file."""
    with open(path, errors="replace") as f:
        text = f.read()
    for line in text.splitlines():
        if line.startswith("result "):
            fields = dict(kv.split("=", 1) for kv in line.split()[1:])
            return {k: (v if k == "shape" else float(v)) for k, v in fields.items()}
    tail = "\n".join(text.splitlines()[-15:])
    raise SystemExit("no result from the worker in %s:\n%s" % (path, tail))


def rate(paths):
    """Kernels per second of processes that ran together: their rates added up."""
    return sum(r["work"] / r["seconds"] for r in map(parse_result, paths))


def verdict(ok):
    return "PASS" if ok else "MISS"


def util_line(name, target, full, got):
    """Utilisation in % of the GPU (work relative to the unlimited run) against the target;
    PASS within 2 pp, the simulation's mean-error target."""
    u = 100.0 * got / full
    return "%-36s target %2d%%: %5.1f%% (error %+5.1f pp) %s" % (name, target, u, u - target,
                                                                  verdict(abs(u - target) <= 2.0))


def pair_line(low, high, low_rate, high_rate, full=None):
    """Two containers' completed fixed-size kernels against the ratio of their limits, +-10 %."""
    want = high / low
    r = high_rate / low_rate
    share = ""
    if full:
        share = "GPU share %.1f%% / %.1f%%, " % (100 * low_rate / full, 100 * high_rate / full)
    return "two containers at %d%% and %d%%: %scompleted kernels 1:%.2f (target 1:%g +-10 %%) %s" % (
        low, high, share, r, want, verdict(abs(r / want - 1) <= 0.10))


def latency_line(alone_ms, beside_ms, neighbour_util):
    ratio = beside_ms / alone_ms
    return ("guaranteed request latency p99: alone %.1f ms, beside best-effort %.1f ms, x%.2f "
            "(target <= 1.10) %s; best-effort at %.1f%% of the GPU" % (
                alone_ms, beside_ms, ratio, verdict(ratio <= 1.10), neighbour_util))


def burst_line(request, allowance, full, got):
    u = 100.0 * got / full
    return "burst: request %d%%, allowance %d%%, alone: %.1f%% of the GPU (target >= 90%%) %s" % (
        request, allowance, u, verdict(u >= 90.0))


def selftest():
    """The measuring, parsing and printing above on the fake GPU, asserting what a reader of
    gpu-check's output relies on. No timing is asserted (the machine may be loaded)."""
    import tempfile

    failures = []

    def check(ok, what):
        print("%s %s" % ("ok  " if ok else "FAIL", what))
        if not ok:
            failures.append(what)

    # timed: counts whole steps, elapsed through the last one.
    ticks = iter(range(100))
    w, e = timed(lambda: 3, 5, clock=lambda: next(ticks))
    check((w, e) == (15, 5), "timed counts whole steps up to the first past the deadline: %r" % ((w, e),))
    arr = poisson_arrivals(20.0, 10.0, 1)
    check(all(a < b for a, b in zip(arr, arr[1:])) and 150 < len(arr) < 250 and arr == poisson_arrivals(20.0, 10.0, 1),
          "Poisson arrivals: ordered, about rate x seconds, the same for a seed (%d in 10 s at 20/s)" % len(arr))
    clock = [0.0]
    lat = serve_requests(lambda: clock.__setitem__(0, clock[0] + 2), [1, 2, 10],
                         clock=lambda: clock[0], sleep=lambda s: clock.__setitem__(0, clock[0] + s))
    check(lat == [2, 3, 2], "request latency includes waiting behind the one before: %r" % lat)
    check(p99(list(range(1, 101))) == 99 and p99([5]) == 5, "p99 is the simulation's index")
    check(util_line("x", 30, 200.0, 61.0).endswith("30.5% (error  +0.5 pp) PASS"), util_line("x", 30, 200.0, 61.0))
    check(util_line("x", 10, 100.0, 13.0).endswith("MISS"), "3 pp off is a MISS")
    check("1:9.00 (target 1:9 +-10 %) PASS" in pair_line(10, 90, 1.0, 9.0, 10.0), pair_line(10, 90, 1.0, 9.0, 10.0))
    check(pair_line(10, 90, 1.0, 7.0).endswith("MISS"), "1:7 is a MISS (HAMi#2863's split)")
    check(latency_line(10.0, 11.5, 9.0).split("; ")[0].endswith("x1.15 (target <= 1.10) MISS"), latency_line(10.0, 11.5, 9.0))
    check(burst_line(30, 100, 100.0, 95.0).endswith("95.0% of the GPU (target >= 90%) PASS"), burst_line(30, 100, 100.0, 95.0))

    with tempfile.TemporaryDirectory() as d:
        cfg = os.path.join(d, "etc/vgpu-dra/config")
        os.makedirs(cfg)
        with open(os.path.join(cfg, "vgpu.config"), "w") as f:
            f.write("version 1\npod p\ncontainer c\ngpu 0 GPU-x 0 30\n")
        check(fake_limit(d) == 30, "the fake follows vgpu.config's cores")
        with open(os.path.join(cfg, "cores.allowance"), "w") as f:
            f.write("version 1\ngpu GPU-x 100\n")
        check(fake_limit(d) == 100, "and cores.allowance over it")
        with open(os.path.join(cfg, "cores.allowance"), "w") as f:
            f.write("version 2\ngpu GPU-x 100\n")
        check(fake_limit(d) == 30, "but not a malformed one (the library never bursts on its own)")

        # Every shape through the worker on the fake GPU, its output parsed back.
        for shape in SHAPES:
            path = os.path.join(d, shape + ".out")
            with open(path, "w") as out:
                worker(FakeGPU(limit=100), shape, 0.3, 0.05, out=out)
            r = parse_result(path)
            ran = r["seconds"] >= 0.3 if shape != "requests" else r["requests"] > 0 and r["p99_ms"] > 0
            check(r["shape"] == shape and r["work"] > 0 and ran, "worker %s: %r" % (shape, r))
        bad = os.path.join(d, "bad.out")
        with open(bad, "w") as f:
            f.write("Traceback (most recent call last):\nRuntimeError: CUDA error\n")
        try:
            parse_result(bad)
            check(False, "a worker without a result is an error")
        except SystemExit as e:
            check("RuntimeError: CUDA error" in str(e), "a worker without a result is an error that shows its output")

        # The barrier: release waits for every ready file, and gives up on a dead worker.
        b = os.path.join(d, "b")
        os.mkdir(b)
        open(os.path.join(b, "ready.%d" % os.getpid()), "w").close()
        check(release(b, [os.getpid()], timeout=5) == [] and os.path.exists(os.path.join(b, "go")),
              "release creates go once every worker is ready")
        os.remove(os.path.join(b, "go"))
        check(release(b, [os.getpid(), 2 ** 22 + 1], timeout=5) == [2 ** 22 + 1] and os.path.exists(os.path.join(b, "go")),
              "release gives up on a worker that is gone, and lets the others go")
    print("selftest: %d failed" % len(failures))
    return 1 if failures else 0


def main(argv):
    if argv == ["--selftest"]:
        return selftest()
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--fake", action="store_true")
    r.add_argument("--barrier")
    r.add_argument("--warmup", type=float, default=1.0)
    r.add_argument("shape", choices=SHAPES)
    r.add_argument("seconds", type=float)
    rel = sub.add_parser("release")
    rel.add_argument("dir")
    rel.add_argument("pids", type=int, nargs="+")
    u = sub.add_parser("util")
    u.add_argument("name")
    u.add_argument("target", type=int)
    u.add_argument("--full", nargs="+", required=True)
    u.add_argument("--got", nargs="+", required=True)
    p = sub.add_parser("pair")
    p.add_argument("low", type=int)
    p.add_argument("high", type=int)
    p.add_argument("--low-out", required=True)
    p.add_argument("--high-out", required=True)
    p.add_argument("--full")
    lt = sub.add_parser("latency")
    lt.add_argument("--alone", required=True)
    lt.add_argument("--beside", required=True)
    lt.add_argument("--neighbour", required=True)
    lt.add_argument("--full", required=True)
    bu = sub.add_parser("burst")
    bu.add_argument("request", type=int)
    bu.add_argument("allowance", type=int)
    bu.add_argument("--full", required=True)
    bu.add_argument("--got", required=True)
    a = ap.parse_args(argv)

    if a.cmd == "run":
        worker(FakeGPU() if a.fake else TorchGPU(), a.shape, a.seconds, a.warmup, a.barrier)
    elif a.cmd == "release":
        missing = release(a.dir, a.pids)
        if missing:
            print("workers never ready: %s" % " ".join(map(str, missing)), file=sys.stderr)
            return 1
    elif a.cmd == "util":
        print(util_line(a.name, a.target, rate(a.full), rate(a.got)))
    elif a.cmd == "pair":
        full = rate([a.full]) if a.full else None
        print(pair_line(a.low, a.high, rate([a.low_out]), rate([a.high_out]), full))
    elif a.cmd == "latency":
        print(latency_line(parse_result(a.alone)["p99_ms"], parse_result(a.beside)["p99_ms"],
                           100.0 * rate([a.neighbour]) / rate([a.full])))
    elif a.cmd == "burst":
        print(burst_line(a.request, a.allowance, rate([a.full]), rate([a.got])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
