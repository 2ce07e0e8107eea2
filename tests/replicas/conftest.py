"""The replica tier shares the fault tier's harness (edges, closed-loop writers, the checks of
acknowledged ids); scripts/test-replicas exports where the primary and the standby are."""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "faults"))
