"""Warnings that point at the user's line: `warn_caller` names the first frame outside specroute's packages,
so a note raised deep in the loop shows the call in the user's script (or the CLI's), not a line of ours."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

from router.infra.quiet import PROJECT_PACKAGES

# a frame in a product package is ours; the command line (specroute/) is a caller like a user's script
_OURS = tuple(str(Path(__file__).resolve().parents[2] / name) for name in PROJECT_PACKAGES if name != "specroute")


def warn_caller(message: str, category: type[Warning] = UserWarning) -> None:
    """warnings.warn(message) attributed to the nearest caller outside router/, eval/, train/ and data_gen/."""
    level, frame = 2, sys._getframe(1)  # stacklevel 1 is this function, 2 our caller
    while frame is not None and str(Path(frame.f_code.co_filename).resolve()).startswith(_OURS):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)
