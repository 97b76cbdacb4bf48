"""The run: enumerating cases, making their artifacts, running and judging one case, and the two
front ends that drive it (``python -m quantverdict`` and the pytest plugin)."""
