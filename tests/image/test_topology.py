"""The operator env -> torchrun arguments mapping (pure function, no processes)."""

from __future__ import annotations

import pytest

from megdet.image.topology import (
    DEFAULT_MASTER_PORT,
    SHUTDOWN_MARGIN_SECONDS,
    EnvError,
    topology_from_env,
    torchrun_arguments,
)


def operator_env(nnodes: int, node_rank: int, nproc: str, *, integer_world: bool) -> dict:
    """The env the PyTorchJob operator gives one pod (Master-0 is node 0, Worker-i is i+1)."""
    world = nnodes * int(nproc) if integer_world else nnodes
    return {
        "MASTER_ADDR": "job-master-0",
        "MASTER_PORT": "23456",
        "PET_MASTER_ADDR": "job-master-0",
        "PET_MASTER_PORT": "23456",
        "PET_NNODES": str(nnodes),
        "PET_NODE_RANK": str(node_rank),
        "PET_NPROC_PER_NODE": nproc,
        "WORLD_SIZE": str(world),
        "RANK": str(node_rank),
    }


@pytest.mark.parametrize(
    ("nnodes", "node_rank", "world"),
    [(1, 0, 8), (2, 0, 16), (2, 1, 16), (8, 0, 64), (8, 5, 64), (8, 7, 64)],
)
@pytest.mark.parametrize("nproc", ["8", "auto", "gpu"])
def test_nodes_by_eight_processes_map_to_torchrun_arguments(nnodes, node_rank, world, nproc):
    # With nprocPerNode "auto"/"gpu" the operator's WORLD_SIZE is the node count; with "8" it is
    # nodes x 8. Either way the launcher must arrive at the same global world size.
    env = operator_env(nnodes, node_rank, nproc, integer_world=nproc == "8")
    topology = topology_from_env(env, visible_gpus=8)
    assert topology.world_size == world
    assert torchrun_arguments(topology) == [
        f"--nnodes={nnodes}:{nnodes}",
        "--nproc-per-node=8",
        "--max-restarts=0",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=job-master-0:23456",
        "--rdzv-id=megdet",
        f"--rdzv-conf=is_host={int(node_rank == 0)}",  # node 0 hosts the rendezvous store
    ]


def test_single_node_without_master_env_is_standalone():
    topology = topology_from_env({"PET_NPROC_PER_NODE": "8"}, visible_gpus=0)
    assert topology.standalone
    assert topology.world_size == 8
    assert torchrun_arguments(topology) == [
        "--standalone", "--nnodes=1", "--nproc-per-node=8", "--max-restarts=0",
    ]  # fmt: skip


def test_empty_env_means_one_process_per_visible_gpu_or_one_on_cpu():
    assert topology_from_env({}, visible_gpus=4).nproc_per_node == 4
    assert topology_from_env({}, visible_gpus=0).nproc_per_node == 1


def test_cpu_keyword_starts_one_process_not_one_per_core():
    topology = topology_from_env({"PET_NPROC_PER_NODE": "cpu"}, visible_gpus=8)
    assert topology.nproc_per_node == 1


def test_gpu_count_is_only_probed_for_auto_and_gpu():
    def no_probe() -> int:
        raise AssertionError("GPU count probed for an integer nprocPerNode")

    assert topology_from_env({"PET_NPROC_PER_NODE": "3"}, visible_gpus=no_probe).world_size == 3


def test_master_port_defaults_to_torchruns_when_only_the_address_is_given():
    topology = topology_from_env({"MASTER_ADDR": "m", "PET_NNODES": "2", "PET_NODE_RANK": "1"}, 1)
    assert topology.master_port == DEFAULT_MASTER_PORT
    assert "--rdzv-endpoint=m:29500" in torchrun_arguments(topology)


def test_pet_aliases_are_used_when_the_plain_names_are_absent():
    env = {"PET_MASTER_ADDR": "m", "PET_MASTER_PORT": "1234", "PET_NNODES": "2", "RANK": "1"}
    topology = topology_from_env(env, visible_gpus=1)
    assert (topology.master_addr, topology.master_port, topology.node_rank) == ("m", 1234, 1)


def test_trainjob_env_has_only_the_five_pet_variables():
    # Kubeflow Trainer v2 (v2.3.0 pkg/runtime/framework/plugins/torch/torch.go): no WORLD_SIZE,
    # RANK or MASTER_*; PET_MASTER_ADDR is node 0's JobSet pod name, the port 29500.
    env = {
        "PET_NNODES": "4", "PET_NPROC_PER_NODE": "8", "PET_NODE_RANK": "2",
        "PET_MASTER_ADDR": "r-node-0-0.r", "PET_MASTER_PORT": "29500",
    }  # fmt: skip
    topology = topology_from_env(env, visible_gpus=8)
    assert (topology.world_size, topology.node_rank) == (32, 2)
    args = torchrun_arguments(topology)
    assert "--rdzv-endpoint=r-node-0-0.r:29500" in args and "--rdzv-conf=is_host=0" in args


def test_grace_period_sets_torchruns_shutdown_timeout_with_a_margin():
    # torchrun waits TORCH_ELASTIC_SHUTDOWN_TIMEOUT (30 s) after SIGTERM, then SIGKILLs the
    # trainers; the pod's grace period (300 s by default in the chart) must govern instead.
    env = {"PET_NPROC_PER_NODE": "1", "MEGDET_GRACE_PERIOD_SECONDS": "300"}
    topology = topology_from_env(env)
    assert topology.shutdown_timeout == 300 - SHUTDOWN_MARGIN_SECONDS == 290
    assert "--shutdown-timeout=290" in torchrun_arguments(topology)
    # Unset (plain `docker run`): torchrun's own default applies, and no flag is passed.
    assert topology_from_env({}).shutdown_timeout is None
    assert not any(a.startswith("--shutdown-timeout") for a in torchrun_arguments(
        topology_from_env({})))  # fmt: skip


def test_worker_restarts_and_run_id_come_from_the_chart_env():
    env = {"MASTER_ADDR": "m", "PET_NNODES": "2", "MEGDET_MAX_RESTARTS": "3",
           "MEGDET_RUN_ID": "coco-1x"}  # fmt: skip
    args = torchrun_arguments(topology_from_env(env, visible_gpus=1))
    assert "--max-restarts=3" in args and "--rdzv-id=coco-1x" in args


@pytest.mark.parametrize(
    ("env", "variable", "phrase"),
    [
        ({"PET_NNODES": "abc"}, "PET_NNODES", "'abc' is not a whole number"),
        (
            {"MEGDET_GRACE_PERIOD_SECONDS": "5m"},
            "MEGDET_GRACE_PERIOD_SECONDS",
            "'5m' is not a whole number",
        ),
        ({"MEGDET_GRACE_PERIOD_SECONDS": "10"}, "MEGDET_GRACE_PERIOD_SECONDS", "no time to"),
        ({"MEGDET_MAX_RESTARTS": "-1"}, "MEGDET_MAX_RESTARTS", "must be >= 0"),
        ({"MEGDET_MAX_RESTARTS": "x"}, "MEGDET_MAX_RESTARTS", "not a whole number"),
        ({"MEGDET_RUN_ID": "a b"}, "MEGDET_RUN_ID", "use letters, digits"),
        ({"MEGDET_POD_MILLICPUS": "0.5"}, "MEGDET_POD_MILLICPUS", "'0.5' is not a whole number"),
        ({"MEGDET_POD_MILLICPUS": "-500"}, "MEGDET_POD_MILLICPUS", "must be >= 0"),
        ({"PET_NNODES": "0"}, "PET_NNODES", "must be >= 1"),
        ({"PET_NNODES": "1:4", "MASTER_ADDR": "m"}, "PET_NNODES", "elastic range"),
        (
            {"PET_NNODES": "2", "PET_NODE_RANK": "2", "MASTER_ADDR": "m"},
            "PET_NODE_RANK",
            "must be below PET_NNODES (2)",
        ),
        ({"PET_NODE_RANK": "-1"}, "PET_NODE_RANK", "must be >= 0"),
        ({"PET_NODE_RANK": "x"}, "PET_NODE_RANK", "not a whole number"),
        ({"PET_NPROC_PER_NODE": "many"}, "PET_NPROC_PER_NODE", "auto, gpu, cpu"),
        ({"PET_NPROC_PER_NODE": "0"}, "PET_NPROC_PER_NODE", "must be >= 1"),
        ({"PET_NPROC_PER_NODE": "gpu"}, "PET_NPROC_PER_NODE", "no GPU is visible"),
        ({"PET_NNODES": "2", "PET_NODE_RANK": "1"}, "MASTER_ADDR", "is not set"),
        ({"MASTER_ADDR": "m", "MASTER_PORT": "http"}, "MASTER_PORT", "not a whole number"),
        ({"MASTER_ADDR": "m", "MASTER_PORT": "70000"}, "MASTER_PORT", "not a TCP port"),
        ({"MASTER_ADDR": "a", "PET_MASTER_ADDR": "b"}, "MASTER_ADDR", "disagrees"),
        ({"PET_NODE_RANK": "0", "RANK": "1", "PET_NNODES": "2"}, "PET_NODE_RANK", "disagrees"),
        (
            {"PET_NNODES": "2", "MASTER_ADDR": "m", "PET_NPROC_PER_NODE": "4", "WORLD_SIZE": "6"},
            "WORLD_SIZE",
            "matches neither",
        ),
    ],
)
def test_malformed_env_names_the_variable(env, variable, phrase):
    with pytest.raises(EnvError) as info:
        topology_from_env(env, visible_gpus=0)
    assert info.value.variable == variable
    assert str(info.value).startswith(f"{variable}: ")
    assert phrase in str(info.value)
