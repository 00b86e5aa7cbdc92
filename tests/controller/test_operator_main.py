"""`megdet controller`: flags and their errors (the operator itself is tested against kmock)."""

from __future__ import annotations

import pytest

from megdet.cli import build_parser, main
from megdet.controller.daemon import MAX_RANDOM_PRIORITY


def test_controller_command_defaults_match_the_chart() -> None:
    args = build_parser().parse_args(["controller"])
    assert args.metrics_port == 8080 and args.health_port == 8081
    assert args.peering == "megdet-controller" and not args.standalone
    assert 1 <= args.priority <= MAX_RANDOM_PRIORITY
    assert args.namespace == []


def test_random_priority_differs_between_replicas() -> None:
    drawn = {build_parser().parse_args(["controller"]).priority for _ in range(20)}
    assert len(drawn) > 1


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--priority", "high"], "--priority: 'high' is not a whole number or 'random'"),
        (["--metrics-port", "0"], "--metrics-port: 0 must be >= 1"),
        (["--api-timeout", "-1"], "--api-timeout: -1 must be a finite number > 0"),
        (["--metrics-port", "70000"], "--metrics-port 70000 must be <= 65535"),
        (
            ["--metrics-port", "9000", "--health-port", "9000"],
            "--metrics-port and --health-port must differ",
        ),
        (["--peering", "x", "--standalone"], "not allowed with argument"),
    ],
)
def test_bad_flags_exit_2_naming_the_flag(argv, message, capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["controller", *argv])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err
