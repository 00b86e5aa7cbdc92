"""The metric names our exporters expose, read from their own prometheus_client registries.

The trainer's names come from ``megdet.trainer.metrics.build_registry`` (every trainer metric in
one registry), the controller's from ``megdet.controller.metrics.REGISTRY``. A dashboard or an
alert that reads a name outside these (and outside the explicit external list in
:mod:`megdet.monitoring.queries`) reads something nothing exports.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry

__all__ = ["exported_metric_names", "sample_names"]

# The sample names prometheus_client exposes per metric type (family name + suffix).
_SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("", "_sum", "_count", "_created"),
    "gauge": ("",),
    "info": ("_info",),
}


def sample_names(registry: CollectorRegistry) -> set[str]:
    """Every sample name a registry can expose, whether or not a labelled child exists yet."""
    names: set[str] = set()
    for family in registry.collect():
        for suffix in _SUFFIXES.get(family.type, ("",)):
            names.add(family.name + suffix)
    return names


def trainer_metric_names() -> set[str]:
    """Sample names of every trainer metric."""
    from megdet.trainer.metrics import build_registry

    return sample_names(build_registry())


def controller_metric_names() -> set[str]:
    """Sample names of every controller metric."""
    from megdet.controller.metrics import REGISTRY

    return sample_names(REGISTRY)


def exported_metric_names() -> set[str]:
    """Sample names the trainer and the controller expose."""
    return trainer_metric_names() | controller_metric_names()
