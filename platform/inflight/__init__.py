"""Inflight's Django project (settings, apps). Lives in platform/ but is imported as `inflight`."""
