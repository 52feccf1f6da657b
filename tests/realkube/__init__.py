"""Tests against a real Kubernetes control plane built from its Go modules (scripts/control-plane.sh)."""
