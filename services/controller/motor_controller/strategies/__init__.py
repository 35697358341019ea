"""Fault-tolerance strategies, one per module, each behind ``fault_policy.Strategy``."""
