"""MegDetRuns through the controller, against kmock and a real API server side by side.

The controller is the real one (kopf + our handlers + the official client + the in-process Helm
render) in its own spawned process, so its memory and CPU are its own. The API it talks to is

- ``kmock``: an in-memory Kubernetes API emulator (with the small extensions in
  tests/controller/kmock_helpers.py: resourceVersions, uids, generateName), served from this
  process; the specs are applied with the CRD's defaults filled in, as a server stores them;
- ``cluster``: a real control plane on this machine (bench/controller_cluster.py: etcd,
  kube-apiserver with RBAC and an audit log, controller-manager, scheduler, kwok fake 8-GPU
  nodes; the PyTorchJob, Trainer v2 and MegDetRun CRDs; the operator chart installed with Helm),
  the controller logged in with a token of the chart's ServiceAccount, the runs POSTed with the
  admin kubeconfig through the official client (the server defaults them);
- ``both`` (the default): kmock, then the cluster, in one invocation, and the ratios.

All runs are applied at once (a burst, the worst case for queueing), or with ``--paced`` one
after another, each once the previous one is reconciled (a reconcile without others competing
for the cores); in a mix of shapes: 8 GPUs, 16 GPUs with InfiniBand, 64 GPUs with gang
scheduling, 16 GPUs as a TrainJob (+ its TrainingRuntime). ``--namespaces K`` spreads the runs
over K namespaces (round robin).

Reported, for each API:
- total: first apply -> the last run's status carries its job (kmock: when the status write
  reaches the emulator; cluster: when the watch of this process delivers it);
- apply phase: first create sent -> last create answered (how fast this process applies; a
  burst is as fast as the API lets it be, so apply -> status compares only with this in view);
- reconcile latency: each create-reconcile handler's own duration (render, look up
  and create the job(s), write status), measured inside the controller; p50/p99/max;
- apply -> status latency per run (queueing included), from the moment the create returned;
- the pure part alone (plan_children: one render + adopt) timed in the controller process
  for the same specs right before the burst;
- controller CPU time (all its threads) from ready to stop, per run; the API side's CPU per
  run over the same span (kmock: this process, which serves kmock and applies the runs;
  cluster: kube-apiserver + etcd, with the other components and this process beside it);
- controller memory: VmRSS when ready (chart loaded), VmHWM (peak) and VmRSS at the end (all
  runs reconciled: what stays, against the peak's backlog of events and handlers in flight);
- cluster only: the controller's API requests per run, by verb and by call, from the API
  server's audit log (its ServiceAccount's requests between the first apply and its stop),
  and the status writes the server refused with 409.

The last status is followed by a 1 s settle before the controller is stopped, so kopf's trailing
writes (its progress annotations) land in the counts.

    .venv/bin/python -m bench.controller_reconcile [--api kmock|cluster|both] [--runs 200]
        [--nodes 4] [--namespaces 1] [--workers N] [--paced] [--json] [--keep-logs DIR]
        [--write-costs N] [--delete] [--tracemalloc]

``--delete``: once every run is reconciled, delete them all (and on kmock, which has no
garbage collector, what they own), wait until each is gone and the controller is quiet, and
read its memory again (does it come back?). ``--tracemalloc``: trace the
controller's allocations and report the files whose memory grew, and the served or owned
objects still alive in it, when reconciled and at the end. Every flag, with its default:
``--help`` (one field each of ``bench/reconcile/options.py``'s Options). The parts live in
``bench/reconcile/``: options, the controller process, the driver of the runs, the report.
"""

from __future__ import annotations

from bench import harness
from bench.reconcile.driver import compare, run
from bench.reconcile.options import APIS, Options
from bench.reconcile.report import print_report

__all__ = ["APIS", "Options", "compare", "main", "print_report", "run"]


def main(argv: list[str] | None = None) -> None:
    options = Options.from_args(argv, __doc__.splitlines()[0])
    harness.emit(compare(options), options.json, print_report)


if __name__ == "__main__":
    main()
