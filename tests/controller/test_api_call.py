"""controller/kubeapi.py api_call and retry_later: a failure worth retrying becomes kopf's
TemporaryError after the backoff's delay (counted as a reconcile error); any other is the
caller's, unchanged."""

from __future__ import annotations

import kopf
import pytest
from kubernetes import client as k8s

from megdet.controller import metrics
from megdet.controller.kubeapi import Backoff, api_call, retry_later

BACKOFF = Backoff(base=2.0, cap=60.0)


def errors_counted() -> float:
    return metrics.RECONCILES.labels("error")._value.get()


def test_api_call_answers_the_call() -> None:
    assert api_call("get x", lambda: {"a": 1}, BACKOFF, 0) == {"a": 1}


@pytest.mark.parametrize("status", [409, 429, 500, 503])
def test_a_retryable_failure_is_retried_after_the_backoff(status: int) -> None:
    err = k8s.ApiException(status=status, reason="busy")
    before = errors_counted()

    def call() -> None:
        raise err

    with pytest.raises(kopf.TemporaryError) as caught:
        api_call("get x", call, BACKOFF, 2)
    assert caught.value.delay == 8.0 and str(caught.value).startswith("get x: ")
    assert caught.value.__cause__ is err
    assert errors_counted() == before + 1


def test_any_other_failure_is_the_callers() -> None:
    err = k8s.ApiException(status=422, reason="Invalid")
    before = errors_counted()

    def call() -> None:
        raise err

    with pytest.raises(k8s.ApiException) as caught:
        api_call("create x", call, BACKOFF, 0)
    assert caught.value is err
    assert retry_later("create x", err, BACKOFF, 0) is None  # returns: the caller sorts it
    assert errors_counted() == before


def test_retry_later_sorts_a_caught_failure() -> None:
    with pytest.raises(kopf.TemporaryError) as caught:
        retry_later("write status", ConnectionError("reset"), BACKOFF, 0)
    assert caught.value.delay == 2.0
