"""kopf's diff base of a MegDetRun kept in its status (:class:`StatusDiffBase`), written by the
reconcile's own status write, and kopf's progress without its marker annotation
(:class:`ProgressAnnotations`). Why, from kopf's source: docs/controller.md, "The controller in
detail" (kopf's bookkeeping rides on the status write).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

import kopf

from megdet.controller.api import GROUP
from megdet.controller.run_record import RunRecords

__all__ = ["FIELD", "LEGACY_KEY", "ProgressAnnotations", "StatusDiffBase"]

#: ``status.<FIELD>``: the essence kopf compares the run with, as compact JSON.
FIELD = "handledConfiguration"
#: The annotation (under ``megdet.io/``) earlier controllers kept the base in.
LEGACY_KEY = "last-handled-configuration"


def _encode(essence: Mapping[str, Any]) -> str:
    return json.dumps(essence, separators=(",", ":"), sort_keys=True)


class StatusDiffBase(kopf.DiffBaseStorage):
    """kopf's ``settings.persistence.diffbase_storage`` for MegDetRuns (see the module)."""

    def __init__(self, records: RunRecords | None = None) -> None:
        super().__init__()
        self._legacy = kopf.AnnotationsDiffBaseStorage(prefix=GROUP, key=LEGACY_KEY)
        #: Each run's record (``written_base``): the base the handler's last status write
        #: carried, until kopf stores the same (or the run is forgotten).
        self.records = records if records is not None else RunRecords()

    def build(
        self, *, body: kopf.Body, extra_fields: Iterable[Any] | None = None
    ) -> kopf.BodyEssence:
        """kopf's essence, without any ``megdet.io/`` annotation: those are kopf's bookkeeping
        (its progress) and ours, never part of what a user asks for. (kopf left them out of the
        essence anyway once its marker annotation was on the run.)"""
        essence = super().build(body=body, extra_fields=extra_fields)
        annotations = (essence.get("metadata") or {}).get("annotations")
        if annotations:
            for key in [k for k in annotations if k.startswith(f"{GROUP}/")]:
                del annotations[key]
            self.remove_empty_stanzas(essence)
        return essence

    def encoded(self, body: Mapping[str, Any]) -> str:
        """The base kopf stores once the handler given ``body`` ends (what the reconcile
        writes into its last status write)."""
        return _encode(self.build(body=kopf.Body(dict(body))))

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        status = body.get("status")
        encoded = status.get(FIELD) if isinstance(status, Mapping) else None
        try:
            if isinstance(encoded, str) and encoded:
                decoded = json.loads(encoded)
            else:  # an earlier controller's annotation
                decoded = self._legacy.fetch(body=body)
        except ValueError:  # not ours to trust: handled as never handled (a create)
            return None
        return decoded if isinstance(decoded, dict) else None  # type: ignore[return-value]

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        encoded = _encode(essence)
        meta = body.get("metadata") or {}
        written = self.records.take((meta.get("namespace"), meta.get("name")), "written_base")
        if written != encoded:
            patch.status[FIELD] = encoded

    def note_written(self, namespace: str, name: str, encoded: str) -> None:
        """The handler's status write carried ``encoded`` (the handler ends with it)."""
        self.records.set((namespace, name), written_base=encoded)

    def __len__(self) -> int:
        return len(self.records.values_of("written_base"))


class ProgressAnnotations(kopf.AnnotationsProgressStorage):
    """kopf's progress of a run's handlers in ``megdet.io/<handler>`` annotations, without
    kopf's marker annotation: a reconcile that succeeds at once then leaves kopf nothing to
    patch (its progress record is written and purged within one patch, which ends up empty:
    kopf 1.45 ``_cogs/configs/progress.py``, ``AnnotationsProgressStorage.purge``)."""

    def __init__(self) -> None:
        super().__init__(prefix=GROUP)

    def _store_marker(self, prefix: str, patch: kopf.Patch, body: kopf.Body) -> None:
        return None  # see the class: the marker's only reader is kopf's essence, ours drops it
