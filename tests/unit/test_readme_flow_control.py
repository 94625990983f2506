"""The README's "Flow control" example declares jobs that registration accepts.

The block is read from README.md itself and run with ``@job`` standing in for
``build_definition`` (the registration's validation, without the registry), so an option
renamed or a rule tightened in ``definition/options.py`` fails here until the README says it
too. The enqueue lines need a queue and are left out; ``using(priority=)`` is checked by the
same validation as ``@job(priority=)``.
"""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from kumiko_jobs import InvalidJob
from kumiko_jobs.definition.job import JobDefinition
from kumiko_jobs.definition.options import build_definition

README = Path(__file__).resolve().parents[2] / "README.md"


def flow_control_example() -> str:
    text = README.read_text()
    section = text.split("### Flow control", 1)[1]
    block = re.search(r"```python\n(.*?)```", section, re.S)
    assert block is not None, "README's Flow control section lost its Python example"
    return block.group(1)


def declare(source: str) -> dict[str, JobDefinition]:
    """Run the example's declarations; returns the definitions by function name."""
    made: dict[str, JobDefinition] = {}

    def job(**options: Any) -> Any:
        def register(func: Any) -> Any:
            made[func.__name__] = build_definition(
                func, {"name": f"readme.{func.__name__}", **options}
            )
            return func

        return register

    declarations = "\n".join(line for line in source.splitlines() if ".enqueue(" not in line)
    exec(declarations, {"job": job, "timedelta": timedelta})  # our own README's example
    return made


def test_the_readmes_flow_control_jobs_register() -> None:
    made = declare(flow_control_example())
    assert set(made) == {"send_receipt", "call_partner_api", "sync_account", "render_invoice"}
    assert made["send_receipt"].priority == 10
    assert made["sync_account"].rate_limit_by == "account"
    assert made["render_invoice"].unique is not None


def test_calibration_a_wrong_option_in_the_example_is_refused() -> None:
    """The same route refuses what registration refuses (so the test above can fail)."""
    broken = flow_control_example().replace('rate_limit="5/s"', 'rate_limit="5/minute"')
    with pytest.raises(InvalidJob, match="rate_limit"):
        declare(broken)
