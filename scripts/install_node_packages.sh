#!/usr/bin/env bash
# The real node's Debian packages (cluster.node, docs/cluster.md): containerd, runc, the
# CNI plugins (in /usr/lib/cni), iptables (kube-proxy's), busybox-static (the test image) and
# gcc with glibc's static library (the pause binary); and libjemalloc2, the controller image's
# allocator, which tests/controller/test_heap.py preloads on the host. CI machines are fresh:
# `make test` and `make cluster` call this. Root only (the node itself needs root); a no-op
# when all are there.
set -euo pipefail
packages=(containerd runc containernetworking-plugins iptables busybox-static gcc libc6-dev libjemalloc2)
missing=()
for pkg in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ ${#missing[@]} -eq 0 ]; then
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "install_node_packages: the real node needs root; missing Debian packages: ${missing[*]}" >&2
    echo "install_node_packages: as root: apt-get install ${missing[*]}" >&2
    exit 0  # the node reports what is missing when it starts; the kwok nodes do not need them
fi
if ! command -v apt-get >/dev/null; then
    echo "install_node_packages: no apt-get; install these by hand: ${missing[*]}" >&2
    exit 0
fi
echo "installing the real node's Debian packages: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
# Another apt run on the machine holds dpkg's lock: wait for it rather than fail.
apt-get -o DPkg::Lock::Timeout=600 update -qq
apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${missing[@]}"
# Debian's containerd package enables and starts containerd.service: a second containerd,
# running as root with its socket in /run/containerd, that the real node never uses (it runs
# its own under .cluster/node/). Installed here, it is disabled again, and stopped where
# systemd runs (/run/systemd/system: sd_booted()'s test).
if [[ " ${missing[*]} " == *" containerd "* ]] && command -v systemctl >/dev/null; then
    echo "install_node_packages: disabling Debian's containerd.service (the real node runs its own containerd)"
    if [ -d /run/systemd/system ]; then
        systemctl disable --now containerd.service
    else
        systemctl disable containerd.service >/dev/null 2>&1 || true  # no systemd: only the links
    fi
fi
