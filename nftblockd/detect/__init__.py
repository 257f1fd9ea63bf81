"""Detection: filters (matcher.py and its regex tooling, timestamps.py, filterload.py, f2b.py), the tracker
(tracker.py: failures -> ban decisions) and the jails that run sources through them (jails.py).

Everything but jails.py and filterload.py is pure: no IO, no clock. Nothing here touches the kernel or the
state database; a jail hands its decisions to a sink it is given."""
