"""The run report (`python -m components.report`): report.md, report.json and every plot, built
from a run folder alone."""
