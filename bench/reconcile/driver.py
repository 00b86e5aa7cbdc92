"""The benchmark's runs: applied to kmock or to a real API server, with the controller process
serving them; ``run`` measures one API, ``compare`` each in turn with the ratios."""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import sys
import time
from typing import Any

from bench import harness
from bench.controller_runs import SPECS, cluster_body, namespace_of, run_name, served_spec
from bench.reconcile import kmock_helpers, memory, report
from bench.reconcile.controller import ControllerProcess, restart
from bench.reconcile.options import APIS, Options

#: Cluster bursts: threads POSTing the runs (kmock's single loop applies 200 in under 1 s).
APPLY_THREADS = 8
#: Seconds after the last status before the controller is told to stop.
SETTLE_S = 1.0
#: With --delete: after the last run is released, the memory is read once the controller has
#: used under 5 % of a core for this many seconds in a row (the garbage collector's deletions
#: of the jobs still reach it after the runs are gone; the heap trimmer looks every 2 s and
#: trims at its first look below 20 % of a core), or after DELETE_QUIET_TIMEOUT_S.
DELETE_QUIET_S = 6.0
DELETE_QUIET_TIMEOUT_S = 300.0


# --- kmock ----------------------------------------------------------------------------------


async def _delete_all_kmock(api: Any, helpers: Any, timeout: float) -> float:
    """Delete every run and (as the garbage collector would) what it owns; wait until every run
    is gone (runs carry no finalizer: at once, unless an earlier controller's is still being
    removed). Returns the seconds it took."""
    import kmock

    started = time.perf_counter()
    owned = (helpers.PYTORCHJOBS, helpers.TRAINJOBS, helpers.RUNTIMES, helpers.NETWORKPOLICIES)
    for resource in (helpers.RUNS, *owned):
        group_version, plural = resource.rsplit("/", 1)
        prefix = "/api/v1" if "/" not in group_version else f"/apis/{group_version}"
        for res, ns, name in [k for k, obj in api.objects.items() if not obj.deleted]:
            if res == kmock.resource(resource):
                await api.delete(f"{prefix}/namespaces/{ns}/{plural}/{name}")
    runs_resource = kmock.resource(helpers.RUNS)
    while any(res == runs_resource and not obj.deleted for (res, _, _), obj in api.objects.items()):
        if time.perf_counter() - started > timeout:
            raise RuntimeError(f"runs still not released {timeout} s after their deletion")
        await asyncio.sleep(0.05)
    return time.perf_counter() - started


def _after_deletion(controller: ControllerProcess, options: Options) -> tuple[float, dict]:
    """Once every run is gone: the seconds until the controller is quiet, and its RSS at the
    --rss-after-delete points after that."""
    quiet_s = harness.wait_quiet(
        [controller.proc.pid], DELETE_QUIET_S, timeout=DELETE_QUIET_TIMEOUT_S
    )
    return quiet_s, memory.rss_after_delete(controller.proc.pid, options.rss_after_delete)


async def _run_kmock(options: Options) -> dict[str, Any]:
    import kmock

    runs, namespaces, timeout = options.runs, options.namespaces, options.timeout
    helpers = kmock_helpers()
    applied: dict[tuple[str, str], float] = {}
    status_seen: dict[tuple[str, str], float] = {}
    refused = [0]  # status writes answered 409 (none since writes carry no precondition)

    class StampingEmulator(helpers.Emulator):
        # kmock keeps every request for test assertions and matches each new request against
        # its reactions by scanning that history: quadratic in the number of requests, which
        # made kmock, not the controller, the bottleneck (cProfile: 2/3 of the time in kmock's
        # filtering at 30 runs). The benchmark keeps only the request being served, and stamps
        # status writes here rather than in a reaction.
        async def _handle(self, request: Any) -> Any:
            del self._requests[:-1]
            path = request.url.path
            stamped = None
            if request.method == "PATCH" and path.endswith("/status") and "/megdetruns/" in path:
                parts = path.split("/")
                key = (parts[-4], parts[-2])  # .../namespaces/<ns>/megdetruns/<name>/status
                status = (request.data or {}).get("status") or {}
                if status.get("jobName") and key not in status_seen:
                    status_seen[key] = time.perf_counter()
                    stamped = key
            try:
                return await super()._handle(request)
            except kmock.KubernetesError as err:
                if getattr(err, "status", None) == 409 and path.endswith("/status"):
                    refused[0] += 1
                    if stamped is not None:
                        del status_seen[stamped]  # that write did not land
                raise

    async with StampingEmulator() as api, kmock.Server(api):
        helpers.declare_resources(api)
        target = {"api": "kmock", "url": str(api.url)}
        controller = ControllerProcess(target, options, options.tracemalloc)
        deleted_s = deleted_quiet_s = restarted = None
        rss_later: dict[str, float] = {}
        try:
            await controller.wait_ready(None)

            started = time.perf_counter()
            own_cpu = time.process_time()
            for i in range(runs):
                key = (namespace_of(i, namespaces), run_name(i, runs))
                body = helpers.run_body(key[1], served_spec(i), namespace=key[0])
                await helpers.apply(api, body)
                applied[key] = time.perf_counter()
                while options.paced and key not in status_seen:
                    if time.perf_counter() - started > timeout:
                        raise RuntimeError(f"{key} not reconciled in {timeout} s")
                    await asyncio.sleep(0.002)
            last_report = time.perf_counter()
            while len(status_seen) < runs:
                now = time.perf_counter()
                if now - started > timeout:
                    raise RuntimeError(
                        f"only {len(status_seen)} of {runs} reconciled in {timeout} s"
                    )
                if now - last_report > 10:
                    print(
                        f"  [kmock] ... {len(status_seen)}/{runs} reconciled",
                        file=sys.stderr,
                        flush=True,
                    )
                    last_report = now
                await asyncio.sleep(0.01)
            await asyncio.sleep(SETTLE_S)
            jobs = sum(
                1
                for (resource, _ns, _name), obj in list(api.objects.items())
                if resource
                in (kmock.resource(helpers.PYTORCHJOBS), kmock.resource(helpers.TRAINJOBS))
                and not obj.deleted
            )
            await asyncio.to_thread(controller.mark_reconciled)
            if options.delete:
                deleted_s = await _delete_all_kmock(api, helpers, timeout)
                deleted_quiet_s, rss_later = await asyncio.to_thread(
                    _after_deletion, controller, options
                )
            child = await controller.collect()
            own_cpu = time.process_time() - own_cpu
            if options.restart:
                await asyncio.to_thread(controller.close)
                restarted = await restart(target, options)
        finally:
            await asyncio.to_thread(controller.close)

    result = report.result_of(
        "kmock", options, applied, status_seen, started, child, jobs, refused[0]
    )
    result.update(delete_s=deleted_s, delete_quiet_s=deleted_quiet_s, restart=restarted)
    if options.delete:
        result["rss_after_delete_mib"] = rss_later
    # kmock serves from this process, which also applies the runs: its CPU is the API's side.
    result["api_cpu_per_run_ms"] = own_cpu / runs * 1e3
    result["other_cpu_per_run_ms"] = {"this process (kmock + client)": own_cpu / runs * 1e3}
    return result


# --- a real API server ----------------------------------------------------------------------


def _run_cluster(options: Options) -> dict[str, Any]:
    from bench.controller_cluster import CONTROLLER_USER, BenchCluster, RunClient
    from bench.controller_cluster import write_costs as measure_write_costs

    runs, namespaces, timeout = options.runs, options.namespaces, options.timeout
    bench = BenchCluster(options.nodes, training_operator=options.training_operator)
    started_up = time.perf_counter()
    try:
        bench.start()
        startup_s = time.perf_counter() - started_up
        bench.create_namespaces(sorted({namespace_of(i, namespaces) for i in range(runs)}))
        client = RunClient(bench.kube.kubeconfig)
        client.start_watch()
        target = {"api": "cluster", "kubeconfig": str(bench.controller_kubeconfig)}
        controller = ControllerProcess(target, options, options.tracemalloc)
        deleted_s = deleted_quiet_s = restarted = rss_later = None
        try:
            asyncio.run(controller.wait_ready(180))
            time.sleep(0.5)  # lets the controller's first lists and watches settle
            wall_start = time.time()
            started = time.perf_counter()
            own_cpu, cpu_before = time.process_time(), bench.component_cpu_s()
            operator_before = bench.operator_requests()
            if options.paced:
                created = []
                for i in range(runs):
                    body = cluster_body(i, runs, namespaces)
                    created.append(client.create(body))
                    key = (body["metadata"]["namespace"], body["metadata"]["name"])
                    client.wait_for(
                        lambda key=key: key in client.status_seen,
                        timeout - (time.perf_counter() - started),
                        f"{key} reconciled",
                    )
            else:
                # POSTs from several threads: one after another, each waits ~10 ms for the API
                # server (100 ms once the controller loads the 2 cores), and the burst would
                # become a trickle that the controller keeps up with.
                bodies = [cluster_body(i, runs, namespaces) for i in range(runs)]
                with concurrent.futures.ThreadPoolExecutor(APPLY_THREADS) as pool:
                    created = list(pool.map(client.create, bodies))
            specs_as_kmock = all(
                created[i]["spec"] == served_spec(i) for i in range(min(runs, len(SPECS)))
            )
            client.wait_for(
                lambda: len(client.status_seen) >= runs,
                timeout - (time.perf_counter() - started),
                f"all {runs} runs reconciled",
            )
            time.sleep(SETTLE_S)
            quiet_s = pods_s = None
            if options.training_operator:
                # The anchor: until the training operator has made every PyTorchJob's pods, then
                # until it (statuses) and the controller (their mirror) are both quiet.
                pods_s = bench.wait_for_pods(bench.expected_pods(), timeout)
                pids = [bench.kube.state()["pids"]["training-operator"], controller.proc.pid]
                quiet_s = pods_s + bench.wait_quiet(pids, timeout=timeout)
            # The reconcile phase ends here: its requests and CPU are counted up to this point.
            wall_end = time.time()
            own_cpu = time.process_time() - own_cpu
            cpu_after = bench.component_cpu_s()
            operator_after = bench.operator_requests()
            by_kind = bench.jobs_by_kind()  # before any deletion lets the garbage collector in
            pods = bench.count_pods() if options.training_operator else {}  # the same
            jobs = sum(by_kind.values())
            controller.mark_reconciled()
            if options.delete:
                deleted_s = client.delete_all(timeout)
                deleted_quiet_s, rss_later = _after_deletion(controller, options)
            child = asyncio.run(controller.collect())
            if options.restart:
                controller.close()
                restarted = asyncio.run(restart(target, options))
        finally:
            controller.close()
            client.stop()
        requests = bench.controller_requests(wall_start, wall_end)
        refused = sum(
            n for call, n in requests["non_2xx"].items() if call == "patch megdetruns/status 409"
        )
        result = report.result_of(
            "cluster", options, client.applied, client.status_seen, started, child, jobs, refused
        )
        cpu = {
            name: (cpu_after[name] - cpu_before.get(name, 0.0)) / runs * 1e3 for name in cpu_after
        }
        cpu["this process (client + watch)"] = own_cpu / runs * 1e3
        result.update(
            api_cpu_per_run_ms=cpu.get("kube-apiserver", 0.0) + cpu.get("etcd", 0.0),
            other_cpu_per_run_ms=cpu,
            nodes=options.nodes,
            specs_as_kmock=specs_as_kmock,
            cluster_startup_s=startup_s,
            api_requests=requests,
            api_requests_per_run={
                "total": requests["total"] / runs,
                **{verb: n / runs for verb, n in requests["by_verb"].items()},
            },
            controller_login=f"ServiceAccount token ({CONTROLLER_USER})",
            delete_s=deleted_s,
            delete_quiet_s=deleted_quiet_s,
            rss_after_delete_mib=rss_later,
            restart=restarted,
            # statuses first seen by a list, after the watch was told 410 Gone (their
            # apply -> status is read late by up to one watch window)
            watch_relists=client.relists,
        )
        if options.training_operator:
            result["anchor"] = report.anchor(
                result,
                by_kind,
                operator_after,
                operator_before,
                (
                    cpu_after.get("training-operator", 0.0)
                    - cpu_before.get("training-operator", 0.0)
                ),
                quiet_s,
                pods,
            )
        if options.write_costs:
            result["write_costs"] = measure_write_costs(bench, client, options.write_costs)
        return result
    finally:
        bench.stop(keep_logs=options.keep_logs)


def run(options: Options) -> dict[str, Any]:
    """One API's measurements (``options.api``: kmock or cluster)."""
    if options.api == "kmock":
        return asyncio.run(_run_kmock(options))
    if options.api == "cluster":
        return _run_cluster(options)
    raise ValueError(f"api {options.api!r}: want one of {', '.join(APIS)}")


def compare(options: Options) -> dict[str, Any]:
    """Each API of ``options.apis`` in turn (kmock first), in one invocation, with the
    cluster/kmock ratios."""
    results: dict[str, dict[str, Any]] = {}
    for api in options.apis:
        print(f"  [{api}] {options.runs} runs ...", file=sys.stderr, flush=True)
        results[api] = run(dataclasses.replace(options, api=api))
    return {
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "results": results,
        "ratios_cluster_over_kmock": report.ratios(results),
        "goals": {api: report.goals(r) for api, r in results.items()},
    }
