"""Numbers as YAML gives them, with their bounds: 24 stays 24 and 0.5 stays 0.5, as the job
files and results have always said them (an int where a float would do is kept an int). The
config's types (planning/typed_config.py) and the settings a cell shares with them
(core/loads.ClosedLoopSettings) use these."""

from typing import Annotated, Union

from pydantic import Field

Positive = Union[Annotated[int, Field(gt=0)], Annotated[float, Field(gt=0)]]  # noqa: UP007
AtLeastOne = Union[Annotated[int, Field(ge=1)], Annotated[float, Field(ge=1)]]  # noqa: UP007
NonNegative = Union[Annotated[int, Field(ge=0)], Annotated[float, Field(ge=0)]]  # noqa: UP007
AboveOne = Union[Annotated[int, Field(gt=1)], Annotated[float, Field(gt=1)]]  # noqa: UP007
Share = Union[Annotated[int, Field(gt=0, le=1)], Annotated[float, Field(gt=0, le=1)]]  # noqa: UP007  (0, 1]
Number = Union[int, float]  # noqa: UP007
