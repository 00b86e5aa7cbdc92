"""Which run owns an output folder (its stamp ``.megdet-run.json``), so runs do not clobber.

When ``megdet train`` starts, global rank 0 reads the stamp in the output folder and decides
(:func:`decide`); every rank then learns the decision (``comm.all_gather``, which is also the
barrier: no rank writes into the folder before rank 0 has stamped it or refused it).

* No stamp (a new folder, or one from before stamps): rank 0 writes one (created exclusively,
  so of two runs starting together in an empty folder one stamps it and the other is refused).
* A stamp with this run's uid (a restarted pod, a resume of the same run): continue.
* A stamp written by a local run (``origin: local``, no ``MEGDET_RUN_UID``): continue, and a
  cluster run adopts it. Local folders are one user's own; only cluster stamps are protected.
* A cluster stamp (``origin: cluster``) with another uid: refused (exit 2), unless
  ``MEGDET.RESUME_FROM`` is that run's uid or name, in which case this run adopts the folder:
  the stamp is rewritten with this run's identity and a history entry for the previous owner.

The identity comes from the environment: ``MEGDET_RUN_UID`` (the MegDetRun's
``metadata.uid``; set on cluster runs) and ``MEGDET_RUN_NAME``. A run without
``MEGDET_RUN_UID`` is local and stamps a random uid. Nothing in the folder is ever deleted;
stamps are written to a temporary file and renamed (or hard-linked) into place.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from megdet.trainer.config import ConfigError

STAMP_FILE = ".megdet-run.json"
ENV_UID = "MEGDET_RUN_UID"
ENV_NAME = "MEGDET_RUN_NAME"
LOCAL, CLUSTER = "local", "cluster"
_UID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")


class OwnershipError(ConfigError):
    """The output folder belongs to another run (or its stamp cannot be read)."""


@dataclass(frozen=True)
class RunIdentity:
    """Who is starting: ``uid`` is None for a local run (a random one is stamped)."""

    uid: str | None
    name: str

    @property
    def origin(self) -> str:
        return LOCAL if self.uid is None else CLUSTER


def identity_from_env(env: Mapping[str, str] = os.environ) -> RunIdentity:
    """This run's identity from MEGDET_RUN_UID / MEGDET_RUN_NAME (ConfigError if malformed)."""
    uid = env.get(ENV_UID, "").strip() or None
    if uid is not None and not _UID.match(uid):
        raise ConfigError(
            f"{ENV_UID}: {uid!r} is invalid: expected the MegDetRun's metadata.uid (letters, "
            "digits, '.', '_', ':', '-'; at most 128), or unset for a local run"
        )
    return RunIdentity(uid=uid, name=env.get(ENV_NAME, "").strip())


@dataclass(frozen=True)
class Decision:
    """What rank 0 does with the folder: ``action`` is create, continue or adopt."""

    action: str
    stamp: dict[str, Any]
    message: str


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _new_stamp(me: RunIdentity, history: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "uid": me.uid or uuid.uuid4().hex,
        "name": me.name,
        "origin": me.origin,
        "created": _now(),
        "history": history,
    }


def _describe(stamp: Mapping[str, Any]) -> str:
    name = stamp.get("name") or "(unnamed)"
    return (
        f"run {name!r} (uid {stamp.get('uid')}, {stamp.get('origin', '?')}, "
        f"stamped {stamp.get('created', '?')})"
    )


def read_stamp(folder: str | os.PathLike) -> dict[str, Any] | None:
    """The folder's stamp, None when there is none; OwnershipError when it cannot be read."""
    path = Path(folder) / STAMP_FILE
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as err:
        raise OwnershipError(f"OUTPUT_DIR: cannot read {path}: {err}") from None
    try:
        stamp = json.loads(text)
    except ValueError:
        stamp = None
    if not isinstance(stamp, dict) or not isinstance(stamp.get("uid"), str):
        raise OwnershipError(
            f"OUTPUT_DIR: {path} is not a run stamp (JSON with a uid), so which run owns "
            f"{folder} is unknown; check the folder's contents, then fix or move the stamp away"
        )
    return stamp


def decide(
    folder: str | os.PathLike, stamp: dict[str, Any] | None, me: RunIdentity, resume_from: str
) -> Decision:
    """What this run may do in ``folder`` given its stamp; OwnershipError when it must not."""
    if stamp is None:
        new = _new_stamp(me, [])
        return Decision("create", new, f"Stamped {folder} for {_describe(new)}")
    if me.uid is not None and stamp["uid"] == me.uid:
        return Decision("continue", stamp, f"Continuing in {folder}: stamped by this run")
    if me.uid is None and stamp.get("origin") == LOCAL:
        return Decision("continue", stamp, f"Continuing in {folder}: a local run's folder")
    owner = _describe(stamp)
    if resume_from and resume_from in (stamp["uid"], stamp.get("name")):
        reason = f"MEGDET.RESUME_FROM {resume_from!r}"
    elif stamp.get("origin") == LOCAL:
        reason = "a local run's folder"
    else:
        who = f"{me.name!r} (uid {me.uid})" if me.uid else "a local run (MEGDET_RUN_UID unset)"
        fix = f"MEGDET.RESUME_FROM {stamp['uid']}"
        if stamp.get("name"):
            fix += f" (or {stamp['name']})"
        raise OwnershipError(
            f"OUTPUT_DIR: {folder} belongs to {owner}, not to this run, {who}; refusing to "
            f"write into it. Give this run its own output folder, or, to continue that run's "
            f"checkpoints on purpose, set {fix} (a MegDetRun's spec.resumeFrom)"
            + (f"; MEGDET.RESUME_FROM {resume_from!r} names neither" if resume_from else "")
        )
    previous = [*stamp.get("history", []), {**_without_history(stamp), "adopted": _now()}]
    new = _new_stamp(me, previous)
    return Decision("adopt", new, f"Adopted {folder} from {owner} ({reason})")


def _without_history(stamp: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in stamp.items() if k != "history"}


def _write_tmp(folder: Path, stamp: dict[str, Any]) -> str:
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f"{STAMP_FILE}.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(stamp, f, indent=2)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    return tmp


def write_stamp(folder: str | os.PathLike, stamp: dict[str, Any], exclusive: bool) -> bool:
    """Put ``stamp`` in place atomically; with ``exclusive``, only if there is none yet.

    Returns False when ``exclusive`` and another process stamped the folder first.
    """
    folder = Path(folder)
    path = folder / STAMP_FILE
    tmp = _write_tmp(folder, stamp)
    try:
        if not exclusive:
            os.replace(tmp, path)
            return True
        try:
            os.link(tmp, path)  # complete content under the final name, or FileExistsError
        except FileExistsError:
            return False
        except OSError:  # a filesystem without hard links: create exclusively, then fill
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                return False
            with os.fdopen(fd, "w") as f:
                f.write(Path(tmp).read_text())
        return True
    finally:
        Path(tmp).unlink(missing_ok=True)


def claim(folder: str | os.PathLike, me: RunIdentity, resume_from: str) -> Decision:
    """Rank 0: decide about ``folder`` and write the stamp when creating or adopting."""
    for _ in range(3):
        decision = decide(folder, read_stamp(folder), me, resume_from)
        if decision.action == "continue":
            return decision
        if write_stamp(folder, decision.stamp, exclusive=decision.action == "create"):
            return decision
        # Another run stamped the empty folder between our read and our write: decide again.
    raise OwnershipError(f"OUTPUT_DIR: {folder}: the stamp {STAMP_FILE} keeps changing")


def claim_output_folder(folder: str, resume_from: str) -> str:
    """Every rank: rank 0 claims ``folder``, all ranks get its outcome (the log line).

    Raises OwnershipError (a ConfigError: exit 2) on every rank when rank 0 refused.
    """
    from detectron2.utils import comm

    outcome: tuple[bool, str] | None = None
    unexpected: Exception | None = None
    if comm.is_main_process():
        # Whatever happens, rank 0 reaches the all_gather: the other ranks are waiting there.
        try:
            outcome = (True, claim(folder, identity_from_env(), resume_from).message)
        except ConfigError as err:
            outcome = (False, str(err))
        except OSError as err:
            outcome = (False, f"OUTPUT_DIR: cannot write the run stamp in {folder}: {err}")
        except Exception as err:
            outcome, unexpected = (False, f"OUTPUT_DIR: {folder}: claiming it failed: {err}"), err
    ok, text = comm.all_gather(outcome)[0]
    if unexpected is not None:
        raise unexpected
    if not ok:
        raise OwnershipError(text)
    return text
