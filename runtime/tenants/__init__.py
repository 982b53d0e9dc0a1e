"""Tenants of a shared front: keys (stored hashed), allowed models, rates, quotas, priorities and
usage (issue #36 item 4); ``serve --tenants FILE``. See :mod:`.keys` for the file."""
