"""Monitoring: Grafana dashboards as code, Prometheus alert rules, and helpers to run them."""
