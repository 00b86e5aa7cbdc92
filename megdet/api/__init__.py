"""The MegDetRun API apart from the operator that serves it: its CRD, the checks a spec goes
through and the job a spec becomes, all without a cluster.

The running operator (``megdet controller``, :mod:`megdet.controller`) imports nothing from
here; this package imports the controller's pure modules (the names, the run chart's renderer,
the planning, the policy's rules). It holds:

- :mod:`~megdet.api.crd` (``make crd``): the MegDetRun CRD, generated from the run chart's
  values schema, through :mod:`~megdet.api.openapi` (JSON Schema to a structural schema) and
  :mod:`~megdet.api.cel_rules` (the generated CEL rules);
- :mod:`~megdet.api.schema` (what the API server does with that schema: default, validate,
  run CEL) and :mod:`~megdet.api.validation` (every check a spec goes through, in the
  cluster's order);
- :mod:`~megdet.api.cli`: ``megdet validate`` and ``megdet render``, reading runs through
  :mod:`~megdet.api.documents`; ``megdet render --pods`` is :mod:`~megdet.api.pods`;
- the other generated files: :mod:`~megdet.api.admission` (``make policy``: the operator
  chart's admission policy) and :mod:`~megdet.api.docs_tables` (``make doc-tables``).
"""
