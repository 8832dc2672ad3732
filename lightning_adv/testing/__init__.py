"""Test utilities: slow reference implementations the kernels are tested against."""
