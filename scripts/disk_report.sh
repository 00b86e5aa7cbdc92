#!/usr/bin/env bash
# What the test suite's caches hold on this machine, and the free space left: .ci/run prints it
# when `make test` ends, so the end of a CI log says where the disk went (a run that ran out
# of space said only "No space left on device"). Read-only; each figure bounded in time.
cd "$(dirname "$0")/.." || exit 0
echo "--- disk at the end of the run ($(date -u +%FT%TZ))"
df -h . /tmp 2>/dev/null | awk '!seen[$0]++'
gomod=$(command -v go >/dev/null && go env GOMODCACHE 2>/dev/null || echo "$HOME/go/pkg/mod")
for path in "${MEGDET_IMAGE_CACHE:-$HOME/.cache/megdet/image}" \
    "${MEGDET_CLUSTER_CACHE:-$HOME/.cache/megdet/cluster}" "$gomod" "$HOME/.cache/pip" \
    "$HOME/.kube/cache" .venv output "${TMPDIR:-/tmp}/pytest-of-$(id -un)"; do
    [ -e "$path" ] && timeout 60 du -sxh "$path" 2>/dev/null
done
exit 0
