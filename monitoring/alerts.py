"""Prometheus alert rules for MegDet runs and the controller: the source of the chart's
PrometheusRule.

Each :class:`Alert` states its PromQL, how long it must hold, its summary/description and a
runbook anchor in docs/operations.md. Thresholds users tune live in the operator chart's
values (``alerts.<key>.*``); in an expression ``<<name>>`` stands for ``.Values.alerts.<key>.
<name>``. :func:`prometheusrule_template` writes the Helm template
(charts/megdet-operator/templates/prometheusrule.yaml; ``make dashboards``), so the rules that
ship, the ones ``promtool`` checks and the ones the tests run against a real Prometheus are
the chart's render, never a copy.

Label conventions: trainer series carry ``namespace`` and ``run`` (the PodMonitor's
relabeling) and ``pod``; controller series carry the run's ``namespace`` (its ServiceMonitor
keeps the exposed labels: ``honorLabels``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from megdet.monitoring.records import EFFICIENCY_KEY, RECORDS
from megdet.monitoring.records import GROUP as EFFICIENCY_GROUP

__all__ = ["ALERTS", "GROUPS", "Alert", "prometheusrule_template", "runbook_anchor"]

#: Rule groups, in the order the PrometheusRule lists them.
GROUPS = ("megdet-training", "megdet-controller")

# Prometheus' alert templates, e.g. "{{ $labels.run }}": kept verbatim through Helm.
_PROM_TEMPLATE = re.compile(r"\{\{.*?\}\}")
_VALUE_REF = re.compile(r"<<(\w+)>>")
_RUN = "{{ $labels.namespace }}/{{ $labels.run }}"


@dataclass(frozen=True)
class Alert:
    """One alerting rule; ``key`` names its section under ``alerts`` in the chart's values."""

    name: str
    key: str
    group: str
    expr: str
    summary: str
    description: str
    for_: str = "<<for>>"

    @property
    def anchor(self) -> str:
        """The runbook's anchor in docs/operations.md (GitHub's heading slug)."""
        return runbook_anchor(self.name)


def runbook_anchor(name: str) -> str:
    """GitHub's anchor for a Markdown heading that is exactly ``name``."""
    return name.lower()


ALERTS: tuple[Alert, ...] = (
    Alert(
        name="MegDetNonFiniteLoss",
        key="nonFiniteLoss",
        group="megdet-training",
        # The trainer stops on a non-finite loss, usually before the next scrape; the count
        # comes back from the run history when the run restarts, in a new series (new pod IP).
        # So compare the run's count across all its series in the window, not one series'
        # increase().
        expr=(
            "max by (namespace, run) "
            "(max_over_time(megdet_train_nonfinite_loss_total[<<window>>]))\n"
            "> min by (namespace, run) "
            "(min_over_time(megdet_train_nonfinite_loss_total[<<window>>]))"
        ),
        for_="0m",
        summary=f"Run {_RUN}: the training loss became NaN or infinite",
        description=(
            f"Run {_RUN} met a non-finite loss in the last <<window>>. detectron2 stops the "
            "run on it; resuming from the last checkpoint with the same settings usually "
            "diverges again."
        ),
    ),
    Alert(
        name="MegDetTrainingStalled",
        key="trainingStalled",
        group="megdet-training",
        # Only runs that exported an iteration <<window>> ago (a run still starting up is not
        # stalled) and have iterations left.
        expr=(
            "changes(megdet_train_iteration[<<window>>]) == 0\n"
            "and megdet_train_iteration < megdet_train_max_iterations\n"
            "and megdet_train_iteration offset <<window>>"
        ),
        summary=f"Run {_RUN} has made no iteration progress for <<window>>",
        description=(
            f"The iteration counter of run {_RUN} has not moved for <<window>> although the "
            "run has iterations left. Typical causes: a hung "
            "collective (one rank died or is slow), a stalled data loader, a blocked "
            "checkpoint write."
        ),
    ),
    Alert(
        name="MegDetThroughputDropped",
        key="throughputDrop",
        group="megdet-training",
        expr=(
            "sum by (namespace, run) (rate(megdet_train_images_total[<<window>>]))\n"
            "< <<ratio>> *\n"
            "sum by (namespace, run) (rate(megdet_train_images_total[<<baseline>>] "
            "offset <<window>>))"
        ),
        summary=f"Run {_RUN}: throughput dropped below <<ratio>> of its recent rate",
        description=(
            f"Run {_RUN} trained {{{{ $value | humanize }}}} images/s over the last <<window>>, "
            "less than <<ratio>> of its own rate over the <<baseline>> before. A slow rank "
            "(thermal throttling, a noisy neighbour, a degraded link) slows every rank."
        ),
    ),
    Alert(
        name="MegDetSyncBNDivergence",
        key="syncBNDivergence",
        group="megdet-training",
        # Scope `none` diverges by design: only runs that synchronize BN.
        expr=(
            "max by (namespace, run) (megdet_syncbn_divergence) > <<threshold>>\n"
            "and on (namespace, run)\n"
            'max by (namespace, run) (megdet_train_run_info{sync_bn!="none"})'
        ),
        summary=f"Run {_RUN}: synchronized BatchNorm statistics differ across ranks",
        description=(
            f"The backbone BN running statistics of run {_RUN} differ by up to "
            "{{ $value }} across the ranks of a BN group (threshold <<threshold>>) although "
            "SyncBN is on. Synchronized BN keeps them equal; a difference means some layers "
            "are not synchronized or ranks train on different weights."
        ),
    ),
    Alert(
        name="MegDetCheckpointTooOld",
        key="checkpointTooOld",
        group="megdet-training",
        # A timestamp of 0 means "no checkpoint yet": the stall alert covers a run that makes
        # no progress before its first checkpoint.
        expr=(
            "time() - megdet_train_last_checkpoint_timestamp_seconds > <<maxAgeSeconds>>\n"
            "and megdet_train_last_checkpoint_timestamp_seconds > 0\n"
            "and megdet_train_iteration < megdet_train_max_iterations"
        ),
        summary=f"Run {_RUN}: the last complete checkpoint is older than <<maxAgeSeconds>> s",
        description=(
            f"Run {_RUN} last wrote a complete checkpoint {{{{ $value | humanizeDuration }}}} "
            "ago. A restart now would lose all training since. Checkpoint writes may be "
            "failing (volume full, permissions) or the checkpoint period is too long."
        ),
    ),
    Alert(
        name="MegDetRunRestarting",
        key="restarts",
        group="megdet-training",
        # Resumes come from the trainer (per run); the controller counts job restarts even
        # when pods die before the trainer starts (per namespace).
        expr=(
            "(\n"
            "  max by (namespace, run) (max_over_time(megdet_train_resumes[<<window>>]))\n"
            "  - min by (namespace, run) (min_over_time(megdet_train_resumes[<<window>>]))\n"
            ") >= <<count>>\n"
            "or sum by (namespace) (increase(megdet_controller_jobs_restarted_total[<<window>>]))"
            " >= <<count>>"
        ),
        for_="0m",
        summary="MegDet runs in {{ $labels.namespace }} restarted <<count>> or more times "
        "in <<window>>",
        description=(
            "{{ $value }} restarts in <<window>> in namespace {{ $labels.namespace }}"
            "{{ with $labels.run }} (run {{ . }}){{ end }}. Each restart loses the work since "
            "the last checkpoint; a run that keeps restarting will not finish."
        ),
    ),
    Alert(
        name="MegDetFabricDegraded",
        key="fabricDegraded",
        group="megdet-training",
        # The trainer reads the network from NCCL's own init log (trainer/fabric.py); the
        # series exists from the run's start on, so the alert needs no `for`.
        expr=(
            "count by (namespace, run) "
            '(megdet_train_fabric_info{requested="IB", transport="Socket"}) > 0'
        ),
        for_="0m",
        summary=f"Run {_RUN}: NCCL uses TCP sockets although InfiniBand was requested",
        description=(
            f"{{{{ $value }}}} rank(s) of run {_RUN} asked NCCL for InfiniBand "
            "(nccl.ib.enabled: NCCL_IB_DISABLE=0, or NCCL_IB_HCA) and NCCL's init log says "
            "'Using network Socket': collectives between nodes run over TCP. The run's "
            "FabricDegraded condition and rank 0's 'Fabric:' log line say how many ranks and "
            "what NCCL reported; `megdet doctor` in one of its pods says what InfiniBand lacks."
        ),
    ),
    Alert(
        name="MegDetRunFailed",
        # max, not sum, over controller replicas: each one that acted reports every run.
        key="runFailed",
        group="megdet-controller",
        expr='max by (namespace) (megdet_controller_runs{phase="Failed"}) > 0',
        for_="0m",
        summary="{{ $value }} MegDetRun(s) failed in namespace {{ $labels.namespace }}",
        description=(
            "{{ $value }} MegDetRun(s) in namespace {{ $labels.namespace }} are in phase "
            "Failed: their job failed beyond its restart budget. The alert clears when the "
            "runs are deleted or resubmitted."
        ),
    ),
    Alert(
        name="MegDetRunPendingTooLong",
        key="runPending",
        group="megdet-controller",
        expr='max by (namespace) (megdet_controller_runs{phase="Pending"}) > 0',
        summary="MegDetRuns in namespace {{ $labels.namespace }} have been Pending for <<for>>",
        description=(
            "{{ $value }} MegDetRun(s) in namespace {{ $labels.namespace }} have been in phase "
            "Pending for at least <<for>>: their pods are not all running. With gang "
            "scheduling a job waits until every pod fits; check quota, GPUs free and the "
            "scheduler's events."
        ),
    ),
    Alert(
        name="MegDetControllerReconcileErrors",
        key="reconcileErrors",
        group="megdet-controller",
        expr=(
            "sum by (namespace, job) "
            '(increase(megdet_controller_reconciles_total{result="error"}[<<window>>]))'
            " > <<threshold>>"
        ),
        summary="The MegDet controller keeps failing to reconcile runs",
        description=(
            "{{ $value | humanize }} reconciles raised errors in the last <<window>> and "
            "kept doing so for <<for>> (controller {{ $labels.namespace }}/"
            "{{ $labels.job }}). Runs are not being created or updated."
        ),
    ),
)


def _helm(text: str, key: str) -> str:
    """Keep Prometheus templates verbatim through Helm; turn <<name>> into the chart value."""
    escaped = _PROM_TEMPLATE.sub(lambda m: "{{`" + m.group(0) + "`}}", text)
    return _VALUE_REF.sub(lambda m: f"{{{{ .Values.alerts.{key}.{m.group(1)} }}}}", escaped)


def _quoted(text: str) -> str:
    """A YAML single-quoted scalar (Helm output stays valid YAML whatever the text holds)."""
    return "'" + text.replace("'", "''") + "'"


def _rule_lines(alert: Alert) -> list[str]:
    expr = _helm(alert.expr, alert.key).splitlines()
    enabled = f".Values.alerts.{alert.key}.enabled"
    return [
        f"        {{{{- if {enabled} }}}}",
        f"        - alert: {alert.name}",
        "          expr: |-",
        *[f"            {line}" for line in expr],
        f"          for: {_helm(alert.for_, alert.key)}",
        "          labels:",
        f"            severity: {_helm('<<severity>>', alert.key)}",
        "            {{- with .Values.alerts.ruleLabels }}",
        "            {{- toYaml . | nindent 12 }}",
        "            {{- end }}",
        "          annotations:",
        f"            summary: {_quoted(_helm(alert.summary, alert.key))}",
        f"            description: {_quoted(_helm(alert.description, alert.key))}",
        f"            runbook_url: '{{{{ .Values.alerts.runbookBaseUrl }}}}#{alert.anchor}'",
        "        {{- end }}",
    ]


def _recording_lines() -> list[str]:
    """The efficiency recording rules' group (monitoring/efficiency.py)."""
    lines = [
        f"    {{{{- if .Values.alerts.{EFFICIENCY_KEY}.enabled }}}}",
        f"    - name: {EFFICIENCY_GROUP}",
        "      rules:",
    ]
    for record in RECORDS:
        lines += [f"        - record: {record.record}", "          expr: |-"]
        lines += [f"            {line}" for line in _helm(record.expr, EFFICIENCY_KEY).splitlines()]
    return [*lines, "    {{- end }}"]


def prometheusrule_template(fullname: str, labels: str) -> str:
    """The operator chart's PrometheusRule template; ``fullname``/``labels``: helper names."""
    lines = [
        "{{- /* Generated by `make dashboards` from monitoring/alerts.py: edit that file. */}}",
        "{{- if .Values.alerts.enabled }}",
        "apiVersion: monitoring.coreos.com/v1",
        "kind: PrometheusRule",
        "metadata:",
        f'  name: {{{{ include "{fullname}" . }}}}',
        "  namespace: {{ .Release.Namespace }}",
        "  labels:",
        f'    {{{{- include "{labels}" . | nindent 4 }}}}',
        "    {{- with .Values.alerts.additionalLabels }}",
        "    {{- toYaml . | nindent 4 }}",
        "    {{- end }}",
        "spec:",
        "  groups:",
    ]
    for group in GROUPS:
        members = [alert for alert in ALERTS if alert.group == group]
        # A group whose every alert is switched off is left out (an empty group is invalid).
        any_enabled = " ".join(f".Values.alerts.{alert.key}.enabled" for alert in members)
        lines += [
            f"    {{{{- if or {any_enabled} }}}}",
            f"    - name: {group}",
            "      rules:",
        ]
        for alert in members:
            lines += _rule_lines(alert)
        lines.append("    {{- end }}")
    lines += _recording_lines()
    lines.append("{{- end }}")
    return "\n".join(lines) + "\n"
