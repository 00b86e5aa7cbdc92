"""Monitoring: Grafana dashboards as code and Prometheus alert rules (`make dashboards`)."""
