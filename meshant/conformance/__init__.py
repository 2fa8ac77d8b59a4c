"""The IACP/2 conformance kit: checks any forager or queen against docs/protocol.md.

:func:`check_forager` plays the queen against a forager command; :func:`check_queen` plays
foragers and clients against a queen. Both return a :class:`Report` of one
:class:`Outcome` per check of :data:`CHECKS` (PASS, FAIL or SKIP, with the spec section).
``meshant conformance forager|queen`` is the command line.
"""

from meshant.conformance.catalog import CHECKS, CheckInfo, checks_of
from meshant.conformance.forager_kit import check_forager
from meshant.conformance.queen_kit import check_queen
from meshant.conformance.report import Outcome, Report

__all__ = ["CHECKS", "CheckInfo", "Outcome", "Report", "check_forager", "check_queen",
           "checks_of"]
