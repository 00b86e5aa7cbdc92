"""The MegDetRun controller: validate a run, render its job with the run chart, reconcile it.

The pure part lives in :mod:`megdet.controller.render` (spec -> chart values -> rendered job),
:mod:`megdet.controller.validation` (every check a spec goes through) and
:mod:`megdet.controller.crd` (the CRD, generated from the run chart's values schema). The kopf
handlers build on them and do the I/O.
"""
