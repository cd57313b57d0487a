"""Benchmarks of the kernel's hot paths, each printing a ratio against a floor measured in the
same run."""
