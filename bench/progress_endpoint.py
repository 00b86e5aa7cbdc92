"""The progress endpoint under attack: peak memory under a flood, service during a slowloris.

The endpoint (controller/progress_server.py, with the real hub and the tree's real token check:
around a fake TokenReview function for a tree that sends TokenReviews, with a fake issuer's keys
and a real signed token for one that verifies tokens itself) runs in a child process of its own, so
its peak RSS (``ru_maxrss``) is its own; this process attacks it on 127.0.0.1 only, with
bounded counts and times. Side by side in one invocation:

- ``before``: the code of a git worktree (``--before-tree``, e.g. ``git worktree add
  /tmp/before <commit>``), imported through a small import shim;
- ``after``: this checkout.

Measured, for each:

- **flood**: ``--flood N`` HTTPS POSTs with ``--name-kib`` KiB random run names and no token
  (8 client threads, each from its own loopback address, one connection at a time, as fast as
  the server answers): the child's peak
  RSS before and after, and what it still holds (its refusal-log set);
- **slowloris**: real reporters (4 threads, a fresh HTTPS connection per report as the trainer
  makes, an accepted token: 200) for ``--seconds`` s alone, then again while ``--slow 500``
  connections send a TLS record header and then one byte every 2 s (reconnecting when cut),
  from 127.0.0.2 (one address) and from 127.0.0.2-127.0.0.251 (250 addresses, 2 each): the
  reports per second served, and the child's thread count;
- **reconciles meanwhile**: the same child also runs the real operator (kopf, our handlers)
  against kmock; ``--runs`` MegDetRuns are applied and the time until all are handled is taken
  without and with the slowloris.

    .venv/bin/python -m bench.progress_endpoint [--before-tree DIR] [--flood 10000]
        [--name-kib 30] [--slow 500] [--seconds 10] [--runs 20] [--quick] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import inspect
import json
import os
import random
import selectors
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "bench-reporter-token"
NS = "bench"
RUN = "r1"

# -- the child: the endpoint (and, on request, an operator against kmock) --------------------


_SHIM = """
import importlib.machinery, importlib.util, os, sys
_TREE = os.environ["MEGDET_TREE"]
_SUB = {"trainer", "image", "controller", "monitoring"}
class _Finder:
    @staticmethod
    def find_spec(fullname, path=None, target=None):
        parts = fullname.split(".")
        if parts[0] != "megdet" or len(parts) > 2 or (len(parts) == 2 and parts[1] not in _SUB):
            return None
        folder = os.path.join(_TREE, "megdet" if len(parts) == 1 else parts[1])
        return importlib.util.spec_from_file_location(
            fullname, os.path.join(folder, "__init__.py"), submodule_search_locations=[folder])
sys.meta_path.insert(0, _Finder())
"""


def _child_env(tree: Path | None, shim_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    if tree is not None:
        shim_dir.mkdir(parents=True, exist_ok=True)
        (shim_dir / "sitecustomize.py").write_text(_SHIM)
        env["MEGDET_TREE"] = str(tree)
        env["PYTHONPATH"] = str(shim_dir)
    return env


def _rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def _fake_auth(tree: Path) -> tuple[Any, str]:
    """The tree's RunAuthenticator and the token of the pod r1-master-0 for the run's audience.
    A tree that verifies tokens itself (controller/progress_auth.py: IssuerKeys) gets a fake
    issuer (an RSA key made here, its discovery document and JWKS) and a real signed token; an
    older tree a fake TokenReview that knows TOKEN. Whatever else the decision asks (the run,
    the pod's binding) is answered yes."""
    import dataclasses
    import inspect
    from types import SimpleNamespace

    from megdet import progress as protocol

    audience_args = len(inspect.signature(protocol.run_audience).parameters)

    def audience(name: str) -> str:
        return protocol.run_audience(*(NS, name, f"uid-{name}")[:audience_args])

    around = {
        "runs": lambda ns, name: SimpleNamespace(name=name, uid=f"uid-{name}", job=name),
        "binding": SimpleNamespace(refusal=lambda *a, **k: None),
    }
    try:  # a tree that verifies the tokens with the issuer's keys
        from megdet.controller.progress_auth import IssuerKeys, RunAuthenticator
    except ImportError:
        from megdet.controller.tokenauth import RunAuthenticator

        IssuerKeys = None
    if IssuerKeys is not None:
        import jwt
        from cryptography.hazmat.primitives.asymmetric import rsa

        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
        issuer = "https://kubernetes.default.svc.cluster.local"
        documents = {
            "/.well-known/openid-configuration": {"issuer": issuer, "jwks_uri": issuer + "/k"},
            "/openid/v1/jwks": {"keys": [{**jwk, "kid": "k1", "use": "sig", "alg": "RS256"}]},
        }
        now = int(time.time())
        claims = {
            "iss": issuer, "aud": [audience(RUN)], "sub": f"system:serviceaccount:{NS}:default",
            "exp": now + 86400, "nbf": now, "iat": now,
            "kubernetes.io": {"namespace": NS, "pod": {"name": f"{RUN}-master-0", "uid": "p"}},
        }  # fmt: skip
        token = jwt.encode(claims, key, algorithm="RS256", headers={"kid": "k1"})
        return RunAuthenticator(IssuerKeys(documents.__getitem__), **around), token

    def review(token: str, audiences: list[str]) -> dict[str, Any]:
        if token != TOKEN:
            return {"authenticated": False}
        return {
            "authenticated": True,
            "audiences": [audience(RUN)],
            "user": {
                "username": f"system:serviceaccount:{NS}:default",
                "extra": {
                    "authentication.kubernetes.io/pod-name": [f"{RUN}-master-0"],
                    "authentication.kubernetes.io/pod-uid": ["pod-uid"],
                },
            },
        }

    declared = {f.name for f in dataclasses.fields(RunAuthenticator)}
    auth = RunAuthenticator(review, **{k: v for k, v in around.items() if k in declared})
    return auth, TOKEN


class _Kmock:
    """kmock and the real operator in this (child) process, on their own loop and thread."""

    def __init__(self) -> None:
        import asyncio

        folder = str(Path(os.environ.get("MEGDET_TREE", ROOT)) / "tests" / "controller")
        sys.path.insert(0, folder)
        import kmock_helpers

        self.h = kmock_helpers
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.stop = asyncio.Event()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        asyncio.run_coroutine_threadsafe(self._serve(), self.loop)
        if not self.ready.wait(60):
            raise RuntimeError("kmock and the operator did not start")

    async def _serve(self) -> None:
        import kmock

        h = self.h
        async with h.Emulator() as api, kmock.Server(api):
            h.declare_resources(api)
            api.objects["v1/namespaces", None, h.NAMESPACE] = {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": h.NAMESPACE},
            }
            self.api = api
            self.op = await h.start_operator(str(api.url))
            self.ready.set()
            await self.stop.wait()
            await h.stop_operator(self.op)

    def reconcile(self, runs: int, tag: str) -> float:
        import asyncio

        h = self.h

        async def go() -> float:
            names = [f"{tag}-{i}" for i in range(runs)]
            started = time.perf_counter()
            for name in names:
                await h.apply(self.api, h.run_body(name))
            await h.reconciled(self.api, *names, timeout=300)
            return time.perf_counter() - started

        return asyncio.run_coroutine_threadsafe(go(), self.loop).result(400)


def serve_child(tls: bool, with_kmock: bool) -> None:
    """The child's main: serve, print the port, then answer commands read from stdin."""
    import logging

    logging.disable(logging.CRITICAL)  # the refusal warnings would only cost the child time
    # What the controller process has loaded anyway (kopf, the handlers, the Helm engine), so
    # that both trees start from the same memory whatever their endpoint modules import.
    for module in ("megdet.controller.operator", "megdet.controller.planning"):
        importlib.import_module(module)
    from megdet.controller.progress_hub import ProgressHub
    from megdet.controller.progress_server import ProgressServer

    tree = Path(os.environ.get("MEGDET_TREE", ROOT))
    runs = {(NS, RUN): {"metadata": {"name": RUN, "namespace": NS, "uid": f"uid-{RUN}"},
                        "spec": {"target": "pytorchjob"}, "status": {}}}  # fmt: skip
    if "view" in inspect.signature(ProgressHub).parameters:  # the run's view from the watch
        from megdet.controller.progress_binding import run_ref

        view = lambda ns, n: run_ref(runs.get((ns, n)))  # noqa: E731
        hub = ProgressHub(view, view, lambda *a: None)
    else:  # a tree whose hub reads the run itself and posts the milestone events
        hub = ProgressHub(lambda ns, n: runs.get((ns, n)), lambda *a: None, lambda *a: None)
    context = ca = None
    if tls:
        from megdet.controller.progress_ca import ServingCert

        cert = ServingCert.generate(["localhost"])
        context, ca = cert.context, cert.ca_pem
    auth, token = _fake_auth(tree)
    server = ProgressServer(("127.0.0.1", 0), hub, auth, context)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    kmock_side = _Kmock() if with_kmock else None
    print(json.dumps({"port": server.server_address[1], "ca": ca, "token": token}), flush=True)
    for line in sys.stdin:
        command = line.split()
        if not command:
            continue
        if command[0] == "stats":
            held = getattr(server, "logged", None)
            if held is None:
                held = getattr(server, "_logged", {})
            answer: dict[str, Any] = {
                "rss_kib": _rss_kib("VmRSS"),
                "peak_kib": _rss_kib("VmHWM"),
                "threads": threading.active_count(),
                "logged": len(held),
                # Verdicts kept per token (a tree without a cache keeps none).
                "cached": server.auth.cached() if hasattr(server.auth, "cached") else 0,
                "hub_runs": len(hub.runs),
            }
        elif command[0] == "reconcile" and kmock_side is not None:
            answer = {"seconds": kmock_side.reconcile(int(command[1]), command[2])}
        elif command[0] == "stop":
            break
        else:
            answer = {"error": f"unknown command {command}"}
        print(json.dumps(answer), flush=True)


class _Child:
    def __init__(self, tree: Path | None, tls: bool, with_kmock: bool, shim: Path) -> None:
        args = [sys.executable, "-m", "bench.progress_endpoint", "--serve"]
        args += ["--tls"] if tls else []
        args += ["--with-kmock"] if with_kmock else []
        self.proc = subprocess.Popen(
            args,
            cwd=str(ROOT),
            env=_child_env(tree, shim),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            # The before tree prints a traceback per cut connection; neither child's stderr is
            # a result (a child that fails shows as a missing answer on stdout).
            stderr=subprocess.DEVNULL,
            text=True,
        )
        first = json.loads(self.proc.stdout.readline())  # type: ignore[union-attr]
        self.port, self.ca, self.token = first["port"], first["ca"], first["token"]

    def ask(self, command: str) -> dict[str, Any]:
        assert self.proc.stdin and self.proc.stdout
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self) -> None:
        try:
            assert self.proc.stdin
            self.proc.stdin.write("stop\n")
            self.proc.stdin.close()
            self.proc.wait(30)
        except Exception:
            self.proc.kill()
            self.proc.wait(30)


# -- the attacks ----------------------------------------------------------------------------


def _status_path(name: str) -> str:
    return f"/apis/megdet.io/v1alpha1/namespaces/{NS}/megdetruns/{name}/status"


def flood(port: int, ca: str, count: int, name_kib: int, threads: int = 8) -> dict[str, Any]:
    """``count`` HTTPS POSTs without a token, each naming a fresh random run of name_kib KiB."""
    ctx = ssl.create_default_context(cadata=ca)
    done = [0]
    codes: dict[str, int] = {}
    lock = threading.Lock()
    started = time.perf_counter()

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        while True:
            with lock:
                if done[0] >= count:
                    return
                done[0] += 1
            name = format(rng.getrandbits(4 * 1024 * name_kib), "x").zfill(1024 * name_kib)
            request = (f"POST {_status_path(name)} HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
                       "Connection: close\r\n\r\n{}").encode()  # fmt: skip
            try:
                # A loopback address per thread: the address's cap (8) is not what is measured.
                raw = socket.create_connection(
                    ("127.0.0.1", port), timeout=30, source_address=(f"127.0.1.{1 + seed}", 0)
                )
                with ctx.wrap_socket(raw, server_hostname="localhost") as sock:
                    sock.sendall(request)
                    head = sock.recv(64).split(b" ", 2)
                    code = head[1].decode() if len(head) > 1 else "closed"
            except OSError as err:
                code = type(err).__name__
            with lock:
                codes[code] = codes.get(code, 0) + 1

    pool = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return {"requests": count, "seconds": time.perf_counter() - started, "answers": codes}


class Slowloris:
    """``count`` connections that send a TLS record header, then a byte every ``every`` s, from
    ``sources`` loopback addresses; a connection the server closes is opened again."""

    def __init__(self, port: int, count: int, sources: int, every: float = 2.0) -> None:
        self.port, self.count, self.sources, self.every = port, count, sources, every
        self.stop = threading.Event()
        self.reconnects = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _open(self, i: int) -> socket.socket | None:
        source = f"127.0.0.{2 + i % self.sources}"
        try:
            sock = socket.create_connection(
                ("127.0.0.1", self.port), timeout=5, source_address=(source, 0)
            )
            sock.sendall(b"\x16\x03\x01\x02\x00")  # a handshake record of 512 bytes: to come
            sock.setblocking(False)
            return sock
        except OSError:
            return None

    def _run(self) -> None:
        sel = selectors.DefaultSelector()
        socks: dict[int, socket.socket | None] = {i: self._open(i) for i in range(self.count)}
        for i, sock in socks.items():
            if sock is not None:
                sel.register(sock, selectors.EVENT_READ, i)
        while not self.stop.is_set():
            deadline = time.monotonic() + self.every
            while time.monotonic() < deadline and not self.stop.is_set():
                for key, _ in sel.select(timeout=0.2):
                    i = key.data
                    sock = key.fileobj
                    try:
                        data = sock.recv(4096)  # type: ignore[union-attr]
                    except (BlockingIOError, InterruptedError):
                        continue
                    except OSError:
                        data = b""
                    if not data:  # cut by the server: open another
                        sel.unregister(sock)
                        sock.close()  # type: ignore[union-attr]
                        socks[i] = None
            for i, sock in list(socks.items()):
                if sock is None:
                    self.reconnects += 1
                    socks[i] = sock = self._open(i)
                    if sock is not None:
                        sel.register(sock, selectors.EVENT_READ, i)
                    continue
                with contextlib.suppress(OSError):
                    sock.send(b"\x01")
        for sock in socks.values():
            if sock is not None:
                sock.close()

    def __enter__(self) -> Slowloris:
        self.thread.start()
        time.sleep(1.0)  # let the connections open before the reporters start
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop.set()
        self.thread.join(30)


def reporters(
    port: int, ca: str, seconds: float, threads: int = 4, token: str = TOKEN
) -> dict[str, Any]:
    """Real reporters for ``seconds``: fresh HTTPS connection per report, accepted token."""
    import http.client

    from megdet import progress as protocol

    ctx = ssl.create_default_context(cadata=ca)
    body = json.dumps(
        protocol.to_request(
            protocol.Progress(iteration=1, max_iter=100, updated_time="2026-01-01T00:00:00Z")
        )
    ).encode()
    counts: dict[str, int] = {}
    lock = threading.Lock()
    stop = time.monotonic() + seconds

    def worker() -> None:
        while time.monotonic() < stop:
            try:
                conn = http.client.HTTPSConnection("localhost", port, context=ctx, timeout=10)
                conn.request(
                    "POST",
                    _status_path(RUN),
                    body,
                    {"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
                )
                result = str(conn.getresponse().status)
                conn.close()
            except (OSError, http.client.HTTPException) as err:
                result = type(err).__name__
            with lock:
                counts[result] = counts.get(result, 0) + 1

    pool = [threading.Thread(target=worker) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return {"seconds": seconds, "answers": counts, "ok_per_s": counts.get("200", 0) / seconds}


# -- the comparison -------------------------------------------------------------------------


def measure(tree: Path | None, args: Any, shim: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    child = _Child(tree, tls=True, with_kmock=False, shim=shim)
    try:
        out["flood_start"] = child.ask("stats")
        out["flood"] = flood(child.port, child.ca, args.flood, args.name_kib)
        out["flood_end"] = child.ask("stats")
    finally:
        child.close()
    child = _Child(tree, tls=True, with_kmock=True, shim=shim)
    try:
        out["alone"] = reporters(child.port, child.ca, args.seconds, token=child.token)
        out["reconcile_alone_s"] = child.ask(f"reconcile {args.runs} quiet")["seconds"]
        for label, sources in (("one_source", 1), ("many_sources", 250)):
            with Slowloris(child.port, args.slow, sources) as attack:
                out[label] = reporters(child.port, child.ca, args.seconds, token=child.token)
                out[label]["threads"] = child.ask("stats")["threads"]
                out[label]["reconcile_s"] = child.ask(f"reconcile {args.runs} {label[:4]}")[
                    "seconds"
                ]
                out[label]["slow_reconnects"] = attack.reconnects
        out["end"] = child.ask("stats")
    finally:
        child.close()
    return out


def run(quick: bool = False, before_tree: str | None = None, **overrides: Any) -> dict[str, Any]:
    args = argparse.Namespace(
        flood=300 if quick else 10_000,
        name_kib=30,
        slow=40 if quick else 500,
        seconds=2.0 if quick else 10.0,
        runs=3 if quick else 20,
    )
    for key, value in overrides.items():
        if value is not None:
            setattr(args, key, value)
    result: dict[str, Any] = {"params": vars(args).copy(), "trees": {}}
    with tempfile.TemporaryDirectory(prefix="megdet-bench-shim-") as shim:
        if before_tree:
            result["trees"]["before"] = measure(Path(before_tree).resolve(), args, Path(shim))
        result["trees"]["after"] = measure(None, args, Path(shim))
    return result


def _mib(kib: int) -> str:
    return f"{kib / 1024:.0f} MiB"


def print_report(result: dict[str, Any]) -> None:
    p = result["params"]
    trees = result["trees"]
    print(f"flood: {p['flood']} POSTs, {p['name_kib']} KiB random names, no token")
    for label, r in trees.items():
        start, end = r["flood_start"], r["flood_end"]
        print(
            f"  {label:6} peak RSS {_mib(start['peak_kib'])} -> {_mib(end['peak_kib'])}, "
            f"RSS after {_mib(end['rss_kib'])}, refusal-log set {end['logged']}, "
            f"cache {end['cached']}, {r['flood']['requests'] / r['flood']['seconds']:.0f} req/s "
            f"answers {r['flood']['answers']}"
        )
    print(f"reporters (4 threads, HTTPS, fresh connection each) for {p['seconds']:g} s; "
          f"slowloris {p['slow']} connections; {p['runs']} runs reconciled on kmock")  # fmt: skip
    for label, r in trees.items():
        print(f"  {label:6} alone: {r['alone']['ok_per_s']:.0f} reports/s, "
              f"reconcile {r['reconcile_alone_s']:.2f} s")  # fmt: skip
        for attack in ("one_source", "many_sources"):
            a = r[attack]
            print(
                f"  {label:6} slowloris {attack}: {a['ok_per_s']:.0f} reports/s "
                f"({a['ok_per_s'] / max(r['alone']['ok_per_s'], 1e-9):.2f} of alone), "
                f"answers {a['answers']}, threads {a['threads']}, "
                f"reconcile {a['reconcile_s']:.2f} s, slow reconnects {a['slow_reconnects']}"
            )
        print(f"  {label:6} peak RSS of the slowloris child {_mib(r['end']['peak_kib'])}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--tls", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--with-kmock", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--before-tree", help="a git worktree of the code to compare with")
    parser.add_argument("--flood", type=int)
    parser.add_argument("--name-kib", type=int)
    parser.add_argument("--slow", type=int)
    parser.add_argument("--seconds", type=float)
    parser.add_argument("--runs", type=int)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.serve:
        serve_child(args.tls, args.with_kmock)
        return
    for name in ("flood", "name_kib", "slow", "runs"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    if args.seconds is not None and not args.seconds > 0:
        parser.error(f"--seconds must be > 0, got {args.seconds}")
    result = run(
        args.quick,
        args.before_tree,
        flood=args.flood,
        name_kib=args.name_kib,
        slow=args.slow,
        seconds=args.seconds,
        runs=args.runs,
    )
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print_report(result)


if __name__ == "__main__":
    main()
