"""motor_coordinator."""
