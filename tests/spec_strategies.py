"""Hypothesis strategies for MegDetRun spec sections that the agreement tests sample alike
(tests/api/test_validation.py, tests/e2e/test_apply_runs.py): valid values and
the few that a rule refuses in combination."""

from __future__ import annotations

from hypothesis import strategies as st

NCCL = st.fixed_dictionaries(
    {},
    optional={
        "ib": st.fixed_dictionaries(
            {"enabled": st.booleans()},
            optional={"rdmaResourceName": st.sampled_from(["", "rdma/ib"])},
        )
    },
)
GANG = st.fixed_dictionaries(
    {},
    optional={
        "enabled": st.booleans(),
        "schedulerName": st.sampled_from(["volcano", "scheduler-plugins-scheduler"]),
        "queue": st.sampled_from(["", "training"]),
        "scheduleTimeoutSeconds": st.one_of(st.none(), st.just(600)),
    },
)
KUEUE = st.fixed_dictionaries({}, optional={"queueName": st.sampled_from(["", "q"])})
RUN_POLICY = st.fixed_dictionaries({}, optional={"suspend": st.booleans()})
