"""How long a run's name may be, so every object the training operator derives from it is valid.

The Kubeflow training operator (kubeflow/trainer v1.9.x, ``pkg/controller.v1/common/util.go``
``GenGeneralName``) names each replica's Pod and headless Service
``<job>-<replica type, lower case>-<index>``. A Service name must be a DNS-1035 label of at most
63 characters, so the job name must leave room for the longest suffix the chart can produce:
``-worker-<index>`` with the largest Worker index. The run chart (``charts/megdet``,
``megdet.maxJobNameLength`` in ``_helpers.tpl``) and the MegDetRun CRD (a rule on
``metadata.name``) both use :data:`MAX_JOB_NAME_LENGTH`; a chart test keeps the two equal.
"""

from __future__ import annotations

#: Kubernetes DNS label limit (RFC 1123 / 1035): Service, Pod hostname, label values.
DNS_LABEL_MAX = 63

#: The chart's schema maximum for ``gpus``; with ``gpusPerNode: 1`` that is one pod per GPU.
MAX_GPUS = 100_000

#: The longest replica suffix: "-worker-" plus the largest Worker index. With MAX_GPUS pods the
#: Master is index 0 of its own type and the Workers are 0 .. MAX_GPUS - 2.
LONGEST_REPLICA_SUFFIX = len("-worker-") + len(str(MAX_GPUS - 2))

#: The longest job (release fullname, MegDetRun) name: 63 - 13 = 50 characters.
MAX_JOB_NAME_LENGTH = DNS_LABEL_MAX - LONGEST_REPLICA_SUFFIX
