"""Test-only stand-ins shared by the tests and the benches (never installed with gpuwatch)."""
