"""In-memory implementations of every port (``autoscaler.ports``), for tests, the simulator and dry-run."""
