"""What makes the daemon a service: logging and audit lines (logsetup.py), sd_notify and the watchdog
(sdnotify.py), Prometheus metrics (metrics.py), periodic loops (loops.py) and restarting a task that failed
(restart.py)."""
