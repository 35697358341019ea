"""motor_sim."""
