"""Test helpers shared by the test suite and scripts: tiny HF checkpoints and a greedy ORT driver."""
