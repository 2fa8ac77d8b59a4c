"""Schedules: the model (a cron schedule, its policies, its ticks) and the book of the
colony's schedules that fires them."""
