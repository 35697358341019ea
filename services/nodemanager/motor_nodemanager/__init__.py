"""motor_nodemanager."""
