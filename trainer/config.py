"""The MegDet config keys, loading configs by path or shipped name, and planning a run.

``add_megdet_config`` adds the ``MEGDET`` node (detectron2 style: one function that documents
every key). ``plan_config`` turns a loaded config and the actual world size into a
:class:`megdet.plan.Plan` and writes the planned numbers into the detectron2 ``SOLVER`` keys.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import yaml
from detectron2.config import CfgNode, get_cfg

from megdet.plan import Plan, Resize, RunSpec, Scaling, Schedule, SpecError, plan_continuation
from megdet.trainer.weights_pin import PINNED_WEIGHTS

CONFIG_DIR = Path(__file__).resolve().parent / "configs"

#: Allowed values of the enumerated MEGDET keys.
SYNC_BN_SCOPES = ("backbone", "all", "none")
SCALINGS = tuple(s.value for s in Scaling)
SCHEDULES = tuple(s.value for s in Schedule)
RESIZES = tuple(r.value for r in Resize)

#: RunSpec fields and the config keys that feed them (for error messages).
_SPEC_FIELD_KEYS = {
    "gpus": "--num-workers / WORLD_SIZE",
    "gpus_per_node": "LOCAL_WORLD_SIZE",
    "images_per_gpu": "MEGDET.IMAGES_PER_GPU",
    "accumulation_steps": "MEGDET.ACCUMULATION_STEPS",
    "base_lr": "SOLVER.BASE_LR",
    "reference_batch": "MEGDET.REFERENCE_BATCH",
    "scaling": "MEGDET.SCALING",
    "schedule": "MEGDET.SCHEDULE",
    "max_iter": "SOLVER.MAX_ITER",
    "steps": "SOLVER.STEPS",
    "warmup_iters": "SOLVER.WARMUP_ITERS",
    "warmup_factor": "SOLVER.WARMUP_FACTOR",
    "gamma": "SOLVER.GAMMA",
    "resize": "MEGDET.RESIZE",
}


class ConfigError(ValueError):
    """A config file, key or value that cannot be used; the message names the key."""


def add_megdet_config(cfg: CfgNode) -> None:
    """Add the MEGDET keys with their defaults to a detectron2 config."""
    _C = cfg
    _C.MEGDET = CfgNode()
    # Images each worker process sees per micro-batch. The global batch of one optimizer step is
    # world_size * IMAGES_PER_GPU * ACCUMULATION_STEPS; the trainer writes it to
    # SOLVER.IMS_PER_BATCH.
    _C.MEGDET.IMAGES_PER_GPU = 2
    # Micro-batches accumulated into one optimizer step (gradient all-reduce on the last only).
    _C.MEGDET.ACCUMULATION_STEPS = 1
    # The global batch the SOLVER recipe (BASE_LR, MAX_ITER, STEPS, WARMUP_ITERS) was tuned for.
    _C.MEGDET.REFERENCE_BATCH = 16
    # How the learning rate follows the global batch: "linear", "sqrt" or "none".
    _C.MEGDET.SCALING = "linear"
    # Learning-rate curve: "step" (warmup, then x GAMMA at STEPS) or "three-stage".
    _C.MEGDET.SCHEDULE = "step"
    # Which BatchNorm layers are synchronized across workers: "backbone" (the ResNet bottom-up
    # only; FPN and heads keep their own norm), "all" or "none".
    _C.MEGDET.SYNC_BN = "backbone"
    # When the run resumes on another number of workers (docs/elastic.md): "keep-batch" keeps
    # the run's global batch (and so its learning rate) by changing ACCUMULATION_STEPS where
    # the new world can make it, and rescales otherwise; "rescale" always plans the new world's
    # batch (ACCUMULATION_STEPS as set) with the SCALING rule. Either way the schedule stays
    # in images seen.
    _C.MEGDET.RESIZE = "keep-batch"
    # Processes per BN group (MegDet's "BN size" in workers); 0 = the whole world. Must divide
    # the world size.
    _C.MEGDET.BN_GROUP_SIZE = 0
    # Mixed precision (CUDA only; asking for it on CPU is an error).
    _C.MEGDET.AMP = False
    # Every this many iterations all ranks compare their backbone BN running statistics and
    # log/export the largest difference within a BN group (~0 when BN is synchronized).
    # 0 = off. One small all-reduce per check (docs/benchmarks.md).
    _C.MEGDET.SYNCBN_CHECK_PERIOD = 100
    # Prometheus exporter: local rank 0 of each node/pod serves /metrics on this port for all
    # ranks of that node. 0 = off (the default outside the run chart, which sets it).
    _C.MEGDET.METRICS = CfgNode()
    _C.MEGDET.METRICS.PORT = 0
    # COCO-format datasets: annotation JSON and image folder. The CLI flags --train-json etc.
    # set these. Empty VAL_JSON: no evaluation.
    _C.MEGDET.DATA = CfgNode()
    _C.MEGDET.DATA.TRAIN_JSON = ""
    _C.MEGDET.DATA.TRAIN_IMAGES = ""
    _C.MEGDET.DATA.VAL_JSON = ""
    _C.MEGDET.DATA.VAL_IMAGES = ""
    # Trust MODEL.WEIGHTS (and `megdet eval --weights`) whatever it is: URLs (downloaded) and
    # pickle files (.pkl, .pickle, .pyth), which detectron2 loads with pickle and which can
    # therefore run code, and PyTorch files holding more than tensors. False: only empty, a
    # local PyTorch file of tensors, or the ImageNet weights a shipped config names
    # (TRUSTED_WEIGHTS). Also needed for MODEL.LOAD_PROPOSALS (detectron2 unpickles
    # DATASETS.PROPOSAL_FILES_*) and for a URL _BASE_. Honoured from the command line only:
    # a config file that sets it is refused. The seam for the operator's policy
    # (policy.unsafeWeights); never set it for untrusted input.
    _C.MEGDET.ALLOW_UNSAFE_WEIGHTS = False
    # Continue in an output folder stamped by another run (.megdet-run.json): that run's uid or
    # name. "" = only the run that stamped the folder may write there (see ownership.py). The
    # seam for a MegDetRun's spec.resumeFrom.
    _C.MEGDET.RESUME_FROM = ""


def resolve_config_path(name: str) -> Path:
    """A config path as given, or the bare name of a config shipped in trainer/configs/."""
    path = Path(name)
    if path.is_file():
        return path
    for candidate in (CONFIG_DIR / name, CONFIG_DIR / f"{name}.yaml"):
        if candidate.is_file() and "/" not in name:
            return candidate
    shipped = ", ".join(sorted(p.name for p in CONFIG_DIR.glob("megdet_*.yaml")))
    raise ConfigError(f"--config: {name!r} is not a file nor a shipped config ({shipped})")


def load_config(config: str, overrides: list[str] | tuple[str, ...] = ()) -> CfgNode:
    """Load a config (path or shipped name) plus ``KEY VALUE`` overrides, then validate it.

    Raises ConfigError naming the key for unknown keys, wrong types and bad values.
    """
    cfg = get_cfg()
    add_megdet_config(cfg)
    path = resolve_config_path(config)
    # What the config file and its _BASE_ files may not do, before fvcore reads them (it
    # fetches a URL _BASE_ itself): grant the unsafe-files key, or name a URL base.
    _check_files(path, _granted(overrides))
    try:
        # allow_unsafe=False: detectron2's CfgNode defaults to True, which retries a file that
        # yaml.safe_load refuses (a Python tag such as !!python/object/apply) with
        # yaml.unsafe_load, i.e. runs code from the file. fvcore passes the flag on to every
        # _BASE_ file.
        cfg.merge_from_file(str(path), allow_unsafe=False)
    except yaml.constructor.ConstructorError as err:
        if "for the tag" not in str(err.problem):
            raise ConfigError(f"--config: {path} is not valid YAML: {_yaml_problem(err)}") from None
        raise ConfigError(
            f"--config: {path} is refused: a YAML tag that would construct Python objects "
            f"and can run code: {_yaml_problem(err)}; a config may hold only plain YAML "
            "(mappings, lists, strings, numbers, booleans, null)"
        ) from None
    except yaml.YAMLError as err:
        raise ConfigError(f"--config: {path} is not valid YAML: {_yaml_problem(err)}") from None
    except KeyError as err:
        raise ConfigError(f"{path}: {_key_error_text(err)}") from None
    except (ValueError, TypeError, AssertionError) as err:
        raise ConfigError(f"{path}: {err}") from None
    except OSError as err:
        raise ConfigError(f"{path}: cannot read: {err}") from None
    if len(overrides) % 2:
        raise ConfigError(f"overrides come in KEY VALUE pairs; {overrides[-1]!r} has no value")
    for key, value in zip(overrides[::2], overrides[1::2], strict=True):
        _set_key(cfg, key, value)
    validate_config(cfg)
    return cfg


def _yaml_problem(err: yaml.YAMLError) -> str:
    """The YAML error on one line: what is wrong and where (the file's line and column)."""
    if isinstance(err, yaml.MarkedYAMLError):
        mark = err.problem_mark or err.context_mark
        where = ""
        if mark:
            # The file the tag is in: a _BASE_ file's name differs from the loaded config's.
            name = f"{mark.name}, " if mark.name and not mark.name.startswith("<") else ""
            where = f" ({name}line {mark.line + 1}, column {mark.column + 1})"
        return f"{err.problem or err.context}{where}"
    return str(err).replace("\n", " ")


def _key_error_text(err: KeyError) -> str:
    return str(err.args[0]) if err.args else str(err)


def _set_key(cfg: CfgNode, key: str, value: str) -> None:
    node = cfg
    parts = key.split(".")
    for i, part in enumerate(parts):
        if not isinstance(node, CfgNode) or part not in node:
            parent = ".".join(parts[:i]) or "the config root"
            allowed = ", ".join(sorted(node.keys())) if isinstance(node, CfgNode) else ""
            raise ConfigError(f"{key}: unknown config key (keys under {parent}: {allowed})")
        if i < len(parts) - 1:
            node = node[part]
    try:
        cfg.merge_from_list([key, value])
    except (ValueError, TypeError, AssertionError) as err:
        raise ConfigError(f"{key}: {value!r} is invalid: {err}") from None


def validate_config(cfg: CfgNode) -> None:
    """Check the MEGDET values (types and allowed values), naming the key on error."""
    m = cfg.MEGDET
    _choice("MEGDET.SYNC_BN", m.SYNC_BN, SYNC_BN_SCOPES)
    _choice("MEGDET.SCALING", m.SCALING, SCALINGS)
    _choice("MEGDET.SCHEDULE", m.SCHEDULE, SCHEDULES)
    _choice("MEGDET.RESIZE", m.RESIZE, RESIZES)
    for key, minimum in (
        ("IMAGES_PER_GPU", 1),
        ("ACCUMULATION_STEPS", 1),
        ("REFERENCE_BATCH", 1),
        ("BN_GROUP_SIZE", 0),
        ("SYNCBN_CHECK_PERIOD", 0),
    ):
        value = m[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ConfigError(
                f"MEGDET.{key}: {value!r} is invalid: expected an integer >= {minimum}"
            )
    port = m.METRICS.PORT
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ConfigError(
            f"MEGDET.METRICS.PORT: {port!r} is invalid: expected a port number 1-65535, "
            "or 0 (metrics off)"
        )
    for key in ("AMP", "ALLOW_UNSAFE_WEIGHTS"):
        if not isinstance(m[key], bool):
            raise ConfigError(f"MEGDET.{key}: {m[key]!r} is invalid: expected True or False")
    if not isinstance(m.RESUME_FROM, str):
        raise ConfigError(
            f"MEGDET.RESUME_FROM: {m.RESUME_FROM!r} is invalid: expected a run's uid or name, "
            'or "" (continue only this run\'s own output folder)'
        )
    problem = weights_problem(cfg.MODEL.WEIGHTS, m.ALLOW_UNSAFE_WEIGHTS)
    if problem:
        raise ConfigError(f"MODEL.WEIGHTS: {problem}")
    if cfg.MODEL.LOAD_PROPOSALS and not m.ALLOW_UNSAFE_WEIGHTS:
        # detectron2's build_detection_{train,test}_loader pass DATASETS.PROPOSAL_FILES_* to
        # load_proposals_into_dataset, which reads each with PathManager (URLs are downloaded)
        # and pickle.load.
        files = [*cfg.DATASETS.PROPOSAL_FILES_TRAIN, *cfg.DATASETS.PROPOSAL_FILES_TEST]
        raise ConfigError(
            f"MODEL.LOAD_PROPOSALS: True is refused: detectron2 then loads "
            f"DATASETS.PROPOSAL_FILES_TRAIN/TEST ({', '.join(map(repr, files)) or 'none set'}) "
            f"with pickle, which can run code, and downloads URLs; {UNSAFE_GRANT}"
        )


#: How the unsafe-files key is granted: on the command line only (the run chart passes it when
#: the operator's policy.unsafeWeights allows), never by a config file.
UNSAFE_GRANT = (
    "MEGDET.ALLOW_UNSAFE_WEIGHTS True (on the command line; in a cluster, the operator's "
    "policy.unsafeWeights) allows it, only for files you trust"
)


def _granted(overrides: list[str] | tuple[str, ...]) -> bool:
    """Whether the command line grants MEGDET.ALLOW_UNSAFE_WEIGHTS (its last value wins)."""
    granted = False
    for key, value in zip(overrides[::2], overrides[1::2], strict=False):
        if key == "MEGDET.ALLOW_UNSAFE_WEIGHTS":
            granted = value == "True"
    return granted


def _check_files(path: Path, granted: bool, seen: tuple[str, ...] = ()) -> None:
    """Refuse what a config file (and, recursively, its _BASE_ files) may not choose unless the
    command line grants it: setting MEGDET.ALLOW_UNSAFE_WEIGHTS (a run's author writes
    spec.config; the grant is the operator's), and a _BASE_ that is a URL (fvcore downloads it
    through iopath). YAML errors are left to fvcore's own read, which reports them."""
    name = str(path)
    if os.path.realpath(name) in map(os.path.realpath, seen):
        raise ConfigError(f"_BASE_: {name!r} includes itself (through {', '.join(seen)})")
    try:
        with open(name) as f:
            data = yaml.safe_load(f)
    except (OSError, yaml.YAMLError):
        return
    if not isinstance(data, dict):
        return
    megdet = data.get("MEGDET")
    if (
        not granted
        and isinstance(megdet, dict)
        and "ALLOW_UNSAFE_WEIGHTS" in megdet
        and megdet["ALLOW_UNSAFE_WEIGHTS"] is not False
    ):
        raise ConfigError(
            f"MEGDET.ALLOW_UNSAFE_WEIGHTS: set to {megdet['ALLOW_UNSAFE_WEIGHTS']!r} in {name}; "
            f"a config file cannot grant it: {UNSAFE_GRANT}"
        )
    bases = data.get("_BASE_")
    for base in bases if isinstance(bases, list) else [bases] if bases is not None else []:
        if not isinstance(base, str):
            continue  # fvcore's own error
        # fvcore: "~" expanded, then relative to the including file unless it starts with
        # "/", "https://" or "http://" (so with a config in the working folder, a
        # detectron2:// base stays a URL too).
        resolved = os.path.expanduser(base) if base.startswith("~") else base
        if not resolved.startswith(("/", "https://", "http://")):
            resolved = os.path.join(os.path.dirname(name), resolved)
        if is_url(resolved):
            if granted:
                continue
            raise ConfigError(
                f"_BASE_: {base!r} in {name} is refused: a URL (downloaded, so whoever serves "
                f"it chooses the config); name a local file or a shipped config. {UNSAFE_GRANT}"
            )
        _check_files(Path(resolved), granted, (*seen, name))


#: MODEL.WEIGHTS values loaded without MEGDET.ALLOW_UNSAFE_WEIGHTS although they are URLs of
#: pickle files: the ImageNet weights the shipped configs start from (megdet_R50_FPN_1x.yaml),
#: from detectron2's model zoo (https://dl.fbaipublicfiles.com/detectron2/): a name with a
#: SHA-256 pinned in trainer/weights_pin.py only if its file has that hash (checked before it
#: is unpickled), one with none downloaded from that host into a private folder, never from a
#: cache; any other URL or pickle needs the key.
TRUSTED_WEIGHTS = frozenset(PINNED_WEIGHTS)

#: File endings detectron2's DetectionCheckpointer._load_file reads with pickle (.pkl), or with
#: a torch.load we cannot make weights-only (.pyth); .pickle is pickle by name.
PICKLE_SUFFIXES = (".pkl", ".pickle", ".pyth")

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")

#: What MODEL.WEIGHTS may be without MEGDET.ALLOW_UNSAFE_WEIGHTS (for error messages).
ALLOWED_WEIGHTS = (
    "allowed: empty (no pretrained weights), a local PyTorch file (.pth, .pt) holding only "
    f"tensors, or {', '.join(sorted(TRUSTED_WEIGHTS))}; set MEGDET.ALLOW_UNSAFE_WEIGHTS True "
    "only for weights you trust"
)


def is_url(path: str) -> bool:
    """Whether detectron2 would fetch ``path`` through iopath (http://, s3://, detectron2://...)."""
    return bool(_URL.match(path))


def unsafe_weights_reason(path: str) -> str | None:
    """Why loading ``path`` could run code from it (URL, pickle file), or None."""
    if is_url(path):
        return "a URL (downloaded, then loaded with whatever loader its name picks)"
    # detectron2 drops a ?query before choosing the loader by the file's ending.
    names = {path, path.split("?", 1)[0], path.split("#", 1)[0]}
    if any(name.lower().endswith(PICKLE_SUFFIXES) for name in names):
        suffixes = ", ".join(PICKLE_SUFFIXES)
        return f"a pickle file ({suffixes}: loaded with pickle, which can run code)"
    return None


def weights_problem(path: str, allow_unsafe: bool) -> str | None:
    """Why the weights file ``path`` is refused (the message after the key), or None."""
    if not path or allow_unsafe or path in TRUSTED_WEIGHTS:
        return None
    reason = unsafe_weights_reason(path)
    if reason is None:
        return None
    return f"{path!r} is refused: {reason}; {ALLOWED_WEIGHTS}"


def _choice(key: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"{key}: {value!r} is invalid; allowed values: {', '.join(allowed)}")


def spec_from_config(cfg: CfgNode, world_size: int, local_world_size: int) -> RunSpec:
    """The RunSpec for this config at an actual world size (SpecError names the config key)."""
    from megdet.plan import parse_spec

    s = cfg.SOLVER
    data = {
        "gpus": world_size,
        "gpus_per_node": local_world_size,
        "images_per_gpu": cfg.MEGDET.IMAGES_PER_GPU,
        "accumulation_steps": cfg.MEGDET.ACCUMULATION_STEPS,
        "base_lr": s.BASE_LR,
        "reference_batch": cfg.MEGDET.REFERENCE_BATCH,
        "scaling": cfg.MEGDET.SCALING,
        "schedule": cfg.MEGDET.SCHEDULE,
        "max_iter": s.MAX_ITER,
        "steps": tuple(s.STEPS),
        "warmup_iters": s.WARMUP_ITERS,
        "warmup_factor": s.WARMUP_FACTOR,
        "gamma": s.GAMMA,
    }
    return parse_spec(data)


def plan_config(
    cfg: CfgNode,
    world_size: int,
    local_world_size: int,
    images_done: int = 0,
    run_batch: int | None = None,
) -> Plan:
    """Plan the run at this world size and write the plan into ``cfg.SOLVER`` / ``cfg.TEST``.

    The SOLVER values in ``cfg`` are the reference recipe; afterwards they are the planned ones.
    A run that resumes after ``images_done`` images, trained at global batch ``run_batch``,
    gets the continuation (:func:`megdet.plan.plan_continuation`, by ``MEGDET.RESIZE``), whose
    accumulation is written to ``MEGDET.ACCUMULATION_STEPS``.
    Raises ConfigError (naming the config key) when the recipe cannot be planned.
    """
    bn_group = cfg.MEGDET.BN_GROUP_SIZE
    if bn_group not in (0, world_size) and world_size % bn_group:
        divisors = [d for d in range(1, world_size + 1) if world_size % d == 0]
        raise ConfigError(
            f"MEGDET.BN_GROUP_SIZE: {bn_group} does not divide the world size {world_size} this "
            f"run has; allowed values: 0 (the whole world) or {', '.join(map(str, divisors))}"
        )
    try:
        plan = plan_continuation(
            spec_from_config(cfg, world_size, local_world_size),
            images_done,
            run_batch=run_batch,
            resize=cfg.MEGDET.RESIZE,
        )
    except SpecError as err:
        key = _SPEC_FIELD_KEYS.get(err.field, err.field)
        raise ConfigError(f"{key}: {err.message}") from None
    was_frozen = cfg.is_frozen()
    cfg.defrost()
    cfg.MEGDET.ACCUMULATION_STEPS = plan.spec.accumulation_steps
    cfg.SOLVER.IMS_PER_BATCH = plan.global_batch
    cfg.SOLVER.BASE_LR = plan.lr
    cfg.SOLVER.MAX_ITER = plan.max_iter
    cfg.SOLVER.STEPS = plan.steps
    cfg.SOLVER.WARMUP_ITERS = plan.warmup_iters
    # Periods are reference-scale too: keep them constant in images seen.
    cfg.SOLVER.CHECKPOINT_PERIOD = plan.scale_iters(cfg.SOLVER.CHECKPOINT_PERIOD)
    if cfg.TEST.EVAL_PERIOD > 0:
        cfg.TEST.EVAL_PERIOD = plan.scale_iters(cfg.TEST.EVAL_PERIOD)
    # detectron2 must not rescale again (DefaultTrainer.auto_scale_workers).
    cfg.SOLVER.REFERENCE_WORLD_SIZE = 0
    if was_frozen:
        cfg.freeze()
    return plan
