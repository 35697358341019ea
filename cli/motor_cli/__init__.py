"""motor_cli."""
