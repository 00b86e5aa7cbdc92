"""Build the control plane's binaries from upstream Go modules, once per machine.

Versions are pinned in pyproject.toml (``[tool.megdet.cluster]``), beside the project's other
pins. Binaries land in a cache outside the work tree keyed by component and version
(``$MEGDET_CLUSTER_CACHE``, default ``~/.cache/megdet/cluster``), so only the first run on a
machine compiles anything; nothing built or downloaded is committed.

Two ways to build, chosen per module:

* Modules without ``replace`` directives (kwok, Helm, the Kubeflow operators, Kueue) build
  with ``go install pkg@version``, which uses exactly the module's own go.mod.
* ``k8s.io/kubernetes`` and etcd's server module require their sibling modules at placeholder
  versions with ``replace => ./staging/...`` (or ``../api``), so ``go install pkg@version``
  refuses them. For those we write a small wrapper go.mod in the cache that requires the module
  and replaces each sibling by its published version (the list is read from that version's own
  go.mod, so it follows the pin), then ``go build`` inside it.

Kubernetes reports the version stamped into it by ldflags (upstream ``hack/lib/version.sh``);
without it the server says ``v0.0.0-master`` and Helm's ``.Capabilities.KubeVersion`` and any
chart ``kubeVersion`` constraint break.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import dataclasses
import fcntl
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable, Sequence
from pathlib import Path

from cluster import procs

ROOT = Path(__file__).resolve().parent.parent


class BuildError(RuntimeError):
    """A build step failed; the message names the component and the fix."""


def pins() -> dict[str, str]:
    """The control-plane versions pinned in pyproject.toml."""
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return {k: str(v) for k, v in data["tool"]["megdet"]["cluster"].items()}


def cache_dir() -> Path:
    return Path(os.environ.get("MEGDET_CLUSTER_CACHE", Path.home() / ".cache/megdet/cluster"))


@dataclasses.dataclass(frozen=True)
class Component:
    """One upstream module and the binaries built from it."""

    name: str  # the pin's key in [tool.megdet.cluster]
    module: str
    #: binary name -> package path inside the module
    binaries: dict[str, str]
    #: True: build inside a wrapper go.mod that replaces the module's local siblings
    wrapper: bool = False
    #: ldflags -X settings, given the pinned version
    stamp: Callable[[str], dict[str, str]] | None = None
    #: sibling modules replaced in the wrapper, given the module's own go.mod text and version
    siblings: Callable[[str, str], dict[str, str]] | None = None
    #: binaries only the real node runs (cluster.node): built when it starts, so a
    #: kwok-only cluster's first build does not wait for them
    node_binaries: frozenset[str] = frozenset()


def _kube_stamp(version: str) -> dict[str, str]:
    major, minor = version.lstrip("v").split(".")[:2]
    values = {
        "gitVersion": version,
        "gitMajor": major,
        "gitMinor": minor,
        "gitTreeState": "clean",
        "gitCommit": "0" * 40,
        "buildDate": "1970-01-01T00:00:00Z",
    }
    flags = {}
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        for key, value in values.items():
            flags[f"{pkg}.{key}"] = value
    return flags


def _kube_siblings(gomod: str, version: str) -> dict[str, str]:
    """``k8s.io/x => ./staging/src/k8s.io/x`` becomes ``k8s.io/x => k8s.io/x v0.MINOR.PATCH``."""
    staging = "v0." + ".".join(version.lstrip("v").split(".")[1:3])
    names = re.findall(r"^\s*(k8s\.io/[\w.-]+)\s*=>\s*\./staging/", gomod, flags=re.M)
    if not names:
        raise BuildError(f"k8s.io/kubernetes {version}: no staging replace lines in its go.mod")
    return {name: staging for name in names}


def _etcd_siblings(gomod: str, version: str) -> dict[str, str]:
    """``go.etcd.io/etcd/api/v3 => ../api`` and the like become the same published version."""
    names = re.findall(r"^\s*(go\.etcd\.io/etcd/[\w./-]+)\s*=>\s*\.\./", gomod, flags=re.M)
    if not names:
        raise BuildError(f"etcd {version}: no sibling replace lines in its go.mod")
    return {name: version for name in names}


COMPONENTS: dict[str, Component] = {
    c.name: c
    for c in (
        Component(
            "kubernetes",
            "k8s.io/kubernetes",
            {
                "kube-apiserver": "k8s.io/kubernetes/cmd/kube-apiserver",
                "kube-controller-manager": "k8s.io/kubernetes/cmd/kube-controller-manager",
                "kube-scheduler": "k8s.io/kubernetes/cmd/kube-scheduler",
                "kubectl": "k8s.io/kubernetes/cmd/kubectl",
                # The real node (cluster.node).
                "kubelet": "k8s.io/kubernetes/cmd/kubelet",
                "kube-proxy": "k8s.io/kubernetes/cmd/kube-proxy",
            },
            wrapper=True,
            stamp=_kube_stamp,
            siblings=_kube_siblings,
            node_binaries=frozenset({"kubelet", "kube-proxy"}),
        ),
        # An older API server, only to check that the CRD installs on the oldest served minor.
        Component(
            "kubernetes_previous",
            "k8s.io/kubernetes",
            {"kube-apiserver-previous": "k8s.io/kubernetes/cmd/kube-apiserver"},
            wrapper=True,
            stamp=_kube_stamp,
            siblings=_kube_siblings,
        ),
        Component(
            "etcd",
            "go.etcd.io/etcd/server/v3",
            {"etcd": "go.etcd.io/etcd/server/v3"},
            wrapper=True,
            siblings=_etcd_siblings,
        ),
        Component(
            "kwok",
            "sigs.k8s.io/kwok",
            {"kwok": "sigs.k8s.io/kwok/cmd/kwok"},
            stamp=lambda v: {"sigs.k8s.io/kwok/pkg/consts.Version": v},
        ),
        Component(
            "helm",
            "helm.sh/helm/v3",
            {"helm": "helm.sh/helm/v3/cmd/helm"},
            stamp=lambda v: {"helm.sh/helm/v3/internal/version.version": v},
        ),
        Component(
            "training_operator",
            "github.com/kubeflow/training-operator",
            {"training-operator": "github.com/kubeflow/training-operator/cmd/training-operator.v1"},
        ),
        Component(
            "trainer",
            "github.com/kubeflow/trainer/v2",
            {
                "trainer-controller-manager": (
                    "github.com/kubeflow/trainer/v2/cmd/trainer-controller-manager"
                )
            },
        ),
        # The proxy refuses JobSet's version list (403), which `go install pkg@v` reads for
        # deprecations; a wrapper module names the version and never asks for the list.
        Component("jobset", "sigs.k8s.io/jobset", {"jobset": "sigs.k8s.io/jobset"}, wrapper=True),
        Component("kueue", "sigs.k8s.io/kueue", {"kueue": "sigs.k8s.io/kueue/cmd/kueue"}),
        # The real node's cluster DNS (no replace directives; its version is a constant in
        # coremain/version.go, the commit an ldflag of its Makefile).
        Component(
            "coredns",
            "github.com/coredns/coredns",
            {"coredns": "github.com/coredns/coredns"},
            stamp=lambda v: {"github.com/coredns/coredns/coremain.GitCommit": v},
        ),
        # Linters of what the charts and the controller render (docs/helm.md, "Linting what
        # the controller creates"); not part of any cluster.
        Component(
            "kube_score",
            "github.com/zegl/kube-score",
            {"kube-score": "github.com/zegl/kube-score/cmd/kube-score"},
            stamp=lambda v: {"main.version": v},
        ),
        Component(
            "kubeconform",
            "github.com/yannh/kubeconform",
            {"kubeconform": "github.com/yannh/kubeconform/cmd/kubeconform"},
            stamp=lambda v: {"main.version": v},
        ),
    )
}

#: What `make cluster` needs; the rest (Trainer v2, JobSet, Kueue) build on demand.
CORE = ("kubernetes", "etcd", "kwok", "helm", "training_operator")
#: What the real node needs besides the kubelet and kube-proxy (in "kubernetes").
NODE = ("coredns",)


def go_build_cache() -> Path | None:
    """This process's own Go build cache (``<cache>/go-build/<pid>``), deleted when the
    process ends: the binaries are what is kept; the compiled packages behind them were 9.2 GB
    after a full build, held for nothing in Go's default cache. None when the user set
    ``GOCACHE`` (theirs is used, and kept)."""
    return _private_go_dir("GOCACHE", "go-build")


def go_module_cache() -> Path | None:
    """The builds' own Go module cache (``<cache>/go-mod/<pid>``), deleted when the process
    ends, as the build cache is: the builds' dependencies were 3.7 GB of sources in Go's
    default module cache (``~/go/pkg/mod``), kept for nothing once the binaries are built.
    The sources the cluster reads at run time (manifests, kwok's stages: ``module_source``)
    still go to Go's default module cache, one module each. None when the user set
    ``GOMODCACHE`` (theirs is used, and kept)."""
    return _private_go_dir("GOMODCACHE", "go-mod")


def _private_go_dir(variable: str, kind: str) -> Path | None:
    if os.environ.get(variable):
        return None
    root = cache_dir() / kind
    mine = root / str(os.getpid())
    if not mine.exists():
        mine.mkdir(parents=True)
        atexit.register(shutil.rmtree, mine, ignore_errors=True)
        for other in root.iterdir():  # left by a process that was killed
            if other != mine and other.name.isdigit() and not procs.alive(int(other.name)):
                shutil.rmtree(other, ignore_errors=True)
    return mine


#: Go's checksum database (the go command's default).
DEFAULT_SUMDB = "sum.golang.org"
#: The builds' GONOSUMDB: a pattern no module path matches. A GONOSUMDB or GOPRIVATE of the
#: user's (in the environment, or `go env -w`'s file, which an empty variable does not
#: override: cmd/go/internal/cfg Getenv) would exempt matching modules from the database.
NO_SUMDB_EXEMPTIONS = "none.invalid"


def go_env(build: bool = False) -> dict[str, str]:
    """Go's environment for this project's Go commands; ``build``: for a component's build,
    with a module cache of its own (``go_module_cache``)."""
    env = dict(os.environ)
    cache = go_build_cache()
    if cache is not None:
        env["GOCACHE"] = str(cache)
    modules = go_module_cache() if build else None
    if modules is not None:
        env["GOMODCACHE"] = str(modules)
        # Go writes module sources read-only, which a non-root user's rmtree cannot remove.
        env["GOFLAGS"] = (env.get("GOFLAGS", "") + " -modcacherw").strip()
    env.setdefault("CGO_ENABLED", "0")  # upstream ships these binaries static
    # Every module is checked against Go's checksum database: these binaries run as root.
    # sum.golang.org itself may not resolve from a build machine, but the go command asks the
    # module proxy first (GOPROXY's /sumdb/sum.golang.org/supported, which proxy.golang.org
    # serves; cmd/go/internal/modfetch/sumdb.go), so the database is reached through the proxy
    # the modules come from. A database of the user's own (a mirror: GOSUMDB=name+key url)
    # is kept; "off", and the settings that exempt modules from it, are not.
    sumdb = env.get("GOSUMDB", "").strip()
    if sumdb == "off":
        raise BuildError(
            "GOSUMDB=off: the cluster's binaries run as root and are built only with Go's "
            "checksum database on; unset GOSUMDB (the default, sum.golang.org, is reached "
            "through the module proxy) or name a database (GOSUMDB=sum.golang.org)"
        )
    env["GOSUMDB"] = sumdb or DEFAULT_SUMDB
    env["GONOSUMDB"] = NO_SUMDB_EXEMPTIONS
    env["GOFLAGS"] = (env.get("GOFLAGS", "") + " -mod=mod -trimpath").strip()
    env.setdefault("GOTOOLCHAIN", "local")
    return env


def find_go() -> str:
    """The ``go`` on PATH (or in $GOROOT/bin)."""
    go = shutil.which("go")
    if go is None and os.environ.get("GOROOT"):
        go = shutil.which("go", path=str(Path(os.environ["GOROOT"]) / "bin"))
    if go is None:
        raise BuildError(
            "no Go toolchain found: the control plane is built from upstream Go modules. Install "
            "Go >= 1.26 (https://go.dev/doc/install) and put `go` on PATH, then run "
            "`make cluster` again"
        )
    return go


def component_dir(name: str, version: str) -> Path:
    return cache_dir() / "bin" / f"{name}-{version}"


def binary_path(binary: str) -> Path:
    """Where the pinned build of ``binary`` lives (whether built yet or not)."""
    versions = pins()
    for comp in COMPONENTS.values():
        if binary in comp.binaries:
            return component_dir(comp.name, versions[comp.name]) / binary
    raise KeyError(binary)


def gomodcache() -> Path:
    """Go's module cache (where upstream sources, manifests and kwok's stages lie)."""
    try:
        out = subprocess.run(
            [find_go(), "env", "GOMODCACHE"], capture_output=True, text=True, check=True
        ).stdout.strip()
        return Path(out)
    except BuildError:  # binaries built earlier, no `go` on PATH now: Go's default location
        if os.environ.get("GOMODCACHE"):
            return Path(os.environ["GOMODCACHE"])
        gopath = os.environ.get("GOPATH", "").split(os.pathsep)[0] or str(Path.home() / "go")
        return Path(gopath) / "pkg" / "mod"


def module_source(name: str) -> Path:
    """The pinned module's source tree in Go's module cache, downloaded if missing."""
    comp, version = COMPONENTS[name], pins()[name]
    path = gomodcache() / f"{comp.module}@{version}"
    if not path.is_dir():
        subprocess.run(
            [find_go(), "mod", "download", f"{comp.module}@{version}"],
            env=go_env(),
            capture_output=True,
            check=True,
            cwd=cache_dir().parent,
        )
    return path


def component_of(binary: str) -> str:
    """The component that builds ``binary``."""
    return next(c.name for c in COMPONENTS.values() if binary in c.binaries)


def _wanted(comp: Component, node: bool) -> list[str]:
    return [b for b in comp.binaries if node or b not in comp.node_binaries]


def is_built(name: str, node: bool = False) -> bool:
    """Whether the component's binaries are in the cache (``node``: the real node's too)."""
    comp = COMPONENTS[name]
    out = component_dir(name, pins()[name])
    return all((out / b).exists() for b in _wanted(comp, node))


#: The compile flags every component's build gets: none. ``-gcflags=all=-dwarf=false`` (the
#: compiler's debugging information, which ``-ldflags=-w`` drops at link time anyway) was
#: measured no faster: etcd in 51 s and 97 CPU-seconds with it, 49 s and 93 without
#: (bench/go_build.py, docs/benchmarks.md).
COMPILE_FLAGS: tuple[str, ...] = ()


def _ldflags(comp: Component, version: str) -> list[str]:
    flags = ["-s", "-w"]
    if comp.stamp:
        flags += [f"-X={key}={value}" for key, value in comp.stamp(version).items()]
    return ["-ldflags=" + " ".join(flags)]


def _run(cmd: Sequence[str], cwd: Path, log, env: dict[str, str]) -> None:
    log.write("$ " + " ".join(cmd) + "\n")
    log.flush()
    proc = subprocess.run(cmd, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT, check=False)
    if proc.returncode != 0:
        raise BuildError(
            f"`{' '.join(cmd[:3])} ...` failed (exit {proc.returncode}); log: {log.name}"
        )


@contextlib.contextmanager
def _build_lock(name: str, version: str, echo: Callable[[str], None]):
    """One build of a component at a time on this machine (two e2e sessions, or `make cluster`
    beside one, would otherwise write the same folders)."""
    path = cache_dir() / "locks" / f"{name}-{version}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            echo(f"waiting for another process's build of {name} {version} to finish")
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def build(
    name: str, jobs: int | None = None, echo: Callable[[str], None] = print, node: bool = False
) -> Path:
    """Build one component at its pinned version into the cache (no-op when already there).

    Only the binaries that are missing are built: a component that gained a binary (the
    kubelet and kube-proxy joined kube-apiserver & co.) keeps the ones it has. ``node``: also
    the binaries only the real node runs."""
    comp = COMPONENTS[name]
    version = pins()[name]
    out = component_dir(name, version)
    if is_built(name, node):
        return out
    with _build_lock(name, version, echo):
        if is_built(name, node):  # another process built it while this one waited
            return out
        _build_missing(comp, version, out, jobs, echo, _wanted(comp, node))
    return out


def _build_missing(
    comp: Component,
    version: str,
    out: Path,
    jobs: int | None,
    echo: Callable[[str], None],
    wanted: Sequence[str],
    flags: Sequence[str] = COMPILE_FLAGS,
) -> None:
    """Build ``wanted`` into ``out`` (``flags``: the compile flags; bench/go_build.py compares
    sets of them)."""
    name = comp.name
    go = find_go()
    env = go_env(build=True)
    work = cache_dir() / "work" / f"{name}-{version}"
    work.mkdir(parents=True, exist_ok=True)
    tmp_out = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp_out, ignore_errors=True)
    tmp_out.mkdir(parents=True)
    todo = {b: comp.binaries[b] for b in wanted if not (out / b).exists()}
    for binary in comp.binaries:
        if binary not in todo and (out / binary).exists():
            os.link(out / binary, tmp_out / binary)
    log_path = cache_dir() / "logs" / f"{name}-{version}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    par = [f"-p={jobs}"] if jobs else []
    start = time.monotonic()
    echo(f"building {name} {version} ({', '.join(todo)}); log: {log_path}")
    earlier = any((out / b).exists() for b in comp.binaries)
    with open(log_path, "a" if earlier else "w") as log:
        if comp.wrapper:
            _write_wrapper(go, comp, version, work, log, env)
            for binary, pkg in todo.items():
                _run(
                    [
                        go,
                        "build",
                        *par,
                        *flags,
                        *_ldflags(comp, version),
                        "-o",
                        str(tmp_out / binary),
                        pkg,
                    ],
                    work,
                    log,
                    env,
                )
        else:
            env_install = dict(env, GOBIN=str(tmp_out))
            env_install["GOFLAGS"] = env_install["GOFLAGS"].replace("-mod=mod", "").strip()
            for binary, pkg in todo.items():
                _run(
                    [go, "install", *par, *flags, *_ldflags(comp, version), f"{pkg}@{version}"],
                    work,
                    log,
                    env_install,
                )
                built = tmp_out / pkg.rsplit("/", 1)[-1]
                if built.name != binary:
                    built.rename(tmp_out / binary)
    shutil.rmtree(out, ignore_errors=True)
    tmp_out.rename(out)
    echo(f"built {name} {version} in {time.monotonic() - start:.0f} s")


def _write_wrapper(go: str, comp: Component, version: str, work: Path, log, env) -> None:
    """A go.mod that requires the module and replaces its local siblings by published versions."""
    _run([go, "mod", "download", "-json", f"{comp.module}@{version}"], work, log, env)
    gomod_path = (
        Path(
            subprocess.run(
                [go, "env", "GOMODCACHE"], capture_output=True, text=True, env=env, check=True
            ).stdout.strip()
        )
        / "cache"
        / "download"
        / comp.module
        / "@v"
        / f"{version}.mod"
    )
    siblings = comp.siblings(gomod_path.read_text(), version) if comp.siblings else {}
    go_version = (
        subprocess.run(
            [go, "env", "GOVERSION"], capture_output=True, text=True, env=env, check=True
        )
        .stdout.strip()
        .removeprefix("go")
    )
    lines = [
        "// Generated by cluster.build from pyproject.toml's pins; not committed.",
        "module megdet.local/cluster-build",
        "",
        f"go {go_version}",
        "",
        f"require {comp.module} {version}",
        "",
        "replace (",
        *[f"\t{mod} => {mod} {ver}" for mod, ver in sorted(siblings.items())],
        ")",
        "",
    ]
    (work / "go.mod").write_text("\n".join(lines))
    # A file that imports nothing keeps `go` happy about a module with no packages of its own.
    (work / "doc.go").write_text(
        "// Package build exists so that this module has a package.\npackage build\n"
    )


def pause_tag() -> str:
    """The pause image's version in the pinned k8s.io/kubernetes (TAG in build/pause/Makefile)."""
    makefile = (module_source("kubernetes") / "build/pause/Makefile").read_text()
    match = re.search(r"^TAG \?= (\S+)", makefile, flags=re.M)
    if not match:
        raise BuildError("k8s.io/kubernetes: no `TAG ?=` line in build/pause/Makefile")
    return match.group(1)


def build_pause(echo: Callable[[str], None] = print) -> Path:
    """The sandbox's pause binary: upstream's build/pause/linux/pause.c from the pinned
    k8s.io/kubernetes, compiled static with the CFLAGS of its Makefile (a C program: no Go)."""
    tag = pause_tag()
    out = cache_dir() / "bin" / f"pause-{tag}" / "pause"
    if out.exists():
        return out
    gcc = shutil.which("gcc")
    if gcc is None:
        raise BuildError(
            "no C compiler: the real node's pause image is upstream's pause.c compiled with gcc; "
            "install it (`apt-get install gcc libc6-dev`), then run `make cluster` again"
        )
    source = module_source("kubernetes") / "build/pause/linux/pause.c"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name("pause.partial")
    cmd = [gcc, "-Os", "-Wall", "-Werror", "-static", f"-DVERSION=v{tag}-megdet", "-o", str(tmp)]
    proc = subprocess.run([*cmd, str(source)], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise BuildError(
            f"compiling {source} failed (exit {proc.returncode}): {proc.stderr.strip()[-2000:]}; "
            "a static build needs glibc's static library (`apt-get install libc6-dev`)"
        )
    tmp.rename(out)
    echo(f"built pause {tag} from {source}")
    return out


def build_all(
    names: Sequence[str], jobs: int | None = None, echo=print, node: bool = False
) -> dict[str, Path]:
    return {name: build(name, jobs=jobs, echo=echo, node=node) for name in names}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m cluster.build",
        description="Build the pinned control-plane binaries.",
    )
    parser.add_argument(
        "components",
        nargs="*",
        default=list(CORE),
        help=f"components to build (default: {' '.join(CORE)}; also: "
        f"{' '.join(c for c in COMPONENTS if c not in CORE)})",
    )
    parser.add_argument("-j", "--jobs", type=int, default=None, help="go build -p")
    parser.add_argument("--all", action="store_true", help="every pinned component")
    args = parser.parse_args(argv)
    if args.all:
        args.components = list(COMPONENTS)
    unknown = [c for c in args.components if c not in COMPONENTS]
    if unknown:
        parser.error(f"unknown component(s) {', '.join(unknown)}; allowed: {', '.join(COMPONENTS)}")
    try:
        build_all(args.components, jobs=args.jobs, node=True)
    except BuildError as err:
        print(f"megdet cluster build: error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
