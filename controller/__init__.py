"""The MegDetRun controller: validate a run, render its job with the run chart, reconcile it.

Its modules and layers: docs/architecture.md, "The controller". What runs without a cluster
(the CRD generator, ``megdet validate`` and ``megdet render``) is :mod:`megdet.api`; the running
operator imports none of it.
"""
