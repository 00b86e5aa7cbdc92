"""The MegDetRun controller: validate a run, render its job with the run chart, reconcile it.

The pure part lives in :mod:`megdet.controller.render` (spec -> chart values -> rendered job),
:mod:`megdet.controller.planning` (a run -> the objects it owns) and
:mod:`megdet.controller.status` (the run's status); :mod:`megdet.controller.api` names the API
objects. The kopf handlers (:mod:`megdet.controller.reconciler`, registered by
:mod:`megdet.controller.operator`; the API calls for a run's objects in
:mod:`megdet.controller.children`, the job and pod mirror in :mod:`megdet.controller.mirror`)
build on them and do the I/O (:mod:`megdet.controller.kubeapi`). ``megdet controller`` is
:mod:`megdet.controller.daemon`.
What runs without a cluster (the CRD generator, ``megdet validate`` and ``megdet render``,
every check a spec goes through) is :mod:`megdet.api`; the running operator
imports none of it.
"""
