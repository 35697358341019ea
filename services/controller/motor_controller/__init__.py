"""motor_controller."""
