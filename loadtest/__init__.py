"""Load testing and benchmarking of the served pipelines (Locust, SLO gates, ``make bench``)."""
