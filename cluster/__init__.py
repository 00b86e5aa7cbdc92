"""A real Kubernetes control plane for tests and for trying the charts without a cloud.

``cluster.build`` builds the pinned upstream binaries (kube-apiserver, etcd, kwok, the
Kubeflow operators, Helm, ...) from the Go module proxy into a per-machine cache;
``cluster.control_plane`` starts and stops them (``make cluster`` / ``make cluster-down``,
and the pytest e2e fixture).
"""
