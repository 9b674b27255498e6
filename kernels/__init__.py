"""Triton kernels and their torch references (imported as asymagent.kernels; imports nothing of ours)."""
