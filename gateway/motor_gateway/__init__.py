"""motor_gateway."""
