"""GPU efficiency: recording rules and the panels that read them.

A run's efficiency is three numbers joined on ``(namespace, run)``:

* **GPU activity**: dcgm-exporter's ``DCGM_FI_PROF_GR_ENGINE_ACTIVE`` (the ratio of time the
  graphics engine is busy; a default counter of NVIDIA/dcgm-exporter, ``etc/default-counters.csv``,
  tag 4.5.3-4.8.2), averaged over the run's pods, which dcgm-exporter labels with ``pod`` and
  ``namespace``. The run is the pod name less its job suffix (:data:`POD_SUFFIX`).
* **Images per second per GPU**: the trainer's ``megdet_train_images_total`` over its
  ``megdet_train_world_size`` (one process per GPU).
* **Scaling efficiency**: that per-GPU rate over the best per-GPU rate the same run reached while
  it ran on one node (``megdet_train_nodes == 1``) within ``alerts.efficiency.lookback``. A run
  resized from one node to several (docs/elastic.md), or started small and grown, measures its
  own scaling; a run that never ran on one node has no efficiency series (nothing to compare with,
  and no guess is shown).

The rules ship in the operator chart's PrometheusRule (group ``megdet-efficiency``,
``alerts.efficiency.enabled``), rendered by :func:`megdet.monitoring.alerts.prometheusrule_template`
and unit-tested with promtool on synthetic series (tests/monitoring/recording_rules_test.yaml).
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import table
from grafana_foundation_sdk.models.dashboard import DataTransformerConfig

from megdet.monitoring.panels import (
    DATASOURCE,
    NAMESPACES,
    RATE,
    RUN,
    RUN_PODS,
    Ids,
    Panel,
    query,
    timeseries_panel,
)
from megdet.monitoring.records import ACTIVITY, GROUP, IMAGES_PER_GPU, SCALING

__all__ = ["fleet_efficiency_panels", "gpu_panels"]


def gpu_panels(ids: Ids) -> list[Panel]:
    """The run dashboard's GPU row: dcgm-exporter's series and the run's efficiency."""
    return [
        timeseries_panel(
            ids,
            "GPU utilization (DCGM)",
            "dcgm-exporter's DCGM_FI_DEV_GPU_UTIL for the run's pods; empty without "
            "dcgm-exporter (scraped with honorLabels so pod/namespace are the workload's).",
            [(f"avg by (pod, gpu) (DCGM_FI_DEV_GPU_UTIL{{{RUN_PODS}}})", "{{pod}} gpu {{gpu}}")],
            unit="percent",
        ),
        timeseries_panel(
            ids,
            "GPU framebuffer used (DCGM)",
            "dcgm-exporter's DCGM_FI_DEV_FB_USED (MiB) for the run's pods.",
            [(f"max by (pod, gpu) (DCGM_FI_DEV_FB_USED{{{RUN_PODS}}})", "{{pod}} gpu {{gpu}}")],
            unit="decmbytes",
        ),
        timeseries_panel(
            ids,
            "GPU activity (DCGM)",
            "dcgm-exporter's DCGM_FI_PROF_GR_ENGINE_ACTIVE (time the GPU's engine is busy) for "
            "the run's pods, next to the images per second per GPU: activity that stays high "
            "while images/s per GPU falls points at the model or the communication, activity "
            "that falls with it at the input pipeline.",
            [
                (
                    f"avg by (pod, gpu) (DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{RUN_PODS}}})",
                    "{{pod}} gpu {{gpu}}",
                )
            ],
            unit="percentunit",
            width=8,
        ),
        timeseries_panel(
            ids,
            "Images/s per GPU",
            "The run's images per second over its world size (megdet_train_world_size: one "
            "process per GPU).",
            [
                (
                    f"sum(rate(megdet_train_images_total{{{RUN}}}[{RATE}])) "
                    f"/ max(megdet_train_world_size{{{RUN}}})",
                    "images/s per GPU",
                )
            ],
            width=8,
        ),
        timeseries_panel(
            ids,
            "Scaling efficiency",
            "Images/s per GPU over the best the same run reached on one node within the "
            "lookback (alerts.efficiency.lookback); no series for a run that never ran on one "
            f"node ({SCALING}).",
            [(f"max({SCALING}{{{RUN}}})", "efficiency")],
            unit="percentunit",
            width=8,
        ),
    ]


def fleet_efficiency_panels(ids: Ids) -> list[Panel]:
    """The fleet dashboard's table: every run's GPU activity, images/s per GPU and scaling
    efficiency, joined on namespace and run."""
    columns = [(ACTIVITY, "A"), (IMAGES_PER_GPU, "B"), (SCALING, "C")]
    panel = (
        table.Panel()
        .id(ids.next())
        .title("GPU efficiency by run")
        .description(
            "One row per run: GPU activity (dcgm-exporter, empty without it), images/s per GPU "
            "and scaling efficiency against the run's own single-node rate (the "
            f"{GROUP} recording rules)."
        )
        .datasource(DATASOURCE)
        .span(24)
        .height(8)
        .with_transformation(DataTransformerConfig(id_val="merge", options={}))
    )
    for name, ref in columns:
        panel = panel.with_target(query(f"{name}{{{NAMESPACES}}}", ref=ref, instant=True))
    return [panel]
