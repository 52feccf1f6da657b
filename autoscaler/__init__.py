"""Metrics-driven GPU autoscaler and rebalancer for Kubernetes."""

__version__ = "0.1.0"
