"""motor_common."""
