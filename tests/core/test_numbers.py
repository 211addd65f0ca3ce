"""Numbers as YAML gives them (speedsplit/core/numbers.py): 24 stays 24 and 0.5 stays 0.5 (job
files and results have always said them so), each kind with its bounds."""

import pytest
from pydantic import TypeAdapter, ValidationError

from speedsplit.core import numbers


@pytest.mark.parametrize("value", [24, 0.5, 2.0])
def test_a_number_keeps_its_type(value):
    got = TypeAdapter(numbers.Positive).validate_python(value)
    assert got == value and type(got) is type(value)


@pytest.mark.parametrize(
    ("kind", "inside", "outside"),
    [
        (numbers.Positive, [1, 0.001], [0, 0.0, -1]),
        (numbers.AtLeastOne, [1, 1.0, 7.5], [0, 0.99]),
        (numbers.NonNegative, [0, 0.0, 3], [-1, -0.1]),
        (numbers.AboveOne, [2, 1.01], [1, 1.0, 0.5]),
        (numbers.Share, [1, 1.0, 0.25], [0, 0.0, 1.01, 2]),
    ],
)
def test_each_kind_holds_its_bounds(kind, inside, outside):
    adapter = TypeAdapter(kind)
    assert [adapter.validate_python(v) for v in inside] == inside
    for v in outside:
        with pytest.raises(ValidationError):
            adapter.validate_python(v)
