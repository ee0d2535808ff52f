"""Settings and the user's inputs: the frozen config dataclasses (settings.py), loading them
(load.py), the bounds of every number a user gives (limits.py, validate.py), byte sizes
(sizes.py), the user's files (user_files.py) and URLs (urls.py), and the usage-error type
every layer raises (errors.py)."""
