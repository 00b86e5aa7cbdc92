"""What runs without a cluster: the CRD generator and ``megdet validate``'s offline checks.

Nothing here is imported by the running operator (``megdet controller``); the controller's own
modules are the ones in the folder above. This package holds:

- :mod:`~megdet.controller.offline.crd` (``make crd``): the MegDetRun CRD, generated from the
  run chart's values schema, through :mod:`~megdet.controller.offline.openapi` (JSON Schema to
  a structural schema) and :mod:`~megdet.controller.offline.cel_rules` (the generated CEL
  rules);
- :mod:`~megdet.controller.offline.schema` (what the API server does with that schema:
  default, validate, run CEL) and :mod:`~megdet.controller.offline.validation` (every check a
  spec goes through, in the cluster's order);
- :mod:`~megdet.controller.offline.cli`: ``megdet validate`` and ``megdet render``, reading
  runs through :mod:`~megdet.controller.offline.documents`; ``megdet render --pods`` is
  :mod:`~megdet.controller.offline.pods`.
"""
