"""Locust: the users (locustfile.py), a headless run against a local deployment (`make loadtest`),
its report, and the soak (`make soak`)."""
