"""The MegDetRun controller: validate a run, render its job with the run chart, reconcile it.

The pure part lives in :mod:`megdet.controller.render` (spec -> chart values -> rendered job),
:mod:`megdet.controller.validation` (every check a spec goes through),
:mod:`megdet.controller.planning` (a run -> the objects it owns),
:mod:`megdet.controller.status` (the run's status) and :mod:`megdet.controller.crd` (the CRD,
generated from the run chart's values schema); :mod:`megdet.controller.api` names the API
objects. The kopf handlers (:mod:`megdet.controller.reconciler`, registered by
:mod:`megdet.controller.operator`) build on them and do the I/O
(:mod:`megdet.controller.kubeapi`). ``megdet controller`` is :mod:`megdet.controller.daemon`;
``megdet validate`` and ``megdet render`` are :mod:`megdet.controller.offline`.
"""
