"""The training loop (trainer.py) and its lr schedules (schedule.py)."""
